// test_gemm_q4.cu: the tensor-core quantized GEMM (backend/cuda/gemm_q4.cu) against the
// kernel's own arithmetic on the host.
//
// Reference: x rounded to bf16, every weight dequantized and rounded to bf16 (w = bf16(s*q + b)),
// products summed in double. Only the order and precision of the fp32 sums differ from the GPU,
// so each output is checked against a tight bound: |gpu - ref| <= 2e-4 * sum_k |x_k w_k|. An
// indexing error (a wrong row, column, group or tile) is off by about |y| ~ sum |x w| / sqrt(K),
// hundreds of times the bound. (Against the fp32 reference cpu::linear the bf16 rounding alone is
// ~1e-3 of |y|, and a relative bound there fails on outputs that happen to cancel.)
// Edge sizes: T around the 16/32/64-row tiles (1, 15, 16, 17, 64, 65, 300), N around the 64/128
// weight-row tiles and below one tile (1, 31, 64, 65, 200), K of 1, 2, 9 and 32 K tiles (the
// pipeline's prologue and ring wrap), 4 and 8 bits; outputs poisoned (NaN) before each launch.
// Split K (gemm/split_k.h): the same checks with a workspace at the few-token sizes where the
// grid is split, the split outputs equal bit for bit from run to run (and the tickets reset:
// every later product of the test reuses the workspace), and different in their last bits from
// the unsplit ones (the split path really ran).
#include "backend/cuda/common/cuda_check.h"  // first: it sets up fmt for nvcc
#include "backend/cuda/gemm/gemm_q4.h"

#include <cstring>

#include "base/bf16.h"
#include "cuda_test_util.h"

