// test_gemm_q4.cu: the tensor-core quantized GEMM (backend/cuda/gemm_q4.cu) against cpu::linear.
//
// Tolerance: max |gpu - cpu| <= 1e-2 * max |cpu|. The kernel rounds x and every dequantized
// weight to bf16 (relative 2^-9 each) and sums in fp32; the reference is fp32 throughout.
// Edge sizes: T around the 16/32/64-row tiles (1, 15, 16, 17, 64, 65, 300), N around the 64/128
// weight-row tiles and below one tile (1, 31, 64, 65, 200), K of 1, 2, 9 and 32 K tiles (the
// pipeline's prologue and ring wrap), 4 and 8 bits; outputs poisoned (NaN) before each launch.
#include "backend/cuda/cuda_check.h"  // first: it sets up fmt for nvcc
#include "backend/cuda/gemm_q4.h"

#include "backend/cpu/ops.h"
#include "cuda_test_util.h"

namespace lily::test {
namespace {

constexpr double kTolerance = 1e-2;

enum class Mode { store, accumulate };

void check_gemm(int N, int K, int T, int bits, Mode mode) {
  SCOPED_TRACE(testing::Message() << "N " << N << " K " << K << " T " << T << " bits " << bits
                                  << (mode == Mode::accumulate ? " accumulate" : ""));
  const uint32_t seed = uint32_t(N * 7919 + K * 131 + T * 17 + bits);
  TestQMatrix W(1, N, K, bits, seed);
  const auto x = random_floats(size_t(T) * K, seed + 1);
  const auto y0 = random_floats(size_t(T) * N, seed + 2);

  std::vector<float> expected(size_t(T) * N);
  cpu::linear(W.cpu(), x.data(), T, expected.data());
  if (mode == Mode::accumulate)
    for (size_t i = 0; i < expected.size(); ++i) expected[i] += y0[i];

  DeviceArray<float> dx(x), dy(size_t(T) * N);
  if (mode == Mode::accumulate) {
    dy.upload(y0);
    cuda::gemm_q4_accumulate(W.gpu(), dx.get(), dy.get(), T, nullptr);
  } else {
    dy.poison();
    cuda::gemm_q4(W.gpu(), dx.get(), dy.get(), T, nullptr);
  }
  CUDA_OK(cudaDeviceSynchronize());
  const double err = relative_error(dy.download(), expected);
  EXPECT_LT(err, kTolerance) << "max |gpu - cpu| / max |cpu| = " << err;
}

void check_swiglu(int I, int K, int T) {
  SCOPED_TRACE(testing::Message() << "swiglu I " << I << " K " << K << " T " << T);
  const uint32_t seed = uint32_t(I * 31 + K * 7 + T);
  TestQMatrix G(1, I, K, 4, seed), U(1, I, K, 4, seed + 1);
  const auto x = random_floats(size_t(T) * K, seed + 2);
  std::vector<float> g(size_t(T) * I), u(size_t(T) * I), expected(size_t(T) * I);
  cpu::linear(G.cpu(), x.data(), T, g.data());
  cpu::linear(U.cpu(), x.data(), T, u.data());
  for (size_t i = 0; i < expected.size(); ++i) expected[i] = cpu::silu(g[i]) * u[i];

  DeviceArray<float> dx(x), dy(expected.size());
  dy.poison();
  cuda::gemm_q4_swiglu(G.gpu(), U.gpu(), dx.get(), dy.get(), T, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  const double err = relative_error(dy.download(), expected);
  EXPECT_LT(err, kTolerance) << "max |gpu - cpu| / max |cpu| = " << err;
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
