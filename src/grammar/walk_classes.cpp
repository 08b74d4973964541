// walk_classes.cpp: depth-bounded partition refinement of one rule's states (see the header).
#include "grammar/walk_classes.h"

#include <algorithm>
#include <map>
#include <unordered_map>

namespace lily::grammar {

namespace {

bool has_calls(const Rule& rule, int32_t s) { return rule.call_begin[size_t(s) + 1] > rule.call_begin[size_t(s)]; }

// Predecessors by byte edges: preds[begin[t] .. begin[t + 1]) are the states with an edge to t.
struct Predecessors {
  std::vector<uint32_t> begin;
  std::vector<int32_t> preds;

  Predecessors(const Rule& rule, size_t nc) {
    const size_t n = size_t(rule.num_states);
    std::vector<std::pair<int32_t, int32_t>> edges;  // (to, from)
    for (size_t s = 0; s < n; ++s)
      for (size_t c = 0; c < nc; ++c)
        if (const int32_t t = rule.next[s * nc + c]; t >= 0) edges.push_back({t, int32_t(s)});
    std::sort(edges.begin(), edges.end());
    edges.erase(std::unique(edges.begin(), edges.end()), edges.end());
    begin.assign(n + 1, 0);
    for (const auto& [to, from] : edges) ++begin[size_t(to) + 1];
    for (size_t t = 0; t < n; ++t) begin[t + 1] += begin[t];
    for (const auto& [to, from] : edges) preds.push_back(from);
  }
};

struct KeyHash {
  size_t operator()(const std::vector<int32_t>& key) const {
    uint64_t h = 0xcbf29ce484222325ull;
    for (int32_t v : key) h = (h ^ uint32_t(v)) * 0x100000001b3ull;
    return size_t(h);
  }
};

}  // namespace

std::vector<int32_t> walk_classes(const Grammar& g, const Rule& rule, int depth) {
  const size_t n = size_t(rule.num_states), nc = size_t(g.num_classes);
  // Round 0: not accepting (0), accepting (1), and a class of its own for each state with calls.
  std::vector<int32_t> cls(n);
  int32_t next_id = 2;
  for (size_t s = 0; s < n; ++s)
    cls[s] = has_calls(rule, int32_t(s)) ? next_id++ : (rule.flags[s] & Rule::kAccept ? 1 : 0);
  std::vector<int32_t> size(size_t(next_id), 0);
  for (int32_t c : cls) ++size[size_t(c)];

  const Predecessors pred(rule, nc);
  std::vector<int32_t> dirty;
  for (size_t s = 0; s < n; ++s)
    if (!has_calls(rule, int32_t(s))) dirty.push_back(int32_t(s));
  std::vector<uint8_t> marked(n, 0);
  std::vector<int32_t> key(nc + 1);
  for (int round = 0; round < depth && !dirty.empty(); ++round) {
    // Each dirty state's key: its class and its successors' classes, in the ids of this round.
    std::unordered_map<std::vector<int32_t>, std::vector<int32_t>, KeyHash> groups;
    for (int32_t s : dirty) {
      key[0] = cls[size_t(s)];
      for (size_t c = 0; c < nc; ++c) {
        const int32_t t = rule.next[size_t(s) * nc + c];
        key[c + 1] = t < 0 ? -1 : cls[size_t(t)];
      }
      groups[key].push_back(s);
    }
    // A class keeps its id for its states that are not dirty (their successors kept theirs),
    // else for its largest group; every other group becomes a new class.
    std::map<int32_t, int32_t> dirty_in, keeper;  // class -> dirty states; class -> the group size keeping it
    for (const auto& [k, members] : groups) dirty_in[k[0]] += int32_t(members.size());
    for (const auto& [k, members] : groups) {
      const int32_t c = k[0];
      if (dirty_in[c] == size[size_t(c)]) keeper[c] = std::max(keeper[c], int32_t(members.size()));
    }
    std::vector<int32_t> changed;
    for (auto& [k, members] : groups) {
      const int32_t c = k[0];
      auto it = keeper.find(c);
      if (it != keeper.end() && it->second == int32_t(members.size())) {
        keeper.erase(it);  // this group keeps the id (only one group does)
        continue;
      }
      const int32_t id = next_id++;
      size.push_back(int32_t(members.size()));
      size[size_t(c)] -= int32_t(members.size());
      for (int32_t s : members) cls[size_t(s)] = id, changed.push_back(s);
    }
    // The next round's dirty states: those with an edge into a state whose class changed.
    dirty.clear();
    for (int32_t t : changed)
      for (uint32_t i = pred.begin[size_t(t)]; i < pred.begin[size_t(t) + 1]; ++i) {
        const int32_t s = pred.preds[i];
        if (!marked[size_t(s)] && !has_calls(rule, s)) marked[size_t(s)] = 1, dirty.push_back(s);
      }
    for (int32_t s : dirty) marked[size_t(s)] = 0;
  }

  std::vector<int32_t> first(size_t(next_id), -1), rep(n);
  for (size_t s = 0; s < n; ++s) {
    int32_t& f = first[size_t(cls[s])];
    if (f < 0) f = int32_t(s);
    rep[s] = f;
  }
  return rep;
}

}  // namespace lily::grammar
