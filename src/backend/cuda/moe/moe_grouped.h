// moe_grouped.h: the sparse MoE block (spec §2.7) for prefill chunks: routing on the GPU, the
// routed experts as grouped tensor-core GEMMs (gemm_q4.h), a deterministic combine. One stream,
// no host synchronisation. See moe_grouped.cu for the design (the routing pieces, top-k and plan,
// are moe_routing.cu's).
#pragma once

#include <cstddef>

#include "backend/cuda/common/gpu_types.h"
#include "backend/cuda/gemm/split_k.h"

namespace lily::cuda {

// Which kernels run the experts (routed and shared): the tensor-core GEMMs (gemm_q4), or for
// passes of at most 16 tokens the few-row GEMVs (gemv/gemv_rows.h), which read each routed
// expert's rows once for the tokens routed to it and the shared expert's once for all T.
// wgmma: the Hopper GEMMs (gemm_w4_wgmma.h) on 64- or 128-position tiles, x and the activations
// converted to bf16 once each (sm_90a; every expert matrix 4-bit group 64).
enum class MoeExpertKernels { gemm, rows, wgmma };

// Whether the few-row kernels take these experts (4-bit group 64, H <= 2048).
bool moe_rows_supports(const GpuMoe& w);

// Device scratch for T tokens (the caller keeps it; contents are per call). tile_rows: 0 picks
// the grouped GEMMs' tile from the load (gemm_q4_tile_rows of the mean rows per expert); 16, 32
// or 64 force it (bench/kernels/moe_grouped measures the choice). Pass the same value to the
// call that uses the scratch.
size_t moe_grouped_scratch_bytes(const GpuMoe& w, int T, int k, int tile_rows = 0);

// out[t] += sum_s w[t, s] * D_e(silu(G_e x_t) * U_e x_t) + sigmoid(x_t . w_sg) * D_s(silu(G_s x_t) * U_s x_t)
// Router logits at fp32 accuracy (gemm_exact: the decode path and the CPU backend are fp32 too;
// with bf16 inputs a near-tie between experts flips more often, and a flipped expert changes a
// token's output by far more than rounding does).
//   x: [T, H] fp32 (16-byte aligned), out: [T, H] fp32.
// split: optional split-K workspace for the router and the shared expert (split_k.h).
// kernels: gemm or wgmma (wgmma takes tile_rows 0, 64 or 128). xp: wgmma only, x already in bf16
// in x_to_bf16_permuted's order (rms_norm_bf16_permuted wrote both), else converted here.
void moe_grouped_accumulate(const GpuMoe& w, const float* x, int T, int k, void* scratch, float* out,
                            cudaStream_t stream, int tile_rows = 0, const SplitK* split = nullptr,
                            MoeExpertKernels kernels = MoeExpertKernels::gemm, const bf16* xp = nullptr);

// The whole block for a pass of at most 16 tokens, from the residual stream h: x = RMSNorm(h;
// gain) (written to x), the routing in two launches (moe/moe_route_rows.h, then the top-k with
// the plan), the experts on the few-row kernels, h += the combine. Needs moe_rows_supports(w)
// and moe_route_rows_supports(w).   h, x: [T, H] fp32.
void moe_rows_accumulate(const GpuMoe& w, float* h, const float* gain, float eps, int T, int k, void* scratch, float* x,
                         cudaStream_t stream);

// ---- The pieces (tests use them one by one) ---------------------------------------------

// Softmax over E logits (fp32), top-k (ties to the lower index), renormalised: spec §2.7.
//   logits: [T, E] -> ids: [T, k] int32, weights: [T, k] fp32.  E <= 256, k <= 8.
void moe_topk(const float* logits, int T, int E, int k, int32_t* ids, float* weights, cudaStream_t stream);

// moe_topk, and sg[t] = x[t] . w_sg (the shared expert's gate logit, fp32 as cpu::linear) by the
// same warp.   x: [T, H] fp32 (16-byte aligned), w_sg: [1, H] 4 or 8 bits, group 64; sg: [T].
void moe_topk_gate(const float* logits, const float* x, const QMatrix& w_sg, int T, int E, int k, int32_t* ids,
                   float* weights, float* sg, cudaStream_t stream);

// The expert-sorted order of the T*k (token, slot) pairs and the tile map over it.
struct MoePlan {
  int32_t* offsets = nullptr;       // [E + 1]: first position of each expert; offsets[E] = T*k
  int32_t* sorted = nullptr;        // [T*k]: pair index (t*k + s) at each position; stable (pairs in order)
  int32_t* position = nullptr;      // [T*k]: position of each pair
  int32_t* tiles = nullptr;         // [max_tiles, 4]: expert, first position, end position, 0
  int32_t* num_tiles = nullptr;     // [1]
  int32_t* chunk_counts = nullptr;  // [moe_plan_chunks(T*k), E]: moe_plan's scratch
  int max_tiles = 0;
  int tile_rows = 0;  // positions per tile
};

// The most tiles T*k pairs over E experts can need with tiles of tile_rows positions.
int moe_max_tiles(int pairs, int E, int tile_rows);

// The chunks of pairs moe_plan counts in parallel (one block each).
int moe_plan_chunks(int pairs);

// Builds plan (whose device arrays the caller sized with moe_max_tiles and moe_plan_chunks) from
// ids: [T, k], in two launches of moe_plan_chunks(T * k) blocks.
void moe_plan(const int32_t* ids, int T, int k, int E, const MoePlan& plan, cudaStream_t stream);

// moe_topk then moe_plan in one launch, for T <= 32: ids [T, k] and weights [T, k] written too.
void moe_topk_plan(const float* logits, int T, int k, int E, int32_t* ids, float* weights, const MoePlan& plan,
                   cudaStream_t stream);

// The routed experts and the shared expert for given ids / weights ([T, k] on the device);
// kernels: rows needs T <= 16 (kGemvRowsMaxT) and moe_rows_supports(w).
void moe_experts_grouped_accumulate(const GpuMoe& w, const float* x, const int32_t* ids, const float* weights, int T,
                                    int k, void* scratch, float* out, cudaStream_t stream, int tile_rows = 0,
                                    const SplitK* split = nullptr, MoeExpertKernels kernels = MoeExpertKernels::gemm);

}  // namespace lily::cuda
