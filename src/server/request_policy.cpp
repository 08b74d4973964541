#include "server/request_policy.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>

#include "base/log.h"

namespace lily::server {

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// The host of a Host header: "[::1]:80" -> "::1", "a:80" -> "a".
std::string host_name(std::string_view host) {
  if (!host.empty() && host.front() == '[') {
    const size_t close = host.find(']');
    return close == std::string_view::npos ? std::string(host) : lower(host.substr(1, close - 1));
  }
  const size_t colon = host.find(':');
  if (colon != std::string_view::npos && host.find(':', colon + 1) == std::string_view::npos) {
    host = host.substr(0, colon);  // one colon: a port
  }
  return lower(host);
}

}  // namespace

bool is_loopback_host(std::string_view header) {
  const std::string host = host_name(header);
  if (host == "localhost" || ends_with(host, ".localhost")) return true;
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return false;
}

std::string normalize_origin(std::string_view origin) {
  std::string o = lower(origin);
  while (!o.empty() && o.back() == '/') o.pop_back();
  return o;
}

bool is_same_origin(std::string_view origin, std::string_view host_header) {
  if (host_header.empty()) return false;
  const std::string normalized = normalize_origin(origin);
  std::string_view authority = normalized;
  if (authority.rfind("http://", 0) == 0) {
    authority.remove_prefix(7);
  } else if (authority.rfind("https://", 0) == 0) {
    authority.remove_prefix(8);
  } else {
    return false;  // "null" (a file or sandboxed page), or not an origin
  }
  if (authority != lower(host_header)) return false;
  // A DNS name could be a rebinding attacker's own (its page is same-origin with the name it
  // points at this server); an address, or a loopback name, cannot.
  const std::string name = host_name(host_header);
  in_addr v4{};
  in6_addr v6{};
  return is_loopback_host(host_header) || inet_pton(AF_INET, name.c_str(), &v4) == 1 ||
         inet_pton(AF_INET6, name.c_str(), &v6) == 1;
}

bool origin_allowed(std::string_view origin, const std::vector<std::string>& allowed) {
  const std::string o = normalize_origin(origin);
  return std::any_of(allowed.begin(), allowed.end(),
                     [&](const std::string& a) { return a == "*" || normalize_origin(a) == o; });
}

bool is_json_content_type(std::string_view content_type) {
  std::string type = lower(content_type.substr(0, content_type.find(';')));
  type.erase(std::remove_if(type.begin(), type.end(), [](char c) { return c == ' ' || c == '\t'; }), type.end());
  return type == "application/json";
}

std::optional<Refusal> check_host(std::string_view host, bool loopback_bind) {
  if (!loopback_bind || host.empty() || is_loopback_host(host)) return std::nullopt;
  return Refusal{403, fmt::format("the Host '{}' is not a loopback name: this server listens on loopback only and "
                                  "refuses other names (DNS rebinding); use localhost or 127.0.0.1, or start "
                                  "lily serve with --host to serve on another address",
                                  host)};
}

std::optional<Refusal> check_origin(std::string_view origin, bool has_origin, std::string_view host,
                                    const std::vector<std::string>& allowed) {
  if (!has_origin || is_same_origin(origin, host) || origin_allowed(origin, allowed)) return std::nullopt;
  return Refusal{403, fmt::format("requests from the web origin '{}' are refused; start lily serve with "
                                  "--cors-origin {} to allow that page",
                                  origin, origin)};
}

std::optional<Refusal> check_json_content_type(std::string_view type, bool has_type) {
  if (has_type && is_json_content_type(type)) return std::nullopt;
  return Refusal{415, fmt::format("the request body must be JSON sent with Content-Type: application/json (got {}); "
                                  "curl -d sends application/x-www-form-urlencoded unless given "
                                  "-H 'Content-Type: application/json'",
                                  has_type ? fmt::format("'{}'", type) : std::string("no Content-Type"))};
}

}  // namespace lily::server
