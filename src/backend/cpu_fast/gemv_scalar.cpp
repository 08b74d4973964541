// gemv_scalar.cpp: the portable GEMV kernels (any x86-64, and the readable statement of what
// the SIMD kernels compute; see gemv.h), and the row-by-row fallback for other matrices.
#include <vector>

#include "backend/cpu_fast/gemv.h"
#include "backend/cpu_fast/gemv_gguf.h"
#include "base/cpu_clones.h"

namespace lily::cpu_fast::detail {

namespace {

// Code c of a row of packed kBits-wide codes (low bits first: spec §5b).
template <int kBits>
inline uint32_t code_at(const uint8_t* codes, int64_t c) {
  if constexpr (kBits == 8) return codes[c];
  else return (codes[c / 2] >> (4 * (c % 2))) & 0xFu;
}

template <int kBits>
void rows_fp32(const Matrix& W, const QuantizedInput& in, int64_t r0, int64_t r1, float* y) {
  const int64_t cols = W.cols, G = W.group_size, groups = cols / G, row_bytes = cols * kBits / 8;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* codes = static_cast<const uint8_t*>(W.data) + r * row_bytes;
    const bf16* scales = W.scales + r * groups;
    const bf16* biases = W.biases + r * groups;
    float acc = 0;
    for (int64_t g = 0; g < groups; ++g) {
      float dot[8] = {};  // eight partial sums, so the compiler may vectorize
      for (int64_t c = g * G; c < (g + 1) * G; ++c) dot[c % 8] += float(code_at<kBits>(codes, c)) * in.x[c];
      const float d = ((dot[0] + dot[4]) + (dot[1] + dot[5])) + ((dot[2] + dot[6]) + (dot[3] + dot[7]));
      acc += to_float(scales[g]) * d + to_float(biases[g]) * in.sum[size_t(g)];
    }
    y[r] = acc;
  }
}

// The integer sum of a group is exact: |code * x16| <= 255 * 32258, 64 of them < 2^30.
template <int kBits>
void rows_integer(const Matrix& W, const QuantizedInput& in, int64_t r0, int64_t r1, float* y) {
  const int64_t cols = W.cols, groups = cols / kInputGroup, row_bytes = cols * kBits / 8;
  const int16_t* x16 = in.x16.data();
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* codes = static_cast<const uint8_t*>(W.data) + r * row_bytes;
    const bf16* scales = W.scales + r * groups;
    const bf16* biases = W.biases + r * groups;
    float acc = 0;
    for (int64_t g = 0; g < groups; ++g) {
      int32_t dot = 0;
      for (int64_t c = g * kInputGroup; c < (g + 1) * kInputGroup; ++c)
        dot += int32_t(code_at<kBits>(codes, c)) * x16[c];
      const float d = to_float(scales[g]) * in.unit[size_t(g)];
      acc += d * float(dot) + to_float(biases[g]) * in.qsum[size_t(g)];
    }
    y[r] = acc;
  }
}

}  // namespace

void gemv_rows_scalar_fp32(const Matrix& W, const QuantizedInput& x, int64_t r0, int64_t r1, float* y) {
  if (W.bits == 4) rows_fp32<4>(W, x, r0, r1, y);
  else rows_fp32<8>(W, x, r0, r1, y);
}

void gemv_rows_scalar_integer(const Matrix& W, const QuantizedInput& x, int64_t r0, int64_t r1, float* y) {
  if (W.bits == 4) rows_integer<4>(W, x, r0, r1, y);
  else rows_integer<8>(W, x, r0, r1, y);
}

// Cloned per x86-64 level (base/cpu_clones.h): plain bf16 / f32 matrices (a bf16 checkpoint
// run without --quantize) take this path for every product.
LILY_CPU_CLONES void gemv_rows_dequantizing(const Matrix& W, const float* x, int64_t r0, int64_t r1, float* y) {
  if (gguf_gemv_supported(W)) return gguf_gemv_rows(W, x, r0, r1, y);  // GGUF blocks: their own kernels
  std::vector<float> row(static_cast<size_t>(W.cols));                 // a fallback: an allocation per block of rows
  for (int64_t r = r0; r < r1; ++r) {
    W.dequantize_row(r, row.data());
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t c = 0;
    for (; c + 8 <= W.cols; c += 8)
      for (int j = 0; j < 8; ++j) acc[j] += row[size_t(c + j)] * x[c + j];
    float s = 0;
    for (; c < W.cols; ++c) s += row[size_t(c)] * x[c];
    y[r] = s + ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  }
}

}  // namespace lily::cpu_fast::detail
