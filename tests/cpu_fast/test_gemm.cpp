// The prefill product (cpu_fast/gemm.h) against cpu::linear (the reference), for every
// instruction set this processor runs (the others skip, saying so): tokens 1, 2, 7, 8, 9, 15,
// 16, 17, 63, 64, 65 (tiles of 8 and their edges), rows 1, 15, 16, 17, 33 (panels of 16 and
// their edges), columns 64 .. 2112 (odd numbers of groups), 4 and 8 bits, row ranges that
// start inside a panel, outputs poisoned with NaN.
//
// Error bar per output, as for the integer GEMV kernels (test_gemv.cpp): |y - ref| <= B + 1e-5 M,
// M = sum_c |w_c x_c|, B = sum_g unit_g / 2 * sum_{c in g} |w_c| (x's rounding to 16-bit
// integers). Every kernel must also equal the scalar GEMV kernel token by token within 1e-5 M:
// the same integer sums, in another order.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>

#include "backend/cpu/ops.h"
#include "backend/cpu_fast/gemm.h"
#include "model/quant.h"

namespace lily {
namespace {

using cpu_fast::Isa;

struct TestMatrix {
  QuantizedMatrix q;
  Matrix m;
};

TestMatrix random_matrix(int64_t rows, int64_t cols, int bits, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> w(size_t(rows * cols));
  for (auto& v : w) v = dist(rng);
  TestMatrix t;
  t.q = quantize_affine(w, rows, cols, bits, 64);
  t.m.rows = rows, t.m.cols = cols, t.m.format = MatrixFormat::affine, t.m.bits = bits, t.m.group_size = 64;
  t.m.data = t.q.codes.data(), t.m.scales = t.q.scales.data(), t.m.biases = t.q.biases.data();
  return t;
}

std::vector<float> random_values(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-2.f, 2.f);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = dist(rng);
  return x;
}

// The allowance of output (t, r): B + 1e-5 M of the file's comment.
double allowance(const Matrix& W, const float* x, int64_t r) {
  cpu_fast::QuantizedInput in;
  cpu_fast::quantize_input(x, W.cols, 64, in);
  std::vector<float> row(static_cast<size_t>(W.cols));
  W.dequantize_row(r, row.data());
  double m = 1e-30, b = 0;
  for (int64_t c = 0; c < W.cols; ++c) {
    m += std::fabs(double(row[size_t(c)]) * x[c]);
    b += in.unit[size_t(c / 64)] / 2 * std::fabs(row[size_t(c)]);
  }
  return b + 1e-5 * m;
}

class GemmTest : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!cpu_fast::isa_supported(GetParam()))
      GTEST_SKIP() << "this processor does not run the " << cpu_fast::to_string(GetParam()) << " kernels";
    cpu_fast::use_isa(GetParam());
  }
  void TearDown() override { cpu_fast::use_isa(cpu_fast::best_isa()); }
};

