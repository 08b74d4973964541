// ops_dense.cuh: the persistent decode kernel's tasks that are products with the model's matrices,
// and the small ones around them (decode_tasks.h names them; step_args.h has the buffers). Every
// function is called by all kThreads threads of a block and ends with its writes issued (the kernel
// syncs after each task). T = 1 row (the kernel's host side refuses more, for now).
//
//   embed      h = embed[token]                                    (4-bit row, dequantized)
//   in_proj    proj[r] = RMSNorm(h) . W_in[r]        r in the task's rows of the fused matrix;
//              a DeltaNet conv channel r: u = silu(conv(its 3 taps, proj[r])), the taps shifted
//   out_proj   h[r] += y . W_out[r]                  y = mixer, or (DeltaNet) per value head
//                                                    w * rmsnorm(o) * silu(z) (the gated norm)
//   router     logits[r] = x . Wr[r] (8-bit, fp32)    row E: the shared expert's gate row;
//              x = RMSNorm(h) (post_attention_layernorm) by every router task, kept by the first
//   top_k      ids, weights of the k experts          (route_topk.cuh: as every decode kernel)
//   gate_up    act[s][r] = silu(G_e[r] . x) * (U_e[r] . x)    e: slot s's expert (or the shared one),
//              chosen by the task itself from the logits (rank s of the top-k rule)
//   down       h[r] += w_s D_e[r] . act[s]            w_s: the routing weight, sigmoid(gate) shared
//   lm_head    logits[r] = RMSNorm(h) . lm_head[r]    (final norm)
//   advance    position += T
// The 4-bit products run on the tensor cores as the decode GEMVs do (quant_mma.cuh: the input row
// staged once per task as bf16 hi + lo fragments, fp32-level accuracy; the codes as 128 + q,
// dot_tile_biased): a block's rows in tiles of 16, each tile's columns split over up to 16 warps
// so that every warp has work, the parts summed in shared memory in a fixed order. An RMSNorm
// before a product is applied to its results (stage). Activations written by other blocks of
// this launch are read through L2 (__ldcg); the expert slots' routed weights and ids too. down adds into h with atomics
// (the slots of a row tile run on different blocks): the order of those adds varies, so h varies
// in its last bits from run to run.
// Tested: tests/cuda/test_persistent_decode.cpp (the step's logits against the decode step's and
// the CPU backend's).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/common/block_rms.cuh"
#include "backend/cuda/common/deltanet_common.cuh"
#include "backend/cuda/common/quant_dot.cuh"
#include "backend/cuda/common/quant_mma.cuh"
#include "backend/cuda/common/route_topk.cuh"
#include "backend/cuda/decode/moe_common.cuh"
#include "backend/cuda/persistent/step_args.h"
#include "backend/cuda/persistent/trace.cuh"

