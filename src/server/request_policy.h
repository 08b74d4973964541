// request_policy.h: who may use a `lily serve`, decided from a request's head before any
// endpoint sees it. Safe defaults for a server on the user's own machine, where any web page
// the user visits can send requests to it:
//   * Host: on a loopback bind, a request whose Host is not a loopback name (localhost,
//     *.localhost, 127.0.0.0/8, [::1]) is refused (403): a DNS-rebinding page reaches the
//     server under its own name. Requests without Host (HTTP/1.0) pass.
//   * Origin: browsers send it on cross-origin requests, and on a page's own POSTs. One not
//     allowed by --cors-origin is refused (403), so a foreign page can neither read replies nor
//     run completions; an allowed one gets Access-Control-Allow-Origin (no CORS header is ever
//     sent otherwise). The server's own origin passes (is_same_origin: the chat page at /).
//   * Content-Type: the JSON endpoints take application/json only (415): the types a page may
//     send without a CORS preflight (text/plain, forms, none) are refused.
// The API key (--api-key / LILY_API_KEY) is checked by http.cpp on every route but /health.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lily::server {

// "localhost", "localhost:8080", "a.localhost", "127.0.0.1:80", "[::1]:8080", "::1".
bool is_loopback_host(std::string_view host_header);

// The origin as --cors-origin compares it: scheme://host[:port], lower-cased, no trailing '/'.
std::string normalize_origin(std::string_view origin);

// Whether `origin` is the origin the request was sent to: scheme http or https, then exactly
// the Host header ("http://127.0.0.1:8080" with Host "127.0.0.1:8080"), where that Host is a
// loopback name or an IP address. A DNS name does not count: a DNS-rebinding page is same-origin
// with the attacker's name it reached this server under (beyond loopback, where check_host lets
// any name through, such a page needs --cors-origin).
bool is_same_origin(std::string_view origin, std::string_view host_header);

// Whether `origin` (the request's Origin header) is one of `allowed` ("*" allows any).
bool origin_allowed(std::string_view origin, const std::vector<std::string>& allowed);

// application/json, with or without parameters (charset=utf-8), any case.
bool is_json_content_type(std::string_view content_type);

// Why a request is refused (status, message), or nullopt.
struct Refusal {
  int status;
  std::string message;
};
std::optional<Refusal> check_host(std::string_view host_header, bool loopback_bind);
std::optional<Refusal> check_origin(std::string_view origin_header, bool has_origin, std::string_view host_header,
                                    const std::vector<std::string>& allowed);
std::optional<Refusal> check_json_content_type(std::string_view content_type, bool has_content_type);

}  // namespace lily::server
