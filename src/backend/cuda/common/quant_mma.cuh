// quant_mma.cuh: dot products of 4-bit affine-quantized rows (mlx layout, spec §5b) with one
// fp32 vector on the tensor cores, for the single-row (decode) kernels: 16 rows per warp,
// mma.sync m16n8k16 with the weights as the A operand and the vector as the B operand.
//
//   y[r] = sum_g scale[r, g] * (sum_{c in g} q[r, c] x[c]) + bias[r, g] * (sum_{c in g} x[c])
//
// Why: the FP32 path (quant_dot.cuh) spends ~4 instructions per weight (code to float, FMA,
// the x loads and sums); here a weight costs ~1.4 (its nibble becomes an exact bf16 integer
// with a LOP3 and a SUB per pair, then 1/8 of an HMMA), so a warp's compute phase between two
// rounds of loads is ~3x shorter. Accuracy stays at fp32 level: the codes 0..15 are exact in
// bf16, x goes in as two bf16 parts x = hi + lo (~2^-17 relative), products are exact and the
// tensor cores accumulate in fp32.
//
// Layout. A "block" is 128 columns = 4 chunks of 16 bytes = 2 groups (A: chunks 0-1, B: 2-3);
// a "pair" is 2 blocks = 4 groups. Lane (g = lane / 4, t = lane % 4) loads chunk t of every
// block for rows g and g + 8 of the warp's 16; word w of a chunk holds columns 8w .. 8w + 7
// (nibble j = column 8w + j), and dequant_word turns it into the bf16 pairs (j, j + 4),
// j = 0..3. One pair of blocks is one chain of 16 mma into a fresh accumulator: mma 2w (+1)
// of a block takes the pairs j = 0, 1 (2, 3) of word w as a0/a2 (row g) and a1/a3 (row g + 8).
// k is a permutation of the columns, so the B fragments hold x in the same order, staged once
// per block in shared memory (stage_x_fragments). The B operand's 8 columns separate the
// groups and carry the two parts of x:
//     column n:  0, 1 = block 0 group A (hi, lo)   2, 3 = block 0 group B (hi, lo)
//                4, 5 = block 1 group A            6, 7 = block 1 group B
// so lane (g, t) supplies x (part g & 1) of its chunk t only in the block g / 4 and only if
// chunk t is in column g's group, zeros otherwise; and the accumulator columns 2t, 2t + 1 of a
// lane are the hi and lo sums of group 4 * pair + t: every lane ends with its own group's dot
// for rows g and g + 8, scaled there. A quad sum (lanes t = 0..3) completes the rows.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>

#include "backend/cuda/common/arch.cuh"
#include "backend/cuda/common/block_rms.cuh"
#include "backend/cuda/common/mma.cuh"
#include "backend/cuda/common/quant_dot.cuh"

namespace lily::cuda::quant_mma {

constexpr int kBlockCols = 128;     // 4 chunks, 2 groups
constexpr int kPairCols = 256;      // 2 blocks, 4 groups: one mma chain
constexpr int kFragU4PerChunk = 4;  // 16 bf16x2 of one part (hi or lo) of a chunk of x

// Pairs per warp when `warps` warps split `pairs` pairs of a row and each load step takes `step`
// pairs: a multiple of step (a warp's last step would otherwise run into the next warp's pairs
// and count them twice, e.g. 2 pairs at H = 512 over 4 warps, 2 pairs per step).
__host__ __device__ constexpr int pairs_per_warp(int pairs, int warps, int step) {
  return ((pairs + warps - 1) / warps + step - 1) / step * step;
}

// Shared-memory size of the x fragments for `cols` columns: [chunk][part][4 uint4].
__host__ __device__ constexpr int fragment_uint4s(int cols) { return cols / 32 * 2 * kFragU4PerChunk; }

// Word w of a chunk -> a[j] = bf16x2(q[8w + j], q[8w + j + 4]) (low half first), exact integers:
// (w >> 4j & 0x000F000F) | 128.0 is one lop3 with the mask as its immediate and the magic in a
// register (written in C, the two constants made it two instructions, ncu 2026-12-03), then 128
// subtracted.
__device__ __forceinline__ void dequant_word(uint32_t w, uint32_t (&a)[4]) {
  constexpr uint32_t kMagic = 0x43004300u;  // bf16 128.0 in both halves; 128 + q is exact
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint32_t v;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(v) : "r"(w >> (4 * j)), "n"(0x000F000Fu), "r"(kMagic));
#if LILY_SM90_CODE
    asm("sub.rn.bf16x2 %0, %1, %2;\n" : "=r"(a[j]) : "r"(v), "r"(kMagic));
#else  // sub.bf16x2 is sm_90's; v * 1 - 128, one rounding of an exact result, is the same value
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(a[j]) : "r"(v), "r"(0x3F803F80u), "r"(kMagic ^ 0x80008000u));
#endif
  }
}

