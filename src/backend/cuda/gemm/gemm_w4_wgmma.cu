// gemm_w4_wgmma.cu: y = x @ W^T for 4-bit affine W on Hopper's warpgroup MMA (wgmma), many input
// rows: the prefill projections and the grouped MoE experts (issue 19). gemm_q4.cu's products, with
// the weight as wgmma's register operand instead of mma.sync's shared-memory tile.
//
//   y[t, n] (+)= sum_k x[t, k] * W[n, k],   W[n, k] = scale[n, k/64] * q[n, k] + bias[n, k/64]
// As wgmma computes it: y^T = W x^T, M = weight rows, N = tokens, K = columns.
// Shapes:   xp [T, K] bf16 in the K order of gemm_w4_wgmma_layout.h (x_to_bf16_permuted) ·
//           W [E, rows, K] 4-bit mlx codes, group 64, K a multiple of 64 · y [T, rows] fp32
//           (or [T, I] of silu(G x) * U x for the SwiGLU form).
// Numerics: gemm_q4's: w -> bf16 with one rounding (bf16x2 FMA of the exact code q with the bf16
//           scale and bias), x bf16, fp32 accumulation; only the order of the sums differs.
// Block:    384 threads = 3 warpgroups; warpgroup 0 produces, 1 and 2 consume. A block owns 128
//           weight rows (consumer c: rows 64c .. 64c + 63; SwiGLU: consumer 0 the 64 rows of G,
//           consumer 1 the same rows of U) and NT tokens (64 or 128), over K groups of 64 columns.
// Pipeline: kStages stages in shared memory, each one K group: the B tile (NT tokens x 128 bytes,
//           swizzled, 1024-aligned) and the codes of the block's 128 rows (32 bytes each). The
//           scales and biases of all the block's rows and groups are copied once, with stage 0
//           (16-byte cp.async where a row's are whole pieces, K a multiple of 512; else plain).
//           The producer's threads fill a stage with 16-byte cp.async (x rows gathered for the
//           experts; rows past the end zero-filled), and kLag stages later, once their copies have
//           landed, make them visible to the async proxy (fence.proxy.async) and arrive on the
//           stage's `full` barrier. A consumer waits for `full`, reads its two rows' 8-byte code
//           pieces and scales, dequantizes four k16 A fragments in registers (layout header), runs
//           four wgmma m64nNTk16 against the stage's B tile, waits for them and arrives on `empty`,
//           which the producer waits for before it refills the stage.
// Epilogue: from the accumulator fragments (row g / g + 8 of the warp's 16, token 8i + 2t + e)
//           straight to y; SwiGLU: consumer 1 hands u to consumer 0 through shared memory.
// Tested:   tests/cuda/test_gemm_w4_wgmma.cu against the host arithmetic (as test_gemm_q4.cu), the
//           layout in tests/cuda/test_gemm_w4_wgmma_layout.cpp on the CPU.
#include "backend/cuda/common/cuda_check.h"  // first: it sets up fmt for nvcc
#include "backend/cuda/common/arch.cuh"
#include "backend/cuda/common/device_info.h"
#include "backend/cuda/common/mma.cuh"
#include "backend/cuda/gemm/gemm_w4_wgmma.h"
#include "backend/cuda/gemm/gemm_w4_wgmma_layout.h"

