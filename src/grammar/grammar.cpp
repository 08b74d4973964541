// grammar.cpp: fragments, subset construction, trimming and the left-recursion check.
#include "grammar/grammar.h"

#include <algorithm>
#include <map>

#include "base/error.h"

namespace lily::grammar {

namespace {

// More DFA states than this in one grammar is refused (each costs a cache entry when visited).
constexpr size_t kMaxDfaStates = 400'000;
// More NFA states than this is refused before determinization. Schemas come from HTTP clients:
// unbounded, {"maxLength": 1000000} built a 28M-state NFA (6 GB, 160 s on the 2-core machine)
// only for the DFA limit to refuse it. The NFA of a string is ~28 states per character and its
// DFA ~27, so a grammar past this would most likely fail the DFA limit anyway; the largest
// schema in the tests that passes (1000 x 1000 x maxLength 1000, inlined into rules) needs 328K.
constexpr size_t kMaxNfaStates = 500'000;

}  // namespace

ByteSet ByteSet::range(int lo, int hi) {
  ByteSet s;
  for (int b = lo; b <= hi; ++b) s.set(b);
  return s;
}

ByteSet ByteSet::of(std::string_view bytes) {
  ByteSet s;
  for (char c : bytes) s.set(uint8_t(c));
  return s;
}

ByteSet ByteSet::operator|(const ByteSet& o) const {
  ByteSet s;
  for (size_t i = 0; i < 4; ++i) s.bits[i] = bits[i] | o.bits[i];
  return s;
}

ByteSet ByteSet::operator-(const ByteSet& o) const {
  ByteSet s;
  for (size_t i = 0; i < 4; ++i) s.bits[i] = bits[i] & ~o.bits[i];
  return s;
}

size_t Grammar::total_states() const {
  size_t n = 0;
  for (const Rule& r : rules) n += size_t(r.num_states);
  return n;
}

GrammarBuilder::GrammarBuilder() { add_rule("root"); }

int32_t GrammarBuilder::add_rule(std::string name) {
  rules_.push_back({std::move(name), {}});
  return int32_t(rules_.size() - 1);
}

void GrammarBuilder::set_body(int32_t rule, Fragment body) { rules_.at(size_t(rule)).body = body; }

int32_t GrammarBuilder::shared_rule(const std::string& name, const std::function<Fragment()>& make_body) {
  if (auto it = shared_.find(name); it != shared_.end()) return it->second;
  const int32_t rule = add_rule(name);
  shared_[name] = rule;
  set_body(rule, make_body());
  return rule;
}

int32_t GrammarBuilder::new_state() {
  LILY_CHECK(states_.size() < kMaxNfaStates,
             "grammar: more than {} automaton states (bounds such as maxLength or maxItems too large)", kMaxNfaStates);
  states_.emplace_back();
  return int32_t(states_.size() - 1);
}

void GrammarBuilder::bytes(int32_t from, const ByteSet& set, int32_t to) {
  if (!set.empty()) states_[size_t(from)].bytes.push_back({set, to});
}
void GrammarBuilder::epsilon(int32_t from, int32_t to) { states_[size_t(from)].epsilon.push_back(to); }
void GrammarBuilder::call(int32_t from, int32_t rule, int32_t to) { states_[size_t(from)].calls.push_back({rule, to}); }

Fragment GrammarBuilder::empty() {
  int32_t s = new_state();
  return {s, s};
}

Fragment GrammarBuilder::byte_set(const ByteSet& set) {
  Fragment f{new_state(), new_state()};
  bytes(f.start, set, f.end);
  return f;
}

Fragment GrammarBuilder::literal(std::string_view text) {
  Fragment f = empty();
  for (char c : text) {
    int32_t next = new_state();
    ByteSet one;
    one.set(uint8_t(c));
    bytes(f.end, one, next);
    f.end = next;
  }
  return f;
}

Fragment GrammarBuilder::call_rule(int32_t rule) {
  Fragment f{new_state(), new_state()};
  call(f.start, rule, f.end);
  return f;
}

Fragment GrammarBuilder::sequence(const std::vector<Fragment>& parts) {
  if (parts.empty()) return empty();
  for (size_t i = 1; i < parts.size(); ++i) epsilon(parts[i - 1].end, parts[i].start);
  return {parts.front().start, parts.back().end};
}

Fragment GrammarBuilder::alternatives(const std::vector<Fragment>& options) {
  LILY_CHECK(!options.empty(), "grammar: alternatives of nothing");
  if (options.size() == 1) return options[0];
  Fragment f{new_state(), new_state()};
  for (const Fragment& o : options) {
    epsilon(f.start, o.start);
    epsilon(o.end, f.end);
  }
  return f;
}

Fragment GrammarBuilder::optional(Fragment f) {
  Fragment g{new_state(), new_state()};
  epsilon(g.start, f.start);
  epsilon(f.end, g.end);
  epsilon(g.start, g.end);
  return g;
}

Fragment GrammarBuilder::star(Fragment f) {
  Fragment g{new_state(), new_state()};
  epsilon(g.start, f.start);
  epsilon(f.end, g.start);
  epsilon(g.start, g.end);
  return g;
}

namespace {

// Byte classes: bytes that every edge set treats alike share a class.
void make_byte_classes(const std::vector<ByteSet>& sets, Grammar& g) {
  std::array<int32_t, 256> cls{};
  int32_t count = 1;
  for (const ByteSet& s : sets) {
    std::map<std::pair<int32_t, bool>, int32_t> split;
    for (int b = 0; b < 256; ++b) {
      auto key = std::make_pair(cls[size_t(b)], s.test(b));
      auto [it, fresh] = split.try_emplace(key, int32_t(split.size()));
      cls[size_t(b)] = it->second;
    }
    count = int32_t(split.size());
  }
  g.num_classes = count;
  for (int b = 0; b < 256; ++b) g.byte_class[size_t(b)] = uint8_t(cls[size_t(b)]);
}

// Epsilon closures of NFA state sets (states[s].epsilon: the epsilon edges of state s), with a
// visit mark reused between calls.
template <typename States>
class EpsilonClosure {
 public:
  explicit EpsilonClosure(const States& states) : states_(states), mark_(states.size(), -1) {}

