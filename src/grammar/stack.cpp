// stack.cpp: interning, closure and the one-byte step.
#include "grammar/stack.h"

#include <algorithm>

namespace lily::grammar {

int32_t NodePool::intern(const Top& frame) {
  auto [it, fresh] = index_.try_emplace(frame, int32_t(nodes_.size()));
  if (fresh) nodes_.push_back(frame);
  return it->second;
}

void Stepper::close(const Grammar& g, NodePool& pool, std::span<const Top> seeds, Config& out) {
  out.tops.clear();
  out.accepting = false;
  out.base_pop = false;
  work_.assign(seeds.begin(), seeds.end());
  seen_.clear();
  while (!work_.empty()) {
    const Top t = work_.back();
    work_.pop_back();
    if (std::find(seen_.begin(), seen_.end(), t) != seen_.end()) continue;
    seen_.push_back(t);
    const Rule& rule = g.rules[size_t(t.rule)];
    const uint8_t flags = rule.flags[size_t(t.state)];
    if (flags & Rule::kBytes) out.tops.push_back(t);
    if (flags & Rule::kCalls) {
      for (uint32_t i = rule.call_begin[size_t(t.state)]; i < rule.call_begin[size_t(t.state) + 1]; ++i) {
        const CallEdge& e = rule.calls[i];
        work_.push_back({e.rule, 0, pool.intern({t.rule, e.target, t.parent})});
      }
    }
    if (flags & Rule::kAccept) {
      if (t.parent == kRoot) {
        out.accepting = true;
      } else if (t.parent == kBase) {
        out.base_pop = true;
      } else {
        work_.push_back(pool[t.parent]);
      }
    }
  }
}

void Stepper::step(const Grammar& g, NodePool& pool, const Config& in, uint8_t byte, Config& out) {
  if (in.tops.size() == 1) {  // the common case: one stack, a state with only byte edges next
    const Top& t = in.tops[0];
    const Rule& rule = g.rules[size_t(t.rule)];
    const int32_t next = g.next(rule, t.state, byte);
    out.accepting = false;
    out.base_pop = false;
    out.tops.clear();
    if (next < 0) return;
    if (rule.flags[size_t(next)] == Rule::kBytes) {
      out.tops.push_back({t.rule, next, t.parent});
      return;
    }
    seeds_.assign(1, {t.rule, next, t.parent});
    close(g, pool, seeds_, out);
    return;
  }
  seeds_.clear();
  for (const Top& t : in.tops) {
    const int32_t next = g.next(g.rules[size_t(t.rule)], t.state, byte);
    if (next >= 0) seeds_.push_back({t.rule, next, t.parent});
  }
  close(g, pool, seeds_, out);
}

}  // namespace lily::grammar
