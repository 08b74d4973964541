// gemv.h: the fast CPU path's decode kernel, y = W x for one token over affine-quantized weights.
//
//   y[r] = sum_g ( scale[r,g] * sum_{c in g} code[r,c] * x[c]  +  bias[r,g] * xsum[g] )
//
// W is read as stored (spec §5b: 4- or 8-bit codes packed low-first into uint32 words, bf16
// scale and bias per group along the input); the bias term uses the group sums of x, computed
// once per x (quantized_input.h). Two kinds of kernel:
//   Dot::integer  x quantized per group of 64 to 16-bit integers in two int8 halves, and integer
//                 dot products of the codes with them (AVX-512 VNNI vpdpbusd, AVX2 vpmaddubsw +
//                 vpmaddwd): groups of 64 only. quantized_input.h bounds the error it adds.
//   Dot::fp32     the codes widened to fp32 and multiplied with x by FMA: any group of 16 * k
//                 columns; the fallback for group sizes other than 64.
// One file per instruction set (gemv_scalar.cpp, gemv_avx2.cpp, gemv_avx512.cpp); best_isa()
// picks the widest one this processor runs (__builtin_cpu_supports), so one binary runs on any
// x86-64. Matrices the kernels do not take (plain f32/bf16, other bit widths, groups not a
// multiple of 16 columns) are dequantized row by row.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/cpu_fast/quantized_input.h"
#include "base/thread_team.h"
#include "model/weights.h"

namespace lily::cpu_fast {

enum class Isa { scalar, avx2, avx512 };  // avx512: F, BW, VL and VNNI
const char* to_string(Isa isa);
Isa best_isa();               // the widest kernel this processor can run
bool isa_supported(Isa isa);  // whether this processor runs the kernels of `isa`
// The instruction set the products run on: best_isa() unless use_isa() chose another (the tests
// run the whole model on each one the processor has; a benchmark may compare them). use_isa
// throws where the processor lacks `isa`; call it between forwards, not during one.
Isa active_isa();
void use_isa(Isa isa);

enum class Dot { fp32, integer };
const char* to_string(Dot dot);

// Whether the GEMV kernels take W (else its rows are dequantized), and which kind fits it.
bool gemv_supported(const Matrix& W);
Dot preferred_dot(const Matrix& W);  // integer for groups of 64, fp32 otherwise

// Rows [r0, r1) of y = W x, x prepared by quantize_input(x, W.cols, W.group_size).
using GemvRowsFn = void (*)(const Matrix& W, const QuantizedInput& x, int64_t r0, int64_t r1, float* y);
GemvRowsFn gemv_rows_kernel(Isa isa, Dot dot);

// y[W.rows] = W x on the calling thread (any W: rows dequantized where gemv_supported(W) is
// false), with the best kernels, or those of `isa` and `dot` (integer needs groups of 64).
void gemv(const Matrix& W, const float* x, float* y);
void gemv(const Matrix& W, const float* x, float* y, Isa isa, Dot dot);

// x [W.cols] prepared for W: quantized for its group size when the kernels take W, else only
// x.x set. reset_input_for: the buffers only (quantize_groups fills them; quantized_input.h).
void prepare_input(const Matrix& W, const float* x, QuantizedInput& in);
void reset_input_for(const Matrix& W, const float* x, QuantizedInput& in);

// Rows [r0, r1) of y = W x with the best kernel for W. x prepared for W, or for another matrix
// of W.cols columns: where its group size is not W's, W's rows are dequantized (slow, right).
void gemv_rows(const Matrix& W, const QuantizedInput& x, int64_t r0, int64_t r1, float* y);

// A product whose x is prepared.
struct PreparedGemv {
  const Matrix* W;
  const QuantizedInput* x;
  float* y;
};
// Inside a parallel region: this member's share of the rows of all the products, split by
// weights read (each member about the same number of bytes).
void gemv_share(std::span<const PreparedGemv> products, const ThreadTeam::Member& member);

// Several independent products y_i = W_i x_i in one parallel region of cpu_team(), so a
// layer's projections cost one fork-join; products with the same x share its preparation.
// `scratch`: buffers the caller keeps (reused call after call); without it, allocated per call.
struct GemvTask {
  const Matrix* W;
  const float* x;
  float* y;
};
struct GemvScratch {
  std::vector<QuantizedInput> inputs;  // one per distinct x
  std::vector<size_t> input_of;        // task -> its input
  std::vector<PreparedGemv> products;
};
void gemv_parallel(std::span<const GemvTask> tasks, GemvScratch& scratch);
void gemv_parallel(std::span<const GemvTask> tasks);

}  // namespace lily::cpu_fast

namespace lily::cpu_fast::detail {
// The kernels, one file per instruction set; only called where isa_supported() says so.
void gemv_rows_scalar_fp32(const Matrix& W, const QuantizedInput& x, int64_t r0, int64_t r1, float* y);
void gemv_rows_scalar_integer(const Matrix& W, const QuantizedInput& x, int64_t r0, int64_t r1, float* y);
void gemv_rows_avx2_fp32(const Matrix& W, const QuantizedInput& x, int64_t r0, int64_t r1, float* y);
void gemv_rows_avx2_integer(const Matrix& W, const QuantizedInput& x, int64_t r0, int64_t r1, float* y);
// y[t * y_stride + r] for tokens t < n, rows [r0, r1): gemv_rows_avx2_integer's sums for each of
// n tokens, read from the codes once per tile of 4 tokens (4-bit; 8-bit: token by token).
void gemv_tokens_avx2_integer(const Matrix& W, const QuantizedInput* const* x, int n, int64_t r0, int64_t r1, float* y,
                              int64_t y_stride);
void gemv_rows_avx512_fp32(const Matrix& W, const QuantizedInput& x, int64_t r0, int64_t r1, float* y);
void gemv_rows_avx512_integer(const Matrix& W, const QuantizedInput& x, int64_t r0, int64_t r1, float* y);
// Rows [r0, r1) of any matrix: each row dequantized to fp32, then a dot product.
void gemv_rows_dequantizing(const Matrix& W, const float* x, int64_t r0, int64_t r1, float* y);
}  // namespace lily::cpu_fast::detail
