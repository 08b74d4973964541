// grammar.h: a grammar over bytes, as rules that are DFAs which may call other rules.
//
// A grammar is a recursive transition network: rule 0 is the root; each rule is a DFA over
// bytes whose states may also have call edges ("match rule q here, then go on at state t").
// Non-recursive structure is inlined into one rule (a JSON schema without recursion is a single
// DFA); only recursion (json_object's nested values, a $ref that reaches itself) needs calls.
// A text belongs to the grammar when the root rule, with its calls, matches all of it.
//
// GrammarBuilder builds each rule as an NFA (byte-set, epsilon and call edges) out of fragments,
// then build() turns every rule into a DFA (subset construction over byte classes: bytes that
// no edge tells apart share a column), drops the states that cannot reach an accepting one, and
// refuses grammars the matcher cannot run: a rule that matches nothing, or a rule that can call
// itself before reading a byte (left recursion; the matcher's closure would not end), and
// grammars too large to serve (more than 500K NFA or 400K DFA states: schemas come from clients).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace lily::grammar {

// A set of byte values.
struct ByteSet {
  std::array<uint64_t, 4> bits{};
  static ByteSet range(int lo, int hi);
  static ByteSet of(std::string_view bytes);
  static ByteSet all() { return range(0, 255); }
  void set(int b) { bits[size_t(b) >> 6] |= uint64_t(1) << (b & 63); }
  bool test(int b) const { return (bits[size_t(b) >> 6] >> (b & 63)) & 1; }
  ByteSet operator|(const ByteSet& o) const;
  ByteSet operator-(const ByteSet& o) const;
  bool empty() const { return (bits[0] | bits[1] | bits[2] | bits[3]) == 0; }
};

struct CallEdge {
  int32_t rule;    // the rule called
  int32_t target;  // the state of the caller once the callee has matched
};

// One rule as a DFA. State 0 is the start. next[state * num_classes + class]: -1 is no edge.
struct Rule {
  enum Flags : uint8_t { kAccept = 1, kCalls = 2, kBytes = 4 };
  std::string name;
  int32_t num_states = 0;
  std::vector<int32_t> next;
  std::vector<uint8_t> flags;        // [state] Flags
  std::vector<uint32_t> call_begin;  // [state + 1]: calls of state s are calls[call_begin[s] .. call_begin[s + 1])
  std::vector<CallEdge> calls;
};

class Grammar {
 public:
  std::array<uint8_t, 256> byte_class{};
  int32_t num_classes = 0;
  std::vector<Rule> rules;  // rules[0]: the root

  int32_t next(const Rule& rule, int32_t state, uint8_t byte) const {
    return rule.next[size_t(state) * size_t(num_classes) + byte_class[byte]];
  }
  // DFA states of all rules together (a size measure for tests and logs).
  size_t total_states() const;
};

// A piece of NFA with one entry and one exit state.
struct Fragment {
  int32_t start = -1;
  int32_t end = -1;
};

class GrammarBuilder {
 public:
  GrammarBuilder();  // makes rule 0, the root

  // A new rule; its body is set with set_body once it is built (it may call itself meanwhile).
  int32_t add_rule(std::string name);
  void set_body(int32_t rule, Fragment body);
  // The rule named `name`, its body made by make_body() on the first request (later requests,
  // from any compiler on this builder, call the same rule): a piece used in many places, built once.
  int32_t shared_rule(const std::string& name, const std::function<Fragment()>& make_body);

  int32_t new_state();
  // Edges between states (of the same rule's fragments).
  void bytes(int32_t from, const ByteSet& set, int32_t to);
  void epsilon(int32_t from, int32_t to);
  void call(int32_t from, int32_t rule, int32_t to);

  // Common fragments.
  Fragment empty();
  Fragment byte_set(const ByteSet& set);
  Fragment literal(std::string_view text);
  Fragment call_rule(int32_t rule);
  Fragment sequence(const std::vector<Fragment>& parts);
  Fragment alternatives(const std::vector<Fragment>& options);  // at least one option
  Fragment optional(Fragment f);
  Fragment star(Fragment f);  // zero or more; f must not be reused elsewhere

  // NFA states so far: callers bound how much they inline with it.
  size_t size() const { return states_.size(); }

  // The grammar; throws lily::Error (see the header comment) naming the rule. The passes, in
  // order: the alphabet (byte classes), each rule's DFA (subset construction), the dead states
  // trimmed, the left-recursion check.
  Grammar build() const;

 private:
  struct State {
    std::vector<std::pair<ByteSet, int32_t>> bytes;
    std::vector<int32_t> epsilon;
    std::vector<CallEdge> calls;
  };
  struct RuleBody {
    std::string name;
    Fragment body;
  };
  // Passes of build(): g's byte classes from every byte edge; g's rules as DFAs.
  void make_alphabet(Grammar& g) const;
  void determinize(Grammar& g) const;

  std::vector<State> states_;
  std::vector<RuleBody> rules_;
  std::map<std::string, int32_t> shared_;  // shared_rule: name -> rule
};

}  // namespace lily::grammar
