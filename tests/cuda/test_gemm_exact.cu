// test_gemm_exact.cu: the fp32-accurate tensor-core GEMM (backend/cuda/gemm_exact.cu) against an
// exact host evaluation of the same formula.
//
// Reference, in double: y[t, n] = sum_g s[n, g] * (sum_{k in g} q x) + b[n, g] * (sum_{k in g} x)
// with the exact codes, scales, biases and fp32 x. Bound per output: 2e-5 * l1, l1 = sum_g (|s|
// sum |q x| + |b| sum |x|): ten times tighter than test_gemm_q4's bf16 bound, so rounding x to
// bf16 (one part instead of hi + lo) fails it, and an indexing error misses it by orders of
// magnitude. Edge sizes: T around the 64-row tiles (1, 15, 63, 64, 65, 200), N around the
// 64-row tiles (1, 8, 63, 64, 65, 256), K of 1, 2 and 32 groups, 4 and 8 bits; outputs
// poisoned (NaN) before each launch. Split K (gemm/split_k.h): the same bound with a
// workspace at few rows (the groups split over up to 32 blocks), the same bits run to run.
#include "backend/cuda/common/cuda_check.h"  // first: it sets up fmt for nvcc
#include "backend/cuda/gemm/gemm_exact.h"

#include "base/bf16.h"
#include "cuda_test_util.h"

#include <cmath>
#include <cstring>

namespace lily::test {
namespace {

constexpr double kBound = 2e-5;  // of l1, per output

std::vector<float> check_exact(int N, int K, int T, int bits, const cuda::SplitK* split = nullptr) {
  SCOPED_TRACE(testing::Message() << "N " << N << " K " << K << " T " << T << " bits " << bits
                                  << (split ? " split" : ""));
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
  cuda::gemm_exact(W.gpu(), dx.get(), dy.get(), T, nullptr, split);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> got = dy.download();
  expect_within(got, want, bound);
  return got;
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

TEST(CudaGemmExact, SplitK) {
  REQUIRE_GPU();
  cuda::SplitKScratch scratch;
  for (int bits : {4, 8})
    for (int T : {1, 2, 15, 63, 64, 65, 200})
      for (int N : {1, 65, 256}) check_exact(N, 2048, T, bits, scratch.get());
  check_exact(8, 256, 3, 8, scratch.get());     // 4 groups: 2 splits of two
  check_exact(256, 1984, 2, 8, scratch.get());  // 31 groups: 11 splits (the sum's batches of 2 and one more)
  const auto a = check_exact(256, 2048, 2, 8, scratch.get());
  const auto b = check_exact(256, 2048, 2, 8, scratch.get());
  const auto whole = check_exact(256, 2048, 2, 8);
  size_t same_a_b = 0, same_whole = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    same_a_b += std::memcmp(&a[i], &b[i], sizeof(float)) == 0;
    same_whole += std::memcmp(&a[i], &whole[i], sizeof(float)) == 0;
  }
  EXPECT_EQ(same_a_b, a.size()) << "the split sum is not deterministic";
  EXPECT_LT(same_whole, a.size()) << "the product did not split";
}

}  // namespace
}  // namespace lily::test
