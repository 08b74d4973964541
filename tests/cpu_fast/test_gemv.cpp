// The GEMV kernels of src/backend/cpu_fast against cpu::linear (the reference), for every
// instruction set this processor runs (the others skip, saying so) and both kinds of kernel:
// rows 1, 63, 64, 65 and more, columns 64 .. 4096, 4 and 8 bits, outputs poisoned with NaN.
//
// Error bars, relative to a row's magnitude M = sum_c |w_c x_c| (the scale of fp32 rounding):
//   fp32 kernels   |y - ref| <= 1e-5 M
//   integer kernels  |y - ref| <= B + 1e-5 M,  B = sum_g unit_g / 2 * sum_{c in g} |w_c|
// B is the most x's rounding to 16-bit integers can move a row (quantized_input.h): each
// |x - unit x16| is at most unit / 2 and enters the dot product multiplied by w. The integer
// SIMD kernels must also equal the scalar one within 1e-5 M: the same integer sums, in another
// order.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <tuple>

#include "backend/cpu/ops.h"
#include "backend/cpu_fast/gemm.h"
#include "backend/cpu_fast/gemv.h"
#include "model/quant.h"

namespace lily {
namespace {

using cpu_fast::Dot;
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

// Per row: the magnitude M and, for the integer kernels, the bound B of the file's comment.
struct RowScale {
  std::vector<double> magnitude, integer_bound;
};
RowScale row_scales(const Matrix& W, const float* x) {
  RowScale s;
  cpu_fast::QuantizedInput in;
  cpu_fast::quantize_input(x, W.cols, W.group_size, in);
  std::vector<float> row(static_cast<size_t>(W.cols));
  for (int64_t r = 0; r < W.rows; ++r) {
    W.dequantize_row(r, row.data());
    double m = 1e-30, b = 0;
    for (int64_t c = 0; c < W.cols; ++c) {
      m += std::fabs(double(row[size_t(c)]) * x[c]);
      if (in.quantized) b += in.unit[size_t(c / W.group_size)] / 2 * std::fabs(row[size_t(c)]);
    }
    s.magnitude.push_back(m);
    s.integer_bound.push_back(b);
  }
  return s;
}

// The worst |got - want| over rows [r0, r1) as a fraction of its allowance (> 1 fails).
struct Error {
  double worst = 0;
  int64_t row = -1;
};
Error compare_rows(const RowScale& s, bool integer_bound, const std::vector<float>& got, const std::vector<float>& want,
                   int64_t r0, int64_t r1) {
  Error e;
  for (int64_t r = r0; r < r1; ++r) {
    const double allowed = 1e-5 * s.magnitude[size_t(r)] + (integer_bound ? s.integer_bound[size_t(r)] : 0.0);
    const double err = std::isfinite(got[size_t(r)]) ? std::fabs(double(got[size_t(r)]) - want[size_t(r)]) / allowed
                                                     : INFINITY;
    if (err > e.worst || std::isnan(err)) e.worst = err, e.row = r;
  }
  return e;
}

std::string describe(Isa isa, Dot dot, const Matrix& W) {
  return std::string(cpu_fast::to_string(isa)) + "/" + cpu_fast::to_string(dot) + " q" + std::to_string(W.bits) + "g" +
         std::to_string(W.group_size) + " [" + std::to_string(W.rows) + ", " + std::to_string(W.cols) + "]";
}

class GemvTest : public ::testing::TestWithParam<std::tuple<Isa, Dot>> {
 protected:
  void SetUp() override {
    if (!cpu_fast::isa_supported(isa()))
      GTEST_SKIP() << "this processor does not run the " << cpu_fast::to_string(isa()) << " kernels";
  }
  Isa isa() const { return std::get<0>(GetParam()); }
  Dot dot() const { return std::get<1>(GetParam()); }
};

TEST_P(GemvTest, MatchesReferenceAtEdgeSizes) {
  const Isa isa = this->isa();
  const Dot dot = this->dot();
  const std::vector<int> groups = dot == Dot::integer ? std::vector<int>{64} : std::vector<int>{64, 32, 128};
  // integer: 1, 2, 3, 15, 16, 17, 32, 33, 64 groups (the 16-group blocks, a row's odd last group).
  const std::vector<int64_t> widths = dot == Dot::integer
                                          ? std::vector<int64_t>{64, 128, 192, 960, 1024, 1088, 2048, 2112, 4096}
                                          : std::vector<int64_t>{64, 128, 192, 256, 512, 1024, 2048, 4096};
  int cases = 0;
  for (int bits : {4, 8})
    for (int group : groups)
      for (int64_t rows : {1, 2, 3, 63, 64, 65, 111})
        for (int64_t cols : widths) {
          if (cols % group != 0 || (group != 64 && cols > 1024)) continue;
          const uint32_t seed = uint32_t(bits * 1000003 + group * 7919 + rows * 131 + cols);
          TestMatrix t = random_matrix(rows, cols, bits, group, seed);
          std::vector<float> x = random_vector(cols, seed + 1);
          std::vector<float> want(size_t(rows), NAN), got(size_t(rows), NAN), scalar(size_t(rows), NAN);
          cpu::linear(t.m, x.data(), 1, want.data());
          cpu_fast::gemv(t.m, x.data(), got.data(), isa, dot);
          const RowScale s = row_scales(t.m, x.data());
          const Error e = compare_rows(s, dot == Dot::integer, got, want, 0, rows);
          EXPECT_LE(e.worst, 1.0) << describe(isa, dot, t.m) << ": row " << e.row << " got "
                                  << got[size_t(std::max<int64_t>(0, e.row))] << " want "
                                  << want[size_t(std::max<int64_t>(0, e.row))] << ", error / allowed " << e.worst;
          cpu_fast::gemv(t.m, x.data(), scalar.data(), Isa::scalar, dot);
          const Error same = compare_rows(s, false, got, scalar, 0, rows);
          EXPECT_LE(same.worst, 1.0) << describe(isa, dot, t.m) << " vs the scalar kernel: row " << same.row;
          ++cases;
        }
  EXPECT_GT(cases, 100);
}

TEST_P(GemvTest, WritesOnlyItsRows) {
  for (int bits : {4, 8}) {
    TestMatrix t = random_matrix(65, 256, bits, 64, 7u + uint32_t(bits));
    std::vector<float> x = random_vector(256, 8);
    std::vector<float> want(65, NAN), got(65, NAN);
    cpu_fast::QuantizedInput in;
    cpu_fast::quantize_input(x.data(), 256, 64, in);
    cpu::linear(t.m, x.data(), 1, want.data());
    cpu_fast::gemv_rows_kernel(isa(), dot())(t.m, in, 5, 9, got.data());
    const RowScale s = row_scales(t.m, x.data());
    const Error e = compare_rows(s, dot() == Dot::integer, got, want, 5, 9);
    EXPECT_LE(e.worst, 1.0) << describe(isa(), dot(), t.m) << ": row " << e.row;
    for (int64_t r = 0; r < 65; ++r)
      EXPECT_TRUE((r >= 5 && r < 9) || std::isnan(got[size_t(r)])) << "row " << r << " outside [5, 9) was written";
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, GemvTest,
                         ::testing::Combine(::testing::Values(Isa::scalar, Isa::avx2, Isa::avx512),
                                            ::testing::Values(Dot::fp32, Dot::integer)),
                         [](const auto& info) {
                           return std::string(cpu_fast::to_string(std::get<0>(info.param))) + "_" +
                                  cpu_fast::to_string(std::get<1>(info.param));
                         });

// x to 16-bit integers: within unit / 2 of x, x16 = 254 a + b with a, b in [-127, 127] in
// nibble order (a permutation of the columns), padding zero; a zero group gives unit 0, and a
// NaN reaches the group's sum and unit.
TEST(QuantizeInput, RoundsWithinHalfAUnit) {
  std::vector<float> x = random_vector(192 + 64, 3);
  std::fill(x.begin() + 64, x.begin() + 128, 0.f);  // group 1 all zero
  x[200] = 1e-30f;                                  // a tiny value beside normal ones
  x[201] = -x[202] * 1e3f;                          // an outlier
  cpu_fast::QuantizedInput in;
  cpu_fast::quantize_input(x.data(), 256, 64, in);
  ASSERT_TRUE(in.quantized);
  ASSERT_EQ(in.unit.size(), 16u);
  ASSERT_EQ(in.a_nibbles.size(), 256u);
  EXPECT_EQ(in.unit[1], 0.f);
  for (int64_t c = 0; c < 256; ++c) {
    const float unit = in.unit[size_t(c / 64)];
    EXPECT_LE(std::fabs(x[size_t(c)] - unit * in.x16[size_t(c)]), unit / 2 * (1 + 1e-6f) + 1e-38f) << "column " << c;
    const int64_t block = c / 128 * 128, i = c % 128, at = block + (i % 2) * 64 + i / 2;
    const int a = in.a_nibbles[size_t(at)], b = in.b_nibbles[size_t(at)];
    EXPECT_EQ(254 * a + b, in.x16[size_t(c)]) << "column " << c;
    EXPECT_TRUE(std::abs(a) <= 127 && std::abs(b) <= 127) << "column " << c << ": " << a << ", " << b;
  }
  for (int g = 0; g < 4; ++g) {
    int32_t s = 0;
    for (int c = 0; c < 64; ++c) s += in.x16[size_t(g * 64 + c)];
    EXPECT_FLOAT_EQ(in.qsum[size_t(g)], in.unit[size_t(g)] * float(s)) << "group " << g;
  }
  for (int g = 4; g < 16; ++g) EXPECT_EQ(in.unit[size_t(g)], 0.f) << "padding group " << g;
  x[70] = NAN;
  cpu_fast::quantize_input(x.data(), 256, 64, in);
  EXPECT_TRUE(std::isnan(in.sum[1]));
  EXPECT_TRUE(std::isnan(in.unit[1]));
}

// Groups quantized in parts (as the members of a region do) equal the whole at once.
TEST(QuantizeInput, GroupsInPartsEqualTheWhole) {
  const std::vector<float> x = random_vector(5 * 64, 4);
  cpu_fast::QuantizedInput whole, parts;
  cpu_fast::quantize_input(x.data(), 5 * 64, 64, whole);
  cpu_fast::reset_input(x.data(), 5 * 64, 64, parts);
  cpu_fast::quantize_groups(parts, 3, 5);
  cpu_fast::quantize_groups(parts, 0, 3);
  EXPECT_EQ(parts.x16, whole.x16);
  EXPECT_EQ(parts.a_nibbles, whole.a_nibbles);
  EXPECT_EQ(parts.b_nibbles, whole.b_nibbles);
  EXPECT_EQ(parts.unit, whole.unit);
  EXPECT_EQ(parts.qsum, whole.qsum);
  EXPECT_EQ(parts.sum, whole.sum);
}

// Several products in one fork-join, with blocks of rows across tasks, two of them sharing x,
// groups of 64 (integer) and 32 (fp32), and a plain f32 matrix (which the kernels do not take).
TEST(GemvParallel, ManyTasksMatchReference) {
  TestMatrix a = random_matrix(2048, 64, 4, 64, 11), b = random_matrix(65, 4096, 8, 64, 12),
             c = random_matrix(3, 512, 4, 64, 13), d = random_matrix(130, 512, 4, 32, 15);
  std::vector<float> plain_values = random_vector(130 * 256, 14);
  Matrix plain;
  plain.rows = 130, plain.cols = 256, plain.format = MatrixFormat::f32, plain.data = plain_values.data();
  ASSERT_FALSE(cpu_fast::gemv_supported(plain));
  const Matrix* mats[] = {&a.m, &b.m, &c.m, &d.m, &plain};
  std::vector<std::vector<float>> xs, want, got;
  std::vector<cpu_fast::GemvTask> tasks;
  for (size_t i = 0; i < 5; ++i) {
    xs.push_back(random_vector(mats[i]->cols, 20 + uint32_t(i)));
    want.emplace_back(size_t(mats[i]->rows), NAN);
    got.emplace_back(size_t(mats[i]->rows), NAN);
  }
  xs[3] = xs[2];  // c and d read one x through one pointer, with different group sizes
  for (size_t i = 0; i < 5; ++i) {
    const float* x = i == 3 ? xs[2].data() : xs[i].data();
    cpu::linear(*mats[i], x, 1, want[i].data());
    tasks.push_back({mats[i], x, got[i].data()});
  }
  cpu_fast::gemv_parallel(tasks);
  for (size_t i = 0; i < 5; ++i) {
    const bool integer = cpu_fast::gemv_supported(*mats[i]) && cpu_fast::preferred_dot(*mats[i]) == Dot::integer;
    const RowScale s = mats[i]->quantized() ? row_scales(*mats[i], tasks[i].x) : RowScale{};
    if (!mats[i]->quantized()) {
      for (int64_t r = 0; r < mats[i]->rows; ++r) EXPECT_NEAR(got[i][size_t(r)], want[i][size_t(r)], 1e-4);
      continue;
    }
    const Error e = compare_rows(s, integer, got[i], want[i], 0, mats[i]->rows);
    EXPECT_LE(e.worst, 1.0) << "task " << i << " (" << mats[i]->describe() << "): row " << e.row;
  }
}

// A team of 3 members (not the process's) splits the rows of products of unequal widths by
// weight: every row written once, each as the single-thread kernel writes it.
TEST(GemvShare, MembersCoverEveryRowOnce) {
  TestMatrix a = random_matrix(5, 2048, 4, 64, 41), b = random_matrix(130, 128, 4, 64, 42),
             c = random_matrix(1, 64, 8, 64, 43);
  const Matrix* mats[] = {&a.m, &b.m, &c.m};
  std::vector<std::vector<float>> xs, want, got;
  std::vector<cpu_fast::QuantizedInput> inputs(3);
  std::vector<cpu_fast::PreparedGemv> products;
  for (size_t i = 0; i < 3; ++i) {
    xs.push_back(random_vector(mats[i]->cols, 50 + uint32_t(i)));
    want.emplace_back(size_t(mats[i]->rows), NAN);
    got.emplace_back(size_t(mats[i]->rows), NAN);
    cpu_fast::gemv(*mats[i], xs[i].data(), want[i].data());
    cpu_fast::prepare_input(*mats[i], xs[i].data(), inputs[i]);
    products.push_back({mats[i], &inputs[i], got[i].data()});
  }
  ThreadTeam team(3);
  team.run([&](ThreadTeam::Member& m) { cpu_fast::gemv_share(products, m); });
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(got[i], want[i]) << "product " << i;
}

// linear (gemm.h): T = 1 (the GEMV kernels) and T > 1 (the prefill GEMM) within the bars of
// each kernel; a matrix the kernels do not take has its rows dequantized, as cpu::linear.
TEST(GemvLinear, TokensMatchReference) {
  for (int64_t T : {1, 2, 3, 17, 65})
    for (int64_t rows : {1, 15, 16, 17, 63, 130}) {
      TestMatrix t = random_matrix(rows, 256, 4, 64, uint32_t(31 + T * 7 + rows));
      std::vector<float> x = random_vector(T * 256, uint32_t(32 + T));
      std::vector<float> want(size_t(T * rows), NAN), got(size_t(T * rows), NAN);
      cpu::linear(t.m, x.data(), T, want.data());
      cpu_fast::linear(t.m, x.data(), T, got.data());
      for (int64_t i = 0; i < T; ++i) {
        const RowScale s = row_scales(t.m, x.data() + i * 256);
        const std::vector<float> g(got.begin() + i * rows, got.begin() + (i + 1) * rows),
            w(want.begin() + i * rows, want.begin() + (i + 1) * rows);
        const Error e = compare_rows(s, true, g, w, 0, rows);
        EXPECT_LE(e.worst, 1.0) << "T " << T << " rows " << rows << ": token " << i << " row " << e.row;
      }
    }
  std::vector<float> plain_values = random_vector(7 * 96, 33), x = random_vector(3 * 96, 34);
  Matrix plain;
  plain.rows = 7, plain.cols = 96, plain.format = MatrixFormat::f32, plain.data = plain_values.data();
  std::vector<float> want(21, NAN), got(21, NAN);
  cpu::linear(plain, x.data(), 3, want.data());
  cpu_fast::linear(plain, x.data(), 3, got.data());
  EXPECT_EQ(got, want);
}

}  // namespace
}  // namespace lily