namespace lily::cuda::persistent {

constexpr int kWarps = kThreads / 32;
constexpr int kMaxCols = 4096;  // the widest input row of a product

// The scratch of a product's task (in the dynamic shared memory).
struct ProductScratch {
  float xs[kMaxCols];                                // the router's x (fp32); the top-k's logits
  uint4 frag[quant_mma::fragment_uint4s(kMaxCols)];  // and its bf16 hi + lo fragments
  float group_sum[kMaxCols / 64];                    // of x in fp32
  float group_sum_hl[kMaxCols / 64];                 // of x as the fragments hold it (hi + lo)
  uint4 zero[quant_mma::kFragU4PerChunk];
  float red[kWarps];
  float parts[kWarps * 256];  // k-split partial sums: [part][row], at most 256 rows when split
  float out[2][256];          // gate_up: the G and U rows of the task; in_proj: its rows
  float4 conv_w[256];         // in_proj: its conv channels' weights (conv_loads)
  float4 conv_taps[256];      // and older taps (x, y, z: oldest first)
  int32_t ids[8];             // top_k
  float weights[8];
};
static_assert(sizeof(ProductScratch) <= size_t(kScratchBytes), "ProductScratch fits the scratch");

// One 4-bit matrix's rows as the tile loads take them.
struct Rows {
  const uint4* codes;
  const uint16_t* scales;
  const uint16_t* biases;
  int cpr;  // 16-byte chunks a row
};

__device__ __forceinline__ Rows rows_of(const DeviceMatrix& m, int entry = 0) {
  const int64_t words = int64_t(m.cols) * m.bits / 32, groups = m.cols / 64;
  Rows r;
  r.codes = reinterpret_cast<const uint4*>(m.codes + int64_t(entry) * m.rows * words);
  r.scales = m.scales + int64_t(entry) * m.rows * groups;
  r.biases = m.biases + int64_t(entry) * m.rows * groups;
  r.cpr = int(words / 4);
  return r;
}

// out(i, y) for i in [0, n): y = row r0 + i of A (i < nA) or row r0 + i - nA of B, times the staged
// input row (stage_input_row's fragments). Tiles of 16 rows never mix A and B (nA a multiple of 16,
// or B empty). Each tile's pairs of 256 columns are split over `ksplit` warps when there are fewer
// tiles than warps; their parts are summed in warp order.
template <class Out>
__device__ __forceinline__ void block_rows_dot(const Rows& A, int nA, const Rows& B, int n, int r0, ProductScratch& s,
                                               Out out) {
  using namespace quant_mma;
  constexpr int kStep = 2;  // pairs loaded together
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
  const int tiles = (n + 15) / 16, pairs = (A.cpr + 7) / 8;
  int ksplit = kWarps / tiles;
  ksplit = ksplit < 1 ? 1 : (ksplit > (pairs + kStep - 1) / kStep ? (pairs + kStep - 1) / kStep : ksplit);
  const int per = pairs_per_warp(pairs, ksplit, kStep);
  for (int u = warp; u < tiles * ksplit; u += kWarps) {
    const int tile = u / ksplit, part = u % ksplit;
    const int i_g = min(16 * tile + g, n - 1), i_g8 = min(16 * tile + g + 8, n - 1);
    const bool in_a = 16 * tile < nA;
    const Rows& M = in_a ? A : B;
    const int64_t row_g = r0 + (in_a ? i_g : i_g - nA), row_g8 = r0 + (in_a ? i_g8 : i_g8 - nA);
    float y_g = 0.f, y_g8 = 0.f;
    for (int p = part * per; p < (part + 1) * per && p < pairs; p += kStep) {
      TileLoad<kStep> t;
      load_tile<kStep>(t, M.codes, M.scales, M.biases, row_g, row_g8, M.cpr, p);
      dot_tile_biased<kStep>(t, s.frag, s.group_sum, s.group_sum_hl, s.zero, M.cpr, p, y_g, y_g8);
    }
    if (u == 0) trace_mark(3);
    y_g = quad_sum(y_g), y_g8 = quad_sum(y_g8);
    if (t4 == 0) {
      const int a = 16 * tile + g, b = a + 8;
      if (ksplit == 1) {
        if (a < n) out(a, y_g);
        if (b < n) out(b, y_g8);
      } else {
        if (a < n) s.parts[part * 256 + a] = y_g;
        if (b < n) s.parts[part * 256 + b] = y_g8;
      }
    }
  }
  if (ksplit > 1) {
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += kThreads) {
      float y = 0.f;
      for (int part = 0; part < ksplit; ++part) y += s.parts[part * 256 + i];
      out(i, y);
    }
  }
}

template <class Out>
__device__ __forceinline__ void block_rows_dot(const Rows& A, int n, int r0, ProductScratch& s, Out out) {
  block_rows_dot(A, n, A, n, r0, s, out);
}

