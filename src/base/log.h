// log.h: messages for the person running lily, on stderr.
#pragma once

#include <fmt/format.h>

#include <cstdio>
#include <utility>

namespace lily {

enum class LogLevel { debug = 0, info = 1, warn = 2, error = 3, quiet = 4 };

LogLevel log_level();
void set_log_level(LogLevel level);

template <typename... Args>
void log(LogLevel level, fmt::format_string<Args...> format, Args&&... args) {
  if (level < log_level()) return;
  static const char* prefix[] = {"debug: ", "", "warning: ", "error: ", ""};
  fmt::print(stderr, "{}{}\n", prefix[int(level)], fmt::format(format, std::forward<Args>(args)...));
}

#define LILY_LOG_INFO(...) ::lily::log(::lily::LogLevel::info, __VA_ARGS__)
#define LILY_LOG_WARN(...) ::lily::log(::lily::LogLevel::warn, __VA_ARGS__)
#define LILY_LOG_DEBUG(...) ::lily::log(::lily::LogLevel::debug, __VA_ARGS__)

}  // namespace lily
