// The chat page embedded in the binary (src/server/web/embed_page.cmake): the bytes are the
// file's, and its Content-Security-Policy names the hashes of its inline script and style and
// nothing looser. (That the hashes are right, the browser checks: tests/server/browser.)
#include <gtest/gtest.h>

#include <cctype>
#include <fstream>
#include <sstream>

#include "server/chat_page.h"

namespace lily::server {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

TEST(ChatPage, EmbeddedBytesAreTheFile) {
  const std::string file = read_file(LILY_SOURCE_DIR "/src/server/web/chat.html");
  ASSERT_FALSE(file.empty());
  EXPECT_EQ(chat_page_html().size(), file.size());
  EXPECT_TRUE(chat_page_html() == file);
  EXPECT_EQ(chat_page_html().substr(0, 15), "<!doctype html>");
}

// "sha256-" and the base64 of 32 bytes: 43 characters and one '='.
void expect_hash_source(std::string_view hash) {
  ASSERT_EQ(hash.size(), 7u + 44u) << hash;
  EXPECT_EQ(hash.substr(0, 7), "sha256-");
  EXPECT_EQ(hash.back(), '=');
  for (char c : hash.substr(7, 43))
    EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c)) || c == '+' || c == '/') << hash;
}

TEST(ChatPage, CspAllowsOnlyTheInlineScriptAndStyleAndThisOrigin) {
  expect_hash_source(chat_page_script_hash());
  expect_hash_source(chat_page_style_hash());
  EXPECT_NE(chat_page_script_hash(), chat_page_style_hash());
  const std::string csp = chat_page_csp();
  EXPECT_EQ(csp.rfind("default-src 'none'; ", 0), 0u) << csp;
  EXPECT_NE(csp.find("script-src '" + std::string(chat_page_script_hash()) + "'"), std::string::npos) << csp;
  EXPECT_NE(csp.find("style-src '" + std::string(chat_page_style_hash()) + "'"), std::string::npos) << csp;
  EXPECT_NE(csp.find("connect-src 'self'"), std::string::npos) << csp;
  EXPECT_NE(csp.find("frame-ancestors 'none'"), std::string::npos) << csp;
  for (const char* loose : {"unsafe-inline", "unsafe-eval", "*", "http:", "https:"}) {
    EXPECT_EQ(csp.find(loose), std::string::npos) << loose << " in " << csp;
  }
}

}  // namespace
}  // namespace lily::server
