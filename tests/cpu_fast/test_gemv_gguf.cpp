// The GGUF block-format products (src/backend/cpu_fast/gemv_gguf.h) against the reference
// decoder (src/model/gguf_dequant.h) times x in double, for F32, F16, BF16, Q8_0, Q4_0, Q4_K,
// Q5_K, Q6_K and IQ4_XS: rows 1, 63, 64, 65, columns one block, 256, 512, 2048 (and odd lengths
// for the plain types), x unaligned, outputs poisoned with NaN; random blocks one by one; and
// the product through cpu_fast::gemv, which takes GGUF matrices; the integer kernels of
// Q4_K, Q5_K, Q6_K, Q8_0 and Q4_0 (gemv_gguf_avx512.cpp) within gemv_gguf.h's bound at 1, 63,
// 64, 65, 255, 256 and 257 rows and blocks, and on random blocks one by one (Q5_K's also
// against q5_k_by_definition below, a decoder written from the format's definition).
//
// Error bar: the kernels widen the codes to float and accumulate in fp32, so
//   |y - ref| <= 1e-5 M,   M = sum_c |w_c x_c|   (w the reference decoding)
// LILY_CPU_CLONES picks one clone per processor: the run checks the one this processor runs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>

#include "../model/gguf_quantize.h"
#include "backend/cpu_fast/gemv.h"
#include "backend/cpu_fast/gemv_gguf.h"
#include "base/error.h"
#include "model/gguf_dequant.h"

namespace lily {
namespace {

struct GgufTestMatrix {
  std::vector<uint8_t> bytes;
  Matrix m;
};

// rows x cols of N(0, 1) weights quantized by the test quantizers.
GgufTestMatrix quantized_matrix(GgmlType type, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0, 1);
  std::vector<float> w(static_cast<size_t>(cols));
  GgufTestMatrix t;
  for (int64_t r = 0; r < rows; ++r) {
    for (auto& v : w) v = normal(rng);
    auto row = test::quantize_gguf_row(type, w.data(), cols);
    t.bytes.insert(t.bytes.end(), row.begin(), row.end());
  }
  t.m.rows = rows, t.m.cols = cols, t.m.format = MatrixFormat::gguf, t.m.gguf_type = type, t.m.data = t.bytes.data();
  return t;
}

// Offsets of the f16 scale fields in each block type (the rest of a random block is any bytes).
std::vector<int> f16_fields(GgmlType type) {
  switch (type) {
    case GgmlType::Q4_K:
    case GgmlType::Q5_K: return {0, 2};
    case GgmlType::Q6_K: return {208};
    case GgmlType::F32:
    case GgmlType::F16:
    case GgmlType::BF16: return {};
    default: return {0};
  }
}

// `rows` rows of one random block each: every code, scale and bit pattern, finite f16 scales.
GgufTestMatrix random_blocks(GgmlType type, int64_t rows, uint32_t seed) {
  std::mt19937 rng(seed);
  const GgmlTypeInfo& info = ggml_type_info(type);
  GgufTestMatrix t;
  t.bytes.resize(size_t(rows * info.block_bytes));
  for (auto& b : t.bytes) b = uint8_t(rng());
  std::uniform_real_distribution<float> scale(-0.05f, 0.05f);
  for (int64_t r = 0; r < rows; ++r)
    for (int off : f16_fields(type)) test::put_f16(t.bytes.data() + r * info.block_bytes + off, scale(rng));
  t.m.rows = rows, t.m.cols = info.block_size, t.m.format = MatrixFormat::gguf, t.m.gguf_type = type;
  t.m.data = t.bytes.data();
  return t;
}

std::vector<float> random_x(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-2, 2);
  std::vector<float> x(size_t(n + 1));  // x starts at +1: unaligned
  for (auto& v : x) v = u(rng);
  return x;
}

