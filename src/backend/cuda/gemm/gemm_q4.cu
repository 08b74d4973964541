// gemm_q4.cu: y = x @ W^T on the tensor cores for affine-quantized W (mlx layout, spec §5b),
// many input rows: the prefill projections and the grouped MoE experts.
//
//   y[m, n] (+)= sum_k x[m, k] * W[n, k],   W[n, k] = scale[n, k/64] * q[n, k] + bias[n, k/64]
// Shapes:   x [rows, K] fp32 (16-byte aligned) · W [E, N, K] (bits 4 or 8, group 64, K a multiple
//           of 64) · y [rows, N] fp32 (or [rows, N] of silu(G x) * U x for the SwiGLU form).
// Numerics: x -> bf16 (round to nearest) while it is staged; w -> bf16 with one rounding
//           (bf16x2 FMA of the exact code q and the bf16 scale and bias); mma.sync
//           m16n8k16 bf16 with fp32 accumulation; fp32 out. A bf16 copy of W never exists
//           outside one block's shared memory (one 64-column K tile at a time).
// Tiles:    a block computes BM rows x BN weight rows over K tiles of 64 columns (= one quant
//           group, so each row needs one scale and one bias per K tile). Warps WM x WN, each a
//           (BM/WM) x (BN/WN) warp tile of MT x NT mma tiles (16 x 8):
//             Tile16   BM 16  BN 64   1x4 warps  MT 1 NT 2   128 threads  (few rows per expert)
//             Tile32   BM 32  BN 64   2x2 warps  MT 1 NT 4   128 threads
//             Tile64   BM 64  BN 128  2x4 warps  MT 2 NT 4   256 threads  (dense, many rows)
//           (A BM 128 tile took 204 registers, one block per SM: left out until measured.)
//           In the SwiGLU form each warp's first NT/2 n-tiles are rows of G and the last NT/2
//           the same rows of U, so one thread holds g and u of an output and the epilogue
//           writes silu(g) * u: the [rows, 2I] intermediate never exists.
// Pipeline (per K tile kt; one __syncthreads per tile):
//           codes: 16-byte cp.async chunks into a ring of kStages (4-bit: 4) stages, issued
//             kStages-1 tiles ahead. Each thread copies and later dequantizes the same chunks,
//             so a chunk needs only cp.async.wait_group, no barrier, between landing and use.
//           dequant: a thread expands its chunk (32 codes at 4 bits: PRMT + LOP3 build
//             0x4300|q = bf16(128 + q); two bf16x2 FMAs give q = v - 128 (exact), then s*q + b) into the
//             bf16 B tile Bs[buf] [BN][64 + 8] (row stride 144 bytes: ldmatrix without bank
//             conflicts); double buffered.
//           x: fp32 float4 loads into registers one tile ahead, converted to bf16 into the
//             A tile As[buf] [BM][64 + 8]; double buffered. Row gathers (MoE) come for free here.
//           mma: ldmatrix.x4 fragments of As and Bs, MT x NT mma per 16 columns.
//           Order in iteration kt: barrier; issue codes(kt + kStages - 1); store x(kt + 1) to As;
//           load x(kt + 2) and scales(kt + 2) into registers; mma(kt); wait codes(kt + 1);
//           dequant(kt + 1) into Bs. Buffers (kt + 1) & 1 were last read by mma(kt - 1), which
//           every thread finished before the barrier.
// Launch:   programmatic (pdl_launch.cuh): blocks may be scheduled while the previous kernel
//           finishes; they wait for it before reading anything.
// Guards:   rows past the end read zeros (x) and are not written; weight rows past N read row
//           N - 1 and are not written. Grouped: blockIdx.x indexes the tile map; blocks past
//           the device-side tile count exit before any barrier.
// Split K:  dense products whose grid would not cover the SMs (passes of a few tokens) run with
//           gridDim.z > 1 over a workspace (split_k.h): each block sums a range of K tiles, the
//           last block of an output tile adds the ranges in order and runs the epilogue. A
//           kernel of its own (SPLIT): with the split compiled into the one kernel, every 4K
//           product measured ~5% slower.
// Variants: template <Tile, BITS 4|8, Epi store|accumulate|swiglu, SPLIT (not Tile64)>; 8-bit
//           only for Tile16 and Tile64 with store/accumulate (the router).
// Tested:   tests/cuda/test_gemm_q4.cu against cpu::linear; the grouped form through
//           tests/cuda/test_moe_grouped.cu.
#include "backend/cuda/common/cuda_check.h"  // first: it sets up fmt for nvcc
#include "backend/cuda/common/device_info.h"
#include "backend/cuda/common/mma.cuh"
#include "backend/cuda/common/pdl.cuh"
#include "backend/cuda/common/pdl_launch.cuh"
#include "backend/cuda/gemm/gemm_q4.h"
#include "backend/cuda/gemm/split_k.cuh"

