// moe_grouped.cu: the sparse MoE block (spec §2.7) for a prefill chunk of T tokens, on the
// GPU end to end with no host synchronisation: every size the host needs is a bound. The
// routing (top-k, plan) is moe_routing.cu's; here the experts, the combine and the block.
//
//   logits = x @ Wr^T                                   gemm_exact (fp32-level)  [T, E]
//   ids, w, sg; plan                                    moe_topk_gate, moe_plan (moe_routing.cu)
//   act[p]   = silu(G_e x_t) * (U_e x_t)                gemm_q4_grouped_swiglu   [T*k, I]
//   y[p]     = D_e act[p]                               gemm_q4_grouped          [T*k, H]
//   sh       = D_s(silu(G_s x) * U_s x)                 gemm_q4_swiglu, gemm_q4  [T, H]
//   out[t]  += sum_s w[t, s] * y[position(t, s)] + sigmoid(sg[t]) * sh[t]      moe_combine_kernel
// (p: a position in expert-sorted order; pair t*k + s sits at position(t, s).)
// Determinism: the plan's scatter is stable, every output element of the GEMMs has one owner,
//           and the combine sums the k slots in slot order and then adds the shared expert. Same
//           input, same bits.
// Bounds:   the tile map has at most moe_max_tiles(T*k, E, BM) entries; the grouped GEMMs are
//           launched with that many blocks in x and the extra ones exit on the device count.
// Tile rows: BM = gemm_q4_tile_rows(T*k / E): the expected rows per expert (16, 32 or 64).
// Few rows: passes of at most 16 tokens may run the experts on gemv/gemv_rows.h instead
//           (MoeExpertKernels::rows): tiles of 16 (one per expert used: a token picks an expert
//           once), each tile's tokens through its expert's rows read once; the shared expert
//           the same way over all T rows. moe_rows_accumulate is the whole block so, from h:
//             x, logits, sg = norm, router, shared gate     moe_route_rows (one launch)
//             ids, w, plan  = top-k and the plan             moe_plan_kernel with its top-k
//             experts (the shared expert as one more group of the same launches), moe_combine_kernel into h
// wgmma:    on sm_90a (MoeExpertKernels::wgmma) the same products on gemm_w4_wgmma.h, 128-position
//           tiles where the experts average 96 rows or more, else 64: x and act each converted once
//           to bf16 in the GEMM's K order (xp, act_p; xp may come from the caller, written with the
//           norm by rms_norm_bf16_permuted); the shared expert's down stays on gemm_q4 (K = 512: as
//           fast). Outputs in bf16 from the GEMMs' epilogues measured slower
//           (docs/perf-log/2026-12.md, session 19).
// Tested:   tests/cuda/test_moe_grouped.cu (each piece against host references; the block
//           against cpu::sparse_moe).
#include "backend/cuda/common/cuda_check.h"  // first: it sets up fmt for nvcc
#include "backend/cuda/common/pdl_launch.cuh"
#include "backend/cuda/moe/moe_grouped.h"

#include <algorithm>

#include "backend/cuda/common/pdl.cuh"
#include "backend/cuda/common/phase_marks.h"
#include "backend/cuda/common/quant_dot.cuh"
#include "backend/cuda/gemm/gemm_exact.h"
#include "backend/cuda/gemm/gemm_q4.h"
#include "backend/cuda/gemm/gemm_w4_wgmma.h"
#include "backend/cuda/gemv/gemv_rows.h"
#include "backend/cuda/moe/moe_route_rows.h"
#include "backend/cuda/moe/route_topk.cuh"

