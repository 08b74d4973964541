// gemv_gguf.h: the fast CPU path's products over GGUF block-format weights (model/gguf_dequant.h
// has the formats), y = W x for one token, W read as the file stores it.
//
//   y[r] = sum_blocks sum_sub  d_sub * sum_{c in sub} q[c] x[c]  -  m_sub * sum_{c in sub} x[c]
//
// d_sub, m_sub: the block's scale and (K-quants) min of each sub-block, from the block's f16
// and 6- or 8-bit fields; q the small integer codes. x stays fp32: the codes are widened to
// float and multiplied by FMA, 16 lanes at a time (GCC vector extensions, compiled for the
// baseline, AVX2 and AVX-512 by LILY_CPU_CLONES), so the result is the reference dequantization
// times x up to float rounding (no activation quantization). Types: F32, F16, BF16, Q4_0, Q8_0,
// Q4_K, Q5_K, Q6_K, IQ4_XS; other types go through Matrix::dequantize_row. The integer kernels
// (below, gemv_gguf_avx512.cpp) take Q4_K, Q5_K, Q6_K, Q8_0 and Q4_0 against x quantized to 16
// bits.
#pragma once

#include <cstdint>

#include "backend/cpu_fast/quantized_input.h"
#include "model/weights.h"

namespace lily::cpu_fast {

// Whether gguf_dot / gguf_gemv_rows take rows of `type`.
bool gguf_gemv_supported(GgmlType type);
bool gguf_gemv_supported(const Matrix& W);  // a gguf Matrix of a type the kernels take

// The dot product of one row of n values of `type` (n whole blocks) with x[n].
float gguf_dot(GgmlType type, const void* row, const float* x, int64_t n);

// Rows [r0, r1) of y = W x, W a gguf Matrix the kernels take.
void gguf_gemv_rows(const Matrix& W, const float* x, int64_t r0, int64_t r1, float* y);

// Rows [r0, r1) of y = W x for a plain f32 / bf16 / f16 Matrix (a GGUF's F32 routers): the
// vector kernels of the same GGUF types, not a row dequantized and copied first.
bool plain_gemv_supported(const Matrix& W);
void plain_gemv_rows(const Matrix& W, const float* x, int64_t r0, int64_t r1, float* y);

// The integer kernels (gemv_gguf_avx512.cpp): Q4_K, Q5_K, Q6_K, Q8_0 and Q4_0 rows of 64 * k
// columns times x quantized as quantized_input.h does for groups of 64 (x16 = round(x / unit[g]),
// |x - unit x16| <= unit / 2), on AVX-512 VNNI when active_isa() is avx512. The codes times
// the sub-block scales are exact integers, their sums with x16 exact in int32, so the error is
// that of x16 alone:
//
//   |y[r] - sum_c w[r,c] x[c]|  <=  sum_g unit[g] / 2 * sum_{c in g} |w[r,c]|   (+ fp32 rounding)
//
// w the reference decoding (gguf_dequant), the Q4_K / Q5_K mins included (m * sum x16 in the
// same integers). About 2^-16 of each group's largest |x| times sum |w|, as for the mlx kernels.
bool gguf_integer_supported(const Matrix& W);
// Rows [r0, r1) of y = W x: the integer kernels where x is quantized for groups of 64 and
// gguf_integer_supported(W), else the fp32 ones on x.x.
void gguf_gemv_rows(const Matrix& W, const QuantizedInput& x, int64_t r0, int64_t r1, float* y);

}  // namespace lily::cpu_fast
