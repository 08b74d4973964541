// gemv.cpp: which GEMV kernel runs (gemv.h), and the threaded wrappers. The kernels are in
// gemv_scalar.cpp, gemv_avx2.cpp and gemv_avx512.cpp.
#include "backend/cpu_fast/gemv.h"

#include <algorithm>

#include "backend/cpu/ops.h"
#include "base/error.h"
#include "base/thread_pool.h"

namespace lily::cpu_fast {

namespace {

// A block of rows of one product is at least this many weights, and a call with fewer weights
// in all runs on the calling thread: a fork-join of the pool costs tens of microseconds.
constexpr int64_t kBlockWeights = 32 * 1024;
constexpr int64_t kParallelMinWeights = 96 * 1024;

// Rows [r0, r1) of W x with the best kernel for W (x prepared for W when the kernels take it).
void rows_best(const Matrix& W, const QuantizedInput& in, int64_t r0, int64_t r1, float* y) {
  if (gemv_supported(W)) gemv_rows_kernel(best_isa(), preferred_dot(W))(W, in, r0, r1, y);
  else detail::gemv_rows_dequantizing(W, in.x, r0, r1, y);
}

}  // namespace

const char* to_string(Isa isa) {
  switch (isa) {
    case Isa::scalar: return "scalar";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
  }
  return "?";
}

const char* to_string(Dot dot) { return dot == Dot::integer ? "integer" : "fp32"; }

bool isa_supported(Isa isa) {
  switch (isa) {
    case Isa::scalar: return true;
    case Isa::avx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Isa::avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
  }
  return false;
}

Isa best_isa() {
  static const Isa isa = isa_supported(Isa::avx512) ? Isa::avx512 : isa_supported(Isa::avx2) ? Isa::avx2 : Isa::scalar;
  return isa;
}

GemvRowsFn gemv_rows_kernel(Isa isa, Dot dot) {
  LILY_CHECK(isa_supported(isa), "the {} GEMV kernel needs instructions this processor lacks", to_string(isa));
  const bool integer = dot == Dot::integer;
  switch (isa) {
    case Isa::scalar: return integer ? detail::gemv_rows_scalar_integer : detail::gemv_rows_scalar_fp32;
    case Isa::avx2: return integer ? detail::gemv_rows_avx2_integer : detail::gemv_rows_avx2_fp32;
    case Isa::avx512: return integer ? detail::gemv_rows_avx512_integer : detail::gemv_rows_avx512_fp32;
  }
  return detail::gemv_rows_scalar_fp32;
}

bool gemv_supported(const Matrix& W) {
  return W.format == MatrixFormat::affine && (W.bits == 4 || W.bits == 8) && W.group_size > 0 &&
         W.group_size % 16 == 0 && W.cols % W.group_size == 0;
}

Dot preferred_dot(const Matrix& W) { return W.group_size == kInputGroup ? Dot::integer : Dot::fp32; }

void gemv(const Matrix& W, const float* x, float* y) {
  if (!gemv_supported(W)) return detail::gemv_rows_dequantizing(W, x, 0, W.rows, y);
  gemv(W, x, y, best_isa(), preferred_dot(W));
}

void gemv(const Matrix& W, const float* x, float* y, Isa isa, Dot dot) {
  LILY_CHECK(gemv_supported(W), "gemv: the kernels do not take {}", W.describe());
  LILY_CHECK(dot == Dot::fp32 || W.group_size == kInputGroup, "gemv: the integer kernels take groups of {}, not {}",
             kInputGroup, W.group_size);
  thread_local QuantizedInput in;
  quantize_input(x, W.cols, W.group_size, in);
  gemv_rows_kernel(isa, dot)(W, in, 0, W.rows, y);
}

void gemv_parallel(std::span<const GemvTask> tasks) {
  struct Block {
    int64_t task, r0, r1;
  };
  thread_local std::vector<Block> blocks;
  thread_local std::vector<QuantizedInput> inputs;  // one per distinct (x, cols, group size)
  thread_local std::vector<size_t> input_of;        // task -> its input
  blocks.clear();
  input_of.clear();
  size_t n_inputs = 0;
  int64_t weights = 0;
  for (size_t i = 0; i < tasks.size(); ++i) {
    const Matrix& W = *tasks[i].W;
    size_t j = 0;
    while (j < n_inputs && !(inputs[j].x == tasks[i].x && inputs[j].cols == W.cols &&
                             (!gemv_supported(W) || inputs[j].group_size == W.group_size)))
      ++j;
    if (j == n_inputs) {
      if (inputs.size() <= n_inputs) inputs.emplace_back();
      if (gemv_supported(W)) quantize_input(tasks[i].x, W.cols, W.group_size, inputs[j]);
      else inputs[j].x = tasks[i].x, inputs[j].cols = W.cols, inputs[j].group_size = 0;
      ++n_inputs;
    }
    input_of.push_back(j);
    const int64_t rows_per_block = std::max<int64_t>(1, kBlockWeights / std::max<int64_t>(1, W.cols));
    for (int64_t r = 0; r < W.rows; r += rows_per_block)
      blocks.push_back({int64_t(i), r, std::min(W.rows, r + rows_per_block)});
    weights += W.rows * W.cols;
  }
  const int64_t n = int64_t(blocks.size());
  // The worker threads read the calling thread's blocks and inputs through these references.
  const std::vector<Block>& all_blocks = blocks;
  const std::vector<QuantizedInput>& all_inputs = inputs;
  const std::vector<size_t>& task_input = input_of;
  parallel_for(n, weights < kParallelMinWeights ? n : 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const Block& blk = all_blocks[size_t(b)];
      const GemvTask& t = tasks[size_t(blk.task)];
      rows_best(*t.W, all_inputs[task_input[size_t(blk.task)]], blk.r0, blk.r1, t.y);
    }
  });
}

void linear(const Matrix& W, const float* x, int64_t T, float* y) {
  if (T != 1) return cpu::linear(W, x, T, y);
  const GemvTask task{&W, x, y};
  gemv_parallel({&task, 1});
}

}  // namespace lily::cpu_fast
