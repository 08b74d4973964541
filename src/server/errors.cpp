#include "server/errors.h"

namespace lily::server {

std::string error_type_for_status(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    case 503: return "server_overloaded";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

ApiError::ApiError(int status, std::string message, std::string param, std::string code)
    : std::runtime_error(std::move(message)),
      status(status),
      type(error_type_for_status(status)),
      param(std::move(param)),
      code(std::move(code)) {}

void bad_request(const std::string& message, const std::string& param, const std::string& code) {
  throw ApiError(400, message, param, code);
}

json error_json(const ApiError& e) {
  json inner;
  inner["message"] = e.what();
  inner["type"] = e.type;
  inner["param"] = e.param.empty() ? json(nullptr) : json(e.param);
  inner["code"] = e.code.empty() ? json(nullptr) : json(e.code);
  return json{{"error", inner}};
}

json error_json(int status, const std::string& message, const std::string& param, const std::string& code) {
  return error_json(ApiError(status, message, param, code));
}

std::string anthropic_error_type(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503:
    case 529: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

json anthropic_error_json(const ApiError& e) {
  return json{{"type", "error"}, {"error", json{{"type", anthropic_error_type(e.status)}, {"message", e.what()}}}};
}

bool is_anthropic_path(std::string_view path) { return path == "/v1/messages" || path.starts_with("/v1/messages/"); }

json error_json_for_path(const ApiError& e, std::string_view path) {
  return is_anthropic_path(path) ? anthropic_error_json(e) : error_json(e);
}

}  // namespace lily::server
