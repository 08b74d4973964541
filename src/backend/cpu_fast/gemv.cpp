// gemv.cpp: the GEMV dispatch (which kernel runs), the portable kernel, and the threaded
// wrappers. The SIMD kernels are in gemv_avx2.cpp and gemv_avx512.cpp.
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

// Rows [r0, r1) of any matrix (the fallback): each row expanded to fp32, then a dot product.
void rows_by_dequantizing(const Matrix& W, const float* x, int64_t r0, int64_t r1, float* y) {
  thread_local std::vector<float> row;
  row.resize(size_t(W.cols));
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

template <int kBits>
void rows_scalar(const Matrix& W, const float* x, const float* xsum, int64_t r0, int64_t r1, float* y) {
  constexpr int kPerWord = 32 / kBits;
  constexpr uint32_t kMask = (1u << kBits) - 1u;
  const int64_t cols = W.cols, G = W.group_size, groups = cols / G, words = cols / kPerWord;
  for (int64_t r = r0; r < r1; ++r) {
    const uint32_t* codes = static_cast<const uint32_t*>(W.data) + r * words;
    const bf16* scales = W.scales + r * groups;
    const bf16* biases = W.biases + r * groups;
    float acc = 0;
    for (int64_t g = 0; g < groups; ++g) {
      const uint32_t* wg = codes + g * (G / kPerWord);
      const float* xg = x + g * G;
      float dot[kPerWord] = {};
      for (int64_t i = 0; i < G / kPerWord; ++i)
        for (int j = 0; j < kPerWord; ++j) dot[j] += float((wg[i] >> (kBits * j)) & kMask) * xg[i * kPerWord + j];
      float d = 0;
      for (int j = 0; j < kPerWord; ++j) d += dot[j];
      acc += to_float(scales[g]) * d + to_float(biases[g]) * xsum[g];
    }
    y[r] = acc;
  }
}

}  // namespace

namespace detail {
void gemv_rows_scalar(const Matrix& W, const float* x, const float* xsum, int64_t r0, int64_t r1, float* y) {
  if (W.bits == 4) rows_scalar<4>(W, x, xsum, r0, r1, y);
  else rows_scalar<8>(W, x, xsum, r0, r1, y);
}
}  // namespace detail

const char* to_string(Isa isa) {
  switch (isa) {
    case Isa::scalar: return "scalar";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
  }
  return "?";
}

bool isa_supported(Isa isa) {
  switch (isa) {
    case Isa::scalar: return true;
    case Isa::avx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Isa::avx512: return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  }
  return false;
}

Isa best_isa() {
  static const Isa isa = isa_supported(Isa::avx512) ? Isa::avx512 : isa_supported(Isa::avx2) ? Isa::avx2 : Isa::scalar;
  return isa;
}

GemvRowsFn gemv_rows_kernel(Isa isa) {
  LILY_CHECK(isa_supported(isa), "the {} GEMV kernel needs instructions this processor lacks", to_string(isa));
  switch (isa) {
    case Isa::scalar: return detail::gemv_rows_scalar;
    case Isa::avx2: return detail::gemv_rows_avx2;
    case Isa::avx512: return detail::gemv_rows_avx512;
  }
  return detail::gemv_rows_scalar;
}

bool gemv_supported(const Matrix& W) {
  return W.format == MatrixFormat::affine && (W.bits == 4 || W.bits == 8) && W.group_size > 0 &&
         W.group_size % 16 == 0 && W.cols % W.group_size == 0;
}

void group_sums(const float* x, int64_t cols, int group_size, float* xsum) {
  for (int64_t g = 0; g < cols / group_size; ++g) {
    float s = 0;
    for (int64_t c = 0; c < group_size; ++c) s += x[g * group_size + c];
    xsum[g] = s;
  }
}

void gemv(const Matrix& W, const float* x, float* y, Isa isa) {
  if (!gemv_supported(W)) return rows_by_dequantizing(W, x, 0, W.rows, y);
  thread_local std::vector<float> xsum;
  xsum.resize(size_t(W.cols / W.group_size));
  group_sums(x, W.cols, W.group_size, xsum.data());
  gemv_rows_kernel(isa)(W, x, xsum.data(), 0, W.rows, y);
}

void gemv_parallel(std::span<const GemvTask> tasks, Isa isa) {
  const GemvRowsFn kernel = gemv_rows_kernel(isa);
  struct Block {
    int64_t task, r0, r1;
  };
  std::vector<Block> blocks;
  std::vector<std::vector<float>> xsums(tasks.size());
  int64_t weights = 0;
  for (size_t i = 0; i < tasks.size(); ++i) {
    const Matrix& W = *tasks[i].W;
    if (gemv_supported(W)) {
      xsums[i].resize(size_t(W.cols / W.group_size));
      group_sums(tasks[i].x, W.cols, W.group_size, xsums[i].data());
    }
    const int64_t rows_per_block = std::max<int64_t>(1, kBlockWeights / std::max<int64_t>(1, W.cols));
    for (int64_t r = 0; r < W.rows; r += rows_per_block)
      blocks.push_back({int64_t(i), r, std::min(W.rows, r + rows_per_block)});
    weights += W.rows * W.cols;
  }
  const int64_t n = int64_t(blocks.size());
  parallel_for(n, weights < kParallelMinWeights ? n : 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const Block& blk = blocks[size_t(b)];
      const GemvTask& t = tasks[size_t(blk.task)];
      if (gemv_supported(*t.W)) kernel(*t.W, t.x, xsums[size_t(blk.task)].data(), blk.r0, blk.r1, t.y);
      else rows_by_dequantizing(*t.W, t.x, blk.r0, blk.r1, t.y);
    }
  });
}

void linear(const Matrix& W, const float* x, int64_t T, float* y) {
  if (T != 1) return cpu::linear(W, x, T, y);
  const GemvTask task{&W, x, y};
  gemv_parallel({&task, 1});
}

}  // namespace lily::cpu_fast