#include <type_traits>

namespace lily::cuda {

namespace {

template <int BM_, int BN_, int WM_, int WN_>
struct Tile {
  static constexpr int BM = BM_, BN = BN_, WM = WM_, WN = WN_;
  static constexpr int kThreads = 32 * WM * WN;
  static constexpr int kWarpM = BM / WM, kWarpN = BN / WN;
  static constexpr int MT = kWarpM / 16, NT = kWarpN / 8;
  static_assert(MT >= 1 && MT * 16 * WM == BM && NT >= 2 && NT % 2 == 0 && NT * 8 * WN == BN);
};
using Tile16 = Tile<16, 64, 1, 4>;
using Tile32 = Tile<32, 64, 2, 2>;
using Tile64 = Tile<64, 128, 2, 4>;

constexpr int kBK = 64;              // columns per K tile = the quantization group
constexpr int kRowStride = kBK + 8;  // bf16 per shared row: 144 bytes, ldmatrix conflict free

enum class Epi { store, accumulate, swiglu };

struct Params {
  const uint8_t* codes[2];    // [E, N, K*bits/8]: matrix 0 (W or G) and 1 (U, SwiGLU only)
  const uint16_t* scales[2];  // [E, N, K/64] bf16 bits
  const uint16_t* biases[2];
  int N, K;           // rows and columns of one matrix
  const float* x;     // [rows, K]
  int T;              // dense: rows of x and y
  const int4* tiles;  // grouped: [max_tiles] (expert, first, end, -); nullptr: dense
  const int32_t* num_tiles;
  const int32_t* gather;  // x row of position p: gather[p] / gather_div; nullptr: p
  int gather_div;
  float* y;  // [rows, ldy]
  int ldy;
};

using namespace ptx;

__device__ __forceinline__ uint32_t fma_bf16x2(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// ---- Dequantization of one 16-byte chunk into bf16 pairs (columns 2j, 2j + 1 in out[j]) ----

// 4 bits: 32 codes. Byte b of word i holds columns 8i + 2b (low nibble) and 8i + 2b + 1.
__device__ __forceinline__ void dequant_chunk4(const uint4& q, uint16_t scale, uint16_t bias, uint32_t (&out)[16]) {
  const uint32_t s2 = uint32_t(scale) * 0x10001u, b2 = uint32_t(bias) * 0x10001u;
  const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t lo = w[i] & 0x0F0F0F0Fu, hi = (w[i] >> 4) & 0x0F0F0F0Fu;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      // bytes (lo.b, -, hi.b, -) -> halves 0x4300 | q = bf16(128 + q), exact for q < 128
      const uint32_t v = (__byte_perm(lo, hi, b | (b << 4) | ((4 + b) << 8) | ((4 + b) << 12)) & 0x00FF00FFu) |
                         0x43004300u;
      const uint32_t qq = fma_bf16x2(v, 0x3F803F80u, 0xC300C300u);  // v * 1 - 128 = q, exact
      out[4 * i + b] = fma_bf16x2(qq, s2, b2);                      // s * q + b, one rounding
    }
  }
}

// 8 bits: 16 codes, byte j of word i = column 4i + j. Through fp32 (codes up to 255 are not
// exact as 128 + q in bf16).
__device__ __forceinline__ void dequant_chunk8(const uint4& q, uint16_t scale, uint16_t bias, uint32_t (&out)[8]) {
  const float s = __uint_as_float(uint32_t(scale) << 16), b = __uint_as_float(uint32_t(bias) << 16);
  const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      // PRMT builds 0x4B0000qq = 2^23 + q; one FADD removes 2^23.
      const float q0 = __uint_as_float(__byte_perm(w[i], 0x4B000000u, 0x7540u + 2 * h)) - 8388608.f;
      const float q1 = __uint_as_float(__byte_perm(w[i], 0x4B000000u, 0x7540u + 2 * h + 1)) - 8388608.f;
      out[2 * i + h] = pack_bf16(fmaf(s, q0, b), fmaf(s, q1, b));
    }
  }
}