namespace lily::cuda {
namespace {

using namespace w4_wgmma;
using namespace ptx;

constexpr int kThreads = 384;  // producer + two consumer warpgroups
constexpr int kRows = 128;     // weight rows a block
constexpr int kStages = 4;
constexpr int kLag = 2;            // stages a producer thread's copies may still be in flight
constexpr int kNormThreads = 256;  // rms_norm_bf16_permuted_kernel

enum class Epi { store, accumulate, swiglu };

// ---- PTX: wgmma, mbarrier arrive, cp.async with zero fill ----------------------------------

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving reads or writes of r across the wgmma that uses it.
__device__ __forceinline__ void fence_operand(float& r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void fence_operand(uint32_t& r) { asm volatile("" : "+r"(r)::"memory"); }

__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// 16 bytes global -> shared; with `valid` false the destination is zero-filled and src not read.
__device__ __forceinline__ void cp_async16_zfill(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}

// Shared-memory matrix descriptor of a K-major, 128-byte-swizzled tile (rows of 128 bytes, 8-row
// atoms 1024 bytes apart): start address, leading byte offset (unused with this swizzle: 1),
// stride byte offset 1024, swizzle mode 1 (128 bytes) in bits 62-63.
__device__ __forceinline__ uint64_t smem_desc_sw128(const void* tile) {
  const uint64_t addr = smem_addr(tile);
  return ((addr & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

__device__ __forceinline__ uint32_t fma_bf16x2(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

__device__ __forceinline__ float silu(float g) { return g / (1.f + __expf(-g)); }

__device__ __forceinline__ void wgmma_m64n16k16(float (&d)[8], const uint32_t (&a)[4], uint64_t desc_b) {
  asm volatile("{\n"
               ".reg .pred p;\n"
               "setp.ne.b32 p, %13, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {"
               "%0, %1, %2, %3, %4, %5, %6, %7"
               "}, {%8, %9, %10, %11}, %12, p, 1, 1, 0;\n"
               "}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}

__device__ __forceinline__ void wgmma_m64n32k16(float (&d)[16], const uint32_t (&a)[4], uint64_t desc_b) {
  asm volatile("{\n"
               ".reg .pred p;\n"
               "setp.ne.b32 p, %21, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
               "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
               "}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n"
               "}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                 "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}

__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b) {
  asm volatile("{\n"
               ".reg .pred p;\n"
               "setp.ne.b32 p, %37, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
               "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
               "}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n"
               "}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                 "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                 "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                 "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}

__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b) {
  asm volatile("{\n"
               ".reg .pred p;\n"
               "setp.ne.b32 p, %69, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
               "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
               "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
               "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
               "}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n"
               "}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                 "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                 "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                 "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                 "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                 "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                 "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                 "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}

// The first N accumulators of a wider product's (the m64nN layouts agree on them).
template <int N, int M>
__device__ __forceinline__ float (&first(float (&acc)[M]))[N] {
  static_assert(N <= M);
  return *reinterpret_cast<float(*)[N]>(acc);
}

// ---- The kernel ------------------------------------------------------------------------------

struct Params {
  const uint8_t* codes[2] = {nullptr, nullptr};    // W (or G), U: [E, rows, K / 2] bytes
  const uint16_t* scales[2] = {nullptr, nullptr};  // [E, rows, K / 64] bf16
  const uint16_t* biases[2] = {nullptr, nullptr};
  int rows = 0, K = 0;          // of one matrix
  const bf16* x = nullptr;      // [*, K] in the kernel's K order
  RowsOutput y;                 // output feature n of position t: its part's y[t * ld + n - first_row]
  int T = 0;                    // dense: tokens
  const int4* tiles = nullptr;  // grouped: gemm_q4's tile map
  const int32_t* num_tiles = nullptr;
  const int32_t* gather = nullptr;
  int gather_div = 1;
};

template <int NT>
struct Smem {
  static constexpr int kB = NT * kRowBytes;  // bytes of a stage's B tile
  static constexpr int kCodes = kRows * 32;  // bytes of a stage's codes (one K group of 128 rows)
  static constexpr int kCodesAt = kStages * kB;
  static constexpr int kScalesAt = kCodesAt + kStages * kCodes;
  static_assert(kB % 1024 == 0, "B tiles must stay 1024-aligned (the swizzle)");
  // scales and biases [kRows][groups] each, then the barriers; 1024 of slack to align the base
  static int bytes(int groups) { return kScalesAt + 2 * kRows * groups * 2 + 2 * kStages * 8 + 1024; }
};

template <int NT, Epi EPI>
__global__ void __launch_bounds__(kThreads, 1) gemm_w4_wgmma_kernel(const Params p) {
#if LILY_SM90A_CODE
  using S = Smem<NT>;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  const int G = p.K / kGroup;
  uint8_t* b_tiles = smem;                                          // [kStages][NT rows x 128 B]
  uint8_t* codes = smem + S::kCodesAt;                              // [kStages][kRows][32 B]
  uint16_t* sc = reinterpret_cast<uint16_t*>(smem + S::kScalesAt);  // [kRows][G]
  uint16_t* bi = sc + kRows * G;                                    // [kRows][G]
  uint64_t* full = reinterpret_cast<uint64_t*>(bi + kRows * G);     // [kStages]
  uint64_t* empty = full + kStages;                                 // [kStages]

  // The block's tokens (dense) or expert-sorted positions (grouped): [t0, t1).
  int expert = 0, t0, t1;
  if (p.tiles) {
    if (int(blockIdx.y) >= __ldcg(p.num_tiles)) return;  // whole block: before any barrier
    const int4 t = __ldcg(p.tiles + blockIdx.y);
    expert = t.x, t0 = t.y, t1 = t.z;
  } else {
    t0 = blockIdx.y * NT;
    t1 = min(p.T, t0 + NT);
  }
  constexpr int kOutRows = EPI == Epi::swiglu ? kRows / 2 : kRows;  // output features a block
  const int m0 = blockIdx.x * kOutRows;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(full + s, 128);   // every producer thread, once a stage
      mbarrier_init(empty + s, 256);  // every consumer thread
    }
  }
  __syncthreads();

  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    // ---- producer ----
    const int pt = threadIdx.x;
    // Block row lr (0..127) -> matrix (G or U in the SwiGLU form) and global row (the last row
    // for rows past the end: read, never written).
    auto global_row = [&](int lr, int& mi) {
      mi = EPI == Epi::swiglu ? lr / 64 : 0;
      const int r = EPI == Epi::swiglu ? m0 + lr % 64 : m0 + lr;
      return int64_t(expert) * p.rows + min(r, p.rows - 1);
    };
    // Codes: chunks j = pt, pt + 128 of a stage (row j / 2, half j % 2).
    const uint8_t* c_src[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int j = pt + 128 * i;
      int mi;
      const int64_t row = global_row(j / 2, mi);
      c_src[i] = (mi ? p.codes[1] : p.codes[0]) + row * (p.K / 2) + (j % 2) * 16;
    }
    // x: this thread's 16-byte chunk ci of tokens n = pt / 8 + 16 i.
    constexpr int kXChunks = NT / 16;
    const bf16* x_src[kXChunks];
    bool x_ok[kXChunks];
    uint32_t x_dst[kXChunks];
    const int ci = pt % 8;
#pragma unroll
    for (int i = 0; i < kXChunks; ++i) {
      const int n = pt / 8 + 16 * i, pos = t0 + n;
      x_ok[i] = pos < t1;
      const int64_t src = !x_ok[i] ? 0 : p.gather ? __ldcg(p.gather + pos) / p.gather_div : pos;
      x_src[i] = p.x + src * p.K + ci * 8;
      x_dst[i] = b_tile_offset(n, ci * 8);
    }
    for (int kt = 0; kt < G; ++kt) {
      const int st = kt % kStages;
      if (kt >= kStages) mbarrier_wait(empty + st, ((kt / kStages) - 1) & 1);
      if (kt == 0 && G % 8 == 0) {  // the scales and biases of every row and group, with stage 0
        const int per_row = G / 8;
        for (int j = pt; j < kRows * per_row; j += 128) {
          const int lr = j / per_row, part = j % per_row;
          int mi;
          const int64_t row = global_row(lr, mi);
          cp_async16(sc + lr * G + part * 8, (mi ? p.scales[1] : p.scales[0]) + row * G + part * 8);
          cp_async16(bi + lr * G + part * 8, (mi ? p.biases[1] : p.biases[0]) + row * G + part * 8);
        }
      } else if (kt == 0) {  // rows not of 16-byte pieces (K < 512 or not a multiple): plain copies
        for (int j = pt; j < kRows * G; j += 128) {
          const int lr = j / G, g = j % G;
          int mi;
          const int64_t row = global_row(lr, mi);
          sc[lr * G + g] = (mi ? p.scales[1] : p.scales[0])[row * G + g];
          bi[lr * G + g] = (mi ? p.biases[1] : p.biases[0])[row * G + g];
        }
      }
#pragma unroll
      for (int i = 0; i < 2; ++i) cp_async16(codes + st * S::kCodes + (pt + 128 * i) * 16, c_src[i] + kt * 32);
#pragma unroll
      for (int i = 0; i < kXChunks; ++i)
        cp_async16_zfill(b_tiles + st * S::kB + x_dst[i], x_src[i] + kt * kGroup, x_ok[i]);
      cp_async_commit();
      if (kt >= kLag) {  // stage kt - kLag has landed: hand it over
        cp_async_wait<kLag>();
        fence_proxy_async_shared();
        mbarrier_arrive(full + (kt - kLag) % kStages);
      }
    }
    cp_async_wait<0>();
    fence_proxy_async_shared();
    for (int kt = max(0, G - kLag); kt < G; ++kt) mbarrier_arrive(full + kt % kStages);
    return;
  }

  // ---- consumers ----
  const int c = wg - 1, ct = threadIdx.x - 128 * wg;  // consumer, thread in its warpgroup
  const int w = ct / 32, lane = ct % 32, g = lane / 4, t = lane % 4;
  const int lr[2] = {64 * c + 16 * w + g, 64 * c + 16 * w + g + 8};  // block rows: g, g + 8
  float acc[NT / 2];
#pragma unroll
  for (int i = 0; i < NT / 2; ++i) acc[i] = 0.f;
  const int n = t1 - t0;  // positions of the tile (at most NT)

  for (int kt = 0; kt < G; ++kt) {
    const int st = kt % kStages;
    mbarrier_wait(full + st, (kt / kStages) & 1);
    const uint8_t* cs = codes + st * S::kCodes;
    const uint2 q[2] = {*reinterpret_cast<const uint2*>(cs + lr[0] * 32 + t * 8),
                        *reinterpret_cast<const uint2*>(cs + lr[1] * 32 + t * 8)};
    uint32_t s2[2], b2[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) s2[r] = sc[lr[r] * G + kt] * 0x10001u, b2[r] = bi[lr[r] * G + kt] * 0x10001u;
    // A fragments of the four k16 steps: bf16(s * q + b), q from 0x4300 | q = bf16(128 + q).
    uint32_t a[kStepsPerGroup][4];
#pragma unroll
    for (int s = 0; s < kStepsPerGroup; ++s)
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint32_t qq = fma_bf16x2(code_pair(h ? q[r].y : q[r].x, s), 0x3F803F80u, 0xC300C300u);  // exact
          a[s][a_register(r, h)] = fma_bf16x2(qq, s2[r], b2[r]);
        }
    wgmma_fence();
    const uint8_t* bt = b_tiles + st * S::kB;
    // As wide as the tile's positions need (an expert's last tile is often a few): the first
    // 8, 16 or 32 accumulators of the 128-wide layout are the narrower products' own.
    if (n > 64) {
      if constexpr (NT == 128) {
#pragma unroll
        for (int s = 0; s < kStepsPerGroup; ++s) wgmma_m64n128k16(acc, a[s], smem_desc_sw128(bt + 32 * s));
      }
    } else if (n > 32) {
#pragma unroll
      for (int s = 0; s < kStepsPerGroup; ++s) wgmma_m64n64k16(first<32>(acc), a[s], smem_desc_sw128(bt + 32 * s));
    } else if (n > 16) {
#pragma unroll
      for (int s = 0; s < kStepsPerGroup; ++s) wgmma_m64n32k16(first<16>(acc), a[s], smem_desc_sw128(bt + 32 * s));
    } else {
#pragma unroll
      for (int s = 0; s < kStepsPerGroup; ++s) wgmma_m64n16k16(first<8>(acc), a[s], smem_desc_sw128(bt + 32 * s));
    }
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int s = 0; s < kStepsPerGroup; ++s)
#pragma unroll
      for (int i = 0; i < 4; ++i) fence_operand(a[s][i]);
#pragma unroll
    for (int i = 0; i < NT / 2; ++i) fence_operand(acc[i]);
    mbarrier_arrive(empty + st);
  }

  // ---- epilogue: acc[4i + j] = (row lr[j / 2], token 8i + 2t + j % 2) ----
  if constexpr (EPI == Epi::swiglu) {
    // Consumer 1 (U) hands its accumulators to consumer 0 (G) through the drained stages.
    float* handoff = reinterpret_cast<float*>(smem);  // [NT / 2][128]
    asm volatile("bar.sync 1, 256;\n" ::: "memory");
    if (c == 1) {
#pragma unroll
      for (int i = 0; i < NT / 2; ++i) handoff[i * 128 + ct] = acc[i];
    }
    asm volatile("bar.sync 1, 256;\n" ::: "memory");
    if (c == 1) return;
  }
  // The thread's two output features: where each one's column starts, and its part's row stride.
  float* col[2];
  int ld[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int feature = m0 + lr[r];
    int part = 0;
#pragma unroll
    for (int j = 1; j < RowsOutput::kMaxParts; ++j) part += j < p.y.count && feature >= p.y.parts[j].first_row;
    col[r] = p.y.parts[part].y + (feature - p.y.parts[part].first_row);
    ld[r] = p.y.parts[part].ld;
  }
#pragma unroll
  for (int i = 0; i < NT / 8; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int feature = m0 + lr[j / 2], pos = t0 + 8 * i + 2 * t + j % 2;
      if (pos >= t1 || feature >= p.rows) continue;
      float* dst = col[j / 2] + int64_t(pos) * ld[j / 2];
      const float v = acc[4 * i + j];
      if constexpr (EPI == Epi::swiglu) *dst = silu(v) * reinterpret_cast<const float*>(smem)[(4 * i + j) * 128 + ct];
      else if constexpr (EPI == Epi::accumulate) *dst += v;
      else *dst = v;
    }
#else
  __trap();
#endif
}

// xp[t, 64 g + c] = bf16(x[t, 64 g + k_of_column(c)]): one thread per 8 outputs (16 bytes).
__global__ void x_to_bf16_permuted_kernel(const float* __restrict__ x, uint4* __restrict__ xp, int64_t chunks, int K) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= chunks) return;
  const int64_t row = i / (K / 8);
  const int col0 = int(i % (K / 8)) * 8, group0 = col0 / kGroup * kGroup, c0 = col0 % kGroup;
  xp[i] = permuted_piece(x + row * K + group0, c0);
}

// x = RMSNorm(h; gain) (rms_norm's formula: x * (1 / sqrt(mean(x^2) + eps)) * gain) into x_out
// (fp32, when asked) and into xp as x_to_bf16_permuted writes it: one block a row, h read once.
__global__ void __launch_bounds__(kNormThreads)
    rms_norm_bf16_permuted_kernel(const float* __restrict__ h, const float* __restrict__ gain, float eps, int K,
                                  float* x_out, uint4* __restrict__ xp) {
  extern __shared__ float row[];  // [K]: h, then the normed row
  __shared__ float partial[kNormThreads / 32];
  const int tid = threadIdx.x;
  const float4* hr = reinterpret_cast<const float4*>(h + int64_t(blockIdx.x) * K);
  float ss = 0.f;
  for (int i = tid; i < K / 4; i += kNormThreads) {
    const float4 v = __ldg(hr + i);
    reinterpret_cast<float4*>(row)[i] = v;
    ss = fmaf(v.x, v.x, fmaf(v.y, v.y, fmaf(v.z, v.z, fmaf(v.w, v.w, ss))));
  }
#pragma unroll
  for (int o = 16; o > 0; o /= 2) ss += __shfl_xor_sync(0xFFFFFFFFu, ss, o);
  if (tid % 32 == 0) partial[tid / 32] = ss;
  __syncthreads();
  float total = 0.f;
#pragma unroll
  for (int w = 0; w < kNormThreads / 32; ++w) total += partial[w];
  const float inv = 1.f / sqrtf(total / float(K) + eps);
  for (int i = tid; i < K / 4; i += kNormThreads) {
    float4 v = reinterpret_cast<float4*>(row)[i];
    const float4 g = __ldg(reinterpret_cast<const float4*>(gain) + i);
    v = make_float4(v.x * inv * g.x, v.y * inv * g.y, v.z * inv * g.z, v.w * inv * g.w);
    reinterpret_cast<float4*>(row)[i] = v;
    if (x_out) reinterpret_cast<float4*>(x_out + int64_t(blockIdx.x) * K)[i] = v;
  }
  __syncthreads();
  for (int i = tid; i < K / 8; i += kNormThreads) {  // output chunk i: columns 8i .. 8i + 7
    xp[int64_t(blockIdx.x) * (K / 8) + i] = permuted_piece(row + i * 8 / kGroup * kGroup, i * 8 % kGroup);
  }
}

// ---- Host side -------------------------------------------------------------------------------

void check_matrix(const QMatrix& m, const char* what) {
  LILY_CHECK(gemm_w4_wgmma_supports(m), "{}: [{}, {}] q{} group {} (4 bits, group 64, cols a multiple of 64)", what,
             m.rows, m.cols, m.bits, m.group_size);
}

void check_pair(const QMatrix& G, const QMatrix& U, const char* what) {
  check_matrix(G, what);
  LILY_CHECK(
      G.batch == U.batch && G.rows == U.rows && G.cols == U.cols && G.bits == U.bits && G.group_size == U.group_size,
      "{}: G [{}, {}, {}] and U [{}, {}, {}] differ", what, G.batch, G.rows, G.cols, U.batch, U.rows, U.cols);
}

// The parts cover rows [0, rows) in order, each with a buffer and a stride of at least its rows.
void check_parts(const RowsOutput& y, int rows, const char* what) {
  LILY_CHECK(y.count >= 1 && y.count <= RowsOutput::kMaxParts && y.parts[0].first_row == 0,
             "{}: {} output parts (1..{}, the first at row 0)", what, y.count, RowsOutput::kMaxParts);
  for (int j = 0; j < y.count; ++j) {
    const int end = j + 1 < y.count ? y.parts[j + 1].first_row : rows;
    LILY_CHECK(y.parts[j].y && end > y.parts[j].first_row && y.parts[j].ld >= end - y.parts[j].first_row,
               "{}: output part {} (rows {} .. {}, ld {}) of {} rows", what, j, y.parts[j].first_row, end,
               y.parts[j].ld, rows);
  }
}

Params make_params(const QMatrix& A, const QMatrix* B, const bf16* xp, float* y) {
  LILY_CHECK(aligned16(xp), "gemm_w4_wgmma: xp must be 16-byte aligned");
  Params p;
  p.codes[0] = reinterpret_cast<const uint8_t*>(A.codes);
  p.scales[0] = reinterpret_cast<const uint16_t*>(A.scales);
  p.biases[0] = reinterpret_cast<const uint16_t*>(A.biases);
  const QMatrix& b = B ? *B : A;
  p.codes[1] = reinterpret_cast<const uint8_t*>(b.codes);
  p.scales[1] = reinterpret_cast<const uint16_t*>(b.scales);
  p.biases[1] = reinterpret_cast<const uint16_t*>(b.biases);
  p.rows = A.rows, p.K = A.cols;
  p.x = xp, p.y = RowsOutput::whole(y, A.rows);
  return p;
}

template <int NT, Epi EPI>
void launch(const Params& p, int grid_y, cudaStream_t stream) {
  constexpr int kOutRows = EPI == Epi::swiglu ? kRows / 2 : kRows;
  const int bytes = Smem<NT>::bytes(p.K / kGroup);
  auto kernel = gemm_w4_wgmma_kernel<NT, EPI>;
  allow_dynamic_shared(kernel, size_t(bytes), "gemm_w4_wgmma");
  kernel<<<dim3((p.rows + kOutRows - 1) / kOutRows, grid_y), kThreads, bytes, stream>>>(p);
  CUDA_CHECK_LAUNCH();
}

template <Epi EPI>
void dense(const QMatrix& W, const QMatrix* U, const bf16* xp, const RowsOutput& y, int T, cudaStream_t stream) {
  LILY_CHECK(T >= 0, "gemm_w4_wgmma: T = {}", T);
  if (T == 0) return;
  Params p = make_params(W, U, xp, nullptr);
  p.y = y;
  p.T = T;
  if (T > 64) launch<128, EPI>(p, (T + 127) / 128, stream);
  else launch<64, EPI>(p, 1, stream);
}

template <Epi EPI>
void grouped(const QMatrix& W, const QMatrix* U, const bf16* xp, const GroupedTiles& g, float* y, cudaStream_t stream) {
  LILY_CHECK(g.tiles && g.num_tiles && g.max_tiles >= 0, "gemm_w4_wgmma_grouped: no tile map");
  LILY_CHECK(g.tile_rows >= 1 && g.tile_rows <= 128, "gemm_w4_wgmma_grouped: tile rows {} (at most 128)", g.tile_rows);
  LILY_CHECK(g.gather_div >= 1, "gemm_w4_wgmma_grouped: gather_div {}", g.gather_div);
  if (g.max_tiles == 0) return;
  Params p = make_params(W, U, xp, y);
  p.tiles = reinterpret_cast<const int4*>(g.tiles);
  p.num_tiles = g.num_tiles;
  p.gather = g.gather, p.gather_div = g.gather_div;
  if (g.tile_rows > 64) launch<128, EPI>(p, g.max_tiles, stream);
  else launch<64, EPI>(p, g.max_tiles, stream);
}

}  // namespace

bool gemm_w4_wgmma_supports(const QMatrix& W) {
  return W.bits == 4 && W.group_size == 64 && W.rows > 0 && W.cols > 0 && W.cols % kGroup == 0;
}

void x_to_bf16_permuted(const float* x, bf16* xp, int T, int K, cudaStream_t stream) {
  LILY_CHECK(T >= 0 && K > 0 && K % kGroup == 0, "x_to_bf16_permuted: T {} K {}", T, K);
  LILY_CHECK(aligned16(xp), "x_to_bf16_permuted: xp must be 16-byte aligned");
  const int64_t chunks = int64_t(T) * K / 8;
  if (chunks == 0) return;
  x_to_bf16_permuted_kernel<<<unsigned((chunks + 255) / 256), 256, 0, stream>>>(x, reinterpret_cast<uint4*>(xp), chunks,
                                                                                K);
  CUDA_CHECK_LAUNCH();
}

void rms_norm_bf16_permuted(const float* h, const float* gain, float eps, int T, int K, float* x, bf16* xp,
                            cudaStream_t stream) {
  LILY_CHECK(T >= 0 && K > 0 && K % kGroup == 0 && K <= 12288, "rms_norm_bf16_permuted: T {} K {}", T, K);
  LILY_CHECK(aligned16(h) && aligned16(gain) && aligned16(xp) && (!x || aligned16(x)),
             "rms_norm_bf16_permuted: h, gain, x and xp must be 16-byte aligned");
  if (T == 0) return;
  const size_t bytes = size_t(K) * 4;
  if (bytes > 48 * 1024) allow_dynamic_shared(rms_norm_bf16_permuted_kernel, bytes, "rms_norm_bf16_permuted");
  rms_norm_bf16_permuted_kernel<<<unsigned(T), kNormThreads, bytes, stream>>>(h, gain, eps, K, x,
                                                                              reinterpret_cast<uint4*>(xp));
  CUDA_CHECK_LAUNCH();
}

void gemm_w4_wgmma(const QMatrix& W, const bf16* xp, float* y, int T, cudaStream_t stream) {
  check_matrix(W, "gemm_w4_wgmma");
  dense<Epi::store>(W.entry(0), nullptr, xp, RowsOutput::whole(y, W.rows), T, stream);
}

void gemm_w4_wgmma(const QMatrix& W, const bf16* xp, const RowsOutput& y, int T, cudaStream_t stream) {
  check_matrix(W, "gemm_w4_wgmma");
  check_parts(y, W.rows, "gemm_w4_wgmma");
  dense<Epi::store>(W.entry(0), nullptr, xp, y, T, stream);
}

void gemm_w4_wgmma_accumulate(const QMatrix& W, const bf16* xp, float* y, int T, cudaStream_t stream) {
  check_matrix(W, "gemm_w4_wgmma_accumulate");
  dense<Epi::accumulate>(W.entry(0), nullptr, xp, RowsOutput::whole(y, W.rows), T, stream);
}

void gemm_w4_wgmma_swiglu(const QMatrix& G, const QMatrix& U, const bf16* xp, float* y, int T, cudaStream_t stream) {
  check_pair(G, U, "gemm_w4_wgmma_swiglu");
  const QMatrix u = U.entry(0);
  dense<Epi::swiglu>(G.entry(0), &u, xp, RowsOutput::whole(y, G.rows), T, stream);
}

void gemm_w4_wgmma_grouped_swiglu(const QMatrix& G, const QMatrix& U, const bf16* xp, const GroupedTiles& tiles,
                                  float* y, cudaStream_t stream) {
  check_pair(G, U, "gemm_w4_wgmma_grouped_swiglu");
  grouped<Epi::swiglu>(G, &U, xp, tiles, y, stream);
}

void gemm_w4_wgmma_grouped(const QMatrix& W, const bf16* xp, const GroupedTiles& tiles, float* y, cudaStream_t stream) {
  check_matrix(W, "gemm_w4_wgmma_grouped");
  grouped<Epi::store>(W, nullptr, xp, tiles, y, stream);
}

}  // namespace lily::cuda
