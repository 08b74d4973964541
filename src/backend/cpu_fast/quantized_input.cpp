// quantized_input.cpp: x per group of 64 to 16-bit integers in two int8 halves
// (quantized_input.h). Portable C++: x is a few thousand values read once per product's input,
// against megabytes of weights.
#include "backend/cpu_fast/quantized_input.h"

#include <algorithm>
#include <cmath>

#include "base/cpu_clones.h"
#include "base/error.h"

namespace lily::cpu_fast {

namespace {

constexpr int kRadix = 254;                      // x16 = 254 a + b
constexpr float kRange = 127.f * float(kRadix);  // |x16| <= 32258, so |a|, |b| <= 127

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

struct GroupSums {
  float unit, qsum;
};

// One group of 64: x16, and its halves a, b (x16 = 254 a + b) in nibble order: a_even[j], b_even[j]
// of column 2j, a_odd[j], b_odd[j] of column 2j + 1. A group with a NaN or an infinity gets x16 = 0
// and a unit of NaN or infinity, which carries it into the result. Straight loops, cloned per
// x86-64 level (base/cpu_clones.h): the compiler vectorizes them.
LILY_CPU_CLONES GroupSums quantize_group(const float* x, int16_t* x16, int8_t* a_even, int8_t* a_odd, int8_t* b_even,
                                         int8_t* b_odd) {
  float amax = 0;
  bool nan = false, inf = false;
  for (int c = 0; c < kInputGroup; ++c) {
    amax = std::max(amax, std::fabs(x[c]));
    nan |= std::isnan(x[c]);
    inf |= std::isinf(x[c]);
  }
  const bool finite = !nan && !inf;
  if (!finite) amax = nan ? NAN : INFINITY;
  const float inv = finite && amax > 0 ? kRange / amax : 0.f;
  int32_t q = 0;
  for (int c = 0; c < kInputGroup; ++c) {
    x16[c] = int16_t(std::nearbyint(x[c] * inv));  // |x * inv| <= kRange (x finite; 0 otherwise)
    q += x16[c];
  }
  for (int j = 0; j < kInputGroup / 2; ++j) {
    const float even = x16[2 * j], odd = x16[2 * j + 1];
    const float ae = std::nearbyint(even / float(kRadix)), ao = std::nearbyint(odd / float(kRadix));
    a_even[j] = int8_t(ae), a_odd[j] = int8_t(ao);  // then |b| <= 127
    b_even[j] = int8_t(even - float(kRadix) * ae), b_odd[j] = int8_t(odd - float(kRadix) * ao);
  }
  const float unit = amax / kRange;
  return {unit, unit * float(q)};
}

}  // namespace

void reset_input(const float* x, int64_t cols, int group_size, QuantizedInput& out) {
  LILY_CHECK(group_size > 0 && cols % group_size == 0, "quantize_input: {} columns in groups of {}", cols, group_size);
  const int64_t padded_groups = round_up(cols / group_size, 16);
  out.x = x;
  out.cols = cols;
  out.group_size = group_size;
  out.quantized = group_size == kInputGroup;
  out.sum.assign(size_t(padded_groups), 0.f);
  if (!out.quantized) return;
  out.unit.assign(size_t(padded_groups), 0.f);
  out.qsum.assign(size_t(padded_groups), 0.f);
  out.x16.resize(size_t(cols));
  out.a_nibbles.assign(size_t(round_up(cols, 128)), int8_t(0));
  out.b_nibbles.assign(size_t(round_up(cols, 128)), int8_t(0));
}

void quantize_groups(QuantizedInput& out, int64_t g0, int64_t g1) {
  const int64_t G = out.group_size;
  for (int64_t g = g0; g < g1; ++g) {
    const float* x = out.x + g * G;
    float s = 0;
    for (int64_t c = 0; c < G; ++c) s += x[c];
    out.sum[size_t(g)] = s;
    if (!out.quantized) continue;
    // Group g's columns in nibble order: its block of 128 from 128 (g / 2), the low nibbles'
    // half at + 32 (g % 2), the high nibbles' 64 further.
    const int64_t at = 128 * (g / 2) + 32 * (g % 2);
    int8_t *a = out.a_nibbles.data() + at, *b = out.b_nibbles.data() + at;
    const GroupSums q = quantize_group(x, out.x16.data() + g * kInputGroup, a, a + 64, b, b + 64);
    out.unit[size_t(g)] = q.unit;
    out.qsum[size_t(g)] = q.qsum;
  }
}

void quantize_input(const float* x, int64_t cols, int group_size, QuantizedInput& out) {
  reset_input(x, cols, group_size, out);
  quantize_groups(out, 0, cols / group_size);
}

}  // namespace lily::cpu_fast
