// walk_classes.h: the states of a rule that no token can tell apart, so that the matcher makes
// one cache entry for all of them.
//
// A bounded repetition is a chain of DFA states (a string of at most 1024 characters: ~27
// states per character), and the matcher's cache entry of a state costs a walk of the whole
// vocabulary trie (~18 ms at 248K tokens in string content). Far from the chain's end its states
// take the same tokens: what a walk from a state finds depends only on the bytes of at most
// `depth` (the longest token) read from it. Two states are depth-equivalent when, for every byte
// string of at most `depth` bytes, the states it leads to from each are both absent or both
// present with the same accepting flag. Moore's partition refinement, `depth` rounds at most, each
// recomputing only the states with an edge into a class that split in the round before, computes
// the classes. A state with call edges is a class of its own (the walk pushes its callees).
#pragma once

#include <cstdint>
#include <vector>

#include "grammar/grammar.h"

namespace lily::grammar {

// [state] -> the lowest state of its class, for one rule of g.
std::vector<int32_t> walk_classes(const Grammar& g, const Rule& rule, int depth);

}  // namespace lily::grammar