  // `set` becomes its closure, sorted.
  void operator()(std::vector<int32_t>& set) {
    ++stamp_;
    std::vector<int32_t> work = set;
    set.clear();
    for (int32_t s : work) mark_[size_t(s)] = stamp_;
    while (!work.empty()) {
      const int32_t s = work.back();
      work.pop_back();
      set.push_back(s);
      for (int32_t t : states_[size_t(s)].epsilon) {
        if (mark_[size_t(t)] != stamp_) mark_[size_t(t)] = stamp_, work.push_back(t);
      }
    }
    std::sort(set.begin(), set.end());
  }

 private:
  const States& states_;
  std::vector<int32_t> mark_;
  int32_t stamp_ = 0;
};

// Live states: accepting, or an edge to a live state (a call counts when its callee can match).
std::vector<std::vector<uint8_t>> live_states(const Grammar& g) {
  const size_t nc = size_t(g.num_classes);
  std::vector<std::vector<uint8_t>> live(g.rules.size());
  for (size_t r = 0; r < g.rules.size(); ++r) live[r].assign(size_t(g.rules[r].num_states), 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < g.rules.size(); ++r) {
      const Rule& rule = g.rules[r];
      for (int32_t s = 0; s < rule.num_states; ++s) {
        if (live[r][size_t(s)]) continue;
        bool ok = rule.flags[size_t(s)] & Rule::kAccept;
        for (size_t c = 0; !ok && c < nc; ++c) {
          int32_t t = rule.next[size_t(s) * nc + c];
          ok = t >= 0 && live[r][size_t(t)];
        }
        for (uint32_t i = rule.call_begin[size_t(s)]; !ok && i < rule.call_begin[size_t(s) + 1]; ++i) {
          const CallEdge& e = rule.calls[i];
          ok = live[size_t(e.rule)][0] && live[r][size_t(e.target)];
        }
        if (ok) live[r][size_t(s)] = 1, changed = true;
      }
    }
  }
  return live;
}

// Drops the edges and calls into states that cannot reach an accepting one, and sets the
// kBytes / kCalls flags of what is left.
void trim_dead_states(Grammar& g) {
  const size_t nc = size_t(g.num_classes);
  const std::vector<std::vector<uint8_t>> live = live_states(g);
  LILY_CHECK(live[0][0], "grammar: the root rule matches no text");
  for (size_t r = 0; r < g.rules.size(); ++r) {
    Rule& rule = g.rules[r];
    std::vector<CallEdge> kept;
    std::vector<uint32_t> begin{0};
    for (int32_t s = 0; s < rule.num_states; ++s) {
      for (size_t c = 0; c < nc; ++c) {
        int32_t& t = rule.next[size_t(s) * nc + c];
        if (t >= 0 && !live[r][size_t(t)]) t = -1;
        if (t >= 0) rule.flags[size_t(s)] |= Rule::kBytes;
      }
      for (uint32_t i = rule.call_begin[size_t(s)]; i < rule.call_begin[size_t(s) + 1]; ++i) {
        const CallEdge& e = rule.calls[i];
        if (live[size_t(e.rule)][0] && live[r][size_t(e.target)]) kept.push_back(e);
      }
      begin.push_back(uint32_t(kept.size()));
      if (begin[size_t(s) + 1] > begin[size_t(s)]) rule.flags[size_t(s)] |= Rule::kCalls;
    }
    rule.calls = std::move(kept);
    rule.call_begin = std::move(begin);
  }
}

// Left recursion: which rules each rule can call before reading a byte (through callees that
// can match the empty text); a cycle there would make the matcher's closure endless.
void check_left_recursion(const Grammar& g) {
  const size_t nr = g.rules.size();
  std::vector<uint8_t> nullable(nr, 0);
  auto empty_reach = [&](size_t r, std::vector<int32_t>* callees) {
    const Rule& rule = g.rules[r];
    std::vector<uint8_t> seen(size_t(rule.num_states), 0);
    std::vector<int32_t> work{0};
    seen[0] = 1;
    bool accept = false;
    while (!work.empty()) {
      int32_t s = work.back();
      work.pop_back();
      if (rule.flags[size_t(s)] & Rule::kAccept) accept = true;
      for (uint32_t i = rule.call_begin[size_t(s)]; i < rule.call_begin[size_t(s) + 1]; ++i) {
        const CallEdge& e = rule.calls[i];
        if (callees) callees->push_back(e.rule);
        if (nullable[size_t(e.rule)] && !seen[size_t(e.target)]) seen[size_t(e.target)] = 1, work.push_back(e.target);
      }
    }
    return accept;
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < nr; ++r)
      if (!nullable[r] && empty_reach(r, nullptr)) nullable[r] = 1, changed = true;
  }
  std::vector<std::vector<int32_t>> left(nr);
  for (size_t r = 0; r < nr; ++r) empty_reach(r, &left[r]);
  std::vector<uint8_t> color(nr, 0);  // 0 new, 1 on the path, 2 done
  auto visit = [&](auto&& self, size_t r) -> void {
    color[r] = 1;
    for (int32_t q : left[r]) {
      LILY_CHECK(color[size_t(q)] != 1, "grammar: rule '{}' can reach itself before any byte (left recursion)",
                 g.rules[size_t(q)].name);
      if (color[size_t(q)] == 0) self(self, size_t(q));
    }
    color[r] = 2;
  };
  for (size_t r = 0; r < nr; ++r)
    if (color[r] == 0) visit(visit, r);
}

}  // namespace