__device__ __forceinline__ float silu(float g) { return g / (1.f + __expf(-g)); }

// ---- The kernel -----------------------------------------------------------------------------

template <class TL, int BITS>
struct Smem {
  static constexpr int kRowBytes = BITS * 8;               // codes of one row in one K tile
  static constexpr int kChunks = TL::BN * kRowBytes / 16;  // 16-byte chunks per K tile
  static constexpr int kStages = BITS == 4 ? 4 : 3;
  static constexpr int kA = 2 * TL::BM * kRowStride * 2;  // bytes: As[2]
  static constexpr int kB = 2 * TL::BN * kRowStride * 2;  // bytes: Bs[2]
  static constexpr int kCodes = kStages * kChunks * 16;   // bytes: the codes ring
  static constexpr int kBytes = kA + kB + kCodes;
};

template <class TL, int BITS, Epi EPI, bool SPLIT>
__global__ void __launch_bounds__(TL::kThreads) gemm_q4_kernel(const Params p, const SplitK split) {
  constexpr int BM = TL::BM, BN = TL::BN, MT = TL::MT, NT = TL::NT, kThreads = TL::kThreads;
  using S = Smem<TL, BITS>;
  constexpr int kStages = S::kStages, kRowBytes = S::kRowBytes, kChunks = S::kChunks;
  constexpr int kChunksPerRow = kRowBytes / 16, kChunkCols = 128 / BITS;
  constexpr int kCPT = kChunks / kThreads;      // code chunks per thread per K tile
  constexpr int kA4 = BM * kBK / 4 / kThreads;  // float4 of x per thread per K tile
  static_assert(kCPT >= 1 && kCPT * kThreads == kChunks && kA4 >= 1 && kA4 * kThreads * 4 == BM * kBK);
  constexpr int kOutN = EPI == Epi::swiglu ? BN / 2 : BN;  // output columns per block

  extern __shared__ uint4 smem[];
  uint16_t* As = reinterpret_cast<uint16_t*>(smem);                                          // [2][BM][kRowStride]
  uint16_t* Bs = As + 2 * BM * kRowStride;                                                   // [2][BN][kRowStride]
  uint4* ring = reinterpret_cast<uint4*>(reinterpret_cast<uint8_t*>(smem) + S::kA + S::kB);  // [kStages][kChunks]

  pdl_wait();  // launched after the wait (pdl_launch.cuh): nothing of the predecessor is read before
  pdl_launch_dependents();
  int expert = 0, r0, r1;
  if (p.tiles) {                                         // the tile map through L2: written one or two launches back
    if (int(blockIdx.x) >= __ldcg(p.num_tiles)) return;  // whole block: before any barrier
    const int4 t = __ldcg(p.tiles + blockIdx.x);
    expert = t.x, r0 = t.y, r1 = t.z;
  } else {
    r0 = blockIdx.x * BM;
    r1 = min(p.T, r0 + BM);
  }
  const int n_out0 = blockIdx.y * kOutN;
  // K tiles [k0, k0 + KT) of W: all of them, or this block's split.
  const KRange kr = SPLIT ? split_k_range(p.K / kBK) : KRange{0, p.K / kBK};
  const int k0 = kr.begin, KT = kr.end - kr.begin;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int wm = warp / TL::WN, wn = warp % TL::WN;

  // This thread's code chunks: block-local weight row, column part, source row pointers.
  const int64_t row_bytes = int64_t(p.K) * BITS / 8, gpr = p.K / kBK;
  const uint8_t* c_src[kCPT];
  const uint16_t *c_scale[kCPT], *c_bias[kCPT];
  int c_dst[kCPT];  // offset in Bs[buf] (bf16 elements)
#pragma unroll
  for (int i = 0; i < kCPT; ++i) {
    const int c = tid + i * kThreads, r = c / kChunksPerRow, part = c % kChunksPerRow;
    int mi = 0, n = n_out0 + r;
    if constexpr (EPI == Epi::swiglu) {  // warp tile rows: first half G, second half U
      constexpr int kWarpRows = BN / TL::WN, kHalf = kWarpRows / 2;
      mi = (r % kWarpRows) >= kHalf;
      n = n_out0 + (r / kWarpRows) * kHalf + (r % kHalf);
    }
    const int64_t grow = int64_t(expert) * p.N + min(n, p.N - 1);
    // (selects, not p.codes[mi]: indexing the parameter array would copy it to local memory)
    c_src[i] = (mi ? p.codes[1] : p.codes[0]) + grow * row_bytes + int64_t(k0) * kRowBytes + part * 16;
    c_scale[i] = (mi ? p.scales[1] : p.scales[0]) + grow * gpr + k0;
    c_bias[i] = (mi ? p.biases[1] : p.biases[0]) + grow * gpr + k0;
    c_dst[i] = r * kRowStride + part * kChunkCols;
  }
  // This thread's x float4s: source row pointers (nullptr: zeros) and offsets in As[buf].
  const float* a_src[kA4];
  int a_dst[kA4];
#pragma unroll
  for (int i = 0; i < kA4; ++i) {
    const int f = tid + i * kThreads, m = f / (kBK / 4), c4 = f % (kBK / 4);
    const int pos = r0 + m;
    a_src[i] = nullptr;
    if (pos < r1) {
      const int64_t src = p.gather ? __ldcg(p.gather + pos) / p.gather_div : pos;
      a_src[i] = p.x + src * p.K + int64_t(k0) * kBK + c4 * 4;
    }
    a_dst[i] = m * kRowStride + c4 * 4;
  }

  auto issue_codes = [&](int kt) {
    if (kt < KT) {
#pragma unroll
      for (int i = 0; i < kCPT; ++i)
        cp_async16(ring + (kt % kStages) * kChunks + tid + i * kThreads, c_src[i] + int64_t(kt) * kRowBytes);
    }
    cp_async_commit();  // an empty group past the end keeps the wait counts uniform
  };
  float4 ra[kA4];
  auto load_x = [&](int kt) {
#pragma unroll
    for (int i = 0; i < kA4; ++i)
      ra[i] = a_src[i] ? __ldg(reinterpret_cast<const float4*>(a_src[i] + kt * kBK)) : make_float4(0.f, 0.f, 0.f, 0.f);
  };
  auto store_x = [&](int buf) {
#pragma unroll
    for (int i = 0; i < kA4; ++i) {
      uint2 v{pack_bf16(ra[i].x, ra[i].y), pack_bf16(ra[i].z, ra[i].w)};
      *reinterpret_cast<uint2*>(As + buf * BM * kRowStride + a_dst[i]) = v;
    }
  };
  uint16_t sc[kCPT], bi[kCPT];
  auto load_scales = [&](int kt) {
#pragma unroll
    for (int i = 0; i < kCPT; ++i) sc[i] = __ldg(c_scale[i] + kt), bi[i] = __ldg(c_bias[i] + kt);
  };
  auto dequant = [&](int kt, int buf, const uint16_t(&s)[kCPT], const uint16_t(&b)[kCPT]) {
#pragma unroll
    for (int i = 0; i < kCPT; ++i) {
      const uint4 q = ring[(kt % kStages) * kChunks + tid + i * kThreads];
      uint4* dst = reinterpret_cast<uint4*>(Bs + buf * BN * kRowStride + c_dst[i]);
      if constexpr (BITS == 4) {
        uint32_t out[16];
        dequant_chunk4(q, s[i], b[i], out);
#pragma unroll
        for (int j = 0; j < 4; ++j) dst[j] = make_uint4(out[4 * j], out[4 * j + 1], out[4 * j + 2], out[4 * j + 3]);
      } else {
        uint32_t out[8];
        dequant_chunk8(q, s[i], b[i], out);
#pragma unroll
        for (int j = 0; j < 2; ++j) dst[j] = make_uint4(out[4 * j], out[4 * j + 1], out[4 * j + 2], out[4 * j + 3]);
      }
    }
  };

  float acc[MT][NT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][j][e] = 0.f;

        // Prologue: codes of tiles 0 .. kStages-2 in flight; tile 0 staged; x and scales of tile 1 loaded.
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue_codes(s);
  load_x(0);
  load_scales(0);
  store_x(0);
  cp_async_wait<kStages - 2>();
  dequant(0, 0, sc, bi);
  if (KT > 1) load_x(1), load_scales(1);

  for (int kt = 0; kt < KT; ++kt) {
    const int buf = kt & 1;
    __syncthreads();
    issue_codes(kt + kStages - 1);
    uint16_t s_next[kCPT], b_next[kCPT];  // scales of tile kt + 1
#pragma unroll
    for (int i = 0; i < kCPT; ++i) s_next[i] = sc[i], b_next[i] = bi[i];
    if (kt + 1 < KT) store_x(buf ^ 1);
    if (kt + 2 < KT) load_x(kt + 2), load_scales(kt + 2);

    const uint16_t* As_w = As + buf * BM * kRowStride + (wm * TL::kWarpM) * kRowStride;
    const uint16_t* Bs_w = Bs + buf * BN * kRowStride + (wn * TL::kWarpN) * kRowStride;
#pragma unroll
    for (int s = 0; s < kBK / 16; ++s) {
      uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
        ldmatrix_x4(a[mt], As_w + (mt * 16 + (lane & 15)) * kRowStride + s * 16 + (lane >> 4) * 8);
      uint32_t b[NT][2];
#pragma unroll
      for (int jp = 0; jp < NT / 2; ++jp) {
        uint32_t r[4];
        ldmatrix_x4(r,
                    Bs_w + (jp * 16 + (lane & 7) + ((lane >> 4) << 3)) * kRowStride + s * 16 + ((lane >> 3) & 1) * 8);
        b[2 * jp][0] = r[0], b[2 * jp][1] = r[1], b[2 * jp + 1][0] = r[2], b[2 * jp + 1][1] = r[3];
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int j = 0; j < NT; ++j) mma_bf16(acc[mt][j], a[mt], b[j][0], b[j][1]);
    }

    if (kt + 1 < KT) {
      cp_async_wait<kStages - 2>();  // this thread's chunks of tile kt + 1 have landed
      dequant(kt + 1, buf ^ 1, s_next, b_next);
    }
  }
  cp_async_wait<0>();

  if constexpr (SPLIT) {  // the last block of this output tile sums the splits
    constexpr int kRegs = MT * NT * 4;
    float flat[kRegs];
#pragma unroll
    for (int r = 0; r < kRegs; ++r) flat[r] = acc[r / (NT * 4)][(r / 4) % NT][r % 4];
    if (!split_k_finish(flat, split, int(blockIdx.y * gridDim.x + blockIdx.x))) return;
#pragma unroll
    for (int r = 0; r < kRegs; ++r) acc[r / (NT * 4)][(r / 4) % NT][r % 4] = flat[r];
  }

  // Epilogue. Thread (g, t) of a warp holds rows g and g + 8 of each 16-row tile, columns
  // 2t and 2t + 1 of each 8-column tile. One owner per output element: deterministic.
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int pos = r0 + wm * TL::kWarpM + mt * 16 + g + 8 * h;
      if (pos >= r1) continue;
      float* yrow = p.y + int64_t(pos) * p.ldy;
      if constexpr (EPI == Epi::swiglu) {
#pragma unroll
        for (int j = 0; j < NT / 2; ++j) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int n = n_out0 + wn * (TL::kWarpN / 2) + j * 8 + 2 * t + e;
            if (n < p.N) yrow[n] = silu(acc[mt][j][2 * h + e]) * acc[mt][j + NT / 2][2 * h + e];
          }
        }
      } else {
#pragma unroll
        for (int j = 0; j < NT; ++j) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int n = n_out0 + wn * TL::kWarpN + j * 8 + 2 * t + e;
            if (n < p.N) {
              if constexpr (EPI == Epi::accumulate) yrow[n] += acc[mt][j][2 * h + e];
              else yrow[n] = acc[mt][j][2 * h + e];
            }
          }
        }
      }
    }
  }
}