// The input row x [cols] (read through L2; GAIN: times gain) staged for block_rows_dot in one pass
// and one barrier: thread i takes columns 8i .. 8i + 7 (two float4 loads) straight into the
// fragments (quant_mma::store_fragments8). s.red[warp] gets the warp's share of sum(x^2): an RMSNorm is
// applied after the products, RMSNorm(x) . w = inv ((gain * x) . w) (row_inv_rms), so that no
// block-wide sum stands between the loads and the fragments (docs/perf.md, session 18).
// The first `skip` threads (whole warps) take no columns: they may do other work before the barrier.
template <bool GAIN>
__device__ __forceinline__ void stage(const float* x, const float* gain, int cols, ProductScratch& s, int skip = 0) {
  const int lane = threadIdx.x % 32, n8 = cols / 8;
  float ss = 0.f;
  for (int base = 0; base < n8; base += kThreads - skip) {  // whole warps each turn (the shuffles)
    const int i = base + int(threadIdx.x) - skip;
    const bool mine = i >= 0 && i < n8;
    const float4 zero4 = make_float4(0.f, 0.f, 0.f, 0.f);
    const float4 v0 = mine ? __ldcg(reinterpret_cast<const float4*>(x) + 2 * i) : zero4;
    const float4 v1 = mine ? __ldcg(reinterpret_cast<const float4*>(x) + 2 * i + 1) : zero4;
    float y[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
#pragma unroll
    for (int j = 0; j < 8; ++j) ss = fmaf(y[j], y[j], ss);
    if (GAIN && mine) {
      const float4 g0 = __ldg(reinterpret_cast<const float4*>(gain) + 2 * i);
      const float4 g1 = __ldg(reinterpret_cast<const float4*>(gain) + 2 * i + 1);
      const float g[8] = {g0.x, g0.y, g0.z, g0.w, g1.x, g1.y, g1.z, g1.w};
#pragma unroll
      for (int j = 0; j < 8; ++j) y[j] *= g[j];
    }
    quant_mma::store_fragments8(i, mine, y, s.frag, s.group_sum, s.group_sum_hl);
  }
#pragma unroll
  for (int m = 16; m > 0; m /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, m);
  if (lane == 0) s.red[threadIdx.x / 32] = ss;
  if (threadIdx.x < quant_mma::kFragU4PerChunk) s.zero[threadIdx.x] = make_uint4(0, 0, 0, 0);
  __syncthreads();
  trace_mark(2);
}

// 1 / sqrt(mean(x^2) + eps) of the row stage() staged (after its barrier), the warps' shares summed
// in warp order.
__device__ __forceinline__ float row_inv_rms(const ProductScratch& s, int cols, float eps) {
  float ss = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) ss += s.red[w];
  return 1.f / sqrtf(ss / float(cols) + eps);
}

constexpr uint32_t kPrefetchPiece = 32 * 1024;  // bytes a bulk prefetch instruction

// [p, p + bytes) into L2, the range shrunk to 16-byte boundaries (never past the allocation).
__device__ __forceinline__ void prefetch_l2(const void* p, uint64_t bytes) {
  uint64_t b = (reinterpret_cast<uint64_t>(p) + 15) & ~uint64_t(15);
  const uint64_t e = (reinterpret_cast<uint64_t>(p) + bytes) & ~uint64_t(15);
  for (; b + 16 <= e; b += kPrefetchPiece) {
    const uint32_t n = uint32_t(e - b < kPrefetchPiece ? e - b : kPrefetchPiece);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(b), "r"(n) : "memory");
  }
}

// Rows [r0, r0 + n) of entry e of m into L2; returns the bytes.
__device__ __forceinline__ uint32_t prefetch_rows(const DeviceMatrix& m, int e, int64_t r0, int64_t n) {
  const int64_t words = int64_t(m.cols) * m.bits / 32, groups = m.cols / 64, row = int64_t(e) * m.rows + r0;
  prefetch_l2(m.codes + row * words, uint64_t(n * words * 4));
  prefetch_l2(m.scales + row * groups, uint64_t(n * groups * 2));
  prefetch_l2(m.biases + row * groups, uint64_t(n * groups * 2));
  return uint32_t(n * (words * 4 + groups * 4));
}

using deltanet_detail::sigmoid;  // 1 / (1 + e^-v)
using moe_detail::silu;          // v / (1 + e^-v), as the decode MoE's

// h = embed[token]: thread i dequantizes word i of the row (8 columns of one group).
__device__ inline void embed_task(const StepArgs& a, const DeviceTask& t) {
  const DeviceMatrix& m = a.embed;
  const int H = a.dims.H, words = H / 8;
  for (int r = t.row; r < t.row + t.rows; ++r) {
    const int64_t token = __ldcg(a.buf.token + r);
    for (int w = threadIdx.x; w < words; w += kThreads) {
      const uint32_t q = __ldg(m.codes + token * words + w);
      const int grp = w / 8;
      const float scale = quant::load_bf16(m.scales + token * (H / 64) + grp);
      const float bias = quant::load_bf16(m.biases + token * (H / 64) + grp);
#pragma unroll
      for (int j = 0; j < 8; ++j) a.buf.hidden[int64_t(r) * H + 8 * w + j] = scale * float((q >> (4 * j)) & 15u) + bias;
    }
  }
}

// u = silu(conv over the channel's 3 older taps and x), the taps (oldest first) and the weights as
// conv_loads left them; the channel's state [3, C] shifted by one (the task that computes channel
// c owns its taps; T = 1).
__device__ __forceinline__ float conv_channel(const float4& w, const float4& taps, float* state, int C, int c,
                                              float x) {
  state[c] = taps.y, state[C + c] = taps.z, state[2 * C + c] = x;
  return silu(fmaf(w.x, taps.x, fmaf(w.y, taps.y, fmaf(w.z, taps.z, w.w * x))));
}

