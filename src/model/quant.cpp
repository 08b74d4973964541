#include "model/quant.h"

#include <algorithm>
#include <cmath>

#include "base/cpu_clones.h"
#include "base/error.h"

namespace lily {

// Cloned per x86-64 level (base/cpu_clones.h): the reference backend's linear spends a third
// of its time here.
LILY_CPU_CLONES void dequantize_row(const uint32_t* codes, const bf16* scales, const bf16* biases, int64_t cols,
                                    int bits, int group_size, float* out) {
  const int per_word = 32 / bits;
  const uint32_t mask = (1u << bits) - 1u;
  const int words_per_group = group_size / per_word;
  for (int64_t g = 0; g < cols / group_size; ++g) {
    const float scale = to_float(scales[g]);
    const float bias = to_float(biases[g]);
    const uint32_t* w = codes + g * words_per_group;
    float* o = out + g * group_size;
    for (int i = 0; i < words_per_group; ++i) {
      uint32_t word = w[i];
      for (int j = 0; j < per_word; ++j) o[i * per_word + j] = scale * float((word >> (bits * j)) & mask) + bias;
    }
  }
}

// MLX affine quantization of one group (mlx/ops.cpp affine_quantize): the edge with the
// larger magnitude becomes the bias and is kept exact; the scale's sign is chosen so codes
// count from that edge towards the other.
QuantizedMatrix quantize_affine(std::span<const float> w, int64_t rows, int64_t cols, int bits, int group_size) {
  LILY_CHECK(cols % group_size == 0, "cannot quantize: {} columns is not a multiple of the group size {}", cols,
             group_size);
  LILY_CHECK(bits == 2 || bits == 4 || bits == 8, "cannot quantize to {} bits", bits);
  const int per_word = 32 / bits;
  const float n_bins = float((1 << bits) - 1);
  const int64_t groups = cols / group_size;
  QuantizedMatrix q;
  q.codes.assign(size_t(rows * cols / per_word), 0);
  q.scales.resize(size_t(rows * groups));
  q.biases.resize(size_t(rows * groups));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const float* x = w.data() + r * cols + g * group_size;
      // As MLX's GPU kernels (which make mlx-community files) do: the max starts at 0.
      float lo = x[0], hi = 0.f;
      for (int i = 0; i < group_size; ++i) lo = std::min(lo, x[i]), hi = std::max(hi, x[i]);
      const bool min_is_edge = std::fabs(lo) > std::fabs(hi);
      float scale = std::max((hi - lo) / n_bins, 1e-7f);
      scale = min_is_edge ? scale : -scale;
      const float edge = min_is_edge ? lo : hi;
      // Snap the scale so that the edge lands exactly on a code.
      const float q0 = std::round(edge / scale);  // half away from zero, as Metal round()
      float bias = 0.f;
      if (q0 != 0.f) {
        scale = edge / q0;
        bias = edge;
      }
      q.scales[size_t(r * groups + g)] = to_bf16(scale);
      q.biases[size_t(r * groups + g)] = to_bf16(bias);
      // As MLX does, codes come from the unrounded float scale and bias.
      for (int i = 0; i < group_size; ++i) {
        float code = std::clamp(std::round((x[i] - bias) / scale), 0.f, n_bins);
        int64_t col = g * group_size + i;
        q.codes[size_t((r * cols + col) / per_word)] |= uint32_t(code) << (bits * (col % per_word));
      }
    }
  }
  return q;
}

}  // namespace lily
