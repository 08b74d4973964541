// fragments.cpp: JSON lexemes and free text as NFA pieces (see the header).
#include "grammar/fragments.h"

#include <array>
#include <map>
#include <tuple>

#include "base/error.h"

namespace lily::grammar {

namespace {

ByteSet byte(int b) {
  ByteSet s;
  s.set(b);
  return s;
}

const ByteSet kHex = ByteSet::range('0', '9') | ByteSet::range('a', 'f') | ByteSet::range('A', 'F');
const ByteSet kDigit = ByteSet::range('0', '9');
const ByteSet kCont = ByteSet::range(0x80, 0xBF);

// Edges for the UTF-8 sequences of 2..4 bytes from `from` to `to` (well-formed: no overlongs,
// no surrogates, nothing above U+10FFFF).
void utf8_multibyte(GrammarBuilder& b, int32_t from, int32_t to) {
  const int32_t c1 = b.new_state(), c2 = b.new_state(), c3 = b.new_state();
  const int32_t e0 = b.new_state(), ed = b.new_state(), f0 = b.new_state(), f4 = b.new_state();
  b.bytes(from, ByteSet::range(0xC2, 0xDF), c1);
  b.bytes(from, byte(0xE0), e0);
  b.bytes(from, ByteSet::range(0xE1, 0xEC) | ByteSet::range(0xEE, 0xEF), c2);
  b.bytes(from, byte(0xED), ed);
  b.bytes(from, byte(0xF0), f0);
  b.bytes(from, ByteSet::range(0xF1, 0xF3), c3);
  b.bytes(from, byte(0xF4), f4);
  b.bytes(e0, ByteSet::range(0xA0, 0xBF), c1);
  b.bytes(ed, ByteSet::range(0x80, 0x9F), c1);
  b.bytes(f0, ByteSet::range(0x90, 0xBF), c2);
  b.bytes(f4, ByteSet::range(0x80, 0x8F), c2);
  b.bytes(c3, kCont, c2);
  b.bytes(c2, kCont, c1);
  b.bytes(c1, kCont, to);
}

// `count` bytes of `set` from `from`; returns the state after them.
int32_t repeat(GrammarBuilder& b, int32_t from, const ByteSet& set, int count) {
  for (int i = 0; i < count; ++i) {
    const int32_t next = b.new_state();
    b.bytes(from, set, next);
    from = next;
  }
  return from;
}

// 0..count bytes of `set` from `from`; returns the state after them (reached after any number).
int32_t upto(GrammarBuilder& b, int32_t from, const ByteSet& set, int count) {
  const int32_t end = b.new_state();
  for (int i = 0; i < count; ++i) {
    b.epsilon(from, end);
    const int32_t next = b.new_state();
    b.bytes(from, set, next);
    from = next;
  }
  b.epsilon(from, end);
  return end;
}

// The UTF-8 decoder as a byte automaton, for keys: 0 is a character boundary, -1 an error.
// States 1..7: need 1, 2, 3 continuation bytes; after E0, ED, F0, F4.
int utf8_next(int state, int b, const ByteSet& ascii_ok) {
  const bool cont = b >= 0x80 && b <= 0xBF;
  switch (state) {
    case 0:
      if (b < 0x80) return ascii_ok.test(b) ? 0 : -1;
      if (b >= 0xC2 && b <= 0xDF) return 1;
      if (b == 0xE0) return 4;
      if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) return 2;
      if (b == 0xED) return 5;
      if (b == 0xF0) return 6;
      if (b >= 0xF1 && b <= 0xF3) return 3;
      if (b == 0xF4) return 7;
      return -1;
    case 1: return cont ? 0 : -1;
    case 2: return cont ? 1 : -1;
    case 3: return cont ? 2 : -1;
    case 4: return b >= 0xA0 && b <= 0xBF ? 1 : -1;
    case 5: return b >= 0x80 && b <= 0x9F ? 1 : -1;
    case 6: return b >= 0x90 && b <= 0xBF ? 2 : -1;
    case 7: return b >= 0x80 && b <= 0x8F ? 2 : -1;
  }
  return -1;
}

// Aho-Corasick automaton of byte patterns: next[node][byte], and which nodes complete one.
struct PatternAutomaton {
  std::vector<std::array<int32_t, 256>> next;
  std::vector<uint8_t> done;

