// bench_gemm_w4.cu: issue 19's first question for the wgmma W4A16 GEMM (gemm/gemm_w4_wgmma.cu):
// how many TFLOP/s each prefill product of the full-size model reaches on it, against gemm_q4
// (mma.sync, weights dequantized into shared memory) on the same shapes and tokens.
//
// Dense: the DeltaNet input projections fused [12352, 2048], attention's q/gate/k/v [9216, 2048],
// out_proj and o_proj [2048, 4096] (accumulate), the shared expert's gate/up [512, 2048] (SwiGLU)
// and down [2048, 512]. Grouped: the routed experts (256, top-8, uniform random routing) gate/up
// [256 x 512, 2048] and down [256 x 2048, 512]. The wgmma rows include the bf16 conversion of x
// (x_to_bf16_permuted) timed on its own too: in a pass one conversion serves several products.
// Median of 20 timed calls after 3 warm-ups (median_ms.cuh); random weights (speed does not depend
// on the values); TFLOP/s = 2 T N K / time against the H200's ~790 bf16 peak.
#include "backend/cuda/common/cuda_check.h"  // first: it sets up fmt for nvcc
#include "../common/median_ms.cuh"
#include "../common/random_qmatrix.cuh"
#include "backend/cuda/gemm/gemm_q4.h"
#include "backend/cuda/gemm/gemm_w4_wgmma.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

using namespace lily;
using bench::median_ms;
using bench::random_qmatrix;

