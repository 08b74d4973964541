// test_gemv_rows.cu: the few-row projections (backend/cuda/gemv/gemv_rows.h) against the
// tensor-core kernels' own arithmetic on the host (cuda_test_util.h's bf16_reference).
//
// Reference: x rounded to bf16 (the RMSNorm form: cpu::rms_norm's x * inv * gain rounded, as the
// kernel does), each weight bf16(s * q + b), products summed in double; bound per output 2e-4 *
// sum_k |x_k w_k| (an indexing error is off by ~|y|, hundreds of times more; test_gemm_q4.cu says
// why this bound), plus in the RMSNorm form one bf16 step (2^-7) of the largest term: the GPU sums
// mean(x^2) in another order, so a value may round to the neighbouring bf16. The RMSNorm form is
// also held to the fp32 reference (cpu::rms_norm, cpu::linear) at 1e-2 of max |y|.
// Edge sizes: T 1..16 across the 8-token tiles (1, 2, 7, 8, 9, 15, 16), rows around the 16-row
// tiles (1, 15, 16, 17, 33, 300), cols of one group, a partial 512-column warp share and the
// widest (64, 192, 576, 2048, 4096 for the accumulating form), the shapes of the ring kernel;
// outputs NaN-poisoned before each launch, guard values after every output part.
#include "backend/cuda/common/cuda_check.h"  // first: it sets up fmt for nvcc
#include "backend/cuda/gemv/gemv_rows.h"

#include "backend/cpu/ops.h"
#include "cuda_test_util.h"

