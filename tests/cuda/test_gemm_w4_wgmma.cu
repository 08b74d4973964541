// test_gemm_w4_wgmma.cu: the wgmma W4A16 GEMM (backend/cuda/gemm/gemm_w4_wgmma.cu) against the
// kernel's own arithmetic on the host, as test_gemm_q4.cu checks gemm_q4: x rounded to bf16,
// every weight bf16(s*q + b), products summed in double; each output within 2e-4 * sum_k |x w|
// (an indexing error is off by ~|y|, hundreds of times that). Outputs poisoned (NaN) first.
// Edge sizes: tokens around the 64/128-token tiles (1, 63, 64, 65, 128, 129, 300), weight rows
// around the 128-row (SwiGLU: 64-row) block (1, 127, 128, 129, 300), K of 1 to 9 groups (the
// scales copied plainly below 8 or off a multiple of 8) and 8, 32 and 64 groups (past the ring); the grouped forms with
// empty, 1-row, full and split experts and gathered rows. x_to_bf16_permuted against the host permutation, bit for bit.
#include "backend/cuda/common/cuda_check.h"  // first: it sets up fmt for nvcc
#include "backend/cuda/gemm/gemm_w4_wgmma.h"
#include "backend/cuda/gemm/gemm_w4_wgmma_layout.h"

#include <cstring>
#include <memory>

#include "backend/cpu/ops.h"
#include "base/bf16.h"
#include "cuda_test_util.h"

