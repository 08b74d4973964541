// test_gemm_exact.cu: the fp32-accurate tensor-core GEMM (backend/cuda/gemm_exact.cu) against an
// exact host evaluation of the same formula.
//
// Reference, in double: y[t, n] = sum_g s[n, g] * (sum_{k in g} q x) + b[n, g] * (sum_{k in g} x)
// with the exact codes, scales, biases and fp32 x. Bound per output: 2e-5 * l1, l1 = sum_g (|s|
// sum |q x| + |b| sum |x|): ten times tighter than test_gemm_q4's bf16 bound, so rounding x to
// bf16 (one part instead of hi + lo) fails it, and an indexing error misses it by orders of
// magnitude. Edge sizes: T around the 64-row tiles (1, 15, 63, 64, 65, 200), N around the
// 64-row tiles (1, 8, 63, 64, 65, 256), K of 1, 2 and 32 groups, 4 and 8 bits; outputs
// poisoned (NaN) before each launch.
#include "backend/cuda/common/cuda_check.h"  // first: it sets up fmt for nvcc
#include "backend/cuda/prefill/gemm_exact.h"

#include "base/bf16.h"
#include "cuda_test_util.h"

#include <cmath>

namespace lily::test {
namespace {

constexpr double kBound = 2e-5;  // of l1, per output

void check_exact(int N, int K, int T, int bits) {
  SCOPED_TRACE(testing::Message() << "N " << N << " K " << K << " T " << T << " bits " << bits);
  const uint32_t seed = uint32_t(N * 7919 + K * 131 + T * 17 + bits);
  TestQMatrix W(1, N, K, bits, seed);
  const auto x = random_floats(size_t(T) * K, seed + 1);
  const int per_word = 32 / bits, groups = K / 64;
  const uint32_t mask = (1u << bits) - 1u;

  std::vector<double> want(size_t(T) * N), bound(want.size());
  for (int t = 0; t < T; ++t)
    for (int n = 0; n < N; ++n) {
      double y = 0, l1 = 0;
      for (int g = 0; g < groups; ++g) {
        const double s = to_float(W.host.scales[size_t(n) * groups + g]);
        const double b = to_float(W.host.biases[size_t(n) * groups + g]);
        double qx = 0, aqx = 0, xs = 0, axs = 0;
        for (int k = 64 * g; k < 64 * g + 64; ++k) {
          const uint32_t word = W.host.codes[(size_t(n) * K + k) / per_word];
          const double q = double((word >> (bits * (k % per_word))) & mask);
          const double xv = x[size_t(t) * K + k];
          qx += q * xv, aqx += std::fabs(q * xv), xs += xv, axs += std::fabs(xv);
        }
        y += s * qx + b * xs;
        l1 += std::fabs(s) * aqx + std::fabs(b) * axs;
      }
      want[size_t(t) * N + n] = y;
      bound[size_t(t) * N + n] = kBound * l1;
    }

  DeviceArray<float> dx(x), dy(want.size());
  dy.poison();
  cuda::gemm_exact(W.gpu(), dx.get(), dy.get(), T, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  expect_within(dy.download(), want, bound);
}

TEST(CudaGemmExact, EdgeSizes) {
  REQUIRE_GPU();
  for (int bits : {4, 8})
    for (int T : {1, 15, 63, 64, 65, 200})
      for (int N : {1, 8, 63, 64, 65})
        for (int K : {64, 128}) check_exact(N, K, T, bits);
}

// The prefill router's shape: 256 experts, H = 2048, 8 bits; and a 4-bit matrix of that size.
TEST(CudaGemmExact, RouterShape) {
  REQUIRE_GPU();
  check_exact(256, 2048, 300, 8);
  check_exact(256, 2048, 64, 4);
}

}  // namespace
}  // namespace lily::test
