// fast_math.h: e^x, SiLU and sigmoid in plain float arithmetic the compiler vectorizes (std::exp
// is a call per element: in the prefill's SiLUs, ~2 M a layer, it cost more than the conv and
// the gated norm they belong to).
//
//   e^x = 2^n e^r,  n = round(x / ln 2),  r = x - n ln 2 in [-ln2/2, ln2/2]
//   e^r ~ 1 + r + r^2 (c5 + c4 r + ... + c0 r^5)      (Cephes expf: within ~2 ulp)
//
// n is rounded by adding 1.5 * 2^23 (the integer lands in the low bits, read back as bits, so no
// float-to-int conversion), and 2^n built in the exponent field. x is clamped to [-87.3, 88.4],
// where 2^n stays a normal float (e^x then underflows to ~1e-38 or saturates at ~2.4e38 instead
// of 0 or infinity: SiLU and sigmoid, the uses here, come out the same); NaN passes through.
#pragma once

#include <bit>
#include <cstdint>

namespace lily::cpu_fast {

inline float exp_approx(float x) {
  constexpr float kRound = 12582912.f;  // 1.5 * 2^23
  x = x < -87.33654f ? -87.33654f : (x > 88.37626f ? 88.37626f : x);
  const float t = x * 1.44269504089f + kRound;
  const float n = t - kRound;
  float r = x - n * 0.693359375f;  // ln 2 in two parts (Cephes C1, C2)
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.f;
  const uint32_t e = (std::bit_cast<uint32_t>(t) - std::bit_cast<uint32_t>(kRound) + 127u) << 23;
  return p * std::bit_cast<float>(e);
}

inline float sigmoid_approx(float x) { return 1.f / (1.f + exp_approx(-x)); }
inline float silu_approx(float x) { return x / (1.f + exp_approx(-x)); }

}  // namespace lily::cpu_fast