// The weights and older taps of the task's conv channels (rows first + i < C) into s.conv_w and
// s.conv_taps, by the block's last threads: with a task's rows in fewer warps' products than the
// block has (96 rows: 12 of 16), these threads have no products to hold up while their loads are
// in flight.
__device__ __forceinline__ void conv_loads(const DeviceLayer& L, const float* state, int C, int first, int n,
                                           ProductScratch& s) {
  for (int i = kThreads - 1 - int(threadIdx.x); i >= 0 && i < n && first + i < C; i += kThreads) {
    const int c = first + i;
    s.conv_w[i] = __ldg(reinterpret_cast<const float4*>(L.conv1d) + c);
    s.conv_taps[i] = make_float4(__ldcg(state + c), __ldcg(state + C + c), __ldcg(state + 2 * C + c), 0.f);
  }
}

// proj[r] = RMSNorm(h) . W_in[r] for the task's rows of the fused input projection; a DeltaNet
// layer's conv channels (r < conv_dim) leave as u = silu(conv(taps, proj[r])). The products go
// through s.out (the conv needs its loads done: a barrier), then each row out by thread i.
__device__ inline void in_proj_task(const StepArgs& a, const DeviceTask& t, ProductScratch& s) {
  const DeviceLayer& L = a.layers[t.layer];
  const int C = L.attention ? 0 : (2 * a.dims.Hk + a.dims.Hv) * 128, n = int(t.count), first = int(t.first);
  float* state = a.seq.conv[t.layer];
  stage<true>(a.buf.hidden, L.input_norm, a.dims.H, s);
  const float inv = row_inv_rms(s, a.dims.H, a.dims.eps);
  conv_loads(L, state, C, first, n, s);
  block_rows_dot(rows_of(L.in_proj), n, first, s, [&](int i, float y) { s.out[0][i] = inv * y; });
  __syncthreads();
  float* out = a.buf.proj + first;
  for (int i = threadIdx.x; i < n; i += kThreads)
    out[i] = first + i < C ? conv_channel(s.conv_w[i], s.conv_taps[i], state, C, first + i, s.out[0][i]) : s.out[0][i];
}

// The input row of a DeltaNet layer's out_proj, staged for block_rows_dot: per value head the gated
// norm y = w * o * rsqrt(mean(o^2) + eps) * silu(z) (spec §2.2.2), o from mixer, z from proj. A
// thread takes 8 columns, 16 threads a head of 128.
__device__ inline void stage_gated_norm(const StepArgs& a, const DeviceLayer& L, int cols, ProductScratch& s) {
  const int c0 = 8 * threadIdx.x, C = (2 * a.dims.Hk + a.dims.Hv) * 128;
  const bool mine = c0 < cols;
  // Two float4 loads an array (a warp's loads cover its 1 KB of o and of z once; eight scalar
  // loads through L2 fetched each line eight times).
  float o[8], z[8], w[8], ss = 0.f;
  auto load8 = [&](const float* p, float(&v)[8], bool l2) {
    const float4 x0 = !mine ? make_float4(0.f, 0.f, 0.f, 0.f)
                      : l2  ? __ldcg(reinterpret_cast<const float4*>(p))
                            : __ldg(reinterpret_cast<const float4*>(p));
    const float4 x1 = !mine ? make_float4(0.f, 0.f, 0.f, 0.f)
                      : l2  ? __ldcg(reinterpret_cast<const float4*>(p) + 1)
                            : __ldg(reinterpret_cast<const float4*>(p) + 1);
    v[0] = x0.x, v[1] = x0.y, v[2] = x0.z, v[3] = x0.w, v[4] = x1.x, v[5] = x1.y, v[6] = x1.z, v[7] = x1.w;
  };
  load8(a.buf.mixer + c0, o, true);
  load8(a.buf.proj + C + c0, z, true);
  load8(L.gated_norm + c0 % 128, w, false);
#pragma unroll
  for (int j = 0; j < 8; ++j) ss = fmaf(o[j], o[j], ss);
#pragma unroll
  for (int m = 1; m < 16; m *= 2) ss += __shfl_xor_sync(0xffffffffu, ss, m);
  const float inv = 1.f / sqrtf(ss / 128.f + a.dims.eps);
  float y[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) y[j] = w[j] * (o[j] * inv) * silu(z[j]);
  quant_mma::store_fragments8(threadIdx.x, mine, y, s.frag, s.group_sum, s.group_sum_hl);
  if (threadIdx.x < quant_mma::kFragU4PerChunk) s.zero[threadIdx.x] = make_uint4(0, 0, 0, 0);
  __syncthreads();
  trace_mark(2);
}

