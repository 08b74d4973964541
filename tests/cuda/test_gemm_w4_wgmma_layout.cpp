// test_gemm_w4_wgmma_layout.cpp: the K order and tile addressing of the wgmma W4A16 GEMM
// (backend/cuda/gemm/gemm_w4_wgmma_layout.h), on the CPU.
//
// The kernel's rules (which code nibbles a thread turns into which A register, where the producer
// puts each 16-byte piece of x) are run here for a whole warpgroup and read back through the
// hardware's own definitions, written out independently below from the PTX manual: the A
// fragment of wgmma m64nNk16 (per warp, mma.m16n8k16's: register i holds row g + 8 (i % 2),
// columns 2t + 8 (i / 2) + {0, 1}) and the 128-byte swizzle of a K-major B tile (byte address bits
// 4-6 XORed with bits 7-9). The product through fragments must equal the plain sum over k.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "backend/cuda/gemm/gemm_w4_wgmma_layout.h"
#include "base/bf16.h"
#include "model/quant.h"

namespace lily::test {
namespace {

using namespace cuda::w4_wgmma;

// The hardware's view, independent of the header.
int fragment_row(int warp, int lane, int reg) { return 16 * warp + lane / 4 + 8 * (reg % 2); }
int fragment_col(int step, int lane, int reg, int e) { return 16 * step + 2 * (lane % 4) + 8 * (reg / 2) + e; }
uint32_t swizzle128(uint32_t byte) { return byte ^ (((byte >> 7) & 7u) << 4); }

TEST(W4WgmmaLayout, KOrderIsAPermutationOfTheGroup) {
  std::set<int> ks;
  for (int c = 0; c < kGroup; ++c) {
    const int k = k_of_column(c);
    ASSERT_TRUE(k >= 0 && k < kGroup) << c;
    EXPECT_EQ(column_of_k(k), c);
    ks.insert(k);
  }
  EXPECT_EQ(ks.size(), size_t(kGroup));
  EXPECT_NE(k_of_column(1), 1);  // not the identity: x must really be reordered
}

TEST(W4WgmmaLayout, BTileOffsetIsTheHardwareSwizzle) {
  for (int n = 0; n < 128; ++n)
    for (int c = 0; c < kGroup; c += 8) {  // the producer's 16-byte pieces
      const uint32_t at = b_tile_offset(n, c);
      EXPECT_EQ(at, swizzle128(uint32_t(n) * kRowBytes + 2 * c)) << n << " " << c;
      EXPECT_EQ(at % 16, 0u);
      EXPECT_LT(at, uint32_t(n + 1) * kRowBytes);  // stays in the token's 128 bytes
    }
}

TEST(W4WgmmaLayout, CodePairTakesNibblesSAndSPlusFour) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 100; ++trial) {
    const uint32_t word = rng();
    for (int s = 0; s < kStepsPerGroup; ++s) {
      const uint32_t v = code_pair(word, s);
      EXPECT_EQ(int(v & 0xFFFF) - 0x4300, int((word >> (4 * s)) & 15));
      EXPECT_EQ(int(v >> 16) - 0x4300, int((word >> (4 * (s + 4))) & 15));
      // bf16 0x4300 | q is 128 + q
      EXPECT_EQ(to_float(bf16{uint16_t(v & 0xFFFF)}), 128.f + float((word >> (4 * s)) & 15));
    }
  }
}