namespace lily::test {
namespace {

constexpr double kBound = 2e-4;  // of sum_k |x_k w_k|, per output
constexpr float kGuard = 12345.f;
constexpr int kGuardFloats = 64;

// rms_norm_gemv_rows of [rows, cols] for T tokens, its output split into parts of the given
// sizes (summing to rows), each in its own buffer [T, size] followed by guards.
void check_rms_norm(int rows, int cols, int T, const std::vector<int>& part_rows) {
  SCOPED_TRACE(testing::Message() << "rms_norm rows " << rows << " cols " << cols << " T " << T << " parts "
                                  << part_rows.size());
  const uint32_t seed = uint32_t(rows * 7919 + cols * 131 + T * 17);
  TestQMatrix W(1, rows, cols, 4, seed);
  ASSERT_TRUE(cuda::gemv_rows_supports(W.gpu(), true));
  const auto x = random_floats(size_t(T) * cols, seed + 1, 3.f);
  auto gain = random_floats(size_t(cols), seed + 2, 0.2f);
  for (auto& g : gain) g += 1.f;  // zero-centred: 1 + w
  const float eps = 1e-6f;
  std::vector<float> normed(x.size()), fp32(size_t(T) * rows);
  cpu::rms_norm(x.data(), gain.data(), T, cols, eps, normed.data());
  const Bf16Reference ref = bf16_reference(W, normed, T);
  cpu::linear(W.cpu(), normed.data(), T, fp32.data());

  DeviceArray<float> dx(x), dgain(gain);
  std::vector<std::unique_ptr<DeviceArray<float>>> out;
  cuda::RowsOutput y;
  int first = 0;
  for (int n : part_rows) {
    out.push_back(std::make_unique<DeviceArray<float>>(size_t(T) * n + kGuardFloats));
    std::vector<float> init(out.back()->size(), kGuard);
    std::fill(init.begin(), init.begin() + ptrdiff_t(size_t(T) * n), std::nanf(""));
    out.back()->upload(init);
    y.then(out.back()->get(), first, n);
    first += n;
  }
  ASSERT_EQ(first, rows);
  cuda::rms_norm_gemv_rows(W.gpu(), dx.get(), T, dgain.get(), eps, y, nullptr);
  CUDA_OK(cudaDeviceSynchronize());

  std::vector<float> got(size_t(T) * rows);
  first = 0;
  for (size_t p = 0; p < part_rows.size(); ++p) {
    const int n = part_rows[p];
    const auto part = out[p]->download();
    for (size_t i = size_t(T) * n; i < part.size(); ++i) ASSERT_EQ(part[i], kGuard) << "part " << p << " index " << i;
    for (int t = 0; t < T; ++t)
      for (int r = 0; r < n; ++r) got[size_t(t) * rows + first + r] = part[size_t(t) * n + r];
    first += n;
  }
  std::vector<double> bound(ref.l1.size());
  for (size_t i = 0; i < bound.size(); ++i) bound[i] = kBound * ref.l1[i] + std::ldexp(ref.max_term[i], -7);
  expect_within(got, ref.y, bound);
  const double err = relative_error(got, fp32);
  EXPECT_LT(err, 1e-2) << "max |gpu - fp32 reference| / max |fp32 reference| = " << err;
}

void check_accumulate(int rows, int cols, int T) {
  SCOPED_TRACE(testing::Message() << "accumulate rows " << rows << " cols " << cols << " T " << T);
  const uint32_t seed = uint32_t(rows * 31 + cols * 7 + T);
  TestQMatrix W(1, rows, cols, 4, seed);
  ASSERT_TRUE(cuda::gemv_rows_supports(W.gpu(), false));
  const auto x = random_floats(size_t(T) * cols, seed + 1);
  auto y0 = random_floats(size_t(T) * rows + kGuardFloats, seed + 2);
  Bf16Reference ref = bf16_reference(W, x, T);
  std::vector<double> bound(ref.l1.size());
  for (size_t i = 0; i < bound.size(); ++i) {
    ref.y[i] += y0[i];
    bound[i] = kBound * ref.l1[i] + 1e-6 * std::fabs(y0[i]);
  }

  DeviceArray<float> dx(x), dy(y0);
  cuda::gemv_rows_accumulate(W.gpu(), dx.get(), T, dy.get(), nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  auto got = dy.download();
  for (size_t i = size_t(T) * rows; i < got.size(); ++i) ASSERT_EQ(got[i], y0[i]) << "wrote past the rows: " << i;
  got.resize(size_t(T) * rows);
  expect_within(got, ref.y, bound);
}

TEST(CudaGemvRows, RmsNormEdgeSizes) {
  REQUIRE_GPU();
  for (int T : {1, 2, 7, 8, 9, 15, 16})
    for (int rows : {1, 15, 16, 17, 33, 300})
      for (int cols : {64, 192, 576, 2048}) check_rms_norm(rows, cols, T, {rows});
}

TEST(CudaGemvRows, AccumulateEdgeSizes) {
  REQUIRE_GPU();
  for (int T : {1, 2, 7, 8, 9, 15, 16})
    for (int rows : {1, 15, 16, 17, 33, 300})
      for (int cols : {64, 192, 576, 4096}) check_accumulate(rows, cols, T);
}

// A fused matrix's output into its parts: [qkv; z; b; a]-like sizes that do not fall on tiles,
// and a part of one row.
TEST(CudaGemvRows, FusedParts) {
  REQUIRE_GPU();
  for (int T : {1, 9, 16}) {
    check_rms_norm(40 + 24 + 1 + 7, 256, T, {40, 24, 1, 7});
    check_rms_norm(512 + 256 + 16 + 16, 2048, T, {512, 256, 16, 16});
    check_rms_norm(33 + 31, 128, T, {33, 31});
  }
}

// The model's shapes: DeltaNet in_proj (fused, in four parts), attention q/k/v (three parts),
// out_proj and o_proj (accumulating).
TEST(CudaGemvRows, ModelShapes) {
  REQUIRE_GPU();
  for (int T : {5, 16}) {
    check_rms_norm(12352, 2048, T, {8192, 4096, 32, 32});
    check_rms_norm(9216, 2048, T, {8192, 512, 512});
    check_accumulate(2048, 4096, T);
  }
}

// The shapes the shared-memory ring kernel takes (gemv_rows_ring.cu: cols 512, 1024, 2048, rows
// a multiple of a task's): fewer items than blocks (32 rows), several a block (8192 rows), T
// across the token tiles; and a row count just off it, which the register form takes.
TEST(CudaGemvRows, RingShapes) {
  REQUIRE_GPU();
  for (int T : {1, 8, 9, 16})
    for (int cols : {512, 1024, 2048}) {
      for (int rows : {32, 64, 320, 8192}) {
        check_rms_norm(rows, cols, T, {rows});
        check_accumulate(rows, cols, T);
      }
      check_rms_norm(48, cols, T, {48});
    }
}

TEST(CudaGemvRows, RefusesWhatItDoesNotTake) {
  REQUIRE_GPU();
  TestQMatrix q8(1, 16, 128, 8, 1), wide(1, 16, 4096, 4, 2);
  EXPECT_FALSE(cuda::gemv_rows_supports(q8.gpu(), false));
  EXPECT_FALSE(cuda::gemv_rows_supports(wide.gpu(), true));  // the RMSNorm form: at most 2048 columns
  EXPECT_TRUE(cuda::gemv_rows_supports(wide.gpu(), false));
  TestQMatrix W(1, 16, 128, 4, 3);
  DeviceArray<float> x(size_t(17) * 128), y(size_t(17) * 16);
  EXPECT_THROW(cuda::gemv_rows_accumulate(W.gpu(), x.get(), 17, y.get(), nullptr), Error);
  EXPECT_THROW(cuda::gemv_rows_accumulate(W.gpu(), x.get(), 0, y.get(), nullptr), Error);
  EXPECT_THROW(cuda::gemv_rows_accumulate(q8.gpu(), x.get(), 1, y.get(), nullptr), Error);
}

}  // namespace
}  // namespace lily::test
