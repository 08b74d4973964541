// number_range.cpp: the automaton of the numbers in a range (the language is in the header).
//
// A magnitude lo..hi (0 <= lo <= hi, grid units) is read digit by digit. Its integer part has k
// digits for some k between the digits of lo's integer part and of hi's: one entry per k, and
// each branch is tight on lo's digits only when k is lo's length, on hi's only when k is hi's.
// A state is (rel, tight_lo, tight_hi, dot, residue): rel < 0 is -(integer digits left), 0 the
// point, r > 0 after r fraction digits; tight: the digits so far equal the bound's; dot: after
// '.', a digit due. States off both bounds are shared by every branch, so the automaton has
// O(digits) states per residue.
#include "grammar/number_range.h"

#include <map>
#include <tuple>
#include <vector>

namespace lily::grammar {

namespace {

class MagnitudeAutomaton {
 public:
  MagnitudeAutomaton(GrammarBuilder& b, const NumberRange& r, const std::string& lo, const std::string& hi)
      : b_(b),
        fraction_(r.fraction_digits),
        integer_cap_(r.integer_digits),
        modulus_(r.modulus),
        lo_(padded(lo)),
        hi_(padded(hi)),
        lo_int_(int(lo_.size()) - fraction_),
        hi_int_(int(hi_.size()) - fraction_) {}

  Fragment build() {
    const int32_t start = b_.new_state();
    end_ = b_.new_state();
    for (int k = lo_int_; k <= std::min(hi_int_, integer_cap_); ++k) {
      const Key first{-k, k == lo_int_, k == hi_int_, false, 0};
      digit_edges(start, first, k > 1 ? 1 : 0);
    }
    while (!work_.empty()) {
      const Key key = work_.back();
      work_.pop_back();
      expand(key);
    }
    return {start, end_};
  }

 private:
  struct Key {
    int rel;
    bool tight_lo, tight_hi, dot;
    int64_t residue;
    auto tie() const { return std::tie(rel, tight_lo, tight_hi, dot, residue); }
    bool operator<(const Key& o) const { return tie() < o.tie(); }
  };

  // The bound's digits with at least one before the point: lo = 5 with 16 fraction digits is
  // "0" "0000000000000005".
  std::string padded(const std::string& magnitude) const {
    const size_t need = size_t(fraction_) + 1;
    return magnitude.size() >= need ? magnitude : std::string(need - magnitude.size(), '0') + magnitude;
  }
  // The digit of lo / hi read at `rel` (its integer part aligned on the point).
  int lo_digit(int rel) const { return lo_[size_t(lo_int_ + rel)] - '0'; }
  int hi_digit(int rel) const { return hi_[size_t(hi_int_ + rel)] - '0'; }

  int32_t state(const Key& key) {
    auto [it, fresh] = states_.try_emplace(key, -1);
    if (fresh) {
      it->second = b_.new_state();
      work_.push_back(key);
    }
    return it->second;
  }

  Key after_digit(const Key& key, int d) const {
    return {key.dot ? 1 : key.rel + 1, key.tight_lo && d == lo_digit(key.rel), key.tight_hi && d == hi_digit(key.rel),
            false, (key.residue * 10 + d) % modulus_};
  }

  // Edges from `from` on the digits `key` may read (at least `min_digit`), to the states after.
  void digit_edges(int32_t from, const Key& key, int min_digit) {
    const int first = key.tight_lo ? lo_digit(key.rel) : min_digit;
    const int last = key.tight_hi ? hi_digit(key.rel) : 9;
    std::map<int32_t, ByteSet> edges;
    for (int d = first; d <= last; ++d) edges[state(after_digit(key, d))].set('0' + d);
    for (const auto& [to, set] : edges) b_.bytes(from, set, to);
  }

  // The number may end here: the integer part is whole, no digit is due, a multiple, and the
  // rest of lo (when tight on it) is zeros (the text's rest is).
  bool can_end(const Key& key) const {
    if (key.rel < 0 || key.dot || key.residue != 0) return false;
    return !key.tight_lo || lo_.find_first_not_of('0', size_t(lo_int_ + key.rel)) == std::string::npos;
  }

  void expand(const Key& key) {
    const int32_t from = states_.at(key);
    if (can_end(key)) b_.epsilon(from, end_);
    if (key.rel == 0 && !key.dot && fraction_ > 0) {
      Key dot = key;
      dot.dot = true;
      b_.bytes(from, ByteSet::of("."), state(dot));
    }
    if (key.rel < 0 || key.dot || (key.rel > 0 && key.rel < fraction_)) digit_edges(from, key, 0);
  }

  GrammarBuilder& b_;
  const int fraction_, integer_cap_;
  const int64_t modulus_;
  const std::string lo_, hi_;
  const int lo_int_, hi_int_;  // digits before the point
  int32_t end_ = -1;
  std::map<Key, int32_t> states_;
  std::vector<Key> work_;
};

Fragment magnitudes(GrammarBuilder& b, const NumberRange& r, const std::string& lo, const std::string& hi) {
  return MagnitudeAutomaton(b, r, lo, hi).build();
}

}  // namespace

Fragment json_number_in_range(GrammarBuilder& b, const NumberRange& r) {
  std::vector<Fragment> alternatives;
  if (!r.hi.negative) alternatives.push_back(magnitudes(b, r, r.lo.negative ? "0" : r.lo.magnitude, r.hi.magnitude));
  if (r.lo.negative) {  // magnitudes from 1 (zero is written 0, never -0)
    const std::string lo = r.hi.negative ? r.hi.magnitude : "1";
    alternatives.push_back(b.sequence({b.literal("-"), magnitudes(b, r, lo, r.lo.magnitude)}));
  }
  return b.alternatives(alternatives);
}

}  // namespace lily::grammar