// ---- Launchers ------------------------------------------------------------------------------

template <class TL, int BITS, Epi EPI, bool SPLIT>
void launch(const Params& p, unsigned grid_x, unsigned splits, const SplitK& split, cudaStream_t stream) {
  constexpr int kOutN = EPI == Epi::swiglu ? TL::BN / 2 : TL::BN;
  constexpr int bytes = Smem<TL, BITS>::kBytes;
  auto kernel = gemm_q4_kernel<TL, BITS, EPI, SPLIT>;
  static const bool configured = [&] {  // once per instantiation: allow > 48 KB of shared memory
    allow_dynamic_shared(kernel, size_t(bytes), "gemm_q4");
    return true;
  }();
  (void)configured;
  const dim3 grid(grid_x, unsigned((p.N + kOutN - 1) / kOutN), splits);
  launch_after_wait(kernel, grid, dim3(TL::kThreads), bytes, stream, p, split);
}

// split: a workspace to split K over more blocks when the grid is small (dense only), or null.
template <int BITS, Epi EPI>
void dispatch_tile(int tile_rows, const Params& p, int rows, const int max_tiles, const SplitK* split,
                   cudaStream_t stream) {
  auto go = [&](auto tile) {
    using TL = decltype(tile);
    constexpr int kOutN = EPI == Epi::swiglu ? TL::BN / 2 : TL::BN;
    const unsigned gx = p.tiles ? unsigned(max_tiles) : unsigned((rows + TL::BM - 1) / TL::BM);
    const int64_t tiles = int64_t(gx) * ((p.N + kOutN - 1) / kOutN);
    if constexpr (TL::BM != 64) {  // Tile64 runs only on grids that cover the SMs (dense()): no split form
      const int64_t floats = int64_t(TL::kThreads) * TL::MT * TL::NT * 4;
      const int splits = p.tiles ? 1 : split_k_count(split, tiles, p.K / kBK, 2, floats);
      if (splits > 1) return launch<TL, BITS, EPI, true>(p, gx, unsigned(splits), *split, stream);
    }
    launch<TL, BITS, EPI, false>(p, gx, 1, SplitK{}, stream);
  };
  if constexpr (BITS == 8) {
    if (tile_rows <= 16) go(Tile16{});
    else go(Tile64{});
  } else {
    if (tile_rows == 16) go(Tile16{});
    else if (tile_rows == 32) go(Tile32{});
    else go(Tile64{});
  }
}