// One warpgroup's 64 rows against `tokens` tokens over `groups` K groups, every value placed as
// the kernel places it and read back as the hardware reads it.
void check_warpgroup_product(int tokens, int groups, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "tokens " << tokens << " groups " << groups);
  constexpr int M = 64;
  const int K = groups * kGroup;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> wf(size_t(M) * K), x(size_t(tokens) * K);
  for (auto& v : wf) v = 0.05f * nd(rng);
  for (auto& v : x) v = nd(rng);
  const QuantizedMatrix W = quantize_affine(wf, M, K, 4, kGroup);
  auto weight = [&](int m, int k) {  // bf16(s * q + b)
    const uint32_t word = W.codes[(size_t(m) * K + k) / 8];
    const float q = float((word >> (4 * (k % 8))) & 15);
    const size_t g = size_t(m) * groups + k / kGroup;
    return round_bf16(std::fmaf(to_float(W.scales[g]), q, to_float(W.biases[g])));
  };
  // x_to_bf16_permuted's rows
  std::vector<bf16> xp(x.size());
  for (int n = 0; n < tokens; ++n)
    for (int k = 0; k < K; ++k)
      xp[size_t(n) * K + k] = to_bf16(x[size_t(n) * K + k / kGroup * kGroup + k_of_column(k % kGroup)]);

  std::vector<double> got(size_t(M) * tokens, 0.0);
  for (int kt = 0; kt < groups; ++kt) {
    // The producer: 16-byte pieces ci of each token's group to b_tile_offset(n, 8 ci).
    std::vector<uint8_t> tile(size_t(tokens) * kRowBytes, 0xEE);
    for (int n = 0; n < tokens; ++n)
      for (int ci = 0; ci < 8; ++ci)
        std::memcpy(tile.data() + b_tile_offset(n, 8 * ci), xp.data() + size_t(n) * K + kt * kGroup + 8 * ci, 16);
    // The hardware's B: element (k column c, token n) at the swizzled address.
    auto b_at = [&](int c, int n) {
      bf16 v;
      std::memcpy(&v, tile.data() + swizzle128(uint32_t(n) * kRowBytes + 2 * c), 2);
      return double(to_float(v));
    };
    // The consumers: every thread's A registers, placed where the hardware takes them from.
    std::vector<double> a(size_t(M) * kGroup, NAN);
    for (int warp = 0; warp < 4; ++warp)
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane / 4, t = lane % 4;
        const int rows[2] = {16 * warp + g, 16 * warp + g + 8};
        for (int s = 0; s < kStepsPerGroup; ++s)
          for (int r = 0; r < 2; ++r)
            for (int h = 0; h < 2; ++h) {
              // the 8-byte piece of row r: words 2t, 2t + 1 of the group
              const uint32_t word = W.codes[(size_t(rows[r]) * K + kt * kGroup) / 8 + 2 * t + h];
              const uint32_t pair = code_pair(word, s);
              const int reg = a_register(r, h);
              for (int e = 0; e < 2; ++e) {
                const float q = float(int((pair >> (16 * e)) & 0xFFFF) - 0x4300);
                const size_t gi = size_t(rows[r]) * groups + kt;
                const float w = round_bf16(std::fmaf(to_float(W.scales[gi]), q, to_float(W.biases[gi])));
                double& slot = a[size_t(fragment_row(warp, lane, reg)) * kGroup + fragment_col(s, lane, reg, e)];
                ASSERT_TRUE(std::isnan(slot)) << "two registers for one A element";
                slot = w;
              }
            }
      }
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < tokens; ++n)
        for (int c = 0; c < kGroup; ++c) got[size_t(m) * tokens + n] += a[size_t(m) * kGroup + c] * b_at(c, n);
  }
  double worst = 0;
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < tokens; ++n) {
      double want = 0, l1 = 0;
      for (int k = 0; k < K; ++k) {
        const double p = double(weight(m, k)) * double(round_bf16(x[size_t(n) * K + k]));
        want += p, l1 += std::fabs(p);
      }
      worst = std::max(worst, std::fabs(got[size_t(m) * tokens + n] - want) / (l1 + 1e-30));
    }
  EXPECT_LE(worst, 1e-12);  // only the order of exact products differs
}

TEST(W4WgmmaLayout, WarpgroupProductThroughFragmentsIsTheProduct) {
  check_warpgroup_product(8, 1, 1);
  check_warpgroup_product(64, 2, 2);
  check_warpgroup_product(128, 3, 3);
}

}  // namespace
}  // namespace lily::test