  explicit PatternAutomaton(const std::vector<std::string>& patterns) {
    std::vector<std::array<int32_t, 256>> child(1);
    child[0].fill(-1);
    done.assign(1, 0);
    for (const std::string& p : patterns) {
      LILY_CHECK(!p.empty(), "grammar: an empty pattern");
      int32_t n = 0;
      for (char c : p) {
        if (child[size_t(n)][uint8_t(c)] < 0) {
          child[size_t(n)][uint8_t(c)] = int32_t(child.size());
          child.emplace_back();  // may move the rows: no reference into them is held
          child.back().fill(-1);
          done.push_back(0);
        }
        n = child[size_t(n)][uint8_t(c)];
      }
      done[size_t(n)] = 1;
    }
    next = child;
    std::vector<int32_t> fail(child.size(), 0), queue;
    for (int b = 0; b < 256; ++b) {
      if (child[0][size_t(b)] < 0) {
        next[0][size_t(b)] = 0;
      } else {
        queue.push_back(child[0][size_t(b)]);
      }
    }
    for (size_t qi = 0; qi < queue.size(); ++qi) {
      const int32_t n = queue[qi];
      if (done[size_t(fail[size_t(n)])]) done[size_t(n)] = 1;
      for (int b = 0; b < 256; ++b) {
        const int32_t c = child[size_t(n)][size_t(b)];
        if (c < 0) {
          next[size_t(n)][size_t(b)] = next[size_t(fail[size_t(n)])][size_t(b)];
        } else {
          fail[size_t(c)] = next[size_t(fail[size_t(n)])][size_t(b)];
          queue.push_back(c);
        }
      }
    }
  }
};

}  // namespace

Fragment json_whitespace(GrammarBuilder& b, int max_indent) {
  Fragment f{b.new_state(), b.new_state()};
  b.epsilon(f.start, f.end);
  if (max_indent < 0) return f;
  b.bytes(f.start, byte(' '), f.end);
  const int32_t indent = b.new_state();  // after the newlines: spaces and tabs only
  int32_t cur = f.start;
  for (int i = 0; i < kMaxNewlines; ++i) {
    const int32_t next = b.new_state();
    b.bytes(cur, byte('\n'), next);
    b.epsilon(next, indent);
    cur = next;
  }
  b.epsilon(upto(b, indent, ByteSet::of(" \t"), max_indent), f.end);
  return f;
}

Fragment json_string_char(GrammarBuilder& b, bool raw_lt) {
  Fragment f{b.new_state(), b.new_state()};
  b.bytes(f.start, ByteSet::range(0x20, 0x7F) - ByteSet::of(raw_lt ? "\"\\" : "\"\\<"), f.end);
  utf8_multibyte(b, f.start, f.end);
  const int32_t esc = b.new_state(), u = b.new_state(), d = b.new_state();
  b.bytes(f.start, byte('\\'), esc);
  b.bytes(esc, ByteSet::of("\"\\/bfnrt"), f.end);
  b.bytes(esc, byte('u'), u);
  // \uXXXX outside D800-DFFF: a first digit other than D, or D then 0-7.
  {
    const int32_t h1 = b.new_state();
    b.bytes(u, kHex - ByteSet::of("Dd"), h1);
    b.epsilon(repeat(b, h1, kHex, 3), f.end);
  }
  b.bytes(u, ByteSet::of("Dd"), d);
  b.epsilon(repeat(b, repeat(b, d, ByteSet::range('0', '7'), 1), kHex, 2), f.end);
  // A high surrogate D800-DBFF, then \u and a low one DC00-DFFF.
  int32_t hi = repeat(b, repeat(b, d, ByteSet::of("89ABab"), 1), kHex, 2);
  hi = repeat(b, repeat(b, hi, byte('\\'), 1), byte('u'), 1);
  hi = repeat(b, repeat(b, hi, ByteSet::of("Dd"), 1), ByteSet::range('C', 'F') | ByteSet::range('c', 'f'), 1);
  b.epsilon(repeat(b, hi, kHex, 2), f.end);
  return f;
}

Fragment json_string(GrammarBuilder& b, int min, int max, bool raw_lt) {
  LILY_CHECK(min >= 0 && min <= max, "grammar: a string of {}..{} characters", min, max);
  Fragment f = b.literal("\"");
  for (int i = 0; i < min; ++i) f = b.sequence({f, json_string_char(b, raw_lt)});
  return b.sequence({f, json_string_rest(b, max - min, raw_lt)});
}

Fragment json_string_rest(GrammarBuilder& b, int max, bool raw_lt) {
  Fragment f = b.empty();
  const int32_t close = b.new_state();
  for (int i = 0; i < max; ++i) {
    b.epsilon(f.end, close);
    f = b.sequence({f, json_string_char(b, raw_lt)});
  }
  b.epsilon(f.end, close);
  const int32_t end = b.new_state();
  b.bytes(close, byte('"'), end);
  return {f.start, end};
}

