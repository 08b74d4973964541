// env.h: reading the LILY_* environment switches (A/B runs of kernel forms, measurement modes;
// docs/perf.md names each where it was measured).
#pragma once

#include <cstdlib>
#include <string_view>

namespace lily {

// The value of the environment variable `name`; empty when it is not set.
inline std::string_view env_value(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string_view(v) : std::string_view();
}

}  // namespace lily
