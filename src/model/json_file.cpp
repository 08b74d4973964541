#include "model/json_file.h"

#include <fstream>
#include <iterator>

#include "base/error.h"
#include "base/json_text.h"

namespace lily {

nlohmann::json parse_json_limited(std::string_view text) {
  if (json_text_nests_deeper_than(text, kMaxJsonDepth)) fail("JSON nested deeper than {} levels", kMaxJsonDepth);
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