void check_matrix(const QMatrix& m, const char* what) {
  LILY_CHECK(m.bits == 4 || m.bits == 8, "{}: {}-bit weights are not supported (4 or 8)", what, m.bits);
  LILY_CHECK(m.group_size == 64, "{}: group size {} is not supported (64)", what, m.group_size);
  LILY_CHECK(m.cols > 0 && m.cols % 64 == 0 && m.rows > 0, "{}: shape [{}, {}] (cols must be a multiple of 64)", what,
             m.rows, m.cols);
}

void check_pair(const QMatrix& G, const QMatrix& U, const char* what) {
  check_matrix(G, what);
  LILY_CHECK(G.batch == U.batch && G.rows == U.rows && G.cols == U.cols && G.bits == U.bits && U.group_size == 64,
             "{}: G [{}, {}, {}] q{} and U [{}, {}, {}] q{} differ", what, G.batch, G.rows, G.cols, G.bits, U.batch,
             U.rows, U.cols, U.bits);
  LILY_CHECK(G.bits == 4, "{}: the SwiGLU form takes 4-bit weights, got {}", what, G.bits);
}

Params make_params(const QMatrix& A, const QMatrix* B, const float* x, float* y, int ldy) {
  LILY_CHECK(aligned16(x), "gemm_q4: x must be 16-byte aligned");
  Params p{};
  const QMatrix& second = B ? *B : A;
  p.codes[0] = reinterpret_cast<const uint8_t*>(A.codes);
  p.codes[1] = reinterpret_cast<const uint8_t*>(second.codes);
  p.scales[0] = reinterpret_cast<const uint16_t*>(A.scales);
  p.scales[1] = reinterpret_cast<const uint16_t*>(second.scales);
  p.biases[0] = reinterpret_cast<const uint16_t*>(A.biases);
  p.biases[1] = reinterpret_cast<const uint16_t*>(second.biases);
  p.N = A.rows, p.K = A.cols;
  p.x = x, p.y = y, p.ldy = ldy;
  p.gather_div = 1;
  return p;
}