namespace lily::cuda {

namespace {

constexpr int kMaxExperts = kRouteMaxExperts;  // warp_route_topk's bounds (route_topk.cuh)
constexpr int kMaxK = kRouteMaxK;
constexpr int kCombineThreads = 256;

// ---- Combine ----------------------------------------------------------------------------

struct CombineParams {
  const float* y;                  // [P, H] routed expert outputs in expert order
  const int32_t* position;         // [T, k]
  const float* weights;            // [T, k]
  const float* shared;             // [T, H] shared expert output (ungated)
  const float* shared_gate_logit;  // [T]
  int H, k;
  float* out;  // [T, H]
};

__global__ void __launch_bounds__(kCombineThreads) moe_combine_kernel(CombineParams p) {
  pdl_wait();
  pdl_launch_dependents();
  const int t = blockIdx.x;
  const float sg = 1.f / (1.f + expf(-p.shared_gate_logit[t]));
  for (int h = threadIdx.x * 4; h < p.H; h += kCombineThreads * 4) {
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s = 0; s < p.k; ++s) {  // slot order: deterministic
      const float w = p.weights[int64_t(t) * p.k + s];
      const float4 v = *reinterpret_cast<const float4*>(p.y + int64_t(p.position[int64_t(t) * p.k + s]) * p.H + h);
      acc.x = fmaf(w, v.x, acc.x), acc.y = fmaf(w, v.y, acc.y), acc.z = fmaf(w, v.z, acc.z),
      acc.w = fmaf(w, v.w, acc.w);
    }
    const float4 sh = *reinterpret_cast<const float4*>(p.shared + int64_t(t) * p.H + h);
    float4* o = reinterpret_cast<float4*>(p.out + int64_t(t) * p.H + h);
    float4 r = *o;
    r.x += acc.x + sg * sh.x, r.y += acc.y + sg * sh.y, r.z += acc.z + sg * sh.z, r.w += acc.w + sg * sh.w;
    *o = r;
  }
}

// ---- Scratch layout ---------------------------------------------------------------------

struct Layout {
  size_t logits, ids, weights, offsets, sorted, position, tiles, num_tiles, chunk_counts, act, y, shared_act, shared_y,
      sg;
  size_t xp, act_p, bytes;  // the wgmma form's bf16 copies of x [T, H] and act [P, I]
  int max_tiles, tile_rows;
};

Layout layout(const GpuMoe& w, int T, int k, int tile_rows) {
  const size_t E = size_t(w.experts_gate.batch), I = size_t(w.experts_gate.rows), H = size_t(w.experts_gate.cols);
  const size_t Is = size_t(w.shared_gate.rows), P = size_t(T) * size_t(k);
  Layout l{};
  LILY_CHECK(tile_rows == 0 || tile_rows == 16 || tile_rows == 32 || tile_rows == 64 || tile_rows == 128,
             "moe_grouped: tile rows {} (0: from the load, or 16, 32, 64, 128)", tile_rows);
  l.tile_rows = tile_rows > 0 ? tile_rows : gemm_q4_tile_rows(double(P) / double(E));
  l.max_tiles = moe_max_tiles(int(P), int(E), l.tile_rows);
  size_t at = 0;
  auto take = [&](size_t bytes) {
    const size_t here = at;
    at += (bytes + 255) / 256 * 256;
    return here;
  };
  l.logits = take(size_t(T) * E * 4);
  l.ids = take(P * 4);
  l.weights = take(P * 4);
  l.offsets = take((E + 1) * 4);
  l.sorted = take(P * 4);
  l.position = take(P * 4);
  l.tiles = take(size_t(l.max_tiles) * 16);
  l.num_tiles = take(4);
  l.chunk_counts = take(size_t(moe_plan_chunks(int(P))) * E * 4);
  l.act = take(P * I * 4);
  l.y = take(P * H * 4);
  l.shared_act = take(size_t(T) * Is * 4);
  l.shared_y = take(size_t(T) * H * 4);
  l.sg = take(size_t(T) * 4);
  l.xp = take(size_t(T) * H * 2);
  l.act_p = take(P * I * 2);
  l.bytes = at;
  return l;
}

template <typename T>
T* at(void* base, size_t offset) {
  return reinterpret_cast<T*>(static_cast<char*>(base) + offset);
}

void check_weights(const GpuMoe& w, int k) {
  const QMatrix &g = w.experts_gate, &u = w.experts_up, &d = w.experts_down;
  LILY_CHECK(g.batch >= 1 && g.batch <= kMaxExperts, "moe_grouped: {} experts (1..{})", g.batch, kMaxExperts);
  LILY_CHECK(k >= 1 && k <= kMaxK && k <= g.batch, "moe_grouped: top-{} of {} experts", k, g.batch);
  LILY_CHECK(u.batch == g.batch && d.batch == g.batch && d.rows == g.cols && d.cols == g.rows,
             "moe_grouped: gate [{}, {}, {}] up [{}, {}, {}] down [{}, {}, {}] do not fit", g.batch, g.rows, g.cols,
             u.batch, u.rows, u.cols, d.batch, d.rows, d.cols);
  LILY_CHECK(w.router.rows == g.batch && w.router.cols == g.cols, "moe_grouped: router [{}, {}] for {} experts of {}",
             w.router.rows, w.router.cols, g.batch, g.cols);
  LILY_CHECK(w.shared_gate.cols == g.cols && w.shared_down.rows == g.cols && w.shared_down.cols == w.shared_gate.rows &&
                 w.shared_expert_gate.rows == 1 && w.shared_expert_gate.cols == g.cols,
             "moe_grouped: shared expert gate [{}, {}] down [{}, {}] expert gate [{}, {}] for hidden {}",
             w.shared_gate.rows, w.shared_gate.cols, w.shared_down.rows, w.shared_down.cols, w.shared_expert_gate.rows,
             w.shared_expert_gate.cols, g.cols);
}

}  // namespace

