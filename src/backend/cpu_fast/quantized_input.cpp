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

// v rounded into [-kRange, kRange]; NaN to 0 (x NaN or infinite: unit, NaN or infinite, carries
// it into the result).
int16_t to_int16(float v) {
  if (!(v >= -kRange && v <= kRange)) return int16_t(v > 0 ? kRange : v < 0 ? -kRange : 0);
  return int16_t(std::nearbyint(v));
}

// x16 of one group of 64; returns its unit. Cloned per x86-64 level (base/cpu_clones.h).
LILY_CPU_CLONES float quantize_group(const float* x, int16_t* x16) {
  float amax = 0;
  for (int c = 0; c < kInputGroup; ++c) amax = std::max(amax, std::fabs(x[c]));
  for (int c = 0; c < kInputGroup; ++c)
    if (std::isnan(x[c])) amax = NAN;  // std::max skipped it
  const float inv = amax > 0 && std::isfinite(amax) ? kRange / amax : 0.f;
  for (int c = 0; c < kInputGroup; ++c) x16[c] = to_int16(x[c] * inv);
  return amax / kRange;
}

// Column c's halves a, b of x16 into their places in nibble order.
void put_in_nibble_order(const int16_t* x16, int64_t c, int8_t* a_nibbles, int8_t* b_nibbles) {
  const int64_t block = c / 128 * 128, i = c % 128, at = block + (i % 2) * 64 + i / 2;
  const int v = x16[c], a = v >= 0 ? (v + kRadix / 2) / kRadix : -((kRadix / 2 - v) / kRadix);  // |b| <= 127
  a_nibbles[at] = int8_t(a);
  b_nibbles[at] = int8_t(x16[c] - kRadix * a);
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
    int16_t* x16 = out.x16.data() + g * kInputGroup;
    out.unit[size_t(g)] = quantize_group(x, x16);
    int32_t q = 0;
    for (int c = 0; c < kInputGroup; ++c) q += x16[c];
    out.qsum[size_t(g)] = out.unit[size_t(g)] * float(q);
    for (int64_t c = g * kInputGroup; c < (g + 1) * kInputGroup; ++c)
      put_in_nibble_order(out.x16.data(), c, out.a_nibbles.data(), out.b_nibbles.data());
  }
}

void quantize_input(const float* x, int64_t cols, int group_size, QuantizedInput& out) {
  reset_input(x, cols, group_size, out);
  quantize_groups(out, 0, cols / group_size);
}

}  // namespace lily::cpu_fast