namespace {

constexpr double kPeakTflops = 790.0;

struct Buffers {
  float* x = nullptr;
  bf16* xp = nullptr;
  float* y = nullptr;
};

Buffers buffers(size_t x_elems, size_t y_elems) {
  Buffers b;
  CUDA_CHECK(cudaMalloc(&b.x, x_elems * 4));
  CUDA_CHECK(cudaMalloc(&b.xp, x_elems * 2));
  CUDA_CHECK(cudaMalloc(&b.y, y_elems * 4));
  CUDA_CHECK(cudaMemset(b.x, 0, x_elems * 4));
  CUDA_CHECK(cudaMemset(b.y, 0, y_elems * 4));
  return b;
}

void release(Buffers& b) { cudaFree(b.x), cudaFree(b.xp), cudaFree(b.y); }

void row(const char* what, int T, double flop, double q4_ms, double convert_ms, double w4_ms) {
  auto tf = [&](double ms) { return flop / (ms * 1e-3) / 1e12; };
  std::printf("%-34s %5d | %8.3f %6.1f %5.1f%% | %7.3f %8.3f %6.1f %5.1f%% | %5.2fx\n", what, T, q4_ms, tf(q4_ms),
              100 * tf(q4_ms) / kPeakTflops, convert_ms, w4_ms, tf(w4_ms), 100 * tf(w4_ms) / kPeakTflops,
              q4_ms / w4_ms);
}

enum class Form { store, accumulate, swiglu };

void dense(const char* what, int N, int K, int T, Form form) {
  const cuda::QMatrix W = random_qmatrix(1, N, K, 4, 11), U = random_qmatrix(1, N, K, 4, 12);
  Buffers b = buffers(size_t(T) * K, size_t(T) * N);
  cuda::x_to_bf16_permuted(b.x, b.xp, T, K, nullptr);
  const double q4 = median_ms([&] {
    if (form == Form::swiglu) cuda::gemm_q4_swiglu(W, U, b.x, b.y, T, nullptr);
    else if (form == Form::accumulate) cuda::gemm_q4_accumulate(W, b.x, b.y, T, nullptr);
    else cuda::gemm_q4(W, b.x, b.y, T, nullptr);
  });
  const double convert = median_ms([&] { cuda::x_to_bf16_permuted(b.x, b.xp, T, K, nullptr); });
  const double w4 = median_ms([&] {
    if (form == Form::swiglu) cuda::gemm_w4_wgmma_swiglu(W, U, b.xp, b.y, T, nullptr);
    else if (form == Form::accumulate) cuda::gemm_w4_wgmma_accumulate(W, b.xp, b.y, T, nullptr);
    else cuda::gemm_w4_wgmma(W, b.xp, b.y, T, nullptr);
  });
  row(what, T, 2.0 * T * N * K * (form == Form::swiglu ? 2 : 1), q4, convert, w4);
  release(b);
  bench::free_random_qmatrix(W), bench::free_random_qmatrix(U);
}

// A tile map over expert-sorted positions (T tokens, 8 distinct random experts each) with tiles of
// at most tile_rows; gather: position -> token * 8 + slot (gather_div 8).
struct TileMap {
  int32_t* tiles = nullptr;
  int32_t* num_tiles = nullptr;
  int32_t* gather = nullptr;
  int max_tiles = 0;
};

TileMap tile_map(int T, int tile_rows, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int32_t>> by_expert(256);
  for (int t = 0; t < T; ++t) {
    std::vector<int> chosen;
    while (chosen.size() < 8) {
      const int e = int(rng() % 256);
      if (std::find(chosen.begin(), chosen.end(), e) == chosen.end()) chosen.push_back(e);
    }
    for (int s = 0; s < 8; ++s) by_expert[chosen[s]].push_back(t * 8 + s);
  }
  std::vector<int32_t> tiles, gather;
  for (int e = 0; e < 256; ++e) {
    const int first = int(gather.size()), n = int(by_expert[e].size());
    for (int i = 0; i < n; i += tile_rows)
      tiles.insert(tiles.end(), {e, first + i, first + std::min(n, i + tile_rows), 0});
    gather.insert(gather.end(), by_expert[e].begin(), by_expert[e].end());
  }
  TileMap m;
  m.max_tiles = int(tiles.size() / 4);
  const int32_t count = m.max_tiles;
  CUDA_CHECK(cudaMalloc(&m.tiles, tiles.size() * 4));
  CUDA_CHECK(cudaMalloc(&m.num_tiles, 4));
  CUDA_CHECK(cudaMalloc(&m.gather, gather.size() * 4));
  CUDA_CHECK(cudaMemcpy(m.tiles, tiles.data(), tiles.size() * 4, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(m.num_tiles, &count, 4, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(m.gather, gather.data(), gather.size() * 4, cudaMemcpyHostToDevice));
  return m;
}

void release(TileMap& m) { cudaFree(m.tiles), cudaFree(m.num_tiles), cudaFree(m.gather); }

cuda::GroupedTiles grouped_tiles(const TileMap& m, int tile_rows) {
  cuda::GroupedTiles g;
  g.tiles = m.tiles, g.num_tiles = m.num_tiles, g.max_tiles = m.max_tiles, g.tile_rows = tile_rows;
  g.gather = m.gather, g.gather_div = 8;
  return g;
}

// The routed experts: gate/up + SwiGLU over x [T, 2048], down over their [T * 8, 512] output.
void experts(int T) {
  constexpr int E = 256, H = 2048, I = 512;
  const cuda::QMatrix G = random_qmatrix(E, I, H, 4, 21), U = random_qmatrix(E, I, H, 4, 22),
                      D = random_qmatrix(E, H, I, 4, 23);
  const int q4_tile = cuda::gemm_q4_tile_rows(T * 8.0 / E);
  TileMap q4_map = tile_map(T, q4_tile, 5), w4_map = tile_map(T, 64, 5);
  Buffers up = buffers(size_t(T) * H, size_t(T) * 8 * I), down = buffers(size_t(T) * 8 * I, size_t(T) * 8 * H);
  const cuda::GroupedTiles q4g = grouped_tiles(q4_map, q4_tile), w4g = grouped_tiles(w4_map, 64);
  cuda::GroupedTiles q4d = q4g, w4d = w4g;  // down reads the positions' own rows
  q4d.gather = w4d.gather = nullptr, q4d.gather_div = w4d.gather_div = 1;
  cuda::x_to_bf16_permuted(up.x, up.xp, T, H, nullptr);
  cuda::x_to_bf16_permuted(down.x, down.xp, T * 8, I, nullptr);

  const double flop_up = 2.0 * T * 8 * I * H * 2, flop_down = 2.0 * T * 8 * H * I;
  const double q4_up = median_ms([&] { cuda::gemm_q4_grouped_swiglu(G, U, up.x, q4g, up.y, nullptr); });
  const double c_up = median_ms([&] { cuda::x_to_bf16_permuted(up.x, up.xp, T, H, nullptr); });
  const double w4_up = median_ms([&] { cuda::gemm_w4_wgmma_grouped_swiglu(G, U, up.xp, w4g, up.y, nullptr); });
  row("experts gate/up [256x512,2048]", T, flop_up, q4_up, c_up, w4_up);
  const double q4_down = median_ms([&] { cuda::gemm_q4_grouped(D, down.x, q4d, down.y, nullptr); });
  const double c_down = median_ms([&] { cuda::x_to_bf16_permuted(down.x, down.xp, T * 8, I, nullptr); });
  const double w4_down = median_ms([&] { cuda::gemm_w4_wgmma_grouped(D, down.xp, w4d, down.y, nullptr); });
  row("experts down [256x2048,512]", T, flop_down, q4_down, c_down, w4_down);
  // The same on 128-position tiles (the wgmma experts' tile where experts average 64 rows or more).
  TileMap w4_map128 = tile_map(T, 128, 5);
  const cuda::GroupedTiles w4g128 = grouped_tiles(w4_map128, 128);
  cuda::GroupedTiles w4d128 = w4g128;
  w4d128.gather = nullptr, w4d128.gather_div = 1;
  const double w4_up128 = median_ms([&] { cuda::gemm_w4_wgmma_grouped_swiglu(G, U, up.xp, w4g128, up.y, nullptr); });
  row("  gate/up, 128-position tiles", T, flop_up, q4_up, c_up, w4_up128);
  const double w4_down128 = median_ms([&] { cuda::gemm_w4_wgmma_grouped(D, down.xp, w4d128, down.y, nullptr); });
  row("  down, 128-position tiles", T, flop_down, q4_down, c_down, w4_down128);
  release(w4_map128);
  release(up), release(down), release(q4_map), release(w4_map);
  bench::free_random_qmatrix(G), bench::free_random_qmatrix(U), bench::free_random_qmatrix(D);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> lengths = {512, 4096};
  if (argc > 1) {
    lengths.clear();
    for (int i = 1; i < argc; ++i) lengths.push_back(std::atoi(argv[i]));
  }
  std::printf("%-34s %5s | %8s %6s %6s | %7s %8s %6s %6s | %6s\n", "product", "T", "q4 ms", "TF/s", "peak", "cvt ms",
              "w4 ms", "TF/s", "peak", "q4/w4");
  for (int T : lengths) {
    dense("in_proj qkvz+ba [12352,2048]", 12352, 2048, T, Form::store);
    dense("attention q+gate/k/v [9216,2048]", 9216, 2048, T, Form::store);
    dense("out_proj, o_proj [2048,4096] +=", 2048, 4096, T, Form::accumulate);
    dense("shared gate/up [512,2048] swiglu", 512, 2048, T, Form::swiglu);
    dense("shared down [2048,512] +=", 2048, 512, T, Form::accumulate);
    experts(T);
  }
  return 0;
}
