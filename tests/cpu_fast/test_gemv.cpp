// The GEMV kernels of src/backend/cpu_fast against cpu::linear (the reference), for every
// instruction set this processor runs (the others skip, saying so): rows 1, 63, 64, 65 and
// more, columns 64 .. 4096, 4 and 8 bits, groups of 32, 64, 128, outputs poisoned with NaN.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backend/cpu/ops.h"
#include "backend/cpu_fast/gemv.h"
#include "model/quant.h"

namespace lily {
namespace {

using cpu_fast::Isa;

// A random affine-quantized matrix (MLX's quantizer: negative scales and max-edge biases occur).
struct TestMatrix {
  QuantizedMatrix q;
  Matrix m;
};

TestMatrix random_matrix(int64_t rows, int64_t cols, int bits, int group_size, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> w(size_t(rows * cols));
  for (auto& v : w) v = dist(rng);
  TestMatrix t;
  t.q = quantize_affine(w, rows, cols, bits, group_size);
  t.m.rows = rows;
  t.m.cols = cols;
  t.m.format = MatrixFormat::affine;
  t.m.data = t.q.codes.data();
  t.m.scales = t.q.scales.data();
  t.m.biases = t.q.biases.data();
  t.m.bits = bits;
  t.m.group_size = group_size;
  return t;
}

std::vector<float> random_vector(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-2.f, 2.f);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = dist(rng);
  return x;
}

// Largest |got - want| relative to the row's sum |w_c x_c| (the scale of fp32 rounding).
struct Error {
  double worst = 0;
  int64_t worst_row = -1;
};
Error compare_rows(const Matrix& W, const float* x, const std::vector<float>& got, const std::vector<float>& want,
                   int64_t r0, int64_t r1) {
  Error e;
  std::vector<float> row(static_cast<size_t>(W.cols));
  for (int64_t r = r0; r < r1; ++r) {
    W.dequantize_row(r, row.data());
    double magnitude = 1e-30;
    for (int64_t c = 0; c < W.cols; ++c) magnitude += std::fabs(double(row[size_t(c)]) * x[c]);
    const double err = std::isfinite(got[size_t(r)]) ? std::fabs(double(got[size_t(r)]) - want[size_t(r)]) / magnitude
                                                     : INFINITY;
    if (err > e.worst || std::isnan(err)) e.worst = err, e.worst_row = r;
  }
  return e;
}

class GemvTest : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!cpu_fast::isa_supported(GetParam()))
      GTEST_SKIP() << "this processor does not run the " << cpu_fast::to_string(GetParam()) << " kernel";
  }
};

TEST_P(GemvTest, MatchesReferenceAtEdgeSizes) {
  const Isa isa = GetParam();
  int cases = 0;
  for (int bits : {4, 8})
    for (int group : {64, 32, 128})
      for (int64_t rows : {1, 2, 3, 63, 64, 65, 111})
        for (int64_t cols : {64, 128, 192, 256, 512, 1024, 2048, 4096}) {
          if (cols % group != 0 || (group != 64 && cols > 1024)) continue;
          const uint32_t seed = uint32_t(bits * 1000003 + group * 7919 + rows * 131 + cols);
          TestMatrix t = random_matrix(rows, cols, bits, group, seed);
          std::vector<float> x = random_vector(cols, seed + 1);
          std::vector<float> want(size_t(rows), NAN), got(size_t(rows), NAN);
          cpu::linear(t.m, x.data(), 1, want.data());
          cpu_fast::gemv(t.m, x.data(), got.data(), isa);
          const Error e = compare_rows(t.m, x.data(), got, want, 0, rows);
          EXPECT_LE(e.worst, 1e-5) << cpu_fast::to_string(isa) << " q" << bits << "g" << group << " [" << rows << ", "
                                   << cols << "]: row " << e.worst_row << " got "
                                   << got[size_t(std::max<int64_t>(0, e.worst_row))] << " want "
                                   << want[size_t(std::max<int64_t>(0, e.worst_row))];
          ++cases;
        }
  EXPECT_GT(cases, 100);
}