Fragment json_key_except(GrammarBuilder& b, const std::vector<std::string>& excluded, bool raw_lt) {
  // A trie of the excluded contents (quotes off); a key is refused only where it ends on one.
  std::vector<std::map<int, int32_t>> trie(1);
  std::vector<uint8_t> terminal(1, 0);
  for (const std::string& text : excluded) {
    if (text.size() < 2 || text.find('\\') != std::string::npos) continue;  // cannot equal an escape-free key
    int32_t n = 0;
    for (size_t i = 1; i + 1 < text.size(); ++i) {
      auto [it, fresh] = trie[size_t(n)].try_emplace(uint8_t(text[i]), int32_t(trie.size()));
      if (fresh) trie.emplace_back(), terminal.push_back(0);
      n = it->second;
    }
    terminal[size_t(n)] = 1;
  }
  const ByteSet ascii_ok = ByteSet::range(0x20, 0x7F) - ByteSet::of(raw_lt ? "\"\\" : "\"\\<");
  constexpr int32_t kFree = -1;
  // (trie node or kFree, UTF-8 state, characters begun) -> NFA state
  using Key = std::tuple<int32_t, int, int>;
  Fragment f = b.literal("\"");
  const int32_t end = b.new_state();
  std::map<Key, int32_t> states;
  std::vector<Key> work{{0, 0, 0}};
  states[{0, 0, 0}] = f.end;
  while (!work.empty()) {
    const auto [node, u, chars] = work.back();
    work.pop_back();
    const int32_t from = states[{node, u, chars}];
    std::map<int32_t, ByteSet> edges;
    for (int c = 0; c < 256; ++c) {
      const int u2 = utf8_next(u, c, ascii_ok);
      if (u2 < 0) continue;
      const int chars2 = u == 0 ? chars + 1 : chars;  // a byte at a boundary begins a character
      if (chars2 > kMaxFreeKeyChars) continue;
      int32_t node2 = kFree;
      if (node != kFree) {
        auto it = trie[size_t(node)].find(c);
        if (it != trie[size_t(node)].end()) node2 = it->second;
      }
      auto [it, fresh] = states.try_emplace({node2, u2, chars2}, 0);
      if (fresh) it->second = b.new_state(), work.push_back({node2, u2, chars2});
      edges[it->second].set(c);
    }
    for (const auto& [to, set] : edges) b.bytes(from, set, to);
    if (u == 0 && (node == kFree || !terminal[size_t(node)])) b.bytes(from, byte('"'), end);
  }
  return {f.start, end};
}

Fragment json_number(GrammarBuilder& b, bool integer_only) {
  Fragment f{b.new_state(), b.new_state()};
  const int32_t sign = b.new_state(), digits = b.new_state(), integer = b.new_state();
  b.epsilon(f.start, sign);
  b.bytes(f.start, byte('-'), sign);
  b.bytes(sign, byte('0'), integer);
  b.bytes(sign, ByteSet::range('1', '9'), digits);
  b.epsilon(upto(b, digits, kDigit, kMaxIntegerDigits - 1), integer);
  if (integer_only) {
    b.epsilon(integer, f.end);
    return f;
  }
  const int32_t dot = b.new_state(), frac = b.new_state(), exp = b.new_state();
  const int32_t e1 = b.new_state(), e2 = b.new_state(), e3 = b.new_state();
  b.bytes(integer, byte('.'), dot);
  b.bytes(dot, kDigit, frac);
  b.epsilon(integer, exp);
  b.epsilon(upto(b, frac, kDigit, kMaxFractionDigits - 1), exp);
  b.epsilon(exp, f.end);
  b.bytes(exp, ByteSet::of("eE"), e1);
  b.bytes(e1, ByteSet::of("+-"), e2);
  b.epsilon(e1, e2);
  b.bytes(e2, kDigit, e3);
  b.epsilon(upto(b, e3, kDigit, kMaxExponentDigits - 1), f.end);
  return f;
}

namespace {

// The automaton's nodes that complete no pattern, as NFA states; `on_done`: where an edge that
// completes a pattern goes (-1: nowhere). Returns the state of node 0.
int32_t pattern_states(GrammarBuilder& b, const PatternAutomaton& a, int32_t on_done, int32_t end_every) {
  std::vector<int32_t> state(a.next.size(), -1);
  for (size_t n = 0; n < a.next.size(); ++n)
    if (!a.done[n]) state[n] = b.new_state();
  for (size_t n = 0; n < a.next.size(); ++n) {
    if (a.done[n]) continue;
    std::map<int32_t, ByteSet> edges;
    for (int c = 0; c < 256; ++c) {
      const int32_t t = a.next[n][size_t(c)];
      const int32_t to = a.done[size_t(t)] ? on_done : state[size_t(t)];
      if (to >= 0) edges[to].set(c);
    }
    for (const auto& [to, set] : edges) b.bytes(state[n], set, to);
    if (end_every >= 0) b.epsilon(state[n], end_every);
  }
  return state[0];
}

}  // namespace

Fragment text_avoiding(GrammarBuilder& b, const std::vector<std::string>& patterns) {
  const int32_t end = b.new_state();
  return {pattern_states(b, PatternAutomaton(patterns), -1, end), end};
}

Fragment text_until(GrammarBuilder& b, std::string_view pattern) {
  const int32_t end = b.new_state();
  return {pattern_states(b, PatternAutomaton({std::string(pattern)}), end, -1), end};
}

Fragment utf8_char(GrammarBuilder& b, const ByteSet& excluded_ascii) {
  Fragment f{b.new_state(), b.new_state()};
  b.bytes(f.start, ByteSet::range(0, 0x7F) - excluded_ascii, f.end);
  utf8_multibyte(b, f.start, f.end);
  return f;
}

}  // namespace lily::grammar
