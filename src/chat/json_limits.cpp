// json_limits.cpp: the nesting limit (see json_limits.h).
#include "chat/json_limits.h"

#include <utility>
#include <vector>

namespace lily {
namespace {
struct TooDeep {};
}  // namespace

json parse_json_bounded(std::string_view text, int max_nesting, bool* too_deep) {
  if (too_deep) *too_deep = false;
  // The callback's depth is the number of containers open around the event; a container that
  // starts at depth max_nesting would be one too many.
  auto limit = [max_nesting](int depth, json::parse_event_t event, json&) {
    if ((event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) &&
        depth >= max_nesting)
      throw TooDeep{};
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), limit, /*allow_exceptions=*/false);
  } catch (const TooDeep&) {
    if (too_deep) *too_deep = true;
  } catch (const json::exception&) {  // out_of_range: a number beyond a double
  }
  return json(json::value_t::discarded);
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
