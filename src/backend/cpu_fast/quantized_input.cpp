// quantized_input.cpp: x per group of 64 to 16-bit integers in two int8 halves
// (quantized_input.h). Portable C++: x is a few thousand values read once per product's input,
// against megabytes of weights.
#include "backend/cpu_fast/quantized_input.h"

#include <algorithm>
#include <cmath>

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

// x16 of one group of 64; returns its unit.
float quantize_group(const float* x, int16_t* x16) {
  float amax = 0;
  for (int c = 0; c < kInputGroup; ++c) amax = std::max(amax, std::fabs(x[c]));
  for (int c = 0; c < kInputGroup; ++c)
    if (std::isnan(x[c])) amax = NAN;  // std::max skipped it
  const float inv = amax > 0 && std::isfinite(amax) ? kRange / amax : 0.f;
  for (int c = 0; c < kInputGroup; ++c) x16[c] = to_int16(x[c] * inv);
  return amax / kRange;
}

// a_nibbles and b_nibbles from x16: per 128 columns, the even columns then the odd ones.
void to_nibble_order(const int16_t* x16, int64_t cols, int8_t* a_nibbles, int8_t* b_nibbles) {
  auto split = [&](int64_t c, int64_t at) {
    const int a = int(std::lround(float(x16[c]) / float(kRadix)));  // then |b| <= 127
    a_nibbles[at] = int8_t(a);
    b_nibbles[at] = int8_t(x16[c] - kRadix * a);
  };
  for (int64_t block = 0; block < cols; block += 128)
    for (int64_t i = 0; i < 64 && block + 2 * i < cols; ++i) {
      split(block + 2 * i, block + i);
      split(block + 2 * i + 1, block + 64 + i);
    }
}

}  // namespace

void quantize_input(const float* x, int64_t cols, int group_size, QuantizedInput& out) {
  LILY_CHECK(group_size > 0 && cols % group_size == 0, "quantize_input: {} columns in groups of {}", cols, group_size);
  const int64_t groups = cols / group_size, padded_groups = round_up(groups, 16);
  out.x = x;
  out.cols = cols;
  out.group_size = group_size;
  out.quantized = group_size == kInputGroup;
  out.sum.assign(size_t(padded_groups), 0.f);
  for (int64_t g = 0; g < groups; ++g) {
    float s = 0;
    for (int64_t c = 0; c < group_size; ++c) s += x[g * group_size + c];
    out.sum[size_t(g)] = s;
  }
  if (!out.quantized) return;
  out.unit.assign(size_t(padded_groups), 0.f);
  out.qsum.assign(size_t(padded_groups), 0.f);
  out.x16.resize(size_t(cols));
  for (int64_t g = 0; g < groups; ++g) {
    int16_t* x16 = out.x16.data() + g * kInputGroup;
    out.unit[size_t(g)] = quantize_group(x + g * kInputGroup, x16);
    int32_t s = 0;
    for (int c = 0; c < kInputGroup; ++c) s += x16[c];
    out.qsum[size_t(g)] = out.unit[size_t(g)] * float(s);
  }
  out.a_nibbles.assign(size_t(round_up(cols, 128)), int8_t(0));
  out.b_nibbles.assign(size_t(round_up(cols, 128)), int8_t(0));
  to_nibble_order(out.x16.data(), cols, out.a_nibbles.data(), out.b_nibbles.data());
}

}  // namespace lily::cpu_fast
