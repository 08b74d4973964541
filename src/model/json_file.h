// json_file.h: the JSON files of a model directory (config.json, generation_config.json,
// model.safetensors.index.json, safetensors headers), parsed with a nesting limit.
//
// nlohmann's parser is iterative, but copying a value and dump() (which every error message
// that quotes a value uses) recurse once per level: a 2,000,000-deep "[[[..." overflows the
// stack there. No file lily reads nests deeper than a few levels, so anything deeper than
// kMaxJsonDepth is refused before it is parsed (a scan of the text), so none of it is copied or quoted.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace lily {

constexpr int kMaxJsonDepth = 64;

// Throws lily::Error: "not valid JSON: ..." or "JSON nested deeper than 64 levels".
nlohmann::json parse_json_limited(std::string_view text);

// Reads and parses `path`; errors name the file ("cannot open PATH", "PATH: not valid JSON: ...").
nlohmann::json read_json_file(const std::string& path);

}  // namespace lily