// Checks y[r0..r1) against the reference and that the other rows kept their NaN.
void expect_rows_match(const Matrix& W, const float* x, const std::vector<float>& y, int64_t r0, int64_t r1) {
  std::vector<float> w(size_t(W.cols));
  double worst = 0;
  for (int64_t r = 0; r < W.rows; ++r) {
    if (r < r0 || r >= r1) {
      ASSERT_TRUE(std::isnan(y[size_t(r)])) << "row " << r << " outside [" << r0 << ", " << r1 << ") written";
      continue;
    }
    W.dequantize_row(r, w.data());
    double ref = 0, mag = 0;
    for (int64_t c = 0; c < W.cols; ++c)
      ref += double(w[size_t(c)]) * x[c], mag += std::fabs(double(w[size_t(c)]) * x[c]);
    const double err = std::fabs(double(y[size_t(r)]) - ref);
    ASSERT_LE(err, 1e-5 * mag + 1e-30) << W.describe() << " row " << r << ": " << y[size_t(r)] << " vs " << ref;
    worst = std::max(worst, mag > 0 ? err / mag : err);
  }
  ::testing::Test::RecordProperty("worst_relative_error", std::to_string(worst));
}

TEST(GemvGguf, MatricesAtEdgeSizes) {
  for (GgmlType type : test::kGgufTestTypes) {
    const int64_t block = ggml_type_info(type).block_size;
    for (int64_t cols : {block, int64_t(256), int64_t(512), int64_t(2048)})
      for (int64_t rows : {1, 63, 64, 65}) {
        SCOPED_TRACE(fmt::format("{} [{}, {}]", to_string(type), rows, cols));
        const auto t = quantized_matrix(type, rows, cols, uint32_t(rows * 7919 + cols));
        const auto xs = random_x(cols, uint32_t(cols));
        std::vector<float> y(size_t(rows), NAN);
        cpu_fast::gguf_gemv_rows(t.m, xs.data() + 1, 0, rows, y.data());
        expect_rows_match(t.m, xs.data() + 1, y, 0, rows);
        // A slice of the rows, as a thread's share.
        if (rows > 2) {
          std::fill(y.begin(), y.end(), NAN);
          cpu_fast::gguf_gemv_rows(t.m, xs.data() + 1, 1, rows - 1, y.data());
          expect_rows_match(t.m, xs.data() + 1, y, 1, rows - 1);
        }
      }
  }
}

TEST(GemvGguf, RandomBlocksOneByOne) {
  for (GgmlType type : test::kGgufTestTypes) {
    if (ggml_type_info(type).block_size == 1) continue;
    SCOPED_TRACE(to_string(type));
    const auto t = random_blocks(type, 300, uint32_t(type) + 1);
    const auto xs = random_x(t.m.cols, 5);
    std::vector<float> y(300, NAN);
    cpu_fast::gguf_gemv_rows(t.m, xs.data() + 1, 0, 300, y.data());
    expect_rows_match(t.m, xs.data() + 1, y, 0, 300);
  }
}

// F32, F16 and BF16 rows may have any length: the vector body and the scalar tail.
TEST(GemvGguf, PlainRowsOfOddLengths) {
  for (GgmlType type : {GgmlType::F32, GgmlType::F16, GgmlType::BF16})
    for (int64_t cols : {1, 15, 17, 100, 1023}) {
      SCOPED_TRACE(fmt::format("{} x {}", to_string(type), cols));
      const auto t = quantized_matrix(type, 3, cols, uint32_t(cols));
      const auto xs = random_x(cols, 9);
      std::vector<float> y(3, NAN);
      cpu_fast::gguf_gemv_rows(t.m, xs.data() + 1, 0, 3, y.data());
      expect_rows_match(t.m, xs.data() + 1, y, 0, 3);
    }
}

// cpu_fast::gemv takes GGUF matrices (through the GGUF kernels, not row dequantization): the
// integer ones where x is quantized for them, checked in IntegerKernels* below.
TEST(GemvGguf, ThroughCpuFastGemv) {
  for (GgmlType type : test::kGgufTestTypes) {
    SCOPED_TRACE(to_string(type));
    const auto t = quantized_matrix(type, 65, 512, 3);
    const auto xs = random_x(512, 4);
    std::vector<float> y(65, NAN), direct(65, NAN);
    cpu_fast::gemv(t.m, xs.data() + 1, y.data());
    cpu_fast::QuantizedInput in;
    cpu_fast::prepare_input(t.m, xs.data() + 1, in);
    EXPECT_EQ(in.quantized, cpu_fast::gguf_integer_supported(t.m));
    cpu_fast::gguf_gemv_rows(t.m, in, 0, 65, direct.data());
    EXPECT_EQ(y, direct);
    if (!in.quantized) expect_rows_match(t.m, xs.data() + 1, y, 0, 65);
  }
}

