// json_limits.cpp: the nesting limit (see json_limits.h).
#include "chat/json_limits.h"

#include <utility>
#include <vector>

#include "base/json_text.h"

namespace lily {

json parse_json_bounded(std::string_view text, int max_nesting, bool* too_deep) {
  const bool deep = json_text_nests_deeper_than(text, max_nesting);
  if (too_deep) *too_deep = deep;
  if (deep) return json(json::value_t::discarded);
  try {
    return json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  } catch (const json::exception&) {  // out_of_range: a number beyond a double
    return json(json::value_t::discarded);
  }
}

bool json_nests_deeper_than(const json& value, int max_nesting) {
  // (container, its nesting) pairs still to visit.
  std::vector<std::pair<const json*, int>> pending{{&value, value.is_structured() ? 1 : 0}};
  while (!pending.empty()) {
    auto [v, nesting] = pending.back();
    pending.pop_back();
    if (nesting > max_nesting) return true;
    if (!v->is_structured()) continue;
    for (const json& child : *v)
      if (child.is_structured()) pending.emplace_back(&child, nesting + 1);
  }
  return false;
}

}  // namespace lily
