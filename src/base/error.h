// error.h: lily's one error type, with a context chain, and the checks that throw it.
//
// Errors are exceptions carrying a human-readable message. Code that knows *where* it is
// (a file, a tensor, a layer) adds that with `with_context`, so the final message reads
//   "loading models/x/model.safetensors: tensor 'lm_head.weight': expected shape [320, 128], found [128, 320]"
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace lily {

class Error : public std::runtime_error {
 public:
  explicit Error(std::string message) : std::runtime_error(std::move(message)) {}
};

// Runs `fn`; an Error thrown inside gets "context: " prepended to its message.
template <typename Fn>
decltype(auto) with_context(const std::string& context, Fn&& fn) {
  try {
    return fn();
  } catch (const Error& e) {
    throw Error(context + ": " + e.what());
  }
}

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace lily

// LILY_CHECK(cond, "format {}", args...): throws lily::Error with the formatted message.
#define LILY_CHECK(cond, ...)               \
  do {                                      \
    if (!(cond)) ::lily::fail(__VA_ARGS__); \
  } while (0)