void GrammarBuilder::make_alphabet(Grammar& g) const {
  std::vector<ByteSet> sets;
  for (const State& s : states_)
    for (const auto& [set, to] : s.bytes) sets.push_back(set);
  std::sort(sets.begin(), sets.end(), [](const ByteSet& a, const ByteSet& b) { return a.bits < b.bits; });
  sets.erase(std::unique(sets.begin(), sets.end(), [](const ByteSet& a, const ByteSet& b) { return a.bits == b.bits; }),
             sets.end());
  make_byte_classes(sets, g);
}

void GrammarBuilder::determinize(Grammar& g) const {
  const size_t nc = size_t(g.num_classes);
  std::vector<int> representative(nc);
  for (int b = 255; b >= 0; --b) representative[g.byte_class[size_t(b)]] = b;
  EpsilonClosure closure(states_);

  // Only the rules the root reaches through calls: the others (a compiler's fragments made to
  // check a schema and never used) become a state without edges.
  size_t total = 0;
  g.rules.resize(rules_.size());
  std::vector<uint8_t> reached(rules_.size(), 0);
  std::vector<size_t> work{0};
  reached[0] = 1;
  for (size_t w = 0; w < work.size(); ++w) {
    const size_t r = work[w];
    const RuleBody& body = rules_[r];
    LILY_CHECK(body.body.start >= 0, "grammar: rule '{}' has no body", body.name);
    Rule& rule = g.rules[r];
    rule.name = body.name;
    std::map<std::vector<int32_t>, int32_t> ids;
    std::vector<std::vector<int32_t>> sets;
    auto intern = [&](std::vector<int32_t> set) -> int32_t {
      closure(set);
      if (set.empty()) return -1;
      auto [it, fresh] = ids.try_emplace(set, int32_t(sets.size()));
      if (fresh) sets.push_back(std::move(set));
      return it->second;
    };
    intern({body.body.start});
    std::vector<std::vector<CallEdge>> calls;
    for (size_t d = 0; d < sets.size(); ++d) {
      LILY_CHECK(total + sets.size() <= kMaxDfaStates, "grammar: more than {} states (rule '{}')", kMaxDfaStates,
                 body.name);
      rule.next.resize((d + 1) * nc, -1);
      for (size_t c = 0; c < nc; ++c) {
        std::vector<int32_t> target;
        for (int32_t s : sets[d])
          for (const auto& [set, to] : states_[size_t(s)].bytes)
            if (set.test(representative[c])) target.push_back(to);
        if (!target.empty()) rule.next[d * nc + c] = intern(std::move(target));
      }
      std::map<int32_t, std::vector<int32_t>> by_callee;
      for (int32_t s : sets[d])
        for (const CallEdge& e : states_[size_t(s)].calls) by_callee[e.rule].push_back(e.target);
      std::vector<CallEdge> out;
      for (auto& [callee, targets] : by_callee) out.push_back({callee, intern(std::move(targets))});
      calls.push_back(std::move(out));
      bool accept = std::binary_search(sets[d].begin(), sets[d].end(), body.body.end);
      rule.flags.push_back(accept ? Rule::kAccept : 0);
    }
    rule.num_states = int32_t(sets.size());
    total += sets.size();
    rule.call_begin.assign(1, 0);
    for (auto& c : calls) {
      rule.calls.insert(rule.calls.end(), c.begin(), c.end());
      rule.call_begin.push_back(uint32_t(rule.calls.size()));
    }
    for (const CallEdge& e : rule.calls)
      if (!reached[size_t(e.rule)]) reached[size_t(e.rule)] = 1, work.push_back(size_t(e.rule));
  }
  for (size_t r = 0; r < rules_.size(); ++r) {
    if (reached[r]) continue;
    Rule& rule = g.rules[r];
    rule.name = rules_[r].name;
    rule.num_states = 1;
    rule.next.assign(nc, -1);
    rule.flags.assign(1, 0);
    rule.call_begin.assign(2, 0);
  }
}

Grammar GrammarBuilder::build() const {
  Grammar g;
  make_alphabet(g);
  determinize(g);
  trim_dead_states(g);
  check_left_recursion(g);
  return g;
}

}  // namespace lily::grammar
