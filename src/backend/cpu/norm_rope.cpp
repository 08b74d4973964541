// norm_rope.cpp: RMSNorm (zero-centred gain and gated), and partial NEOX rotary embedding.
#include <cmath>

#include "backend/cpu/ops.h"

namespace lily::cpu {

namespace {
float inverse_rms(const float* x, int64_t n, float eps) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += double(x[i]) * x[i];
  return 1.f / std::sqrt(float(ss / double(n)) + eps);
}
}  // namespace

void rms_norm(const float* x, const float* gain, int64_t rows, int64_t n, float eps, float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    const float inv = inverse_rms(xr, n, eps);
    for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * inv * gain[i];
  }
}

void gated_rms_norm(const float* x, const float* z, const float* weight, int64_t rows, int64_t n, float eps, float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    const float* zr = z + r * n;
    float* yr = y + r * n;
    const float inv = inverse_rms(xr, n, eps);
    for (int64_t i = 0; i < n; ++i) yr[i] = weight[i] * (xr[i] * inv) * silu(zr[i]);
  }
}

void apply_rope(float* x, int64_t T, int64_t heads, int64_t head_dim, int64_t rotary_dim, float theta,
                int64_t first_position) {
  const int64_t half = rotary_dim / 2;
  // inv_freq_j = 1 / theta^(2j / rotary_dim), in fp32 as HF computes it.
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int64_t j = 0; j < half; ++j) inv_freq[size_t(j)] = 1.f / std::pow(theta, float(2 * j) / float(rotary_dim));
  std::vector<float> cos_v(static_cast<size_t>(half)), sin_v(static_cast<size_t>(half));
  for (int64_t t = 0; t < T; ++t) {
    const float position = float(first_position + t);
    for (int64_t j = 0; j < half; ++j) {
      const float angle = position * inv_freq[size_t(j)];
      cos_v[size_t(j)] = std::cos(angle);
      sin_v[size_t(j)] = std::sin(angle);
    }
    for (int64_t h = 0; h < heads; ++h) {
      float* p = x + (t * heads + h) * head_dim;
      for (int64_t j = 0; j < half; ++j) {
        const float a = p[j], b = p[j + half];
        p[j] = a * cos_v[size_t(j)] - b * sin_v[size_t(j)];
        p[j + half] = b * cos_v[size_t(j)] + a * sin_v[size_t(j)];
      }
    }
  }
}

}  // namespace lily::cpu
