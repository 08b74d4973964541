// test_gemv.cu: the decode GEMVs (backend/cuda/gemv/gemv.h), every kernel by name, against
// cpu::linear and cpu::rms_norm.
//
// Edge sizes: rows around the 4-row groups, the 16-row tiles and the prefetch kernel's block
// ranges (1, 15, 16, 17, 63, 64, 65, ...), cols with one lane group partly idle (64, 128, 192) or
// several load steps (2048, 3072, 4096); 4-bit (prefetch, mma) and 8-bit (fp32) weights; outputs
// poisoned (NaN) before each launch and guard values past the rows.
#include "backend/cuda/common/cuda_check.h"  // first: it sets up fmt for nvcc
#include "backend/cuda/gemv/gemv.h"

#include "backend/cpu/ops.h"
#include "cuda_test_util.h"

namespace lily::test {
namespace {

using cuda::GemvKernel;

// This machine's device (only after REQUIRE_GPU: it asks the driver).
cuda::DeviceLimits device() { return cuda::current_device_limits(); }

// A matrix of this shape whose arrays are never read: for the kernels' format checks.
cuda::QMatrix shape_only(int rows, int cols, int bits) {
  cuda::QMatrix W;
  W.rows = rows, W.cols = cols, W.bits = bits;
  W.codes = reinterpret_cast<const uint32_t*>(uintptr_t(256));  // only the alignment is read
  W.scales = W.biases = reinterpret_cast<const bf16*>(uintptr_t(512));
  return W;
}

// The 8-bit kernel for 8-bit rows; mma for 4-bit (the prefetch kernel has its own tests below).
GemvKernel kernel_for(int bits) { return bits == 8 ? GemvKernel::fp32 : GemvKernel::mma; }

// gemv_accumulate onto a random y0 for one shape, on `kernel`.
void check_accumulate(GemvKernel kernel, int rows, int cols, int bits) {
  SCOPED_TRACE(testing::Message() << cuda::kernel_name(kernel) << " accumulate rows " << rows << " cols " << cols
                                  << " bits " << bits);
  const uint32_t seed = uint32_t(rows * 7919 + cols * 131 + bits);
  TestQMatrix W(1, rows, cols, bits, seed);
  ASSERT_TRUE(cuda::gemv_supports(kernel, W.gpu(), true, device()));
  const auto x = random_floats(size_t(cols), seed + 1);
  const auto y0 = random_floats(size_t(rows) + 64, seed + 2);
  std::vector<float> expected(static_cast<size_t>(rows));
  cpu::linear(W.cpu(), x.data(), 1, expected.data());
  for (size_t i = 0; i < expected.size(); ++i) expected[i] += y0[i];

  DeviceArray<float> dx(x), dy(y0);
  cuda::gemv_accumulate(kernel, W.gpu(), dx.get(), dy.get(), nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  auto got = dy.download();
  for (size_t i = size_t(rows); i < got.size(); ++i) ASSERT_EQ(got[i], y0[i]) << "wrote past the rows: " << i;
  got.resize(size_t(rows));
  const double err = relative_error(got, expected);
  EXPECT_LT(err, 1e-4) << "max |gpu - cpu| / max |cpu| = " << err;
}

// rms_norm_gemv on `kernel`: the CPU RMSNorm then cpu::linear.
void check_rms_norm_gemv(GemvKernel kernel, int rows, int cols, int bits, float x_scale = 1.f) {
  SCOPED_TRACE(testing::Message() << cuda::kernel_name(kernel) << " rms_norm_gemv rows " << rows << " cols " << cols
                                  << " bits " << bits << " x scale " << x_scale);
  const uint32_t seed = uint32_t(rows * 7919 + cols * 131 + bits + 5);
  TestQMatrix W(1, rows, cols, bits, seed);
  ASSERT_TRUE(cuda::gemv_supports(kernel, W.gpu(), false, device()));
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
  cuda::rms_norm_gemv(kernel, W.gpu(), dx.get(), dgain.get(), eps, dy.get(), nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  auto got = dy.download();
  for (size_t i = size_t(rows); i < got.size(); ++i) ASSERT_EQ(got[i], 12345.f) << "wrote past the rows: " << i;
  got.resize(size_t(rows));
  const double err = relative_error(got, expected);
  EXPECT_LT(err, 1e-4) << "max |gpu - cpu| / max |cpu| = " << err;
}

TEST(CudaGemv, AccumulateEdgeSizes) {
  REQUIRE_GPU();
  for (int bits : {4, 8})
    for (int rows : {1, 63, 64, 65, 2048})
      for (int cols : {64, 128, 192, 256, 320, 1088, 2048, 3072, 4096})
        check_accumulate(kernel_for(bits), rows, cols, bits);
}

TEST(CudaGemv, RmsNormGemvEdgeSizes) {
  REQUIRE_GPU();
  for (int bits : {4, 8})
    for (int rows : {1, 2, 3, 63, 64, 65, 111, 989})
      for (int cols : {64, 128, 192, 256, 1024, 1088, 2048, 4096})
        check_rms_norm_gemv(kernel_for(bits), rows, cols, bits);
}

// The model's decode shapes on the kernels the plan gives them: out_proj / o_proj (+=), the shared
// expert's down, an 8-bit router-sized matrix, tall matrices on both sides of the 4-row groups.
TEST(CudaGemv, ModelShapes) {
  REQUIRE_GPU();
  check_accumulate(GemvKernel::mma, 2048, 4096, 4);
  check_accumulate(GemvKernel::mma, 2048, 512, 4);
  check_accumulate(GemvKernel::fp32, 256, 2048, 8);
  check_accumulate(GemvKernel::mma, 12352, 2048, 4);
  check_accumulate(GemvKernel::fp32, 8447, 256, 8);
  check_accumulate(GemvKernel::fp32, 8449, 256, 8);
  check_rms_norm_gemv(GemvKernel::mma, 12352, 2048, 4);
  check_rms_norm_gemv(GemvKernel::mma, 9216, 2048, 4);
  check_rms_norm_gemv(GemvKernel::fp32, 256, 2048, 8);
  check_rms_norm_gemv(GemvKernel::mma, 20011, 2048, 4);  // > 2 x 132 blocks x 8 warps x 4 rows: several strides
}

// The norm makes the result independent of the input's scale: tiny and large inputs.
TEST(CudaGemv, RmsNormGemvInputScale) {
  REQUIRE_GPU();
  for (GemvKernel k : {GemvKernel::prefetch, GemvKernel::mma})
    for (float scale : {1e-3f, 1e3f}) check_rms_norm_gemv(k, 65, 2048, 4, scale);
  for (float scale : {1e-3f, 1e3f}) check_rms_norm_gemv(GemvKernel::fp32, 65, 2048, 8, scale);
}

// Which kernel takes which matrix: the prefetch kernel the model's input projections (a block's
// rows within its shared memory), not lm_head's rows nor widths off the 512-column grid; mma any
// 4-bit rows of up to 4096 columns; fp32 only 8-bit rows; nobody more than 4096 columns.
TEST(CudaGemv, KernelsTakeTheirFormats) {
  auto takes = [](GemvKernel k, int rows, int cols, int bits, bool accumulate = false) {
    return cuda::gemv_supports(k, shape_only(rows, cols, bits), accumulate, cuda::DeviceLimits{132});
  };
  for (auto [rows, cols] : {std::pair{12352, 2048}, {9216, 2048}, {2048, 4096}, {2048, 512}, {21120, 2048}})
    EXPECT_TRUE(takes(GemvKernel::prefetch, rows, cols, 4)) << rows << " x " << cols;
  EXPECT_FALSE(takes(GemvKernel::prefetch, 21121, 2048, 4));       // 11 tiles for some block of 132
  EXPECT_FALSE(takes(GemvKernel::prefetch, 248320, 2048, 4));      // lm_head: mma
  EXPECT_FALSE(takes(GemvKernel::prefetch, 64, 1088, 4));          // not a multiple of 512 columns
  EXPECT_FALSE(takes(GemvKernel::prefetch, 2048, 4096, 4, true));  // the RMSNorm form only
  EXPECT_FALSE(takes(GemvKernel::prefetch, 2048, 2048, 8));
  EXPECT_TRUE(takes(GemvKernel::mma, 248320, 2048, 4));
  EXPECT_TRUE(takes(GemvKernel::mma, 2048, 4096, 4, true));
  EXPECT_FALSE(takes(GemvKernel::mma, 2048, 4160, 4));
  EXPECT_FALSE(takes(GemvKernel::mma, 256, 2048, 8));
  EXPECT_TRUE(takes(GemvKernel::fp32, 256, 2048, 8));
  EXPECT_TRUE(takes(GemvKernel::fp32, 256, 2048, 8, true));
  EXPECT_FALSE(takes(GemvKernel::fp32, 256, 2048, 4));
  EXPECT_FALSE(takes(GemvKernel::fp32, 256, 4160, 8));
}

// The prefetch kernel at the edges of its block ranges: 1..3 tiles, tiles around the SM count
// (one per block, some blocks two), partial last tiles, 5-6 tiles per block (the DeltaNet input
// projection), the most rows the blocks hold at 2048 columns on 132 SMs (10 tiles each).
TEST(CudaGemv, PrefetchBlockRangeEdges) {
  REQUIRE_GPU();
  for (int rows : {1, 15, 16, 17, 2111, 2112, 2113, 2127, 12352, 12353, 21120})
    if (cuda::gemv_supports(GemvKernel::prefetch, shape_only(rows, 2048, 4), false, device()))
      check_rms_norm_gemv(GemvKernel::prefetch, rows, 2048, 4);
  for (int cols : {512, 1024, 1536, 3072, 4096}) check_rms_norm_gemv(GemvKernel::prefetch, 1000, cols, 4);
  check_rms_norm_gemv(GemvKernel::prefetch, 2001, 4096, 4, 1e3f);
  check_rms_norm_gemv(GemvKernel::prefetch, 12352, 2048, 4);  // the model's DeltaNet input projection
  check_rms_norm_gemv(GemvKernel::prefetch, 9216, 2048, 4);   // and attention's
}

// The matrices too large for the prefetch kernel (lm_head) on mma_gemv.
TEST(CudaGemv, LargeMatricesOnMmaGemv) {
  REQUIRE_GPU();
  for (int rows : {21121, 25344, 31681, 63377, 100003}) check_rms_norm_gemv(GemvKernel::mma, rows, 2048, 4);
  check_rms_norm_gemv(GemvKernel::mma, 40000, 4096, 4);
  check_rms_norm_gemv(GemvKernel::mma, 30001, 512, 4);
  check_rms_norm_gemv(GemvKernel::mma, 248320, 2048, 4);  // lm_head
}

// A kernel given a matrix it does not take says so instead of computing something.
TEST(CudaGemv, RefusesWhatItDoesNotTake) {
  REQUIRE_GPU();
  TestQMatrix w8(1, 64, 256, 8, 3), w4(1, 64, 256, 4, 4);
  DeviceArray<float> x(static_cast<size_t>(256)), gain(static_cast<size_t>(256)), y(static_cast<size_t>(64));
  EXPECT_THROW(cuda::rms_norm_gemv(GemvKernel::mma, w8.gpu(), x.get(), gain.get(), 1e-6f, y.get(), nullptr), Error);
  EXPECT_THROW(cuda::gemv_accumulate(GemvKernel::fp32, w4.gpu(), x.get(), y.get(), nullptr), Error);
  EXPECT_THROW(cuda::gemv_accumulate(GemvKernel::prefetch, w4.gpu(), x.get(), y.get(), nullptr), Error);
}

}  // namespace
}  // namespace lily::test
