#include "model/json_file.h"

#include <fstream>
#include <iterator>

#include "base/error.h"

namespace lily {

namespace {

// Whether `text` opens more than `max_nesting` containers inside each other, outside strings
// (exact for valid JSON; invalid JSON fails to parse anyway). A pass over the text, then the
// plain parser: nlohmann's callback parser, which could stop at the depth itself, is 14x slower
// (755 vs 53 ms on 2.4 MB; safetensors headers are hundreds of KB). chat/json_limits.cpp has
// the same scan for the JSON of requests (model/ does not depend on chat/).
bool nests_deeper_than(std::string_view text, int max_nesting) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
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

}  // namespace

nlohmann::json parse_json_limited(std::string_view text) {
  if (nests_deeper_than(text, kMaxJsonDepth)) fail("JSON nested deeper than {} levels", kMaxJsonDepth);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("not valid JSON: {}", e.what());
  }
}

nlohmann::json read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open {}", path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return with_context(path, [&] { return parse_json_limited(text); });
}

}  // namespace lily
