// bench_moe_grouped.cu: issue 7's two ablations of the prefill MoE block at the full size
// (E = 256 experts, top-8, H = 2048, I = 512, 4-bit experts, 8-bit router, a shared expert):
//
// 1. Tile rows. moe_grouped picks the grouped GEMMs' tile (16, 32 or 64 rows) from the mean
//    rows per expert, T * 8 / 256; this times the whole block with each tile forced, per T, for
//    uniform routing and for a skewed one (a quarter of the experts get most rows).
// 2. Routing on the GPU. The plan (histogram, scan, stable scatter, tile map) is built by one
//    kernel in the stream; the variant without it copies the ids to the host, builds the same
//    plan there and copies it back (one synchronisation per layer). Timed per call, the rest
//    of the block being identical.
//
// Median of 20 timed calls after 3 warm-ups, events around each; random weights (speed does
// not depend on the values). TFLOP/s counts the routed and shared expert products only.
#include "backend/cuda/common/cuda_check.h"  // first: it sets up fmt for nvcc
#include "../common/median_ms.cuh"
#include "../common/random_qmatrix.cuh"
#include "backend/cuda/gemm/gemm_q4.h"
#include "backend/cuda/moe/moe_grouped.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <random>
#include <vector>

using namespace lily;
using bench::median_ms;
using bench::random_qmatrix;

namespace {

// ids [T, 8]: distinct experts per token; skewed: 3 of 4 picks from the first 64 experts.
std::vector<int32_t> make_ids(int T, bool skewed, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(size_t(T) * 8);
  for (int t = 0; t < T; ++t) {
    std::vector<int32_t> chosen;
    while (chosen.size() < 8) {
      const int e = skewed && rng() % 4 != 0 ? int(rng() % 64) : int(rng() % 256);
      if (std::find(chosen.begin(), chosen.end(), e) == chosen.end()) chosen.push_back(e);
    }
    std::copy(chosen.begin(), chosen.end(), ids.begin() + long(t) * 8);
  }
  return ids;
}

// The plan on the host (what moe_plan_kernel computes): stable counting sort and tile map.
void host_plan(const std::vector<int32_t>& ids, int E, int tile_rows, std::vector<int32_t>& offsets,
               std::vector<int32_t>& sorted, std::vector<int32_t>& position, std::vector<int32_t>& tiles) {
  const int P = int(ids.size());
  offsets.assign(size_t(E) + 1, 0);
  for (int32_t e : ids) ++offsets[size_t(e) + 1];
  for (int e = 0; e < E; ++e) offsets[size_t(e) + 1] += offsets[size_t(e)];
  std::vector<int32_t> next(offsets.begin(), offsets.end() - 1);
  sorted.assign(size_t(P), 0), position.assign(size_t(P), 0), tiles.clear();
  for (int i = 0; i < P; ++i) {
    const int pos = next[size_t(ids[size_t(i)])]++;
    sorted[size_t(pos)] = i, position[size_t(i)] = pos;
  }
  for (int e = 0; e < E; ++e)
    for (int r = offsets[size_t(e)]; r < offsets[size_t(e) + 1]; r += tile_rows)
      tiles.insert(tiles.end(), {e, r, std::min(offsets[size_t(e) + 1], r + tile_rows), 0});
}

}  // namespace

