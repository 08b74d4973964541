// ggml's block formats decoded (src/model/gguf_dequant.h): hand-computed blocks, blocks decoded
// by llama.cpp's gguf-py (tests/fixtures/gguf/blocks.gguf, tools/gguf_block_vectors.py), round
// trips through the test quantizers (gguf_quantize.h) within each format's error bound, and
// GGUF matrices as lily's Matrix.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "base/error.h"
#include "gguf_quantize.h"
#include "model/gguf_dequant.h"
#include "model/gguf_file.h"
#include "model/weights.h"

namespace lily {
namespace {

using test::put_f16;

std::vector<float> decode(GgmlType type, const std::vector<uint8_t>& bytes, int64_t n) {
  std::vector<float> out(size_t(n), NAN);
  dequantize_gguf_row(type, bytes.data(), n, out.data());
  return out;
}

// Q8_0 with d = 0.5: x = 0.5 q.
TEST(GgufBlocks, HandComputedQ8_0) {
  std::vector<uint8_t> b(34, 0);
  put_f16(b.data(), 0.5f);
  b[2] = 3, b[3] = uint8_t(-128), b[33] = 127;
  const auto y = decode(GgmlType::Q8_0, b, 32);
  EXPECT_EQ(y[0], 1.5f);
  EXPECT_EQ(y[1], -64.0f);
  EXPECT_EQ(y[2], 0.0f);
  EXPECT_EQ(y[31], 63.5f);
}

// Q4_0 with d = 2: byte j holds value j (low nibble) and value j + 16 (high), both minus 8.
TEST(GgufBlocks, HandComputedQ4_0) {
  std::vector<uint8_t> b(18, 0x88);  // every code 8: zero
  put_f16(b.data(), 2.0f);
  b[2] = 0xF0;   // value 0: code 0 -> -16; value 16: code 15 -> 14
  b[17] = 0x19;  // value 15: code 9 -> 2; value 31: code 1 -> -14
  const auto y = decode(GgmlType::Q4_0, b, 32);
  EXPECT_EQ(y[0], -16.0f);
  EXPECT_EQ(y[16], 14.0f);
  EXPECT_EQ(y[15], 2.0f);
  EXPECT_EQ(y[31], -14.0f);
  EXPECT_EQ(y[1], 0.0f);
}

// Q4_K, d = 1, dmin = 0.5. Sub-block 1: scale byte 1 = 3, min byte 5 = 2: x = 3 q - 1 for the
// high nibbles of qs[0..32). Sub-block 6: scale = (byte 10 & 0xF) | (byte 2 >> 6) << 4 =
// 5 | 2 << 4 = 37; min = (byte 10 >> 4) | (byte 6 >> 6) << 4 = 1 | 1 << 4 = 17: x = 37 q - 8.5
// for the low nibbles of qs[96..128).
TEST(GgufBlocks, HandComputedQ4_K) {
  std::vector<uint8_t> b(144, 0);
  put_f16(b.data(), 1.0f);
  put_f16(b.data() + 2, 0.5f);
  uint8_t* scales = b.data() + 4;
  scales[1] = 3, scales[5] = 2;
  scales[2] = 2 << 6, scales[6] = 1 << 6, scales[10] = 0x15;
  uint8_t* qs = b.data() + 16;
  qs[0] = 0x70;   // value 0 (sub-block 0, scale 0, min 0): 0; value 32: code 7 -> 3 * 7 - 1 = 20
  qs[96] = 0x0C;  // value 192 (sub-block 6): code 12 -> 37 * 12 - 8.5 = 435.5
  const auto y = decode(GgmlType::Q4_K, b, 256);
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_EQ(y[32], 20.0f);
  EXPECT_EQ(y[33], -1.0f);
  EXPECT_EQ(y[192], 435.5f);
  EXPECT_EQ(y[193], -8.5f);
  EXPECT_EQ(y[224], 0.0f);  // sub-block 7: scale 0, min 0
}

// Q5_K: Q4_K with bit s of qh[l] as the fifth bit of value l of sub-block s.
TEST(GgufBlocks, HandComputedQ5_K) {
  std::vector<uint8_t> b(176, 0);
  put_f16(b.data(), 0.25f);
  put_f16(b.data() + 2, 1.0f);
  uint8_t* scales = b.data() + 4;
  scales[0] = 4, scales[4] = 3;  // sub-block 0: x = q - 3
  scales[3] = 8, scales[7] = 1;  // sub-block 3: x = 2 q - 1
  uint8_t* qh = b.data() + 16;
  uint8_t* qs = b.data() + 48;
  qs[5] = 0x0F, qh[5] = 0x01;       // value 5: code 15 + 16 = 31 -> 28
  qs[32 + 9] = 0x20, qh[9] = 0x08;  // value 96 + 9 (sub-block 3: high nibbles of qs[32..64)): 18 -> 35
  const auto y = decode(GgmlType::Q5_K, b, 256);
  EXPECT_EQ(y[5], 28.0f);
  EXPECT_EQ(y[4], -3.0f);
  EXPECT_EQ(y[105], 35.0f);
  EXPECT_EQ(y[104], -1.0f);
}

// Q6_K, d = 0.5: value 32k + l of the first half is a nibble of ql[l + 32 (k % 2)] (low for
// k < 2) with bits 2k of qh[l], minus 32, times d scales[value / 16].
TEST(GgufBlocks, HandComputedQ6_K) {
  std::vector<uint8_t> b(210, 0);
  put_f16(b.data() + 208, 0.5f);
  auto* sc = reinterpret_cast<int8_t*>(b.data() + 192);
  for (int s = 0; s < 16; ++s) sc[s] = int8_t(s + 1);
  sc[4] = -2;
  uint8_t* ql = b.data();
  uint8_t* qh = b.data() + 128;
  ql[3] = 0x5A, qh[3] = 0b00100111;  // values 3 (k 0), 67 (k 2); value 35 (k 1) from ql[35]
  ql[35] = 0x01;
  const auto y = decode(GgmlType::Q6_K, b, 256);
  EXPECT_EQ(y[3], 0.5f * 1 * float((0xA | 3 << 4) - 32));    // 58 - 32 = 26 -> 13
  EXPECT_EQ(y[35], 0.5f * 3 * float((0x1 | 1 << 4) - 32));   // scale index 2: 17 - 32 -> -22.5
  EXPECT_EQ(y[67], 0.5f * -2 * float((0x5 | 2 << 4) - 32));  // scale index 4: 37 - 32 -> -5
  EXPECT_EQ(y[99], 0.5f * 7 * -32.0f);                       // k 3: all bits 0
  EXPECT_EQ(y[128], 0.5f * 9 * -32.0f);                      // second half, scale index 8
}

// IQ4_XS, d = 0.5: sub-block s scale (ls - 32), ls = nibble s of scales_l | 2 bits of scales_h.
TEST(GgufBlocks, HandComputedIQ4_XS) {
  std::vector<uint8_t> b(136, 0x88);  // codes 8: grid value 1
  put_f16(b.data(), 0.5f);
  const uint16_t scales_h = 0b10 << 2;  // sub-block 1: high bits 2
  std::memcpy(b.data() + 2, &scales_h, 2);
  b[4] = 0x3A;  // sub-block 0: ls = 10 -> -22; sub-block 1: ls = 3 | 2 << 4 = 35 -> 3
  b[5] = b[6] = b[7] = 0;
  b[8] = 0xF0;  // sub-block 0, value 0: grid[0] = -127; value 16: grid[15] = 113
  const auto y = decode(GgmlType::IQ4_XS, b, 256);
  EXPECT_EQ(y[0], 0.5f * -22 * -127.0f);
  EXPECT_EQ(y[16], 0.5f * -22 * 113.0f);
  EXPECT_EQ(y[32], 0.5f * 3 * 1.0f);
  EXPECT_EQ(y[64], 0.5f * -32 * 1.0f);  // sub-block 2: ls = 0
}

// llama.cpp's gguf-py decoding of random blocks (tools/gguf_block_vectors.py): the file is
// written by gguf-py's GGUFWriter, so this reads another writer's file too.
TEST(GgufBlocks, MatchGgufPyOnRandomBlocks) {
  GgufModel model(std::string(LILY_FIXTURES_DIR) + "/gguf/blocks.gguf");
  EXPECT_EQ(model.find_metadata("general.architecture")->as_string(), "lily-block-vectors");
  int checked = 0;
  for (const char* name :
       {"Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "F16", "BF16", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL"}) {
    SCOPED_TRACE(name);
    const GgufTensor& blocks = model.get(std::string(name) + ".blocks");
    const GgufTensor& values = model.get(std::string(name) + ".values");
    EXPECT_STREQ(to_string(blocks.type), name);
    ASSERT_EQ(values.type, GgmlType::F32);
    ASSERT_EQ(blocks.ne, values.ne);
    std::vector<float> want(size_t(values.numel())), got(size_t(values.numel()), NAN);
    std::memcpy(want.data(), values.data.data(), want.size() * 4);
    const int64_t n = blocks.ne[0], row_bytes = ggml_row_bytes(blocks.type, n);
    for (int64_t r = 0; r < blocks.rows(); ++r)
      dequantize_gguf_row(blocks.type, blocks.data.data() + r * row_bytes, n, got.data() + r * n);
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], 1e-6f * std::fabs(want[i])) << "value " << i;
      ++checked;
    }
  }
  // Rows of 2 blocks; Q4_0, Q8_0, F16, BF16, Q4_1, Q5_0, Q5_1, IQ4_NL rows of 64.
  EXPECT_EQ(checked, 4 * 4 * 512 + 8 * 4 * 64);
}