size_t moe_grouped_scratch_bytes(const GpuMoe& w, int T, int k, int tile_rows) {
  return layout(w, T, k, tile_rows).bytes;
}

bool moe_rows_supports(const GpuMoe& w) {
  return gemv_rows_swiglu_supports(w.experts_gate, w.experts_up) && gemv_rows_supports(w.experts_down, false) &&
         gemv_rows_swiglu_supports(w.shared_gate, w.shared_up) && gemv_rows_supports(w.shared_down, false);
}

namespace {

MoePlan plan_in(void* scratch, const Layout& l) {
  MoePlan plan;
  plan.offsets = at<int32_t>(scratch, l.offsets);
  plan.sorted = at<int32_t>(scratch, l.sorted);
  plan.position = at<int32_t>(scratch, l.position);
  plan.tiles = at<int32_t>(scratch, l.tiles);
  plan.num_tiles = at<int32_t>(scratch, l.num_tiles);
  plan.chunk_counts = at<int32_t>(scratch, l.chunk_counts);
  plan.max_tiles = l.max_tiles;
  plan.tile_rows = l.tile_rows;
  return plan;
}

// The routed experts over the plan's tiles, the shared expert (and its gate logit unless the
// route wrote it: sg_ready), and the combine into out. xp_given: x in bf16 already (wgmma).
void experts_and_combine(const GpuMoe& w, const float* x, const float* weights, const MoePlan& plan, const Layout& l,
                         int T, int k, void* scratch, float* out, cudaStream_t stream, const SplitK* split,
                         MoeExpertKernels kernels, bool sg_ready, const bf16* xp_given) {
  const int H = w.experts_gate.cols;
  float* act = at<float>(scratch, l.act);
  float* y = at<float>(scratch, l.y);
  float* shared_act = at<float>(scratch, l.shared_act);
  float* shared_y = at<float>(scratch, l.shared_y);
  float* sg = at<float>(scratch, l.sg);
  if (kernels == MoeExpertKernels::rows) {
    // The shared expert rides along as one more group (in the same launches where it has the
    // routed experts' shape).
    RowsGroups groups{plan.tiles, plan.num_tiles, plan.max_tiles, plan.sorted, k};
    groups.extra_w = &w.shared_gate, groups.extra_u = &w.shared_up, groups.extra_x = x, groups.extra_y = shared_act;
    groups.extra_T = T;
    phases::mark("moe.experts_gate_up", stream);
    gemv_rows_swiglu(w.experts_gate, w.experts_up, x, T, &groups, act, stream);
    groups.gather = nullptr, groups.gather_div = 1;
    groups.extra_w = &w.shared_down, groups.extra_u = nullptr, groups.extra_x = shared_act, groups.extra_y = shared_y;
    phases::mark("moe.experts_down", stream);
    gemv_rows(w.experts_down, act, T, &groups, y, stream);
  } else if (kernels == MoeExpertKernels::wgmma) {
    const int I = w.experts_gate.rows, P = T * k;
    const bf16* xp = xp_given ? xp_given : at<bf16>(scratch, l.xp);
    bf16* act_p = at<bf16>(scratch, l.act_p);
    GroupedTiles g;
    g.tiles = plan.tiles, g.num_tiles = plan.num_tiles, g.max_tiles = plan.max_tiles, g.tile_rows = plan.tile_rows;
    g.gather = plan.sorted, g.gather_div = k;
    phases::mark("moe.experts_gate_up", stream);
    if (!xp_given) x_to_bf16_permuted(x, at<bf16>(scratch, l.xp), T, H, stream);  // xp: [T, H] bf16, K order
    gemm_w4_wgmma_grouped_swiglu(w.experts_gate, w.experts_up, xp, g, act, stream);
    g.gather = nullptr, g.gather_div = 1;
    phases::mark("moe.experts_down", stream);
    x_to_bf16_permuted(act, act_p, P, I, stream);  // act_p: [P, I] bf16
    gemm_w4_wgmma_grouped(w.experts_down, act_p, g, y, stream);
    phases::mark("moe.shared", stream);
    gemm_w4_wgmma_swiglu(w.shared_gate, w.shared_up, xp, shared_act, T, stream);
    // the shared down [H, Is] (K = 512): gemm_q4 measured as fast (0.101 against 0.105 + 0.009 ms)
    gemm_q4(w.shared_down, shared_act, shared_y, T, stream, split);
  } else {
    GroupedTiles g;
    g.tiles = plan.tiles, g.num_tiles = plan.num_tiles, g.max_tiles = plan.max_tiles, g.tile_rows = plan.tile_rows;
    g.gather = plan.sorted, g.gather_div = k;
    phases::mark("moe.experts_gate_up", stream);
    gemm_q4_grouped_swiglu(w.experts_gate, w.experts_up, x, g, act, stream);
    g.gather = nullptr, g.gather_div = 1;
    phases::mark("moe.experts_down", stream);
    gemm_q4_grouped(w.experts_down, act, g, y, stream);
    phases::mark("moe.shared", stream);
    gemm_q4_swiglu(w.shared_gate, w.shared_up, x, shared_act, T, stream, split);
    gemm_q4(w.shared_down, shared_act, shared_y, T, stream, split);
  }
  // The shared expert's per-token gate logit (8-bit in mlx checkpoints).
  if (!sg_ready) gemm_q4(w.shared_expert_gate, x, sg, T, stream, split);

  LILY_CHECK(aligned16(out), "moe_grouped: out must be 16-byte aligned");
  phases::mark("moe.combine", stream);
  const CombineParams c{y, plan.position, weights, shared_y, sg, H, k, out};
  launch_after_wait(moe_combine_kernel, dim3(unsigned(T)), dim3(kCombineThreads), 0, stream, c);
}

// The wgmma experts' tile: 128 positions where the experts average 96 rows or more, else 64
// (the model's experts, H200: at 128 rows an expert gate/up 0.822 -> 0.732 ms and down 0.294 ->
// 0.340, a net gain; at 64 rows a net loss).
int wgmma_tile_rows(int T, int k, const GpuMoe& w) { return double(T) * k / w.experts_gate.batch >= 96 ? 128 : 64; }

void check_wgmma(const GpuMoe& w, int tile_rows) {
  LILY_CHECK(tile_rows == 0 || tile_rows == 64 || tile_rows == 128,
             "moe_grouped: the wgmma experts take 64- or 128-position tiles ({})", tile_rows);
  for (const QMatrix* m : {&w.experts_gate, &w.experts_up, &w.experts_down, &w.shared_gate, &w.shared_up})
    LILY_CHECK(gemm_w4_wgmma_supports(*m), "moe_grouped: the wgmma GEMM does not take [{}, {}] q{} group {}", m->rows,
               m->cols, m->bits, m->group_size);
}

void check_rows(const GpuMoe& w, int T) {
  LILY_CHECK(T <= kGemvRowsMaxT && moe_rows_supports(w),
             "moe_grouped: the few-row kernels take at most {} tokens of 4-bit experts ({} tokens)", kGemvRowsMaxT, T);
}

// The plan, the experts and the combine for given ids and weights; sg_ready: the top-k wrote the
// shared expert's gate logits.
void experts_from_ids(const GpuMoe& w, const float* x, const int32_t* ids, const float* weights, int T, int k,
                      void* scratch, float* out, cudaStream_t stream, int tile_rows, const SplitK* split,
                      MoeExpertKernels kernels, bool sg_ready, const bf16* xp = nullptr) {
  check_weights(w, k);
  LILY_CHECK((reinterpret_cast<uintptr_t>(scratch) & 255) == 0, "moe_grouped: scratch must be 256-byte aligned");
  if (T <= 0) return;
  const bool rows = kernels == MoeExpertKernels::rows, wgmma = kernels == MoeExpertKernels::wgmma;
  if (rows) check_rows(w, T);
  if (wgmma) check_wgmma(w, tile_rows);
  const int tile = wgmma && tile_rows == 0 ? wgmma_tile_rows(T, k, w) : tile_rows;
  const Layout l = layout(w, T, k, rows ? 16 : tile);
  const MoePlan plan = plan_in(scratch, l);
  phases::mark("moe.plan", stream);
  moe_plan(ids, T, k, w.experts_gate.batch, plan, stream);
  experts_and_combine(w, x, weights, plan, l, T, k, scratch, out, stream, split, kernels, sg_ready, xp);
}

}  // namespace