TEST_P(GemvTest, WritesOnlyItsRows) {
  const Isa isa = GetParam();
  for (int bits : {4, 8}) {
    TestMatrix t = random_matrix(65, 256, bits, 64, 7u + uint32_t(bits));
    std::vector<float> x = random_vector(256, 8);
    std::vector<float> xsum(4), want(65, NAN), got(65, NAN);
    cpu_fast::group_sums(x.data(), 256, 64, xsum.data());
    cpu::linear(t.m, x.data(), 1, want.data());
    cpu_fast::gemv_rows_kernel(isa)(t.m, x.data(), xsum.data(), 5, 9, got.data());
    for (int64_t r = 0; r < 65; ++r) {
      if (r >= 5 && r < 9) EXPECT_NEAR(got[size_t(r)], want[size_t(r)], 1e-4 * (1 + std::fabs(want[size_t(r)])));
      else EXPECT_TRUE(std::isnan(got[size_t(r)])) << "row " << r << " outside [5, 9) was written";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isas, GemvTest, ::testing::Values(Isa::scalar, Isa::avx2, Isa::avx512),
                         [](const auto& info) { return std::string(cpu_fast::to_string(info.param)); });

// Several products in one fork-join, with blocks of rows across tasks and a plain f32 matrix
// (which the kernels do not take) among them.
TEST(GemvParallel, ManyTasksMatchReference) {
  TestMatrix a = random_matrix(2048, 64, 4, 64, 11), b = random_matrix(65, 4096, 8, 64, 12),
             c = random_matrix(3, 512, 4, 64, 13);
  std::vector<float> plain_values = random_vector(130 * 256, 14);
  Matrix plain;
  plain.rows = 130, plain.cols = 256, plain.format = MatrixFormat::f32, plain.data = plain_values.data();
  ASSERT_FALSE(cpu_fast::gemv_supported(plain));
  const Matrix* mats[] = {&a.m, &b.m, &c.m, &plain};
  std::vector<std::vector<float>> xs, want, got;
  std::vector<cpu_fast::GemvTask> tasks;
  for (size_t i = 0; i < 4; ++i) {
    xs.push_back(random_vector(mats[i]->cols, 20 + uint32_t(i)));
    want.emplace_back(size_t(mats[i]->rows), NAN);
    got.emplace_back(size_t(mats[i]->rows), NAN);
    cpu::linear(*mats[i], xs[i].data(), 1, want[i].data());
  }
  for (size_t i = 0; i < 4; ++i) tasks.push_back({mats[i], xs[i].data(), got[i].data()});
  cpu_fast::gemv_parallel(tasks);
  for (size_t i = 0; i < 4; ++i) {
    const Error e = compare_rows(*mats[i], xs[i].data(), got[i], want[i], 0, mats[i]->rows);
    EXPECT_LE(e.worst, 1e-5) << "task " << i << " (" << mats[i]->describe() << "): row " << e.worst_row;
  }
}

// T > 1 goes to the reference unchanged; T = 1 to the kernels.
TEST(GemvLinear, TokensBeyondOneUseReference) {
  TestMatrix t = random_matrix(63, 256, 4, 64, 31);
  std::vector<float> x = random_vector(3 * 256, 32);
  std::vector<float> want(3 * 63, NAN), got(3 * 63, NAN);
  cpu::linear(t.m, x.data(), 3, want.data());
  cpu_fast::linear(t.m, x.data(), 3, got.data());
  EXPECT_EQ(got, want);
  std::vector<float> one(63, NAN);
  cpu_fast::linear(t.m, x.data() + 256, 1, one.data());
  for (int64_t r = 0; r < 63; ++r) EXPECT_NEAR(one[size_t(r)], want[size_t(63 + r)], 1e-4);
}

}  // namespace
}  // namespace lily
