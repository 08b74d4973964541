// linear.cpp: y = x @ W^T for plain and affine-quantized weights.
//
// Parallel over output rows: each thread dequantizes one weight row into a scratch buffer
// and takes its dot product with all T input rows, so a row is expanded once per call.
#include <algorithm>

#include "backend/cpu/ops.h"
#include "base/cpu_clones.h"
#include "base/thread_pool.h"

namespace lily::cpu {

namespace {
// Eight independent partial sums let the compiler vectorize the reduction; cloned per x86-64
// level (base/cpu_clones.h), so the portable build keeps the wide vectors where they exist.
LILY_CPU_CLONES float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  float s = 0;
  for (; i < n; ++i) s += a[i] * b[i];
  return s + ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}
}  // namespace

void linear(const Matrix& W, const float* x, int64_t T, float* y) {
  const int64_t rows = W.rows, cols = W.cols;
  // Enough rows per task to amortize scheduling; fewer when T is large.
  const int64_t min_rows = std::max<int64_t>(1, 4096 / std::max<int64_t>(1, cols * T / 1024));
  parallel_for(rows, min_rows, [&](int64_t r0, int64_t r1) {
    thread_local std::vector<float> row;
    row.resize(size_t(cols));
    for (int64_t r = r0; r < r1; ++r) {
      W.dequantize_row(r, row.data());
      for (int64_t t = 0; t < T; ++t) y[t * rows + r] = dot(row.data(), x + t * cols, cols);
    }
  });
}

}  // namespace lily::cpu
