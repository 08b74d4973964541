#include "runtime/completion_text.h"

#include <algorithm>

namespace lily {

StopStrings::StopStrings(std::vector<std::string> stops) {
  for (auto& s : stops) {
    if (!s.empty()) stops_.push_back(std::move(s));
  }
}

std::string StopStrings::push(std::string_view text) {
  if (stopped_) return {};
  held_ += text;
  // The earliest complete stop string wins (at equal positions the longest).
  size_t best = std::string::npos;
  const std::string* best_stop = nullptr;
  for (const std::string& stop : stops_) {
    size_t pos = held_.find(stop);
    if (pos < best || (pos == best && pos != std::string::npos && stop.size() > best_stop->size())) {
      best = pos;
      best_stop = &stop;
    }
  }
  if (best != std::string::npos) {
    std::string out = held_.substr(0, best);
    held_.clear();
    matched_ = *best_stop;
    stopped_ = true;
    return out;
  }
  // Hold back the longest tail of held_ that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const std::string& stop : stops_) {
    for (size_t n = std::min(stop.size() - 1, held_.size()); n > keep; --n) {
      if (held_.compare(held_.size() - n, n, stop, 0, n) == 0) {
        keep = n;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopStrings::flush() {
  if (stopped_) return {};
  std::string out = std::move(held_);
  held_.clear();
  return out;
}

}  // namespace lily