void moe_experts_grouped_accumulate(const GpuMoe& w, const float* x, const int32_t* ids, const float* weights, int T,
                                    int k, void* scratch, float* out, cudaStream_t stream, int tile_rows,
                                    const SplitK* split, MoeExpertKernels kernels) {
  experts_from_ids(w, x, ids, weights, T, k, scratch, out, stream, tile_rows, split, kernels, false);
}

void moe_rows_accumulate(const GpuMoe& w, float* h, const float* gain, float eps, int T, int k, void* scratch, float* x,
                         cudaStream_t stream) {
  check_weights(w, k);
  LILY_CHECK((reinterpret_cast<uintptr_t>(scratch) & 255) == 0, "moe_grouped: scratch must be 256-byte aligned");
  check_rows(w, T);
  LILY_CHECK(moe_route_rows_supports(w), "moe_rows_accumulate: the router [{}, {}] q{} is not one it takes",
             w.router.rows, w.router.cols, w.router.bits);
  const Layout l = layout(w, T, k, 16);
  int32_t* ids = at<int32_t>(scratch, l.ids);
  float* weights = at<float>(scratch, l.weights);
  float* logits = at<float>(scratch, l.logits);
  phases::mark("moe.router", stream);
  moe_route_rows(w, h, T, gain, eps, x, logits, at<float>(scratch, l.sg), stream);
  const MoePlan plan = plan_in(scratch, l);
  phases::mark("moe.plan", stream);
  moe_topk_plan(logits, T, k, w.experts_gate.batch, ids, weights, plan, stream);
  experts_and_combine(w, x, weights, plan, l, T, k, scratch, h, stream, nullptr, MoeExpertKernels::rows, true, nullptr);
}

