// gemm.cpp: tokens prepared for the prefill products, which kernel runs them (gemm.h), and the
// rows of a region's products split between its members. The AVX-512 kernel is in
// gemm_avx512.cpp; the other instruction sets run the GEMV kernels token by token.
#include "backend/cpu_fast/gemm.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/cpu_clones.h"
#include "base/error.h"

namespace lily::cpu_fast {

namespace {

constexpr float kRange = 127.f * 254.f;  // |x16| <= 32258, as quantized_input.cpp

// One group of 64 to x16 with the rounding of quantized_input.cpp (the same x16, unit and
// qsum; a group with a NaN or an infinity gets x16 = 0 and a unit of NaN or infinity, which
// carries it into the result), split x16 = 256 a + b, a and b in kQuadOrder.
LILY_CPU_CLONES void quantize_group_halves(const float* x, int8_t* a, int8_t* b, float* unit, float* qsum) {
  float amax = 0;
  bool nan = false, inf = false;
  for (int c = 0; c < kInputGroup; ++c) {
    amax = std::max(amax, std::fabs(x[c]));
    nan |= std::isnan(x[c]);
    inf |= std::isinf(x[c]);
  }
  const bool finite = !nan && !inf;
  if (!finite) amax = nan ? NAN : INFINITY;
  const float inv = finite && amax > 0 ? kRange / amax : 0.f;
  int32_t x16[kInputGroup];
  int32_t q = 0;
  for (int c = 0; c < kInputGroup; ++c) {
    x16[c] = int32_t(std::nearbyint(x[c] * inv));
    q += x16[c];
  }
  for (int p = 0; p < kInputGroup; ++p) {
    const int32_t v = x16[kQuadOrder[size_t(p)]];
    const int32_t high = (v + 128) >> 8;  // floor: v - 256 high in [-128, 127]; |high| <= 126
    a[p] = int8_t(high);
    b[p] = int8_t(v - 256 * high);
  }
  *unit = amax / kRange;
  *qsum = *unit * float(q);
}

// A group's halves (64 a, 64 b in kQuadOrder) to token t's places in the batch's tile.
void copy_quads(const int8_t* a, const int8_t* b, TokenBatch& out, int64_t t, int64_t g) {
  for (int i = 0; i < kInputGroup / 4; ++i) {
    int32_t qa, qb;
    std::memcpy(&qa, a + 4 * i, 4);
    std::memcpy(&qb, b + 4 * i, 4);
    out.quads[size_t(quad_index(out, t, g, i, 0))] = qa;
    out.quads[size_t(quad_index(out, t, g, i, 1))] = qb;
  }
}

bool tiled_kernel() { return active_isa() == Isa::avx512; }

}  // namespace

bool gemm_supported(const Matrix& W) { return gemv_supported(W) && W.group_size == kInputGroup; }

void reset_tokens(const float* x, int64_t n, int64_t cols, TokenBatch& out) {
  out.x = x, out.n = n, out.cols = cols;
  const bool quantizable = cols % kInputGroup == 0;
  out.tiled = quantizable && tiled_kernel();
  if (out.tiled) {
    out.quads.resize(size_t(n * cols / 2));
    out.unit.resize(size_t(n * cols / kInputGroup));
    out.qsum.resize(out.unit.size());
  } else if (quantizable) {
    if (int64_t(out.tokens.size()) < n) out.tokens.resize(size_t(n));
    for (int64_t t = 0; t < n; ++t) reset_input(x + t * cols, cols, kInputGroup, out.tokens[size_t(t)]);
  }
}

void prepare_tokens(TokenBatch& out, int64_t t0, int64_t t1) {
  const int64_t cols = out.cols, groups = cols / kInputGroup;
  if (cols % kInputGroup != 0) return;
  for (int64_t t = t0; t < t1; ++t) {
    if (!out.tiled) {
      quantize_groups(out.tokens[size_t(t)], 0, groups);
      continue;
    }
    for (int64_t g = 0; g < groups; ++g) {
      int8_t a[kInputGroup], b[kInputGroup];
      const int64_t at = group_index(out, t, g);
      quantize_group_halves(out.x + t * cols + g * kInputGroup, a, b, &out.unit[size_t(at)], &out.qsum[size_t(at)]);
      copy_quads(a, b, out, t, g);
    }
  }
}

void prepare_tokens(const float* x, int64_t n, int64_t cols, TokenBatch& out) {
  reset_tokens(x, n, cols, out);
  prepare_tokens(out, 0, n);
}

void gather_tokens(const TokenBatch& from, const int32_t* tokens, int64_t n, TokenBatch& out,
                   std::vector<float>& rows) {
  const int64_t cols = from.cols, groups = cols / kInputGroup;
  rows.resize(size_t(n * cols));
  for (int64_t i = 0; i < n; ++i) std::copy_n(from.x + tokens[i] * cols, cols, rows.data() + i * cols);
  out.x = rows.data(), out.n = n, out.cols = cols, out.tiled = from.tiled;
  if (from.tiled) {
    out.quads.resize(size_t(n * cols / 2));
    out.unit.resize(size_t(n * groups));
    out.qsum.resize(out.unit.size());
    for (int64_t i = 0; i < n; ++i) {
      const int64_t t = tokens[i];
      for (int64_t g = 0; g < groups; ++g) {
        for (int64_t q = 0; q < kInputGroup / 4; ++q)
          for (int half = 0; half < 2; ++half)
            out.quads[size_t(quad_index(out, i, g, q, half))] = from.quads[size_t(quad_index(from, t, g, q, half))];
        out.unit[size_t(group_index(out, i, g))] = from.unit[size_t(group_index(from, t, g))];
        out.qsum[size_t(group_index(out, i, g))] = from.qsum[size_t(group_index(from, t, g))];
      }
    }
    return;
  }
  if (cols % kInputGroup != 0) return;
  if (int64_t(out.tokens.size()) < n) out.tokens.resize(size_t(n));
  for (int64_t i = 0; i < n; ++i) {
    out.tokens[size_t(i)] = from.tokens[size_t(tokens[i])];
    out.tokens[size_t(i)].x = out.x + i * cols;
  }
}

void gemm_rows(const Matrix& W, const TokenBatch& x, int64_t r0, int64_t r1, float* y, int64_t y_stride,
               GemmScratch& scratch, const Matrix* then) {
  LILY_CHECK(W.cols == x.cols, "gemm_rows: {} against tokens of {} columns", W.describe(), x.cols);
  if (r0 >= r1 || x.n == 0) return;
  if (gemm_supported(W) && x.tiled) return detail::gemm_rows_avx512(W, x, r0, r1, y, y_stride, scratch, then);
  if (gemm_supported(W) && !x.tokens.empty() && active_isa() == Isa::avx2) {
    std::vector<const QuantizedInput*> tokens(size_t(x.n));
    for (int64_t t = 0; t < x.n; ++t) tokens[size_t(t)] = &x.tokens[size_t(t)];
    detail::gemv_tokens_avx2_integer(W, tokens.data(), int(x.n), r0, r1, y, y_stride);
    return;
  }
  if (gemm_supported(W) && !x.tokens.empty()) {
    const GemvRowsFn kernel = gemv_rows_kernel(active_isa(), Dot::integer);
    for (int64_t t = 0; t < x.n; ++t) kernel(W, x.tokens[size_t(t)], r0, r1, y + t * y_stride);
    return;
  }
  detail::gemm_rows_dequantizing(W, x.x, x.n, r0, r1, y, y_stride);
}

void gemm_share(const PreparedGemm* products, size_t count, const ThreadTeam::Member& member, GemmScratch& scratch) {
  constexpr int64_t kPanel = 16;
  int64_t total = 0;  // panels weighted by their columns: the weights each reads
  for (size_t i = 0; i < count; ++i) total += (products[i].W->rows + kPanel - 1) / kPanel * products[i].W->cols;
  const auto [lo, hi] = member.share(total);
  int64_t offset = 0;
  for (size_t i = 0; i < count; ++i) {
    const PreparedGemm& p = products[i];
    const int64_t cols = std::max<int64_t>(1, p.W->cols), panels = (p.W->rows + kPanel - 1) / kPanel;
    // A panel is this member's when its first weight falls in [lo, hi).
    auto first_panel_from = [&](int64_t w) { return std::clamp<int64_t>((w - offset + cols - 1) / cols, 0, panels); };
    const int64_t r0 = first_panel_from(lo) * kPanel, r1 = std::min(p.W->rows, first_panel_from(hi) * kPanel);
    if (r0 < r1) gemm_rows(*p.W, *p.x, r0, r1, p.y, p.W->rows, scratch);
    offset += panels * p.W->cols;
  }
}

void gemm_parallel(const Matrix& W, const float* x, int64_t T, float* y, TokenBatch& batch,
                   std::vector<GemmScratch>& scratch) {
  ThreadTeam& team = cpu_team();
  scratch.resize(size_t(team.size()));
  reset_tokens(x, T, W.cols, batch);
  team.run([&](ThreadTeam::Member& m) {
    const auto [t0, t1] = m.share(T);
    prepare_tokens(batch, t0, t1);
    m.barrier();
    const PreparedGemm product[] = {{&W, &batch, y}};
    gemm_share(product, 1, m, scratch[size_t(m.index())]);
  });
}

void linear(const Matrix& W, const float* x, int64_t T, float* y, GemvScratch& scratch) {
  if (T <= 0) return;
  if (T == 1) {
    const GemvTask task{&W, x, y};
    return gemv_parallel({&task, 1}, scratch);
  }
  TokenBatch batch;
  std::vector<GemmScratch> gemm;
  gemm_parallel(W, x, T, y, batch, gemm);
}

void linear(const Matrix& W, const float* x, int64_t T, float* y) {
  GemvScratch scratch;
  linear(W, x, T, y, scratch);
}

}  // namespace lily::cpu_fast

