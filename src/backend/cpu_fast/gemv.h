// gemv.h: the fast CPU path's decode kernel, y = W x for one token over affine-quantized weights.
//
//   y[r] = sum_g ( scale[r,g] * sum_{c in g} q[r,c] * x[c]  +  bias[r,g] * xsum[g] )
//
// W is read as stored (spec §5b: 4- or 8-bit codes packed low-first into uint32 words, bf16
// scale and bias per group along the input): the codes are widened to fp32 in registers and
// multiplied with x by FMA, and the bias term uses the group sums of x, computed once per x.
// One kernel per instruction set (gemv_scalar.cpp, gemv_avx2.cpp, gemv_avx512.cpp); best_isa()
// picks the widest one this processor runs (__builtin_cpu_supports), so one binary runs on any
// x86-64. Matrices the kernels do not take (plain f32/bf16, other bit widths, groups not a
// multiple of 16 columns) go to the reference cpu::linear.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/weights.h"

namespace lily::cpu_fast {

enum class Isa { scalar, avx2, avx512 };
const char* to_string(Isa isa);
Isa best_isa();               // the widest kernel this processor can run
bool isa_supported(Isa isa);  // whether this processor runs the kernels of `isa`

// Whether the GEMV kernels take W (else the caller uses cpu::linear).
bool gemv_supported(const Matrix& W);

// Rows [r0, r1) of y = W x. xsum: [W.cols / W.group_size] group sums of x (group_sums()).
using GemvRowsFn = void (*)(const Matrix& W, const float* x, const float* xsum, int64_t r0, int64_t r1, float* y);
GemvRowsFn gemv_rows_kernel(Isa isa);

// xsum[g] = sum of x[g*group_size .. (g+1)*group_size).
void group_sums(const float* x, int64_t cols, int group_size, float* xsum);

// y[W.rows] = W x on the calling thread, with the kernel of `isa` (any W: cpu::linear when
// gemv_supported(W) is false).
void gemv(const Matrix& W, const float* x, float* y, Isa isa = best_isa());

// Several independent products y_i = W_i x_i in one parallel_for over blocks of rows of all
// of them, so a layer's projections cost one fork-join. Products the kernels do not take run
// through cpu::linear on one task.
struct GemvTask {
  const Matrix* W;
  const float* x;
  float* y;
};
void gemv_parallel(std::span<const GemvTask> tasks, Isa isa = best_isa());

// y[T, W.rows] = x[T, W.cols] @ W^T: the GEMV kernels for T = 1, cpu::linear otherwise.
void linear(const Matrix& W, const float* x, int64_t T, float* y);

}  // namespace lily::cpu_fast

namespace lily::cpu_fast::detail {
// The kernels, one per instruction set; only called where isa_supported() says so.
void gemv_rows_scalar(const Matrix& W, const float* x, const float* xsum, int64_t r0, int64_t r1, float* y);
void gemv_rows_avx2(const Matrix& W, const float* x, const float* xsum, int64_t r0, int64_t r1, float* y);
void gemv_rows_avx512(const Matrix& W, const float* x, const float* xsum, int64_t r0, int64_t r1, float* y);
}  // namespace lily::cpu_fast::detail