// The largest |x - decode(quantize(x))| each test quantizer allows, relative to the largest |x|
// of the quantizer's block (32 values for Q4_0 and Q8_0, 256 for the others; the plain types:
// relative to |x| itself): half a step, plus the rounding of the 6-bit scales.
double round_trip_bound(GgmlType type) {
  switch (type) {
    case GgmlType::F32: return 0;
    case GgmlType::F16: return 1.0 / 2048;
    case GgmlType::BF16: return 1.0 / 256;
    case GgmlType::Q8_0: return 0.5 / 127 * 1.002;
    case GgmlType::Q4_0: return 0.5 / 7 * 1.002;
    case GgmlType::Q4_K: return 0.5 * 2 / 15 + 2.0 / 63;  // a sub-block's range is up to 2 amax
    case GgmlType::Q5_K: return 0.5 * 2 / 31 + 2.0 / 63;
    case GgmlType::Q6_K: return 0.5 / 31 + 1.0 / 127;
    case GgmlType::IQ4_XS: return 14.0 / 127 + 2.0 / 31;  // the grid's positive end is 113, not 127
    default: return 0;
  }
}

bool plain(GgmlType type) { return type == GgmlType::F32 || type == GgmlType::F16 || type == GgmlType::BF16; }

TEST(GgufBlocks, RoundTripsWithinTheFormatsBounds) {
  std::mt19937 rng(41);
  std::normal_distribution<float> normal(0, 1);
  for (GgmlType type : test::kGgufTestTypes) {
    SCOPED_TRACE(to_string(type));
    const int64_t block = type == GgmlType::Q8_0 || type == GgmlType::Q4_0 ? 32 : 256;
    for (int64_t n : {256, 512, 2048}) {
      const float unit = n == 512 ? 1e-3f : 1.0f;  // small weights too
      std::vector<float> x(static_cast<size_t>(n));
      for (auto& v : x) v = normal(rng) * unit;
      x[7] = 6.5f * unit;  // an outlier
      const auto bytes = test::quantize_gguf_row(type, x.data(), n);
      ASSERT_EQ(int64_t(bytes.size()), ggml_row_bytes(type, n));
      const auto y = decode(type, bytes, n);
      double worst = 0;
      for (int64_t c = 0; c < n; ++c) {
        // f16 keeps about 3e-8 absolute below its normal range (6e-5).
        const double ref = plain(type) ? std::max(std::fabs(x[size_t(c)]), 1e-4f)
                                       : test::max_abs(x.data() + c / block * block, int(block));
        worst = std::max(worst, std::fabs(double(y[size_t(c)]) - x[size_t(c)]) / ref);
      }
      EXPECT_LE(worst, round_trip_bound(type)) << "n " << n;
      if (type == GgmlType::F32) {
        EXPECT_EQ(worst, 0.0);
      } else EXPECT_GT(worst, 0.0) << "n " << n << ": lossless, so the quantizer was not exercised";
    }
  }
}