namespace lily::cpu_fast::detail {

// Matrices the integer kernels do not take (plain f32/bf16, other group sizes): each row
// dequantized once, then its dot product with every token (as cpu::linear); cloned per x86-64
// level (base/cpu_clones.h) so the dot products vectorize.
LILY_CPU_CLONES void gemm_rows_dequantizing(const Matrix& W, const float* x, int64_t n, int64_t r0, int64_t r1,
                                            float* y, int64_t y_stride) {
  LILY_CHECK(x != nullptr, "gemm_rows: {} needs the tokens' fp32 rows", W.describe());
  const int64_t cols = W.cols;
  std::vector<float> row(static_cast<size_t>(cols));  // a fallback: an allocation per call
  for (int64_t r = r0; r < r1; ++r) {
    W.dequantize_row(r, row.data());
    for (int64_t t = 0; t < n; ++t) {
      const float* xt = x + t * cols;
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int64_t c = 0;
      for (; c + 8 <= cols; c += 8)
        for (int j = 0; j < 8; ++j) acc[j] += row[size_t(c + j)] * xt[c + j];
      float s = 0;
      for (; c < cols; ++c) s += row[size_t(c)] * xt[c];
      y[t * y_stride + r] = s + ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    }
  }
}

}  // namespace lily::cpu_fast::detail
