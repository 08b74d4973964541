// test_gemv.cu: the quantized GEMV (backend/cuda/gemv.cu) against cpu::linear.
//
// Edge sizes: rows around the 4-row groups and the block tiles (1, 63, 64, 65, 2048), cols
// with one lane group partly idle (64, 128, 192) or several load steps (2048, 3072), T = 1
// (decode) and T > 1 in and across the 8-token passes, 4 and 8 bits; outputs poisoned (NaN)
// before each launch.
#include "backend/cuda/common/cuda_check.h"  // first: it sets up fmt for nvcc
#include "backend/cuda/decode/gemv.h"
#include "backend/cuda/decode/gemv_prefetch.h"

#include "backend/cpu/ops.h"
#include "cuda_test_util.h"

#include <cstdlib>

namespace lily::test {
namespace {

// Checks gemv (or gemv_accumulate onto a random y0) for one shape.
void check_gemv(int rows, int cols, int T, int bits, bool accumulate) {
  SCOPED_TRACE(testing::Message() << "rows " << rows << " cols " << cols << " T " << T << " bits " << bits
                                  << (accumulate ? " accumulate" : ""));
  const uint32_t seed = uint32_t(rows * 7919 + cols * 131 + T * 17 + bits);
  TestQMatrix W(1, rows, cols, bits, seed);
  const auto x = random_floats(size_t(T) * cols, seed + 1);
  const auto y0 = random_floats(size_t(T) * rows, seed + 2);

  std::vector<float> expected(size_t(T) * rows);
  cpu::linear(W.cpu(), x.data(), T, expected.data());
  if (accumulate)
    for (size_t i = 0; i < expected.size(); ++i) expected[i] += y0[i];

  DeviceArray<float> dx(x), dy(size_t(T) * rows);
  if (accumulate)
    dy.upload(y0);
  else
    dy.poison();
  if (accumulate)
    cuda::gemv_accumulate(W.gpu(), dx.get(), dy.get(), T, nullptr);
  else
    cuda::gemv(W.gpu(), dx.get(), dy.get(), T, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  const auto got = dy.download();
  const double err = relative_error(got, expected);
  EXPECT_LT(err, 1e-4) << "max |gpu - cpu| / max |cpu| = " << err;
}

TEST(CudaGemv, DecodeEdgeSizes) {
  REQUIRE_GPU();
  for (int bits : {4, 8})
    for (int rows : {1, 63, 64, 65, 2048})
      for (int cols : {64, 128, 192, 256, 320, 1088, 2048, 3072, 4096}) check_gemv(rows, cols, 1, bits, false);
}

TEST(CudaGemv, SeveralRows) {
  REQUIRE_GPU();
  for (int bits : {4, 8})
    for (int T : {2, 7, 8, 9, 64})
      for (int rows : {1, 63, 65, 2048})
        for (int cols : {64, 128, 2048}) check_gemv(rows, cols, T, bits, false);
}

TEST(CudaGemv, Accumulate) {
  REQUIRE_GPU();
  for (int bits : {4, 8})
    for (int T : {1, 2, 7})
      for (int rows : {1, 65, 2048})
        for (int cols : {64, 2048}) check_gemv(rows, cols, T, bits, true);
}

// Full-size decode shapes (a q/k/v-sized projection, o_proj / out_proj, the shared expert's down).
TEST(CudaGemv, ModelShapes) {
  REQUIRE_GPU();
  check_gemv(8192, 2048, 1, 4, false);
  check_gemv(2048, 4096, 1, 4, false);
  check_gemv(2048, 512, 1, 4, true);
  check_gemv(256, 2048, 1, 8, false);
  // Tall matrices take 4 rows per lane group (fewer take 1): both sides of the switch.
  check_gemv(8447, 256, 1, 4, false);
  check_gemv(8449, 256, 1, 4, false);
  check_gemv(12352, 2048, 1, 4, true);
  // T > 1: groups of 8 tokens in parallel on the grid's y (the router of a prefill pass).
  check_gemv(256, 2048, 300, 8, false);
  check_gemv(65, 128, 1001, 4, true);
}

// Rows of the output past `rows` must not be touched: y is a window into a larger buffer.
TEST(CudaGemv, WritesOnlyItsRows) {
  REQUIRE_GPU();
  const int rows = 65, cols = 128, T = 3;
  TestQMatrix W(1, rows, cols, 4, 5);
  const auto x = random_floats(size_t(T) * cols, 6);
  DeviceArray<float> dx(x), dy(size_t(T) * rows + 64);
  std::vector<float> sentinel(dy.size(), 12345.f);
  dy.upload(sentinel);
  cuda::gemv(W.gpu(), dx.get(), dy.get(), T, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  const auto got = dy.download();
  for (size_t i = size_t(T) * rows; i < got.size(); ++i) ASSERT_EQ(got[i], 12345.f) << "index " << i;
}

// rms_norm_gemv: the CPU RMSNorm then cpu::linear, for one token.
void check_rms_norm_gemv(int rows, int cols, int bits, float x_scale = 1.f) {
  SCOPED_TRACE(testing::Message() << "rms_norm_gemv rows " << rows << " cols " << cols << " bits " << bits
                                  << " x scale " << x_scale);
  const uint32_t seed = uint32_t(rows * 7919 + cols * 131 + bits + 5);
  TestQMatrix W(1, rows, cols, bits, seed);
  const auto x = random_floats(size_t(cols), seed + 1, x_scale);
  auto gain = random_floats(size_t(cols), seed + 2, 0.2f);
  for (auto& g : gain) g += 1.f;  // zero-centred: 1 + w
  const float eps = 1e-6f;
  std::vector<float> normed(static_cast<size_t>(cols)), expected(static_cast<size_t>(rows));
  cpu::rms_norm(x.data(), gain.data(), 1, cols, eps, normed.data());
  cpu::linear(W.cpu(), normed.data(), 1, expected.data());

  DeviceArray<float> dx(x), dgain(gain), dy(size_t(rows) + 64);
  std::vector<float> sentinel(dy.size(), 12345.f);
  dy.upload(sentinel);
  CUDA_OK(cudaMemset(dy.get(), 0xFF, size_t(rows) * sizeof(float)));  // NaN: unwritten rows show
  cuda::rms_norm_gemv(W.gpu(), dx.get(), dgain.get(), eps, dy.get(), nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  auto got = dy.download();
  for (size_t i = size_t(rows); i < got.size(); ++i) ASSERT_EQ(got[i], 12345.f) << "wrote past the rows: " << i;
  got.resize(size_t(rows));
  const double err = relative_error(got, expected);
  EXPECT_LT(err, 1e-4) << "max |gpu - cpu| / max |cpu| = " << err;
}

TEST(CudaGemv, RmsNormGemvEdgeSizes) {
  REQUIRE_GPU();
  for (int bits : {4, 8})
    for (int rows : {1, 2, 3, 63, 64, 65, 111, 989})
      for (int cols : {64, 128, 192, 256, 1024, 1088, 2048, 4096}) check_rms_norm_gemv(rows, cols, bits);
}

// The fused model shapes: DeltaNet qkv|z|b|a (12352 rows), attention q|k|v (9216), the router,
// many rows (more row groups than the resident warps: the grid-stride loop).
TEST(CudaGemv, RmsNormGemvModelShapes) {
  REQUIRE_GPU();
  check_rms_norm_gemv(12352, 2048, 4);
  check_rms_norm_gemv(9216, 2048, 4);
  check_rms_norm_gemv(256, 2048, 8);
  check_rms_norm_gemv(20011, 2048, 4);  // > 2 x 132 blocks x 8 warps x 4 rows: several strides
}

// The norm makes the result independent of the input's scale: tiny and large inputs.
TEST(CudaGemv, RmsNormGemvInputScale) {
  REQUIRE_GPU();
  for (float scale : {1e-3f, 1e3f}) check_rms_norm_gemv(65, 2048, 4, scale);
}

// 4-bit rows at T = 1 go to the tensor-core kernel (mma_gemv_kernel) by default;
// LILY_MMA_GEMV=0 sends them to the FP32 staged kernel: both must match the CPU.
TEST(CudaGemv, DecodeFp32PathEdgeSizes) {
  REQUIRE_GPU();
  ScopedEnv fp32("LILY_MMA_GEMV", "0");
  for (int rows : {1, 63, 65, 2048})
    for (int cols : {64, 192, 2048, 4096}) {
      check_gemv(rows, cols, 1, 4, false);
      check_gemv(rows, cols, 1, 4, true);
      check_rms_norm_gemv(rows, cols, 4);
    }
}

// rms_norm_gemv on 4-bit rows of 512-column multiples goes to prefetch_rms_norm_gemv_kernel (weights copied
// into shared memory before the PDL wait) where a block's rows fit; LILY_PREFETCH_GEMV=0 sends
// them to mma_gemv_kernel. The model's input projections must take the prefetch path (the tests
// above then cover it), and both paths must match the CPU at the edges of the block ranges.
TEST(CudaGemv, ModelShapesTakeThePrefetchPath) {
  REQUIRE_GPU();
  const float* x = reinterpret_cast<const float*>(uintptr_t(256));  // only its alignment is read
  for (auto [rows, cols] : {std::pair{12352, 2048}, {9216, 2048}, {2048, 4096}, {2048, 512}}) {  // and others
    TestQMatrix W(1, rows, cols, 4, 1);
    EXPECT_TRUE(cuda::prefetch_gemv_supports(W.gpu(), x)) << rows << " x " << cols;
  }
  TestQMatrix lm_head_like(1, 65536, 2048, 4, 1);  // too many rows per block: mma_gemv, or streaming (opt-in)
  EXPECT_FALSE(cuda::prefetch_gemv_supports(lm_head_like.gpu(), x));
  EXPECT_FALSE(cuda::stream_gemv_supports(lm_head_like.gpu(), x));
  {
    ScopedEnv streaming("LILY_STREAM_GEMV", "1");
    EXPECT_TRUE(cuda::stream_gemv_supports(lm_head_like.gpu(), x));
  }
  TestQMatrix narrow(1, 64, 1088, 4, 1);  // not a multiple of 512 columns
  EXPECT_FALSE(cuda::prefetch_gemv_supports(narrow.gpu(), x));
}

TEST(CudaGemv, PrefetchBlockRangeEdges) {
  REQUIRE_GPU();
  // 1..3 tiles, tiles around the SM count (one per block, some blocks two), partial last tiles,
  // 5-6 tiles per block (the DeltaNet input projection), the most rows the blocks hold at 2048
  // columns on 132 SMs (10 tiles each) and one more (mma_gemv on a 132-SM device).
  for (int rows : {1, 15, 16, 17, 2111, 2112, 2113, 2127, 12352, 12353, 21120, 21121})
    check_rms_norm_gemv(rows, 2048, 4);
  for (int cols : {512, 1024, 1536, 3072, 4096}) check_rms_norm_gemv(1000, cols, 4);
  check_rms_norm_gemv(2001, 4096, 4, 1e3f);
}

// The streaming kernel (rows that do not fit at once): a ring of 3 stages of 3 tiles per block,
// so chunk counts around the ring size, partial last chunks and tiles, and lm_head's shape.
TEST(CudaGemv, StreamingLargeMatrices) {
  REQUIRE_GPU();
  ScopedEnv streaming("LILY_STREAM_GEMV", "1");
  for (int rows : {21121, 25344, 31681, 63377, 100003}) check_rms_norm_gemv(rows, 2048, 4);
  check_rms_norm_gemv(40000, 4096, 4);  // one tile per stage at 4096 columns
  check_rms_norm_gemv(30001, 512, 4);
  check_rms_norm_gemv(248320, 2048, 4);  // lm_head
}

// The same large shapes on mma_gemv (the default for rows beyond the prefetch kernel's).
TEST(CudaGemv, LargeMatricesOnMmaGemv) {
  REQUIRE_GPU();
  for (int rows : {21121, 25344, 31681, 63377, 100003}) check_rms_norm_gemv(rows, 2048, 4);
  check_rms_norm_gemv(40000, 4096, 4);
  check_rms_norm_gemv(30001, 512, 4);
  check_rms_norm_gemv(248320, 2048, 4);  // lm_head
}

// The 8-warp form of the prefetch kernel (LILY_PREFETCH_WARPS=8) at the same edges.
TEST(CudaGemv, PrefetchEightWarps) {
  REQUIRE_GPU();
  ScopedEnv eight("LILY_PREFETCH_WARPS", "8");
  for (int rows : {1, 17, 2113, 12352, 21120}) check_rms_norm_gemv(rows, 2048, 4);
  for (int cols : {512, 4096}) check_rms_norm_gemv(1000, cols, 4);
}

TEST(CudaGemv, MmaPathWithoutPrefetch) {
  REQUIRE_GPU();
  ScopedEnv off("LILY_PREFETCH_GEMV", "0");
  for (int rows : {1, 65, 2048, 12352})
    for (int cols : {512, 2048, 4096}) {
      check_rms_norm_gemv(rows, cols, 4);
    }
}

}  // namespace
}  // namespace lily::test
