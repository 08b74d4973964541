// json_limits.h: a nesting limit for the JSON lily takes from clients and from the model.
//
// nlohmann's parser is iterative, but much of what follows it is not: copying a value, dump()
// (error messages quote values), the chat template's Python-style dumps of tools and tool-call
// arguments. A request body of 50 KB, "[[[[..." 25,000 levels deep inside a tool's parameters,
// used to overflow an HTTP worker's stack there. So JSON text that nests deeper than
// kMaxJsonNesting containers is refused before it is parsed (one scan of the text), and values
// built elsewhere are measured (without recursion) before anything recursive sees them. Real requests nest a few
// levels; the deepest JSON Schemas of real tools a few dozen.
#pragma once

#include <nlohmann/json.hpp>

#include <string_view>

namespace lily {

using json = nlohmann::ordered_json;

inline constexpr int kMaxJsonNesting = 128;  // containers inside containers: [[1]] is 2

// Parses `text`; a discarded value when it is not JSON or nests deeper than `max_nesting`
// (then *too_deep, when given, is set to true; text that is both is too deep). Never throws for
// bad input; numbers that overflow a double (1e309) are not JSON here (nlohmann would throw
// out_of_range).
json parse_json_bounded(std::string_view text, int max_nesting = kMaxJsonNesting, bool* too_deep = nullptr);

// True when `value` nests more than `max_nesting` containers; iterative, stops at the first
// path that is too deep.
bool json_nests_deeper_than(const json& value, int max_nesting = kMaxJsonNesting);

}  // namespace lily