// h[r] += y . W_out[r], y = mixer (attention) or its gated norm (DeltaNet): the task owns its rows
// of h (no other task writes them meanwhile).
__device__ inline void out_proj_task(const StepArgs& a, const DeviceTask& t, ProductScratch& s) {
  const DeviceLayer& L = a.layers[t.layer];
  if (L.attention) stage<false>(a.buf.mixer, nullptr, L.out_proj.cols, s);
  else stage_gated_norm(a, L, L.out_proj.cols, s);
  float* h = a.buf.hidden + t.first;
  block_rows_dot(rows_of(L.out_proj), int(t.count), int(t.first), s, [&](int i, float y) { h[i] = __ldcg(h + i) + y; });
}

// logits[r] = RMSNorm(h) . lm_head[r]
__device__ inline void lm_head_task(const StepArgs& a, const DeviceTask& t, ProductScratch& s) {
  stage<true>(a.buf.hidden, a.final_norm, a.dims.H, s);
  const float inv = row_inv_rms(s, a.dims.H, a.dims.eps);
  float* out = a.buf.logits + t.first;
  block_rows_dot(rows_of(a.lm_head), int(t.count), int(t.first), s, [&](int i, float y) { out[i] = inv * y; });
}

// x = RMSNorm(h) with the post-attention gain into s.xs; the first router task also into moe_input.
__device__ inline void moe_norm(const StepArgs& a, const DeviceTask& t, ProductScratch& s) {
  constexpr int kPer = kMaxCols / 4 / kThreads;  // float4s of h a thread
  const DeviceLayer& L = a.layers[t.layer];
  const int H = a.dims.H, n4 = H / 4;
  float4 v[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int j = threadIdx.x + i * kThreads;
    v[i] = j < n4 ? __ldcg(reinterpret_cast<const float4*>(a.buf.hidden) + j) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  const float inv = block_inv_rms<kPer, kThreads>(v, H, a.dims.eps, s.red);
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int j = threadIdx.x + i * kThreads;
    if (j >= n4) continue;
    const float4 g = __ldg(reinterpret_cast<const float4*>(L.post_norm) + j);
    const float4 x = make_float4(v[i].x * inv * g.x, v[i].y * inv * g.y, v[i].z * inv * g.z, v[i].w * inv * g.w);
    reinterpret_cast<float4*>(s.xs)[j] = x;
    if (t.first == 0) reinterpret_cast<float4*>(a.buf.moe_input)[j] = x;
  }
  __syncthreads();
}

// logits[r] = x . Wr[r] for the task's rows of [Wr; w_sg] (8-bit, fp32), x = RMSNorm(h) (moe_norm):
// a warp a row, lane j the row's 16-byte chunks j, j + 32, ..., taken kChunks at a time with all
// their loads issued first (one memory latency per 2048 columns). x in shared memory.
__device__ inline void router_task(const StepArgs& a, const DeviceTask& t, ProductScratch& s) {
  constexpr int kChunks = 4;  // 16-byte chunks a lane loads together
  const DeviceLayer& L = a.layers[t.layer];
  const int H = a.dims.H, E = a.dims.E;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, cpr = H / 16, gpr = H / 64;
  auto row_of = [&](int r, const DeviceMatrix*& m) {
    m = r < E ? &L.router : &L.shared_expert_gate;
    return int64_t(r < E ? r : 0);
  };
  const int first = int(t.first) + warp, end = int(t.first + t.count);
  moe_norm(a, t, s);
  trace_mark(2);
  for (int r = first; r < end; r += kWarps) {
    const DeviceMatrix* m;
    const int64_t row = row_of(r, m);
    const uint4* codes = reinterpret_cast<const uint4*>(m->codes) + row * cpr;
    float acc = 0.f;
    for (int c0 = lane; c0 < cpr; c0 += 32 * kChunks) {
      uint4 q[kChunks];
      float scale[kChunks], bias[kChunks];
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        const int c = c0 + 32 * j;
        q[j] = c < cpr ? quant::load_codes(codes + c) : make_uint4(0, 0, 0, 0);
        scale[j] = c < cpr ? quant::load_bf16(m->scales + row * gpr + c / 4) : 0.f;
        bias[j] = c < cpr ? quant::load_bf16(m->biases + row * gpr + c / 4) : 0.f;
      }
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        const int c = c0 + 32 * j;
        if (c >= cpr) continue;
        float x[16];
        const float xsum = quant::load_x<16, false>(s.xs + 16 * c, x);
        acc += scale[j] * quant::chunk_dot<8>(q[j], x) + bias[j] * xsum;
      }
    }
    acc = quant::group_sum<32>(acc);
    if (lane == 0) a.buf.router_logits[r] = acc;
    if (r == int(t.first)) trace_mark(3);
  }
}

