// quant.h: affine group quantization, the MLX 4-bit (and 8-bit) weight format (spec §5b).
//
//   w[r, c] = scale[r, c / G] * q[r, c] + bias[r, c / G]      q unsigned, `bits` wide; G = group size
//
// Codes are packed along the input dimension into uint32 words, 32/bits codes per word,
// code j of word i (input column i*(32/bits) + j) in bits [bits*j, bits*j + bits): the low
// nibble first for 4-bit. Scales and biases are bf16. Scales may be negative and a bias may
// be the group maximum: nothing here assumes scale > 0 or bias = min.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/bf16.h"

namespace lily {

// Dequantizes one row of `cols` values.
void dequantize_row(const uint32_t* codes, const bf16* scales, const bf16* biases, int64_t cols, int bits,
                    int group_size, float* out);

// Quantizes rows x cols float values the way MLX's affine quantizer does (round to nearest,
// the larger-magnitude group edge kept exact). Used by `--quantize q4` for bf16 checkpoints.
struct QuantizedMatrix {
  std::vector<uint32_t> codes;  // [rows, cols * bits / 32]
  std::vector<bf16> scales;     // [rows, cols / group_size]
  std::vector<bf16> biases;     // [rows, cols / group_size]
};
QuantizedMatrix quantize_affine(std::span<const float> w, int64_t rows, int64_t cols, int bits, int group_size);

}  // namespace lily
