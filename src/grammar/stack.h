// stack.h: the matcher's run-time state: sets of stacks of rule states, and stepping them.
//
// A stack is its innermost frame, a Top (rule, DFA state, parent), and the frames below it,
// nodes of a NodePool: a node is a frame waiting for its callee (rule, the state to go on at,
// its own parent). Nodes are interned, so equal stacks are equal Tops. kRoot below the
// outermost frame; kBase marks "unknown" in the cache walks of one rule state.
//
// A Config is a set of Tops after closure: calls expanded (the callee's start state pushed),
// accepting states popped (the caller goes on at its return state); only Tops that can read a
// byte are kept. `accepting`: a frame over kRoot can end (the text is a whole sentence);
// `base_pop`: a frame over kBase can end.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/vocabulary.h"

namespace lily::grammar {

inline constexpr int32_t kRoot = -1;
inline constexpr int32_t kBase = -2;

struct Top {
  int32_t rule, state, parent;
  bool operator==(const Top&) const = default;
};

class NodePool {
 public:
  int32_t intern(const Top& frame);
  const Top& operator[](int32_t id) const { return nodes_[size_t(id)]; }
  size_t size() const { return nodes_.size(); }

 private:
  struct Hash {
    size_t operator()(const Top& t) const {
      return (size_t(uint32_t(t.rule)) * 0x9E3779B97F4A7C15ull) ^ (size_t(uint32_t(t.state)) << 20) ^
             size_t(uint32_t(t.parent)) * 0xC2B2AE3D27D4EB4Full;
    }
  };
  std::vector<Top> nodes_;
  std::unordered_map<Top, int32_t, Hash> index_;
};

struct Config {
  std::vector<Top> tops;
  bool accepting = false;
  bool base_pop = false;
  bool alive() const { return !tops.empty() || accepting; }
};

// Closure and stepping, with reused scratch.
class Stepper {
 public:
  // out = the closure of `seeds`.
  void close(const Grammar& g, NodePool& pool, std::span<const Top> seeds, Config& out);
  // out = the closure of every Top of `in` advanced by `byte` (out empty: no Top takes it).
  void step(const Grammar& g, NodePool& pool, const Config& in, uint8_t byte, Config& out);

  // A depth-first walk of `trie` from `start`: on_token(node) for each node whose bytes leave
  // a live config (or end a frame over kBase); on_pop(node, depth) where a frame over kBase can
  // end after the node's bytes (depth: bytes read from the walk's start).
  template <typename OnToken, typename OnPop>
  void walk(const Grammar& g, NodePool& pool, const TokenTrie& trie, const Config& start, OnToken on_token,
            OnPop on_pop);

 private:
  std::vector<Top> work_, seen_, seeds_;
  struct Frame {
    int32_t node, child;
  };
  std::vector<Frame> frames_;
  std::vector<Config> levels_;
};

template <typename OnToken, typename OnPop>
void Stepper::walk(const Grammar& g, NodePool& pool, const TokenTrie& trie, const Config& start, OnToken on_token,
                   OnPop on_pop) {
  const auto& nodes = trie.nodes;
  if (nodes.size() <= 1) return;
  if (levels_.empty()) levels_.resize(64);
  levels_[0] = start;
  frames_.clear();
  frames_.push_back({0, 1});
  while (!frames_.empty()) {
    const size_t d = frames_.size() - 1;
    Frame& f = frames_.back();
    if (f.child >= nodes[size_t(f.node)].end) {
      frames_.pop_back();
      continue;
    }
    const int32_t ch = f.child;
    const TokenTrie::Node& n = nodes[size_t(ch)];
    f.child = n.end;  // next sibling
    if (levels_.size() < d + 2) levels_.resize(levels_.size() * 2);
    Config& c = levels_[d + 1];
    const Config& cur = levels_[d];
    // Inline fast path: one stack, and the next state has only byte edges.
    int32_t next = -1;
    const Rule* rule = nullptr;
    if (cur.tops.size() == 1) {
      rule = &g.rules[size_t(cur.tops[0].rule)];
      next = g.next(*rule, cur.tops[0].state, n.byte);
      if (next < 0) continue;
    }
    if (next >= 0 && rule->flags[size_t(next)] == Rule::kBytes) {
      c.tops.resize(1);
      c.tops[0] = {cur.tops[0].rule, next, cur.tops[0].parent};
      c.accepting = false;
      c.base_pop = false;
    } else {
      step(g, pool, cur, n.byte, c);
    }
    if (c.base_pop) on_pop(ch, int32_t(d + 1));
    if (!c.alive() && !c.base_pop) continue;
    if (n.token_count > 0) on_token(ch);
    if (!c.tops.empty() && ch + 1 < n.end) frames_.push_back({ch, ch + 1});
  }
}

}  // namespace lily::grammar