TEST(GgufBlocks, GgufMatricesDecodeRowByRow) {
  const int64_t rows = 3, cols = 512;
  std::vector<float> w(size_t(rows * cols));
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto& v : w) v = u(rng);
  std::vector<uint8_t> bytes;
  for (int64_t r = 0; r < rows; ++r) {
    auto row = test::quantize_gguf_row(GgmlType::Q6_K, w.data() + r * cols, cols);
    bytes.insert(bytes.end(), row.begin(), row.end());
  }
  Matrix m;
  m.rows = rows, m.cols = cols, m.format = MatrixFormat::gguf, m.gguf_type = GgmlType::Q6_K, m.data = bytes.data();
  EXPECT_EQ(m.bytes(), uint64_t(rows * 2 * 210));
  EXPECT_EQ(m.describe(), "gguf Q6_K [3, 512]");
  std::vector<float> got(size_t(cols), NAN);
  m.dequantize_row(2, got.data());
  const auto want = decode(GgmlType::Q6_K, std::vector<uint8_t>(bytes.begin() + 2 * 420, bytes.end()), cols);
  EXPECT_EQ(got, want);
}

TEST(GgufBlocks, UnsupportedTypesAndPartialBlocksAreErrors) {
  std::vector<uint8_t> b(210, 0);
  std::vector<float> out(256);
  EXPECT_FALSE(gguf_dequant_supported(GgmlType::Q3_K));
  EXPECT_TRUE(gguf_dequant_supported(GgmlType::Q6_K));
  try {
    dequantize_gguf_row(GgmlType::IQ2_XXS, b.data(), 256, out.data());
    FAIL();
  } catch (const Error& e) {
    EXPECT_PRED_FORMAT2(::testing::IsSubstring, "cannot decode ggml type IQ2_XXS", e.what());
  }
  EXPECT_THROW(dequantize_gguf_row(GgmlType::Q6_K, b.data(), 200, out.data()), Error);
}

}  // namespace
}  // namespace lily