void moe_grouped_accumulate(const GpuMoe& w, const float* x, int T, int k, void* scratch, float* out,
                            cudaStream_t stream, int tile_rows, const SplitK* split, MoeExpertKernels kernels,
                            const bf16* xp) {
  check_weights(w, k);
  LILY_CHECK(kernels != MoeExpertKernels::rows, "moe_grouped_accumulate: the few-row form is moe_rows_accumulate");
  LILY_CHECK(!xp || kernels == MoeExpertKernels::wgmma, "moe_grouped_accumulate: a bf16 x is for the wgmma experts");
  if (T <= 0) return;
  const Layout l = layout(w, T, k,
                          kernels == MoeExpertKernels::wgmma && tile_rows == 0 ? wgmma_tile_rows(T, k, w) : tile_rows);
  int32_t* ids = at<int32_t>(scratch, l.ids);
  float* weights = at<float>(scratch, l.weights);
  float* logits = at<float>(scratch, l.logits);
  phases::mark("moe.router", stream);
  gemm_exact(w.router, x, logits, T, stream, split);  // fp32-accurate, as the decode path and the CPU
  phases::mark("moe.topk", stream);                   // and the shared expert's gate logits
  moe_topk_gate(logits, x, w.shared_expert_gate, T, w.router.rows, k, ids, weights, at<float>(scratch, l.sg), stream);
  experts_from_ids(w, x, ids, weights, T, k, scratch, out, stream, tile_rows, split, kernels, true, xp);
}

}  // namespace lily::cuda