int main() {
  const int E = 256, k = 8, H = 2048, I = 512;
  cuda::GpuMoe w;
  w.router = random_qmatrix(1, E, H, 8, 1);
  w.experts_gate = random_qmatrix(E, I, H, 4, 2), w.experts_up = random_qmatrix(E, I, H, 4, 3);
  w.experts_down = random_qmatrix(E, H, I, 4, 4);
  w.shared_gate = random_qmatrix(1, I, H, 4, 5), w.shared_up = random_qmatrix(1, I, H, 4, 6),
  w.shared_down = random_qmatrix(1, H, I, 4, 7);
  w.shared_expert_gate = random_qmatrix(1, 1, H, 8, 8);
  const int maxT = 8192;  // the prefill pass (the default chunk_tokens of kernel_plan.h)
  float *x, *out, *weights;
  int32_t* ids;
  CUDA_CHECK(cudaMalloc(&x, size_t(maxT) * H * 4));
  CUDA_CHECK(cudaMalloc(&out, size_t(maxT) * H * 4));
  CUDA_CHECK(cudaMalloc(&weights, size_t(maxT) * k * 4));
  CUDA_CHECK(cudaMalloc(&ids, size_t(maxT) * k * 4));
  CUDA_CHECK(cudaMemset(x, 0, size_t(maxT) * H * 4));
  std::vector<float> h_weights(size_t(maxT) * k, 1.f / k);
  CUDA_CHECK(cudaMemcpy(weights, h_weights.data(), h_weights.size() * 4, cudaMemcpyHostToDevice));

  std::printf("1. tile rows (whole experts block, given routing; ms and TFLOP/s of the expert products)\n");
  std::printf("%6s %8s %6s | %16s %16s %16s | auto\n", "T", "routing", "rows/e", "16", "32", "64");
  for (int T : {256, 512, 1024, 2048, 4096, 8192})
    for (bool skewed : {false, true}) {
      const auto h_ids = make_ids(T, skewed, uint32_t(T));
      CUDA_CHECK(cudaMemcpy(ids, h_ids.data(), h_ids.size() * 4, cudaMemcpyHostToDevice));
      const double flops = 2.0 * T * (k + 1) * 3.0 * H * I;
      std::printf("%6d %8s %6.1f |", T, skewed ? "skewed" : "uniform", double(T) * k / E);
      for (int tile : {16, 32, 64}) {
        void* scratch;
        CUDA_CHECK(cudaMalloc(&scratch, cuda::moe_grouped_scratch_bytes(w, T, k, tile)));
        const double ms = median_ms(
            [&] { cuda::moe_experts_grouped_accumulate(w, x, ids, weights, T, k, scratch, out, nullptr, tile); });
        std::printf(" %7.3f %6.1f TF", ms, flops / ms / 1e9);
        CUDA_CHECK(cudaFree(scratch));
      }
      std::printf(" | %d\n", cuda::gemm_q4_tile_rows(double(T) * k / E));
    }

  std::printf("\n2. the routing plan: on the GPU (moe_plan) vs on the host (ids down, plan, plan up)\n");
  for (int T : {256, 1024, 4096, 8192}) {
    const auto h_ids = make_ids(T, false, uint32_t(T) + 7);
    CUDA_CHECK(cudaMemcpy(ids, h_ids.data(), h_ids.size() * 4, cudaMemcpyHostToDevice));
    const int P = T * k, tile = cuda::gemm_q4_tile_rows(double(P) / E);
    cuda::MoePlan plan;
    plan.tile_rows = tile, plan.max_tiles = cuda::moe_max_tiles(P, E, tile);
    CUDA_CHECK(cudaMalloc(&plan.offsets, size_t(E + 1) * 4));
    CUDA_CHECK(cudaMalloc(&plan.sorted, size_t(P) * 4));
    CUDA_CHECK(cudaMalloc(&plan.position, size_t(P) * 4));
    CUDA_CHECK(cudaMalloc(&plan.tiles, size_t(plan.max_tiles) * 16));
    CUDA_CHECK(cudaMalloc(&plan.num_tiles, 4));
    const double gpu_ms = median_ms([&] { cuda::moe_plan(ids, T, k, E, plan, nullptr); });
    std::vector<int32_t> got(static_cast<size_t>(P)), offsets, sorted, position, tiles;
    const double host_ms = median_ms([&] {
      CUDA_CHECK(cudaMemcpy(got.data(), ids, size_t(P) * 4, cudaMemcpyDeviceToHost));  // waits for the GPU
      host_plan(got, E, tile, offsets, sorted, position, tiles);
      const int32_t n = int32_t(tiles.size() / 4);
      CUDA_CHECK(cudaMemcpyAsync(plan.offsets, offsets.data(), offsets.size() * 4, cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMemcpyAsync(plan.sorted, sorted.data(), sorted.size() * 4, cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMemcpyAsync(plan.position, position.data(), position.size() * 4, cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMemcpyAsync(plan.tiles, tiles.data(), tiles.size() * 4, cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMemcpyAsync(plan.num_tiles, &n, 4, cudaMemcpyHostToDevice));
    });
    std::printf("T %5d: GPU plan %.3f ms, host plan %.3f ms (per layer; x 40 layers per pass)\n", T, gpu_ms, host_ms);
    cudaFree(plan.offsets), cudaFree(plan.sorted), cudaFree(plan.position), cudaFree(plan.tiles),
        cudaFree(plan.num_tiles);
  }
  return 0;
}