TEST_P(GemmTest, MatchesReferenceAtEdgeSizes) {
  int cases = 0;
  cpu_fast::GemmScratch scratch;
  for (int bits : {4, 8})
    for (int64_t n : {1, 2, 7, 8, 9, 15, 16, 17, 63, 64, 65})
      for (int64_t rows : {1, 15, 16, 17, 33})
        for (int64_t cols : {64, 128, 192, 1088, 2112}) {
          if (cols > 192 && rows > 17 && n > 9) continue;  // keep the test to seconds
          const uint32_t seed = uint32_t(bits * 1000003 + n * 7919 + rows * 131 + cols);
          TestMatrix t = random_matrix(rows, cols, bits, seed);
          const std::vector<float> x = random_values(n * cols, seed + 1);
          const int64_t stride = rows + 3;  // y rows wider than W's
          std::vector<float> want(size_t(n * rows), NAN), got(size_t(n * stride), NAN);
          cpu::linear(t.m, x.data(), n, want.data());
          cpu_fast::TokenBatch batch;
          cpu_fast::prepare_tokens(x.data(), n, cols, batch);
          EXPECT_EQ(batch.tiled, GetParam() == Isa::avx512);
          // Rows in two calls split inside a panel: every row written by one of them.
          const int64_t split = std::min<int64_t>(rows, 5);
          cpu_fast::gemm_rows(t.m, batch, 0, split, got.data(), stride, scratch);
          cpu_fast::gemm_rows(t.m, batch, split, rows, got.data(), stride, scratch);
          std::vector<float> scalar(static_cast<size_t>(rows), NAN);
          cpu_fast::QuantizedInput in;
          double worst = 0, worst_scalar = 0;
          int64_t at_t = -1, at_r = -1;
          for (int64_t i = 0; i < n; ++i) {
            cpu_fast::quantize_input(x.data() + i * cols, cols, 64, in);
            cpu_fast::gemv_rows_kernel(Isa::scalar, cpu_fast::Dot::integer)(t.m, in, 0, rows, scalar.data());
            for (int64_t r = 0; r < rows; ++r) {
              const double g = got[size_t(i * stride + r)], allowed = allowance(t.m, x.data() + i * cols, r);
              const double err = std::isfinite(g) ? std::fabs(g - want[size_t(i * rows + r)]) / allowed : INFINITY;
              if (!(err <= worst)) worst = err, at_t = i, at_r = r;
              worst_scalar = std::max(worst_scalar,
                                      std::isfinite(g) ? std::fabs(g - scalar[size_t(r)]) / allowed : INFINITY);
            }
            for (int64_t r = rows; r < stride; ++r)
              EXPECT_TRUE(std::isnan(got[size_t(i * stride + r)])) << "column " << r << " past the rows was written";
          }
          EXPECT_LE(worst, 1.0) << cpu_fast::to_string(GetParam()) << " q" << bits << " n " << n << " [" << rows << ", "
                                << cols << "]: token " << at_t << " row " << at_r << ", error / allowed " << worst;
          EXPECT_LE(worst_scalar, 1.0) << "against the scalar GEMV: q" << bits << " n " << n << " [" << rows << ", "
                                       << cols << "]";
          ++cases;
        }
  EXPECT_GT(cases, 200);
}

// A gathered batch (the tokens routed to one expert) gives what those tokens give in the whole.
TEST_P(GemmTest, GatheredTokensMatchTheirRows) {
  const int64_t n = 19, cols = 256, rows = 40;
  TestMatrix t = random_matrix(rows, cols, 4, 5);
  const std::vector<float> x = random_values(n * cols, 6);
  cpu_fast::TokenBatch all, some;
  cpu_fast::prepare_tokens(x.data(), n, cols, all);
  const std::vector<int32_t> picked = {18, 0, 3, 4, 5, 6, 7, 8, 9, 17, 2};
  std::vector<float> rows_of_some;
  cpu_fast::gather_tokens(all, picked.data(), int64_t(picked.size()), some, rows_of_some);
  for (size_t i = 0; i < picked.size(); ++i)
    ASSERT_EQ(rows_of_some[i * cols + 5], x[size_t(picked[i] * cols + 5)]) << "the gathered fp32 rows";
  cpu_fast::GemmScratch scratch;
  std::vector<float> y_all(size_t(n * rows), NAN), y_some(picked.size() * size_t(rows), NAN);
  cpu_fast::gemm_rows(t.m, all, 0, rows, y_all.data(), rows, scratch);
  cpu_fast::gemm_rows(t.m, some, 0, rows, y_some.data(), rows, scratch);
  for (size_t i = 0; i < picked.size(); ++i)
    for (int64_t r = 0; r < rows; ++r)
      ASSERT_EQ(y_some[i * size_t(rows) + size_t(r)], y_all[size_t(picked[i] * rows + r)]) << "token " << i;
}

INSTANTIATE_TEST_SUITE_P(Isas, GemmTest, ::testing::Values(Isa::scalar, Isa::avx2, Isa::avx512),
                         [](const auto& info) { return std::string(cpu_fast::to_string(info.param)); });

