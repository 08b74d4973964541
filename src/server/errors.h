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

}  // namespace lily::server
