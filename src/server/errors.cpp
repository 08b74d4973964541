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

}  // namespace lily::server
