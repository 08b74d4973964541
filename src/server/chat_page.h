// chat_page.h: the chat page served at GET / (src/server/web/chat.html), embedded in the binary
// at build time by src/server/web/embed_page.cmake, which defines these three functions in a
// generated source (build/.../chat_page_data.cpp).
#pragma once

#include <string_view>

namespace lily::server {

std::string_view chat_page_html();
// "sha256-BASE64" of the page's one inline <script> and one inline <style>, for its CSP.
std::string_view chat_page_script_hash();
std::string_view chat_page_style_hash();

// The Content-Security-Policy the page is served with: its own script and style, requests to
// its own origin only, nothing else (no other scripts, frames, forms, plugins, images but data:).
std::string chat_page_csp();

}  // namespace lily::server