// The k experts of the row and their weights, into slots 0..k-1 (T = 1).
__device__ inline void top_k_task(const StepArgs& a, ProductScratch& s) {
  const int E = a.dims.E, k = a.dims.k;
  if (threadIdx.x < 32) {
    warp_load_logits(a.buf.router_logits, E, s.xs);
    warp_route_topk(s.xs, E, k, s.ids, s.weights);
    __syncwarp();
    if (threadIdx.x < k) {
      a.buf.slot_ids[threadIdx.x] = s.ids[threadIdx.x];
      a.buf.slot_weights[threadIdx.x] = s.weights[threadIdx.x];
    }
  }
}

// Slot t.slot's expert (-1: an empty slot; the shared expert is slot U).
__device__ __forceinline__ int slot_expert(const StepArgs& a, const DeviceTask& t) {
  return t.slot == a.dims.slots ? -2 : __ldcg(a.buf.slot_ids + t.slot);
}

// act[s][r] = silu(G[r] . x) * (U[r] . x) for the task's rows of slot s's expert. One row: a routed
// slot's expert is chosen here from the router's logits by warp 0, rank t.slot of the top-k rule
// (route_topk.cuh's warp_route_rank: the expert the top-k task's warp_route_topk puts there for the
// downs, by the same instructions on the same logits), while the other warps stage x (the choice
// and the staging meet at its barrier); the expert's rows of G and U go into L2 as soon as it is
// chosen (the top-k task, not waited for, may not have made them known). (The rank by the whole
// block in one pass measured slower than the warp's rounds: docs/perf.md, session 18.)
__device__ inline void gate_up_task(const StepArgs& a, const DeviceTask& t, ProductScratch& s) {
  const DeviceLayer& L = a.layers[t.layer];
  const bool choose = t.slot != a.dims.slots && a.dims.T == 1;
  if (choose && threadIdx.x < 32) {
    warp_load_logits(a.buf.router_logits, a.dims.E, s.xs);
    const int e = warp_route_rank(s.xs, a.dims.E, t.slot);
    if (threadIdx.x == 0) {
      s.ids[0] = e;
      prefetch_rows(L.gate, e, t.first, t.count);
      prefetch_rows(L.up, e, t.first, t.count);
    }
  }
  stage<false>(a.buf.moe_input, nullptr, a.dims.H, s, choose ? 32 : 0);
  const int e = choose ? s.ids[0] : slot_expert(a, t);
  if (e == -1) return;  // an empty slot (the block's barriers are uniform: e is the same in every thread)
  const Rows G = e < 0 ? rows_of(L.shared_gate) : rows_of(L.gate, e);
  const Rows U = e < 0 ? rows_of(L.shared_up) : rows_of(L.up, e);
  const int n = int(t.count);
  block_rows_dot(G, n, U, 2 * n, int(t.first), s, [&](int i, float y) { s.out[i / n][i % n] = y; });
  __syncthreads();
  float* act = a.buf.act + int64_t(t.slot) * a.dims.I + t.first;
  for (int i = threadIdx.x; i < n; i += kThreads) act[i] = silu(s.out[0][i]) * s.out[1][i];
}

// h[r] += w D[r] . act[s] for the task's rows of h.
__device__ inline void down_task(const StepArgs& a, const DeviceTask& t, ProductScratch& s) {
  const DeviceLayer& L = a.layers[t.layer];
  const int e = slot_expert(a, t);
  if (e == -1) return;
  const float w = e < 0 ? sigmoid(__ldcg(a.buf.router_logits + a.dims.E)) : __ldcg(a.buf.slot_weights + t.slot);
  const Rows D = e < 0 ? rows_of(L.shared_down) : rows_of(L.down, e);
  float* h = a.buf.hidden + t.first;
  stage<false>(a.buf.act + int64_t(t.slot) * a.dims.I, nullptr, a.dims.I, s);
  block_rows_dot(D, int(t.count), int(t.first), s, [&](int i, float y) { atomicAdd(h + i, w * y); });
}

}  // namespace lily::cuda::persistent