// The integer kernels (Q4_K, Q5_K, Q6_K, Q8_0, Q4_0 against x16) within gemv_gguf.h's bound:
//   |y - ref| <= sum_g unit[g] / 2 * sum_{c in g} |w_c|  +  1e-6 M
// x's groups of 64 span three decades (each group its own unit), outputs poisoned with NaN.
constexpr GgmlType kIntegerTypes[] = {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::Q4_0};

float f16_value(const uint8_t* p) {
  _Float16 h;
  std::memcpy(&h, p, 2);
  return float(h);
}

// ggml's block_q5_K from its definition, one value at a time (not gguf_dequant's loop):
//   { f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]; }, 256 values, sub-block s = j / 32,
//   l = j % 32: q = nibble s % 2 of qs[32 (s / 2) + l] | bit s of qh[l] << 4, in 0..31;
//   6-bit (sc, m) of s: s < 4 the low 6 bits of scales[s], scales[s + 4]; s >= 4 the nibbles
//   of scales[s + 4] with the top 2 bits of scales[s - 4], scales[s] above them.
//   value = d sc q - dmin m.
void q5_k_by_definition(const uint8_t* block, float* out) {
  const float d = f16_value(block), dmin = f16_value(block + 2);
  const uint8_t* scales = block + 4;
  const uint8_t* qh = block + 16;
  const uint8_t* qs = block + 48;
  for (int j = 0; j < 256; ++j) {
    const int s = j / 32, l = j % 32;
    const int sc = s < 4 ? scales[s] & 63 : (scales[s + 4] & 0xF) | (scales[s - 4] >> 6) << 4;
    const int m = s < 4 ? scales[s + 4] & 63 : (scales[s + 4] >> 4) | (scales[s] >> 6) << 4;
    const int q = ((qs[32 * (s / 2) + l] >> (4 * (s % 2))) & 0xF) | ((qh[l] >> s) & 1) << 4;
    out[j] = d * float(sc) * float(q) - dmin * float(m);
  }
}

// Row r of W decoded: by W.dequantize_row (gguf_dequant), or another decoder of the same row.
using RowDecoder = std::function<void(int64_t r, float* w)>;

std::vector<float> spread_x(int64_t n, uint32_t seed) {
  auto x = random_x(n, seed);
  for (int64_t c = 0; c < n; ++c) x[size_t(c + 1)] *= std::pow(10.0f, float((c / 64) % 3) - 1);
  return x;
}

void expect_integer_rows(const Matrix& W, const float* x, int64_t r0, int64_t r1, const RowDecoder& decode = {}) {
  ASSERT_TRUE(cpu_fast::gguf_integer_supported(W)) << W.describe();
  cpu_fast::QuantizedInput in;
  cpu_fast::prepare_input(W, x, in);
  ASSERT_TRUE(in.quantized);
  std::vector<float> y(size_t(W.rows), NAN), w(size_t(W.cols));
  cpu_fast::gguf_gemv_rows(W, in, r0, r1, y.data());
  double worst = 0;
  for (int64_t r = 0; r < W.rows; ++r) {
    if (r < r0 || r >= r1) {
      ASSERT_TRUE(std::isnan(y[size_t(r)])) << "row " << r << " outside [" << r0 << ", " << r1 << ") written";
      continue;
    }
    if (decode) decode(r, w.data());
    else W.dequantize_row(r, w.data());
    double ref = 0, mag = 0, bound = 0;
    for (int64_t c = 0; c < W.cols; ++c) {
      ref += double(w[size_t(c)]) * x[c], mag += std::fabs(double(w[size_t(c)]) * x[c]);
      bound += in.unit[size_t(c / 64)] / 2.0 * std::fabs(double(w[size_t(c)]));
    }
    const double err = std::fabs(double(y[size_t(r)]) - ref);
    ASSERT_LE(err, bound + 1e-6 * mag + 1e-30) << W.describe() << " row " << r << ": " << y[size_t(r)] << " vs " << ref;
    worst = std::max(worst, bound > 0 ? err / bound : 0.0);
  }
  ::testing::Test::RecordProperty("worst_error_over_bound", std::to_string(worst));
}

constexpr int64_t kEdgeSizes[] = {1, 63, 64, 65, 255, 256, 257};

