// errors.h: OpenAI error objects, {"error": {"message", "type", "param", "code"}}.
//
// Every client mistake is a 4xx with one of these (openai SDKs retry 408/409/429/5xx, so a
// deterministic refusal must never be a 5xx). Status -> type:
//   400 invalid_request_error   401 authentication_error   404 not_found_error
//   413 invalid_request_error   503 server_overloaded      500 server_error
#pragma once

#include <nlohmann/json.hpp>

#include <stdexcept>
#include <string>
#include <string_view>

namespace lily::server {

using json = nlohmann::ordered_json;

struct ApiError : std::runtime_error {
  int status;
  std::string type, param, code;  // empty param / code -> null
  ApiError(int status, std::string message, std::string param = "", std::string code = "");
};

// 400 invalid_request_error naming the field.
[[noreturn]] void bad_request(const std::string& message, const std::string& param = "", const std::string& code = "");

std::string error_type_for_status(int status);
json error_json(const ApiError& error);
json error_json(int status, const std::string& message, const std::string& param = "", const std::string& code = "");

// Anthropic's error object, {"type": "error", "error": {"type", "message"}}. Status -> type:
//   400 invalid_request_error  401 authentication_error  403 permission_error  404 not_found_error
//   413 request_too_large      429 rate_limit_error      503, 529 overloaded_error  other 5xx api_error
// (other 4xx: invalid_request_error).
std::string anthropic_error_type(int status);
json anthropic_error_json(const ApiError& error);
// Whether `path` is one of the Anthropic routes (/v1/messages...), whose errors take that shape.
bool is_anthropic_path(std::string_view path);
// The error body for a request to `path`: Anthropic's shape on its routes, OpenAI's elsewhere.
json error_json_for_path(const ApiError& error, std::string_view path);

}  // namespace lily::server