// Every column of a group appears once in kQuadOrder; a tiled batch holds x16 = 256 a + b.
TEST(GemmLayout, QuadOrderIsAPermutation) {
  std::set<int> seen(cpu_fast::kQuadOrder.begin(), cpu_fast::kQuadOrder.end());
  EXPECT_EQ(seen.size(), 64u);
  EXPECT_EQ(*seen.begin(), 0);
  EXPECT_EQ(*seen.rbegin(), 63);
}

TEST(GemmLayout, TiledHalvesRebuildX16) {
  if (!cpu_fast::isa_supported(Isa::avx512)) GTEST_SKIP() << "tiled batches are the AVX-512 kernel's";
  cpu_fast::use_isa(Isa::avx512);
  const int64_t n = 11, cols = 192;
  std::vector<float> x = random_values(n * cols, 9);
  x[5] = 0.f, x[cols + 7] = 1e-30f, x[2 * cols + 9] = -1e4f;  // a tiny value, an outlier
  cpu_fast::TokenBatch batch;
  cpu_fast::prepare_tokens(x.data(), n, cols, batch);
  ASSERT_TRUE(batch.tiled);
  cpu_fast::QuantizedInput in;
  for (int64_t t = 0; t < n; ++t) {
    cpu_fast::quantize_input(x.data() + t * cols, cols, 64, in);
    for (int64_t g = 0; g < cols / 64; ++g) {
      EXPECT_EQ(batch.unit[size_t(cpu_fast::group_index(batch, t, g))], in.unit[size_t(g)]);
      EXPECT_EQ(batch.qsum[size_t(cpu_fast::group_index(batch, t, g))], in.qsum[size_t(g)]);
      for (int i = 0; i < 16; ++i) {
        const int32_t a = batch.quads[size_t(cpu_fast::quad_index(batch, t, g, i, 0))];
        const int32_t b = batch.quads[size_t(cpu_fast::quad_index(batch, t, g, i, 1))];
        for (int j = 0; j < 4; ++j) {
          const int c = cpu_fast::kQuadOrder[size_t(4 * i + j)];
          const int high = int8_t(uint32_t(a) >> (8 * j)), low = int8_t(uint32_t(b) >> (8 * j));
          ASSERT_EQ(256 * high + low, in.x16[size_t(g * 64 + c)]) << "token " << t << " column " << g * 64 + c;
        }
      }
    }
  }
  cpu_fast::use_isa(cpu_fast::best_isa());
}

// gemm_share: a team of 3 (not the process's) covers every row of products of unequal shapes
// once, each row as gemm_rows alone writes it.
TEST(GemmShare, MembersCoverEveryRowOnce) {
  TestMatrix a = random_matrix(70, 128, 4, 21), b = random_matrix(5, 2048, 4, 22), c = random_matrix(33, 64, 8, 23);
  const Matrix* mats[] = {&a.m, &b.m, &c.m};
  const int64_t n = 10;
  std::vector<std::vector<float>> xs, want, got;
  std::vector<cpu_fast::TokenBatch> batches(3);
  std::vector<cpu_fast::PreparedGemm> products;
  cpu_fast::GemmScratch scratch;
  for (size_t i = 0; i < 3; ++i) {
    xs.push_back(random_values(n * mats[i]->cols, 30 + uint32_t(i)));
    want.emplace_back(size_t(n * mats[i]->rows), NAN);
    got.emplace_back(size_t(n * mats[i]->rows), NAN);
    cpu_fast::prepare_tokens(xs[i].data(), n, mats[i]->cols, batches[i]);
    cpu_fast::gemm_rows(*mats[i], batches[i], 0, mats[i]->rows, want[i].data(), mats[i]->rows, scratch);
  }
  for (size_t i = 0; i < 3; ++i) products.push_back({mats[i], &batches[i], got[i].data()});
  ThreadTeam team(3);
  std::vector<cpu_fast::GemmScratch> scratches(3);
  team.run([&](ThreadTeam::Member& m) {
    cpu_fast::gemm_share(products.data(), products.size(), m, scratches[size_t(m.index())]);
  });
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(got[i], want[i]) << "product " << i;
}

}  // namespace
}  // namespace lily