// Block-wide (every thread calls it; the caller syncs before and after): x [cols] fp32 in
// shared or global memory -> frag [cols / 32][2 parts][4 uint4] in mma order, and group_sum
// [cols / 64]. Each thread loads BATCH pairs of x (or a warp BATCH groups) before it stores
// anything: stores into shared memory between the loads would otherwise serialize them (the
// compiler cannot tell that they do not alias x), one memory latency per pair a thread handles
// when x comes from global memory. From shared memory BATCH = 1 saves the registers.
template <int BATCH = 8>
__device__ __forceinline__ void stage_x_fragments(const float* x, int cols, uint4* frag, float* group_sum) {
  constexpr int kStageBatch = BATCH;
  const int tid = threadIdx.x, nthreads = blockDim.x, npairs = cols / 2;
  uint32_t* f = reinterpret_cast<uint32_t*>(frag);
  for (int i0 = tid; i0 < npairs; i0 += kStageBatch * nthreads) {
    float a[kStageBatch], b[kStageBatch];
#pragma unroll
    for (int r = 0; r < kStageBatch; ++r) {
      const int i = i0 + r * nthreads, chunk = i / 16, k = i % 16;  // pair k of the chunk
      const int c0 = 32 * chunk + 8 * (k / 4) + (k % 4);            // columns c0 and c0 + 4
      a[r] = i < npairs ? x[c0] : 0.f;
      b[r] = i < npairs ? x[c0 + 4] : 0.f;
    }
#pragma unroll
    for (int r = 0; r < kStageBatch; ++r) {
      const int i = i0 + r * nthreads, chunk = i / 16, k = i % 16;
      if (i >= npairs) break;
      uint32_t hi, lo;
      ptx::split_bf16(a[r], b[r], hi, lo);
      f[(chunk * 2 + 0) * 16 + k] = hi;
      f[(chunk * 2 + 1) * 16 + k] = lo;
    }
  }
  const int warp = tid / 32, lane = tid % 32, nwarps = nthreads / 32, ngroups = cols / 64;
  for (int g0 = warp; g0 < ngroups; g0 += kStageBatch * nwarps) {
    float v[kStageBatch];
#pragma unroll
    for (int r = 0; r < kStageBatch; ++r) {
      const int grp = g0 + r * nwarps;
      v[r] = grp < ngroups ? x[64 * grp + lane] + x[64 * grp + 32 + lane] : 0.f;
    }
#pragma unroll
    for (int r = 0; r < kStageBatch; ++r) {
      v[r] = quant::group_sum<32>(v[r]);
      const int grp = g0 + r * nwarps;
      if (lane == 0 && grp < ngroups) group_sum[grp] = v[r];
    }
  }
}