TEST(GemvGguf, IntegerKernelsAtEdgeSizes) {
  if (!cpu_fast::isa_supported(cpu_fast::Isa::avx512)) GTEST_SKIP() << "no AVX-512 VNNI";
  for (GgmlType type : kIntegerTypes)
    for (int64_t cols : {int64_t(ggml_type_info(type).block_size == 256 ? 256 : 64), int64_t(512), int64_t(2048)})
      for (int64_t rows : kEdgeSizes) {
        SCOPED_TRACE(fmt::format("{} [{}, {}]", to_string(type), rows, cols));
        const auto t = quantized_matrix(type, rows, cols, uint32_t(rows * 31 + cols));
        const auto xs = spread_x(cols, uint32_t(cols + 7));
        expect_integer_rows(t.m, xs.data() + 1, 0, rows);
        if (rows > 2) expect_integer_rows(t.m, xs.data() + 1, 1, rows - 1);
      }
}

// Rows of 1 .. 257 blocks of 256 values (K types) or 64 (Q8_0, Q4_0: pairs of blocks, x's
// groups), so every loop's tail: 3 rows each, the middle one alone too.
TEST(GemvGguf, IntegerKernelsAtEdgeBlockCounts) {
  if (!cpu_fast::isa_supported(cpu_fast::Isa::avx512)) GTEST_SKIP() << "no AVX-512 VNNI";
  for (GgmlType type : kIntegerTypes)
    for (int64_t blocks : kEdgeSizes) {
      const int64_t cols = blocks * std::max<int64_t>(ggml_type_info(type).block_size, int64_t(cpu_fast::kInputGroup));
      SCOPED_TRACE(fmt::format("{} [3, {}]", to_string(type), cols));
      const auto t = quantized_matrix(type, 3, cols, uint32_t(blocks * 17 + 5));
      const auto xs = spread_x(cols, uint32_t(blocks + 3));
      expect_integer_rows(t.m, xs.data() + 1, 0, 3);
      expect_integer_rows(t.m, xs.data() + 1, 1, 2);
    }
}

// Random bytes: every code, scale, min and high-bit pattern (Q6_K's scale -128 included).
TEST(GemvGguf, IntegerKernelsOnRandomBlocks) {
  if (!cpu_fast::isa_supported(cpu_fast::Isa::avx512)) GTEST_SKIP() << "no AVX-512 VNNI";
  for (GgmlType type : kIntegerTypes) {
    SCOPED_TRACE(to_string(type));
    // Rows of 256 values: one K block, eight 32-value blocks.
    const int64_t per_row = 256 / ggml_type_info(type).block_size;
    auto t = random_blocks(type, 301 * per_row, uint32_t(type) + 11);
    t.m.rows = 301, t.m.cols = 256;
    const auto xs = spread_x(256, 13);
    expect_integer_rows(t.m, xs.data() + 1, 0, 301);
  }
}

// Q5_K on random blocks against the decoder written from the definition (above), which must
// also agree with gguf_dequant value for value: the kernel's reference is not only itself read
// another way.
TEST(GemvGguf, IntegerQ5KAgainstTheDefinition) {
  if (!cpu_fast::isa_supported(cpu_fast::Isa::avx512)) GTEST_SKIP() << "no AVX-512 VNNI";
  const auto t = random_blocks(GgmlType::Q5_K, 257, 29);
  const auto by_definition = [&](int64_t r, float* w) { q5_k_by_definition(t.bytes.data() + 176 * r, w); };
  std::vector<float> def(256), lib(256);
  for (int64_t r = 0; r < t.m.rows; ++r) {
    by_definition(r, def.data());
    t.m.dequantize_row(r, lib.data());
    ASSERT_EQ(def, lib) << "block " << r;
  }
  for (uint32_t seed : {13u, 14u}) {
    const auto xs = spread_x(256, seed);
    expect_integer_rows(t.m, xs.data() + 1, 0, 257, by_definition);
    expect_integer_rows(t.m, xs.data() + 1, 128, 129, by_definition);
  }
}

TEST(GemvGguf, TypesTheKernelsDoNotTakeAreErrors) {
  EXPECT_FALSE(cpu_fast::gguf_gemv_supported(GgmlType::Q3_K));
  std::vector<uint8_t> row(144, 0);
  std::vector<float> x(256, 1.0f);
  EXPECT_THROW(cpu_fast::gguf_dot(GgmlType::Q2_K, row.data(), x.data(), 256), Error);
  EXPECT_THROW(cpu_fast::gguf_dot(GgmlType::Q4_K, row.data(), x.data(), 255), Error);
}

}  // namespace
}  // namespace lily