template <Epi EPI>
void dense(const QMatrix& W, const QMatrix* U, const float* x, float* y, int T, const SplitK* split,
           cudaStream_t stream) {
  LILY_CHECK(T >= 0, "gemm_q4: T = {}", T);
  if (T == 0) return;
  Params p = make_params(W, U, x, y, W.rows);
  p.T = T;
  // M tile from T, made smaller while the grid would not fill the 132 SMs once (small N:
  // the router, in_proj_a/b).
  const int out_n = W.rows, bn_out = EPI == Epi::swiglu ? 32 : 64;  // BN of Tile16/32 (Tile64: twice that)
  auto blocks = [&](int bm) {
    return int64_t((T + bm - 1) / bm) * ((out_n + bn_out * (bm == 64 ? 2 : 1) - 1) / (bn_out * (bm == 64 ? 2 : 1)));
  };
  int bm = gemm_q4_tile_rows(T);
  if (bm == 64 && blocks(64) < 132) bm = W.bits == 8 ? 16 : 32;
  if (bm == 32 && blocks(32) < 132) bm = 16;
  if (W.bits == 4) dispatch_tile<4, EPI>(bm, p, T, 0, split, stream);
  else if constexpr (EPI != Epi::swiglu) dispatch_tile<8, EPI>(bm, p, T, 0, split, stream);
}

