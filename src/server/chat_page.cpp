// chat_page.cpp: GET / and HEAD /: the chat page (src/server/web/chat.html; docs/server.md,
// "The chat page"). It holds no data, so http.cpp serves it without the API key and while the
// model loads; the page asks for the key itself and sends it with each request.
#include "server/chat_page.h"

#include <string>

#include "server/server.h"

namespace lily::server {

std::string chat_page_csp() {
  // default-src 'none' first, so a directive left out forbids rather than allows; the hashes
  // let exactly the embedded script and style run ('unsafe-inline' would let injected markup
  // run too); connect-src 'self': fetch() to this server only; data: images: the empty favicon
  // link, which keeps the browser from asking for /favicon.ico.
  return "default-src 'none'; script-src '" + std::string(chat_page_script_hash()) + "'; style-src '" +
         std::string(chat_page_style_hash()) +
         "'; connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";
}

void handle_chat_page(ServerContext&, const HttpRequest&, HttpResponse& res) {
  res.set_content(std::string(chat_page_html()), "text/html; charset=utf-8");
  res.set_header("Content-Security-Policy", chat_page_csp());
  res.set_header("X-Content-Type-Options", "nosniff");
  res.set_header("Referrer-Policy", "no-referrer");
  // The page changes with the binary: a browser must not keep an old one past an upgrade.
  res.set_header("Cache-Control", "no-cache");
}

}  // namespace lily::server