namespace lily::test {
namespace {

constexpr double kBound = 2e-4;  // of sum_k |x_k w_k|, per output

enum class Mode { store, accumulate };

std::vector<float> check_gemm(int N, int K, int T, int bits, Mode mode, const cuda::SplitK* split = nullptr) {
  SCOPED_TRACE(testing::Message() << "N " << N << " K " << K << " T " << T << " bits " << bits
                                  << (mode == Mode::accumulate ? " accumulate" : "") << (split ? " split" : ""));
  const uint32_t seed = uint32_t(N * 7919 + K * 131 + T * 17 + bits);
  TestQMatrix W(1, N, K, bits, seed);
  const auto x = random_floats(size_t(T) * K, seed + 1);
  const auto y0 = random_floats(size_t(T) * N, seed + 2);

  Bf16Reference ref = bf16_reference(W, x, T);
  std::vector<double> bound(ref.l1.size());
  for (size_t i = 0; i < bound.size(); ++i) {
    bound[i] = kBound * ref.l1[i];
    if (mode == Mode::accumulate) ref.y[i] += y0[i], bound[i] += 1e-6 * std::fabs(y0[i]);
  }

  DeviceArray<float> dx(x), dy(size_t(T) * N);
  if (mode == Mode::accumulate) {
    dy.upload(y0);
    cuda::gemm_q4_accumulate(W.gpu(), dx.get(), dy.get(), T, nullptr, split);
  } else {
    dy.poison();
    cuda::gemm_q4(W.gpu(), dx.get(), dy.get(), T, nullptr, split);
  }
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> got = dy.download();
  expect_within(got, ref.y, bound);
  return got;
}

std::vector<float> check_swiglu(int I, int K, int T, const cuda::SplitK* split = nullptr) {
  SCOPED_TRACE(testing::Message() << "swiglu I " << I << " K " << K << " T " << T << (split ? " split" : ""));
  const uint32_t seed = uint32_t(I * 31 + K * 7 + T);
  TestQMatrix G(1, I, K, 4, seed), U(1, I, K, 4, seed + 1);
  const auto x = random_floats(size_t(T) * K, seed + 2);
  const SwigluReference ref = swiglu_reference(G, U, x, T, kBound);

  DeviceArray<float> dx(x), dy(ref.want.size());
  dy.poison();
  cuda::gemm_q4_swiglu(G.gpu(), U.gpu(), dx.get(), dy.get(), T, nullptr, split);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> got = dy.download();
  expect_within(got, ref.want, ref.bound);
  return got;
}

size_t bits_differ(const std::vector<float>& a, const std::vector<float>& b) {
  size_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return n;
}

TEST(CudaGemmQ4, EdgeSizes) {
  REQUIRE_GPU();
  for (int bits : {4, 8})
    for (int T : {1, 15, 16, 17, 64, 65, 300})
      for (int N : {1, 31, 64, 65, 200})
        for (int K : {64, 128, 576}) check_gemm(N, K, T, bits, Mode::store);
}

TEST(CudaGemmQ4, LongK) {
  REQUIRE_GPU();
  for (int bits : {4, 8})
    for (int T : {16, 65, 300}) check_gemm(257, 2048, T, bits, Mode::store);
}

TEST(CudaGemmQ4, Accumulate) {
  REQUIRE_GPU();
  for (int bits : {4, 8})
    for (int T : {1, 17, 65})
      for (int N : {1, 65, 200}) check_gemm(N, 192, T, bits, Mode::accumulate);
}

TEST(CudaGemmQ4, SwiGLU) {
  REQUIRE_GPU();
  for (int T : {1, 15, 16, 17, 64, 65, 300})
    for (int I : {16, 33, 64, 100}) check_swiglu(I, 128, T);
  check_swiglu(512, 2048, 65);
}

// Model shapes of one prefill chunk: in_proj_qkv, out_proj (accumulate), in_proj_b, router.
TEST(CudaGemmQ4, ModelShapes) {
  REQUIRE_GPU();
  check_gemm(8192, 2048, 256, 4, Mode::store);
  check_gemm(2048, 4096, 256, 4, Mode::accumulate);
  check_gemm(32, 2048, 256, 4, Mode::store);
  check_gemm(256, 2048, 256, 8, Mode::store);
}

// Few tokens against long K: the grids of 1 to 32 blocks split K over up to 32 blocks each
// (1536 columns: 12 splits, a batch of 8 in the final sum and 4 more).
TEST(CudaGemmQ4, SplitK) {
  REQUIRE_GPU();
  cuda::SplitKScratch scratch;
  for (int bits : {4, 8})
    for (int T : {1, 2, 15, 16, 17, 64, 65})
      for (int N : {1, 31, 65, 200})
        for (int K : {576, 1536, 2048}) check_gemm(N, K, T, bits, Mode::store, scratch.get());
  for (int T : {1, 2, 17})
    for (int N : {1, 65, 2048}) check_gemm(N, 4096, T, 4, Mode::accumulate, scratch.get());
  for (int T : {1, 2, 16, 17}) check_swiglu(512, 2048, T, scratch.get());

  // Same bits from run to run; not the unsplit bits (the split sums in another order).
  const auto a = check_gemm(200, 2048, 2, 4, Mode::store, scratch.get());
  const auto b = check_gemm(200, 2048, 2, 4, Mode::store, scratch.get());
  const auto whole = check_gemm(200, 2048, 2, 4, Mode::store);
  EXPECT_EQ(bits_differ(a, b), 0u);
  EXPECT_GT(bits_differ(a, whole), 0u) << "the product did not split";
  const auto sa = check_swiglu(512, 2048, 2, scratch.get());
  EXPECT_EQ(bits_differ(sa, check_swiglu(512, 2048, 2, scratch.get())), 0u);
  EXPECT_GT(bits_differ(sa, check_swiglu(512, 2048, 2)), 0u) << "the SwiGLU product did not split";
}

// Rows and columns past the output must not be touched: y is a window into a larger buffer.
TEST(CudaGemmQ4, WritesOnlyItsRows) {
  REQUIRE_GPU();
  for (int T : {3, 17, 70}) {
    const int N = 65, K = 128;
    TestQMatrix W(1, N, K, 4, 5);
    const auto x = random_floats(size_t(T) * K, 6);
    DeviceArray<float> dx(x), dy(size_t(T) * N + 64);
    std::vector<float> sentinel(dy.size(), 12345.f);
    dy.upload(sentinel);
    cuda::gemm_q4(W.gpu(), dx.get(), dy.get(), T, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    const auto got = dy.download();
    for (size_t i = size_t(T) * N; i < got.size(); ++i) ASSERT_EQ(got[i], 12345.f) << "T " << T << " index " << i;
  }
}

}  // namespace
}  // namespace lily::test