namespace lily::test {
namespace {

constexpr double kBound = 2e-4;  // of sum_k |x_k w_k|, per output

// x as x_to_bf16_permuted writes it, into xp [T, K] on the device.
void permute(const std::vector<float>& x, int T, int K, const DeviceArray<bf16>& xp) {
  DeviceArray<float> dx(x);
  cuda::x_to_bf16_permuted(dx.get(), xp.get(), T, K, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
}

enum class Mode { store, accumulate };

void check_gemm(int N, int K, int T, Mode mode) {
  SCOPED_TRACE(testing::Message() << "N " << N << " K " << K << " T " << T
                                  << (mode == Mode::accumulate ? " accumulate" : ""));
  const uint32_t seed = uint32_t(N * 7919 + K * 131 + T * 17);
  TestQMatrix W(1, N, K, 4, seed);
  const auto x = random_floats(size_t(T) * K, seed + 1);
  const auto y0 = random_floats(size_t(T) * N, seed + 2);
  Bf16Reference ref = bf16_reference(W, x, T);
  std::vector<double> bound(ref.l1.size());
  for (size_t i = 0; i < bound.size(); ++i) {
    bound[i] = kBound * ref.l1[i];
    if (mode == Mode::accumulate) ref.y[i] += y0[i], bound[i] += 1e-6 * std::fabs(y0[i]);
  }
  const DeviceArray<bf16> xp(size_t(T) * K);
  permute(x, T, K, xp);
  DeviceArray<float> dy(size_t(T) * N);
  if (mode == Mode::accumulate) {
    dy.upload(y0);
    cuda::gemm_w4_wgmma_accumulate(W.gpu(), xp.get(), dy.get(), T, nullptr);
  } else {
    dy.poison();
    cuda::gemm_w4_wgmma(W.gpu(), xp.get(), dy.get(), T, nullptr);
  }
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  expect_within(dy.download(), ref.y, bound);
}

void check_swiglu(int I, int K, int T) {
  SCOPED_TRACE(testing::Message() << "swiglu I " << I << " K " << K << " T " << T);
  const uint32_t seed = uint32_t(I * 31 + K * 7 + T);
  TestQMatrix G(1, I, K, 4, seed), U(1, I, K, 4, seed + 1);
  const auto x = random_floats(size_t(T) * K, seed + 2);
  const SwigluReference ref = swiglu_reference(G, U, x, T, kBound);
  const DeviceArray<bf16> xp(size_t(T) * K);
  permute(x, T, K, xp);
  DeviceArray<float> dy(ref.want.size());
  dy.poison();
  cuda::gemm_w4_wgmma_swiglu(G.gpu(), U.gpu(), xp.get(), dy.get(), T, nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  expect_within(dy.download(), ref.want, ref.bound);
}

TEST(CudaGemmW4Wgmma, PermutesXExactly) {
  REQUIRE_GPU();
  for (int T : {1, 3, 65})
    for (int K : {64, 512, 2048}) {
      const auto x = random_floats(size_t(T) * K, uint32_t(T * 100 + K));
      const DeviceArray<bf16> xp(size_t(T) * K);
      permute(x, T, K, xp);
      const std::vector<bf16> got = xp.download();
      for (int t = 0; t < T; ++t)
        for (int k = 0; k < K; ++k) {
          const int src = k / 64 * 64 + cuda::w4_wgmma::k_of_column(k % 64);
          ASSERT_EQ(got[size_t(t) * K + k].bits, to_bf16(x[size_t(t) * K + src]).bits) << "T " << T << " K " << K;
        }
    }
}

TEST(CudaGemmW4Wgmma, EdgeSizes) {
  REQUIRE_GPU();
  // 129, 150, 160, 161, 300: last tiles of 1, 22, 32, 33 and 44 tokens (the 16-, 32- and 64-wide products)
  for (int T : {1, 63, 64, 65, 128, 129, 150, 160, 161, 300})
    for (int N : {1, 127, 128, 129, 300}) check_gemm(N, 512, T, Mode::store);
}

// K of 1 to 7 groups and past 8 without being a multiple: the scales' plain-copy path (tiny
// models: hidden 256, expert intermediate 128).
TEST(CudaGemmW4Wgmma, ShortAndOddK) {
  REQUIRE_GPU();
  for (int K : {64, 128, 256, 448, 576})
    for (int T : {1, 65, 130}) check_gemm(129, K, T, Mode::store);
  check_swiglu(65, 256, 70);
}

TEST(CudaGemmW4Wgmma, LongK) {
  REQUIRE_GPU();
  for (int T : {16, 65, 200}) {
    check_gemm(257, 2048, T, Mode::store);
    check_gemm(129, 4096, T, Mode::store);
  }
}

TEST(CudaGemmW4Wgmma, Accumulate) {
  REQUIRE_GPU();
  for (int T : {1, 65, 130})
    for (int N : {1, 129}) check_gemm(N, 1024, T, Mode::accumulate);
}

TEST(CudaGemmW4Wgmma, SwiGLU) {
  REQUIRE_GPU();
  for (int T : {1, 64, 65, 200})
    for (int I : {1, 63, 64, 65, 130}) check_swiglu(I, 512, T);
  check_swiglu(512, 2048, 130);
}

// Model shapes of one prefill chunk: in_proj_qkvz, out_proj (accumulate), shared expert.
TEST(CudaGemmW4Wgmma, ModelShapes) {
  REQUIRE_GPU();
  check_gemm(12352, 2048, 256, Mode::store);
  check_gemm(2048, 4096, 256, Mode::accumulate);
  check_swiglu(512, 2048, 256);
}

// The grouped forms: experts of `counts[e]` positions each (expert-sorted), tiles of at most
// tile_rows positions, position p reading x row gather[p] / div.
void check_grouped(const std::vector<int>& counts, int N, int K, int tile_rows, int div, bool swiglu) {
  SCOPED_TRACE(testing::Message() << "grouped N " << N << " K " << K << " tile " << tile_rows << " div " << div
                                  << (swiglu ? " swiglu" : ""));
  const int E = int(counts.size());
  int positions = 0;
  std::vector<int32_t> tiles;
  std::vector<int> expert_of;
  for (int e = 0; e < E; ++e) {
    for (int first = 0; first < counts[e]; first += tile_rows)
      tiles.insert(tiles.end(), {e, positions + first, positions + std::min(counts[e], first + tile_rows), 0});
    for (int i = 0; i < counts[e]; ++i) expert_of.push_back(e);
    positions += counts[e];
  }
  const int num_tiles = int(tiles.size() / 4), max_tiles = num_tiles + 3;  // blocks past the count exit
  tiles.resize(size_t(max_tiles) * 4, 0);
  const int rows_x = std::max(1, (positions + div - 1) / div);
  std::vector<int32_t> gather(std::max(positions, 1));
  std::mt19937 rng(uint32_t(positions * 13 + N));
  for (auto& g : gather) g = int32_t(rng() % uint32_t(rows_x * div));
  const uint32_t seed = uint32_t(N * 3 + K + positions);
  TestQMatrix W(E, N, K, 4, seed), U(E, N, K, 4, seed + 1);
  const auto x = random_floats(size_t(rows_x) * K, seed + 2);

  // The reference, position by position against its expert's matrix.
  std::vector<double> want(size_t(positions) * N), bound(want.size());
  for (int e = 0; e < E; ++e) {
    // Expert e's positions ps and the x rows they read, xe [ps.size(), K].
    std::vector<float> xe;
    std::vector<int> ps;
    for (int p = 0; p < positions; ++p)
      if (expert_of[p] == e) {
        ps.push_back(p);
        const int r = gather[p] / div;
        xe.insert(xe.end(), x.begin() + size_t(r) * K, x.begin() + size_t(r + 1) * K);
      }
    if (ps.empty()) continue;
    const TestQMatrix We = W.entry(e);
    // This expert's outputs [ps.size(), N], then each row to its position.
    const int rows = int(ps.size());
    const Bf16Reference g = swiglu ? Bf16Reference{} : bf16_reference(We, xe, rows);
    const SwigluReference s = swiglu ? swiglu_reference(We, U.entry(e), xe, rows, kBound) : SwigluReference{};
    for (size_t i = 0; i < ps.size(); ++i)
      for (int n = 0; n < N; ++n) {
        const size_t at = i * N + n, out = size_t(ps[i]) * N + n;
        if (swiglu) want[out] = s.want[at], bound[out] = s.bound[at];
        else want[out] = g.y[at], bound[out] = kBound * g.l1[at];
      }
  }

  const DeviceArray<bf16> xp(size_t(rows_x) * K);
  permute(x, rows_x, K, xp);
  DeviceArray<int32_t> dtiles(tiles), dcount(std::vector<int32_t>{num_tiles}), dgather(gather);
  DeviceArray<float> dy(std::max<size_t>(want.size(), 1));
  dy.poison();
  cuda::GroupedTiles gt;
  gt.tiles = dtiles.get(), gt.num_tiles = dcount.get(), gt.max_tiles = max_tiles, gt.tile_rows = tile_rows;
  gt.gather = dgather.get(), gt.gather_div = div;
  if (swiglu) cuda::gemm_w4_wgmma_grouped_swiglu(W.gpu(), U.gpu(), xp.get(), gt, dy.get(), nullptr);
  else cuda::gemm_w4_wgmma_grouped(W.gpu(), xp.get(), gt, dy.get(), nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  if (positions == 0) return;
  expect_within(dy.download(), want, bound);
}

TEST(CudaGemmW4Wgmma, Grouped) {
  REQUIRE_GPU();
  const std::vector<int> counts = {0, 1, 63, 64, 65, 130, 7};
  for (int tile_rows : {16, 64, 128})
    for (bool swiglu : {false, true}) {
      check_grouped(counts, swiglu ? 65 : 129, 512, tile_rows, 1, swiglu);
      check_grouped(counts, swiglu ? 64 : 128, 2048, tile_rows, 8, swiglu);  // 8 positions a token (top-8)
    }
  // Tiles of 16, 17, 32, 33 and 20 positions after a full one (the narrower products of an
  // expert's last tile).
  for (int tile_rows : {64, 128})
    for (bool swiglu : {false, true}) check_grouped({144, 145, 160, 161, 148, 3}, 128, 512, tile_rows, 8, swiglu);
  check_grouped({128, 0, 128, 3}, 2048, 512, 64, 8, false);  // the experts' down shape
  check_grouped({129, 0, 300, 3}, 2048, 512, 128, 8, false);
  check_grouped(counts, 65, 256, 64, 8, true);    // tiny models: hidden 256,
  check_grouped(counts, 256, 128, 64, 1, false);  // expert intermediate 128
}

// rms_norm_bf16_permuted: x as cpu::rms_norm (fp32 sums in another order), xp the bf16 of that x
// in x_to_bf16_permuted's order, bit for bit; without x, the same xp.
TEST(CudaGemmW4Wgmma, RmsNormIntoBf16) {
  REQUIRE_GPU();
  for (int K : {64, 2048, 4096})
    for (int T : {1, 3, 33}) {
      SCOPED_TRACE(testing::Message() << "K " << K << " T " << T);
      const auto h = random_floats(size_t(T) * K, uint32_t(K + T), 3.f);
      auto gain = random_floats(size_t(K), uint32_t(K + T + 1), 0.3f);
      for (auto& g : gain) g += 1.f;
      std::vector<float> want(h.size());
      cpu::rms_norm(h.data(), gain.data(), T, K, 1e-6f, want.data());
      DeviceArray<float> dh(h), dgain(gain), dx(h.size());
      DeviceArray<bf16> xp(h.size()), xp_alone(h.size()), xp_ref(h.size());
      dx.poison(), xp.poison(), xp_alone.poison();
      cuda::rms_norm_bf16_permuted(dh.get(), dgain.get(), 1e-6f, T, K, dx.get(), xp.get(), nullptr);
      cuda::rms_norm_bf16_permuted(dh.get(), dgain.get(), 1e-6f, T, K, nullptr, xp_alone.get(), nullptr);
      cuda::x_to_bf16_permuted(dx.get(), xp_ref.get(), T, K, nullptr);
      CUDA_OK(cudaDeviceSynchronize());
      EXPECT_LT(relative_error(dx.download(), want), 1e-6);
      const auto a = xp.download(), b = xp_alone.download(), c = xp_ref.download();
      for (size_t i = 0; i < a.size(); ++i) {
        ASSERT_EQ(a[i].bits, c[i].bits) << "at " << i;
        ASSERT_EQ(b[i].bits, c[i].bits) << "at " << i;
      }
    }
}

// Rows and tokens past the output must not be touched: y is a window into a larger buffer.
TEST(CudaGemmW4Wgmma, WritesOnlyItsRows) {
  REQUIRE_GPU();
  for (int T : {3, 70, 129}) {
    const int N = 130, K = 512;
    TestQMatrix W(1, N, K, 4, 5);
    const auto x = random_floats(size_t(T) * K, 6);
    const DeviceArray<bf16> xp(size_t(T) * K);
    permute(x, T, K, xp);
    DeviceArray<float> dy(size_t(T) * N + 64);
    dy.upload(std::vector<float>(dy.size(), 12345.f));
    cuda::gemm_w4_wgmma(W.gpu(), xp.get(), dy.get(), T, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    const auto got = dy.download();
    for (size_t i = size_t(T) * N; i < got.size(); ++i) ASSERT_EQ(got[i], 12345.f) << "T " << T << " index " << i;
  }
}

// A fused matrix's rows into the buffers of its parts (RowsOutput), each part a window of a
// larger poisoned buffer: values as the one-buffer product's, nothing written outside the parts.
TEST(CudaGemmW4Wgmma, PartsToTheirBuffers) {
  REQUIRE_GPU();
  for (int T : {1, 70, 129}) {
    SCOPED_TRACE(testing::Message() << "T " << T);
    const int K = 512, first[4] = {0, 136, 200, 232}, N = 264;
    TestQMatrix W(1, N, K, 4, uint32_t(T + 9));
    const auto x = random_floats(size_t(T) * K, uint32_t(T + 10));
    const Bf16Reference ref = bf16_reference(W, x, T);
    const DeviceArray<bf16> xp(size_t(T) * K);
    permute(x, T, K, xp);
    constexpr float kPoison = 12345.f;
    std::vector<std::unique_ptr<DeviceArray<float>>> bufs;
    cuda::RowsOutput y;
    for (int j = 0; j < 4; ++j) {
      const int rows = (j + 1 < 4 ? first[j + 1] : N) - first[j];
      bufs.push_back(std::make_unique<DeviceArray<float>>(size_t(T) * rows + 64));
      bufs.back()->upload(std::vector<float>(bufs.back()->size(), kPoison));
      y.then(bufs.back()->get(), first[j], rows);
    }
    cuda::gemm_w4_wgmma(W.gpu(), xp.get(), y, T, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    for (int j = 0; j < 4; ++j) {
      const int rows = (j + 1 < 4 ? first[j + 1] : N) - first[j];
      const auto got = bufs[size_t(j)]->download();
      for (int t = 0; t < T; ++t)
        for (int r = 0; r < rows; ++r) {
          const size_t at = size_t(t) * N + size_t(first[j] + r);
          ASSERT_NEAR(got[size_t(t) * rows + r], ref.y[at], kBound * ref.l1[at] + 1e-30) << "part " << j;
        }
      for (size_t i = size_t(T) * rows; i < got.size(); ++i) ASSERT_EQ(got[i], kPoison) << "part " << j;
    }
  }
}

TEST(CudaGemmW4Wgmma, RefusesWhatItDoesNotTake) {
  REQUIRE_GPU();
  TestQMatrix W(1, 8, 128, 4, 1);
  cuda::QMatrix odd = W.gpu();
  odd.cols = 96;  // not a multiple of the group
  EXPECT_FALSE(cuda::gemm_w4_wgmma_supports(odd));
  EXPECT_THROW(cuda::gemm_w4_wgmma(odd, nullptr, nullptr, 1, nullptr), Error);
  cuda::QMatrix group32 = W.gpu();
  group32.group_size = 32;
  EXPECT_FALSE(cuda::gemm_w4_wgmma_supports(group32));
  TestQMatrix W8(1, 8, 512, 8, 1);
  EXPECT_FALSE(cuda::gemm_w4_wgmma_supports(W8.gpu()));
}

}  // namespace
}  // namespace lily::test