// Block-wide (every thread calls it; the caller syncs after): the input row x [cols] (NORM:
// x * inv * gain with inv = 1 / sqrt(mean(x^2) + eps), as rms_norm) into xs (fp32, shared), then
// its fragments and group sums (stage_x_fragments), and zero[] cleared. x is read through L2
// (__ldcg: it was written by the previous kernel). red: THREADS / 32 floats of shared scratch.
// cols: a multiple of 64, at most MAXCOLS.
template <bool NORM, int THREADS, int MAXCOLS, int BATCH = 1>
__device__ __forceinline__ void stage_input_row(const float* x, const float* gain, float eps, int cols, float* xs,
                                                uint4* frag, float* group_sum, uint4* zero, float* red) {
  constexpr int kPer = MAXCOLS / 4 / THREADS;
  const int n4 = cols / 4;
  float4 xv[kPer], gv[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int j = threadIdx.x + i * THREADS;
    xv[i] = j < n4 ? __ldcg(reinterpret_cast<const float4*>(x) + j) : make_float4(0.f, 0.f, 0.f, 0.f);
    gv[i] = NORM && j < n4 ? __ldg(reinterpret_cast<const float4*>(gain) + j) : make_float4(1.f, 1.f, 1.f, 1.f);
  }
  float inv = 1.f;
  if constexpr (NORM) inv = block_inv_rms<kPer, THREADS>(xv, cols, eps, red);
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int j = threadIdx.x + i * THREADS;
    if (j < n4)
      reinterpret_cast<float4*>(xs)[j] = NORM ? make_float4(xv[i].x * inv * gv[i].x, xv[i].y * inv * gv[i].y,
                                                            xv[i].z * inv * gv[i].z, xv[i].w * inv * gv[i].w)
                                              : xv[i];
  }
  if (threadIdx.x < kFragU4PerChunk) zero[threadIdx.x] = make_uint4(0, 0, 0, 0);
  __syncthreads();
  stage_x_fragments<BATCH>(xs, cols, frag, group_sum);
}

// The codes, scales and biases a lane needs for NPAIR pairs of blocks of rows g and g + 8.
template <int NPAIR>
struct TileLoad {
  uint4 q[NPAIR][2][2];                   // [pair][block][row g, g + 8]
  float scale[NPAIR][2], bias[NPAIR][2];  // group 4 pair + t, rows g and g + 8
};

// Issue the loads of pairs pair0 .. pair0 + NPAIR - 1 (those past the row end read zeros).
// codes: the matrix's chunks [rows, cpr]; row_g, row_g8: valid rows.
template <int NPAIR>
__device__ __forceinline__ void load_tile(TileLoad<NPAIR>& t, const uint4* codes, const uint16_t* scales,
                                          const uint16_t* biases, int64_t row_g, int64_t row_g8, int cpr, int pair0) {
  const int t4 = threadIdx.x % 4, gpr = cpr / 2;
#pragma unroll
  for (int p = 0; p < NPAIR; ++p) {
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      const int chunk = 4 * (2 * (pair0 + p) + b) + t4;
      const bool ok = chunk < cpr;
      t.q[p][b][0] = ok ? quant::load_codes(codes + row_g * cpr + chunk) : make_uint4(0, 0, 0, 0);
      t.q[p][b][1] = ok ? quant::load_codes(codes + row_g8 * cpr + chunk) : make_uint4(0, 0, 0, 0);
    }
    const int grp = 4 * (pair0 + p) + t4;
    const bool ok = grp < gpr;
    t.scale[p][0] = ok ? quant::load_bf16(scales + row_g * gpr + grp) : 0.f;
    t.scale[p][1] = ok ? quant::load_bf16(scales + row_g8 * gpr + grp) : 0.f;
    t.bias[p][0] = ok ? quant::load_bf16(biases + row_g * gpr + grp) : 0.f;
    t.bias[p][1] = ok ? quant::load_bf16(biases + row_g8 * gpr + grp) : 0.f;
  }
}