template <Epi EPI>
void grouped(const QMatrix& W, const QMatrix* U, const float* x, const GroupedTiles& g, float* y, cudaStream_t stream) {
  LILY_CHECK(g.tiles && g.num_tiles && g.max_tiles >= 0, "gemm_q4_grouped: no tile map");
  LILY_CHECK(g.tile_rows == 16 || g.tile_rows == 32 || g.tile_rows == 64,
             "gemm_q4_grouped: tile rows {} (16, 32 or 64)", g.tile_rows);
  LILY_CHECK(W.bits == 4, "gemm_q4_grouped: {}-bit experts (4 only)", W.bits);
  LILY_CHECK(g.gather_div >= 1, "gemm_q4_grouped: gather_div {}", g.gather_div);
  if (g.max_tiles == 0) return;
  Params p = make_params(W, U, x, y, W.rows);
  p.tiles = reinterpret_cast<const int4*>(g.tiles);
  p.num_tiles = g.num_tiles;
  p.gather = g.gather, p.gather_div = g.gather_div;
  dispatch_tile<4, EPI>(g.tile_rows, p, 0, g.max_tiles, nullptr, stream);
}

}  // namespace

bool gemm_q4_supports(const QMatrix& W) {
  return (W.bits == 4 || W.bits == 8) && W.group_size == 64 && W.cols > 0 && W.cols % 64 == 0 && W.rows > 0;
}

// The next tile up from the rows: bench_moe_grouped (H200, docs/perf-log/2026-11.md, issue 7's
// ablations) has the whole expert block fastest with 16-row tiles at 8 rows per expert, 32 at 16
// and 64 from 32 rows on.
int gemm_q4_tile_rows(double rows) { return rows < 12 ? 16 : rows < 24 ? 32 : 64; }

void gemm_q4(const QMatrix& W, const float* x, float* y, int T, cudaStream_t stream, const SplitK* split) {
  check_matrix(W, "gemm_q4");
  dense<Epi::store>(W.entry(0), nullptr, x, y, T, split, stream);
}

void gemm_q4_accumulate(const QMatrix& W, const float* x, float* y, int T, cudaStream_t stream, const SplitK* split) {
  check_matrix(W, "gemm_q4_accumulate");
  dense<Epi::accumulate>(W.entry(0), nullptr, x, y, T, split, stream);
}

void gemm_q4_swiglu(const QMatrix& G, const QMatrix& U, const float* x, float* y, int T, cudaStream_t stream,
                    const SplitK* split) {
  check_pair(G, U, "gemm_q4_swiglu");
  const QMatrix u = U.entry(0);
  dense<Epi::swiglu>(G.entry(0), &u, x, y, T, split, stream);
}

void gemm_q4_grouped_swiglu(const QMatrix& G, const QMatrix& U, const float* x, const GroupedTiles& tiles, float* y,
                            cudaStream_t stream) {
  check_pair(G, U, "gemm_q4_grouped_swiglu");
  grouped<Epi::swiglu>(G, &U, x, tiles, y, stream);
}

void gemm_q4_grouped(const QMatrix& W, const float* x, const GroupedTiles& tiles, float* y, cudaStream_t stream) {
  check_matrix(W, "gemm_q4_grouped");
  grouped<Epi::store>(W, nullptr, x, tiles, y, stream);
}

}  // namespace lily::cuda
