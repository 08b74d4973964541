// request_policy.h: which Origin a request may come with. The chat page's own POSTs carry its
// origin (browsers send Origin on every non-GET fetch), which must pass without --cors-origin;
// a DNS-rebinding page's must not.
#include <gtest/gtest.h>

#include "server/request_policy.h"

namespace lily::server {
namespace {

TEST(RequestPolicy, SameOriginIsTheHostTheRequestWasSentTo) {
  EXPECT_TRUE(is_same_origin("http://127.0.0.1:8080", "127.0.0.1:8080"));
  EXPECT_TRUE(is_same_origin("http://localhost:8080", "localhost:8080"));
  EXPECT_TRUE(is_same_origin("http://LocalHost:8080/", "localhost:8080"));
  EXPECT_TRUE(is_same_origin("http://[::1]:8080", "[::1]:8080"));
  EXPECT_TRUE(is_same_origin("https://127.0.0.1:8443", "127.0.0.1:8443"));     // behind a TLS proxy
  EXPECT_TRUE(is_same_origin("http://192.168.1.5:8080", "192.168.1.5:8080"));  // --host beyond loopback
  EXPECT_TRUE(is_same_origin("http://127.0.0.1", "127.0.0.1"));                // port 80
}

TEST(RequestPolicy, OtherOriginsAreNotSame) {
  EXPECT_FALSE(is_same_origin("http://127.0.0.1:8081", "127.0.0.1:8080"));  // another port
  EXPECT_FALSE(is_same_origin("http://127.0.0.2:8080", "127.0.0.1:8080"));  // another address
  EXPECT_FALSE(is_same_origin("http://localhost:8080", "127.0.0.1:8080"));  // another name
  EXPECT_FALSE(is_same_origin("null", "127.0.0.1:8080"));                   // a file:// page
  EXPECT_FALSE(is_same_origin("127.0.0.1:8080", "127.0.0.1:8080"));         // no scheme
  EXPECT_FALSE(is_same_origin("ftp://127.0.0.1:8080", "127.0.0.1:8080"));
  EXPECT_FALSE(is_same_origin("http://127.0.0.1:8080", ""));  // no Host (HTTP/1.0)
  EXPECT_FALSE(is_same_origin("", ""));
}

// DNS rebinding: evil.example resolves to this server, so its page and its requests share the
// name; a name is same-origin only when it is a loopback name.
TEST(RequestPolicy, regression_same_origin_rebinding_18) {
  EXPECT_FALSE(is_same_origin("http://evil.example:8080", "evil.example:8080"));
  EXPECT_FALSE(is_same_origin("http://127.0.0.1.nip.io:8080", "127.0.0.1.nip.io:8080"));
  EXPECT_TRUE(check_origin("http://evil.example:8080", true, "evil.example:8080", {}).has_value());
  EXPECT_EQ(check_origin("http://evil.example:8080", true, "evil.example:8080", {})->status, 403);
  // Named with --cors-origin, it is let in.
  EXPECT_FALSE(check_origin("http://mybox.lan:8080", true, "mybox.lan:8080", {"http://mybox.lan:8080"}).has_value());
}

TEST(RequestPolicy, CheckOrigin) {
  EXPECT_FALSE(check_origin("", false, "127.0.0.1:8080", {}).has_value());  // no Origin: not a page
  EXPECT_FALSE(check_origin("http://127.0.0.1:8080", true, "127.0.0.1:8080", {}).has_value());
  const auto foreign = check_origin("https://evil.example", true, "127.0.0.1:8080", {});
  ASSERT_TRUE(foreign.has_value());
  EXPECT_EQ(foreign->status, 403);
  EXPECT_NE(foreign->message.find("--cors-origin https://evil.example"), std::string::npos) << foreign->message;
  EXPECT_FALSE(check_origin("https://app.example", true, "127.0.0.1:8080", {"https://app.example"}).has_value());
  EXPECT_FALSE(check_origin("https://any.example", true, "127.0.0.1:8080", {"*"}).has_value());
}

}  // namespace
}  // namespace lily::server