// The lines load_tile would read for this lane, into L2 only (prefetch.global.L2): a block that
// may not hold the registers of its weights across the PDL wait starts their read before it.
template <int NPAIR>
__device__ __forceinline__ void prefetch_tile_l2(const uint4* codes, const uint16_t* scales, const uint16_t* biases,
                                                 int64_t row_g, int64_t row_g8, int cpr, int pair0) {
  const int t4 = threadIdx.x % 4, gpr = cpr / 2;
  auto prefetch = [](const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); };
#pragma unroll
  for (int p = 0; p < NPAIR; ++p) {
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      const int chunk = 4 * (2 * (pair0 + p) + b) + t4;
      if (chunk < cpr) prefetch(codes + row_g * cpr + chunk), prefetch(codes + row_g8 * cpr + chunk);
    }
    const int grp = 4 * (pair0 + p) + t4;
    if (grp < gpr) {
      prefetch(scales + row_g * gpr + grp), prefetch(scales + row_g8 * gpr + grp);
      prefetch(biases + row_g * gpr + grp), prefetch(biases + row_g8 * gpr + grp);
    }
  }
}

// y_g, y_g8 += this lane's groups' share of rows g and g + 8 over the loaded pairs (the caller
// sums the quad). frag, group_sum: stage_x_fragments' output; zero: 4 uint4 of zeros (shared).
template <int NPAIR>
__device__ __forceinline__ void dot_tile(const TileLoad<NPAIR>& t, const uint4* frag, const float* group_sum,
                                         const uint4* zero, int cpr, int pair0, float& y_g, float& y_g8) {
  const int lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4, gpr = cpr / 2;
  const bool feeds = (t4 >> 1) == ((g >> 1) & 1);  // chunk t is in column g's group
#pragma unroll
  for (int p = 0; p < NPAIR; ++p) {
    float d[2][4] = {};  // one accumulator per block: two independent mma chains of 8
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      const int chunk = 4 * (2 * (pair0 + p) + b) + t4;
      const uint4* src = feeds && (g >> 2) == b && chunk < cpr ? frag + (chunk * 2 + (g & 1)) * kFragU4PerChunk : zero;
      uint32_t bw[16];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint4 v = src[i];
        bw[4 * i] = v.x, bw[4 * i + 1] = v.y, bw[4 * i + 2] = v.z, bw[4 * i + 3] = v.w;
      }
      const uint32_t wg[4] = {t.q[p][b][0].x, t.q[p][b][0].y, t.q[p][b][0].z, t.q[p][b][0].w};
      const uint32_t wg8[4] = {t.q[p][b][1].x, t.q[p][b][1].y, t.q[p][b][1].z, t.q[p][b][1].w};
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        uint32_t ag[4], ag8[4];
        dequant_word(wg[w], ag);
        dequant_word(wg8[w], ag8);
        const uint32_t a0[4] = {ag[0], ag8[0], ag[1], ag8[1]};
        const uint32_t a1[4] = {ag[2], ag8[2], ag[3], ag8[3]};
        ptx::mma_bf16(d[b], a0, bw[4 * w], bw[4 * w + 1]);
        ptx::mma_bf16(d[b], a1, bw[4 * w + 2], bw[4 * w + 3]);
      }
    }
    const int grp = 4 * (pair0 + p) + t4;
    const float xs = grp < gpr ? group_sum[grp] : 0.f;
    const float dg = (d[0][0] + d[0][1]) + (d[1][0] + d[1][1]), dg8 = (d[0][2] + d[0][3]) + (d[1][2] + d[1][3]);
    y_g = fmaf(t.scale[p][0], dg, fmaf(t.bias[p][0], xs, y_g));
    y_g8 = fmaf(t.scale[p][1], dg8, fmaf(t.bias[p][1], xs, y_g8));
  }
}

// Sum over the quad (lanes 4 g .. 4 g + 3); every lane of the warp calls it.
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  v += __shfl_xor_sync(0xffffffffu, v, 2);
  return v;
}

}  // namespace lily::cuda::quant_mma
