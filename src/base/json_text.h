// json_text.h: a scan of JSON text before it is parsed (no parser needed: base depends on nothing).
#pragma once

#include <cstddef>
#include <string_view>

namespace lily {

// Whether `text` opens more than `max_nesting` containers inside each other, outside strings.
// Exact for valid JSON; for invalid JSON the parse fails anyway (and builds no deeper than this
// counts before it does). One pass, no allocation: nlohmann's callback parser, which could stop
// at the depth itself, is 14x slower than its plain parser (755 vs 53 ms on 2.4 MB). Used by
// chat/json_limits.cpp (requests) and model/json_file.cpp (config.json, safetensors headers).
inline bool json_text_nests_deeper_than(std::string_view text, int max_nesting) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;  // the escaped character cannot end the string
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_nesting) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

}  // namespace lily
