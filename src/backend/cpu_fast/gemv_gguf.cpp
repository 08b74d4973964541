// gemv_gguf.cpp: dot products of GGUF block-format rows with an fp32 x (gemv_gguf.h has the
// formula). One function per block type, each a plain loop over the blocks of the row in the
// block's own layout (model/gguf_dequant.cpp decodes the same layouts value by value). Vectors
// of 16 floats (F16x16) hold one sub-block's codes widened to float; sub-block sums stay in
// vectors and are reduced once per row.
// The 64-byte vectors only pass between always-inline helpers, so the ABI note g++ gives for
// them (-Wpsabi: AVX-512 vector arguments without AVX-512) concerns no real call.
#pragma GCC diagnostic ignored "-Wpsabi"  // g++ and clang both
#include "backend/cpu_fast/gemv_gguf.h"

#include <cstring>

#include "base/bf16.h"
#include "base/cpu_clones.h"
#include "base/error.h"
#include "model/gguf_dequant.h"

namespace lily::cpu_fast {

namespace {

typedef float F32x16 __attribute__((vector_size(64)));
typedef uint8_t U8x16 __attribute__((vector_size(16)));
typedef uint16_t U16x16 __attribute__((vector_size(32)));
typedef uint32_t U32x16 __attribute__((vector_size(64)));
typedef int32_t I32x16 __attribute__((vector_size(64)));

#define LILY_INLINE inline __attribute__((always_inline))

LILY_INLINE F32x16 load16(const float* p) {
  F32x16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
LILY_INLINE U8x16 load_u8(const uint8_t* p) {
  U8x16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
// Through int32: g++ 12 converts bytes straight to float one element at a time, and signed
// bytes to int32 slowly too (the kernels shift signed codes by 128 and widen them unsigned).
LILY_INLINE F32x16 widen(U8x16 q) { return __builtin_convertvector(__builtin_convertvector(q, I32x16), F32x16); }
// table[idx[i]] for each lane (idx < 16): pshufb where the target has it. clang has no
// __builtin_shuffle with a variable mask (the fuzz build compiles this file with clang).
LILY_INLINE U8x16 lookup16(U8x16 table, U8x16 idx) {
#if defined(__clang__)
  U8x16 out;
  for (int i = 0; i < 16; ++i) out[i] = table[idx[i] & 15];
  return out;
#else
  return __builtin_shuffle(table, idx);
#endif
}
LILY_INLINE float sum16(F32x16 v) {
  float s = 0;
  for (int i = 0; i < 16; ++i) s += v[i];
  return s;
}
LILY_INLINE float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return half_to_float(h);
}

LILY_CPU_CLONES float dot_f32(const uint8_t* row, const float* x, int64_t n) {
  F32x16 acc = {};
  for (int64_t c = 0; c < n; c += 16) acc += load16(reinterpret_cast<const float*>(row) + c) * load16(x + c);
  return sum16(acc);
}

// n a multiple of 16 here (gguf_dot takes the tail).
LILY_CPU_CLONES float dot_bf16(const uint8_t* row, const float* x, int64_t n) {
  F32x16 acc = {};
  for (int64_t c = 0; c < n; c += 16) {
    U16x16 h;
    std::memcpy(&h, row + 2 * c, sizeof h);
    U32x16 bits = __builtin_convertvector(h, U32x16) << 16;
    F32x16 w;
    std::memcpy(&w, &bits, sizeof w);
    acc += w * load16(x + c);
  }
  return sum16(acc);
}

LILY_CPU_CLONES float dot_f16(const uint8_t* row, const float* x, int64_t n) {
  F32x16 acc = {};
  for (int64_t c = 0; c < n; c += 16) {
    F32x16 w;
    for (int i = 0; i < 16; ++i) w[i] = f16_at(row + 2 * (c + i));
    acc += w * load16(x + c);
  }
  return sum16(acc);
}

// block_q4_0 { f16 d; u8 qs[16]; }: x[j] = d (lo4 - 8), x[j + 16] = d (hi4 - 8).
LILY_CPU_CLONES float dot_q4_0(const uint8_t* row, const float* x, int64_t blocks) {
  F32x16 acc = {};
  for (int64_t b = 0; b < blocks; ++b, row += 18, x += 32) {
    const U8x16 q = load_u8(row + 2);
    const F32x16 lo = widen(U8x16(q & 0xF)) - 8.0f, hi = widen(U8x16(q >> 4)) - 8.0f;
    acc += f16_at(row) * (lo * load16(x) + hi * load16(x + 16));
  }
  return sum16(acc);
}

// block_q8_0 { f16 d; i8 qs[32]; }
LILY_CPU_CLONES float dot_q8_0(const uint8_t* row, const float* x, int64_t blocks) {
  F32x16 acc = {};
  for (int64_t b = 0; b < blocks; ++b, row += 34, x += 32) {
    // q = (q ^ 0x80) - 128 through the unsigned widening (the signed one is slow in g++ 12).
    const F32x16 q0 = widen(U8x16(load_u8(row + 2) ^ 0x80)) - 128.0f;
    const F32x16 q1 = widen(U8x16(load_u8(row + 18) ^ 0x80)) - 128.0f;
    acc += f16_at(row) * (q0 * load16(x) + q1 * load16(x + 16));
  }
  return sum16(acc);
}

// block_q4_K { f16 d; f16 dmin; u8 scales[12]; u8 qs[128]; } and block_q5_K (qh[32] before qs):
// per 64 values, sub-blocks 2i (low nibbles) and 2i + 1 (high); Q5_K adds bit 2i / 2i + 1 of
// qh[l] as the fifth bit. x = d sc q - dmin m.
template <bool kFiveBits>
LILY_INLINE float dot_k(const uint8_t* row, const float* x, int64_t blocks) {
  constexpr int kBlockBytes = kFiveBits ? 176 : 144;
  F32x16 acc = {}, mins = {};
  for (int64_t b = 0; b < blocks; ++b, row += kBlockBytes, x += 256) {
    const float d = f16_at(row), dmin = f16_at(row + 2);
    const uint8_t* scales = row + 4;
    const uint8_t* qh = row + 16;
    const uint8_t* qs = row + (kFiveBits ? 48 : 16);
    for (int i = 0; i < 4; ++i) {
      uint8_t sc0, m0, sc1, m1;
      gguf_scale_min_k4(2 * i, scales, &sc0, &m0);
      gguf_scale_min_k4(2 * i + 1, scales, &sc1, &m1);
      const float* xs = x + 64 * i;
      F32x16 s0 = {}, s1 = {}, xsum0 = {}, xsum1 = {};
      for (int h = 0; h < 2; ++h) {  // l = 16h .. 16h + 15
        const U8x16 q = load_u8(qs + 32 * i + 16 * h);
        U8x16 lo = q & 0xF, hi = q >> 4;
        if constexpr (kFiveBits) {
          const U8x16 high = load_u8(qh + 16 * h);
          lo |= U8x16((high >> (2 * i)) & 1) << 4;
          hi |= U8x16((high >> (2 * i + 1)) & 1) << 4;
        }
        const F32x16 x0 = load16(xs + 16 * h), x1 = load16(xs + 32 + 16 * h);
        s0 += widen(lo) * x0, s1 += widen(hi) * x1;
        xsum0 += x0, xsum1 += x1;
      }
      acc += (d * float(sc0)) * s0 + (d * float(sc1)) * s1;
      mins += (dmin * float(m0)) * xsum0 + (dmin * float(m1)) * xsum1;
    }
  }
  return sum16(acc - mins);
}

LILY_CPU_CLONES float dot_q4_k(const uint8_t* row, const float* x, int64_t blocks) {
  return dot_k<false>(row, x, blocks);
}
LILY_CPU_CLONES float dot_q5_k(const uint8_t* row, const float* x, int64_t blocks) {
  return dot_k<true>(row, x, blocks);
}

// block_q6_K { u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d; }: per half of 128 values, value
// 32k + l (k = 0..3) is the low (k < 2) or high nibble of ql[l + 32 (k % 2)] with bits 2k, 2k + 1
// of qh[l] above it, minus 32; its scale scales[8 half + 2k + l / 16] = scales[value / 16].
LILY_CPU_CLONES float dot_q6_k(const uint8_t* row, const float* x, int64_t blocks) {
  F32x16 acc = {};
  for (int64_t b = 0; b < blocks; ++b, row += 210) {
    const float d = f16_at(row + 208);
    const int8_t* sc = reinterpret_cast<const int8_t*>(row + 192);
    for (int half = 0; half < 2; ++half, x += 128) {
      const uint8_t* ql = row + 64 * half;
      const uint8_t* qh = row + 128 + 32 * half;
      for (int k = 0; k < 4; ++k)
        for (int h = 0; h < 2; ++h) {  // l = 16h .. 16h + 15
          const U8x16 low = load_u8(ql + 32 * (k % 2) + 16 * h);
          const U8x16 nib = k < 2 ? U8x16(low & 0xF) : U8x16(low >> 4);
          const U8x16 q = nib | U8x16((load_u8(qh + 16 * h) >> (2 * k)) & 3) << 4;
          acc += (d * float(sc[8 * half + 2 * k + h])) * ((widen(q) - 32.0f) * load16(x + 32 * k + 16 * h));
        }
    }
  }
  return sum16(acc);
}

// block_iq4_xs { f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]; }: sub-block s of 32 values,
// scale d (ls - 32), values kIq4nlValues[nibble]: low nibbles of qs[16s ..] first, then high.
LILY_CPU_CLONES float dot_iq4_xs(const uint8_t* row, const float* x, int64_t blocks) {
  U8x16 grid;  // the grid + 128, so the unsigned widening takes it (the signed one is slow)
  for (int i = 0; i < 16; ++i) grid[i] = uint8_t(kIq4nlValues[i] + 128);
  F32x16 acc = {};
  for (int64_t b = 0; b < blocks; ++b, row += 136) {
    const float d = f16_at(row);
    uint16_t scales_h;
    std::memcpy(&scales_h, row + 2, 2);
    for (int s = 0; s < 8; ++s, x += 32) {
      const int ls = ((row[4 + s / 2] >> (4 * (s % 2))) & 0xF) | ((scales_h >> (2 * s)) & 3) << 4;
      const U8x16 q = load_u8(row + 8 + 16 * s);
      const F32x16 lo = widen(lookup16(grid, U8x16(q & 0xF))) - 128.0f;
      const F32x16 hi = widen(lookup16(grid, U8x16(q >> 4))) - 128.0f;
      acc += (d * float(ls - 32)) * (lo * load16(x) + hi * load16(x + 16));
    }
  }
  return sum16(acc);
}

}  // namespace

bool gguf_gemv_supported(GgmlType type) {
  switch (type) {
    case GgmlType::F32:
    case GgmlType::F16:
    case GgmlType::BF16:
    case GgmlType::Q4_0:
    case GgmlType::Q8_0:
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
    case GgmlType::Q6_K:
    case GgmlType::IQ4_XS: return true;
    default: return false;
  }
}

bool gguf_gemv_supported(const Matrix& W) { return W.format == MatrixFormat::gguf && gguf_gemv_supported(W.gguf_type); }

float gguf_dot(GgmlType type, const void* row, const float* x, int64_t n) {
  const auto* p = static_cast<const uint8_t*>(row);
  const GgmlTypeInfo& info = ggml_type_info(type);
  LILY_CHECK(n % info.block_size == 0, "gguf_dot: a {} row holds whole blocks of {} values, not {}", info.name,
             info.block_size, n);
  const int64_t blocks = n / info.block_size;
  switch (type) {
    case GgmlType::Q4_0: return dot_q4_0(p, x, blocks);
    case GgmlType::Q8_0: return dot_q8_0(p, x, blocks);
    case GgmlType::Q4_K: return dot_q4_k(p, x, blocks);
    case GgmlType::Q5_K: return dot_q5_k(p, x, blocks);
    case GgmlType::Q6_K: return dot_q6_k(p, x, blocks);
    case GgmlType::IQ4_XS: return dot_iq4_xs(p, x, blocks);
    case GgmlType::F32:
    case GgmlType::F16:
    case GgmlType::BF16: {
      // Plain rows may have any length: the vector loop takes whole 16s, the tail is scalar.
      const int64_t body = n / 16 * 16;
      float s = type == GgmlType::F32    ? dot_f32(p, x, body)
                : type == GgmlType::BF16 ? dot_bf16(p, x, body)
                                         : dot_f16(p, x, body);
      if (body < n) {
        float tail[16];
        dequantize_gguf_row(type, p + body * info.block_bytes, n - body, tail);
        for (int64_t c = body; c < n; ++c) s += tail[c - body] * x[c];
      }
      return s;
    }
    default: fail("gguf_dot: the kernels do not take {} rows", info.name);
  }
}

void gguf_gemv_rows(const Matrix& W, const float* x, int64_t r0, int64_t r1, float* y) {
  LILY_CHECK(gguf_gemv_supported(W), "gguf_gemv_rows: the kernels do not take {}", W.describe());
  const int64_t row_bytes = ggml_row_bytes(W.gguf_type, W.cols);
  const auto* data = static_cast<const uint8_t*>(W.data);
  for (int64_t r = r0; r < r1; ++r) y[r] = gguf_dot(W.gguf_type, data + r * row_bytes, x, W.cols);
}

bool plain_gemv_supported(const Matrix& W) {
  return W.format == MatrixFormat::f32 || W.format == MatrixFormat::bf16 || W.format == MatrixFormat::f16;
}

void plain_gemv_rows(const Matrix& W, const float* x, int64_t r0, int64_t r1, float* y) {
  LILY_CHECK(plain_gemv_supported(W), "plain_gemv_rows: {} is not a plain matrix", W.describe());
  const GgmlType type = W.format == MatrixFormat::f32    ? GgmlType::F32
                        : W.format == MatrixFormat::bf16 ? GgmlType::BF16
                                                         : GgmlType::F16;
  const int64_t row_bytes = ggml_row_bytes(type, W.cols);
  const auto* data = static_cast<const uint8_t*>(W.data);
  for (int64_t r = r0; r < r1; ++r) y[r] = gguf_dot(type, data + r * row_bytes, x, W.cols);
}

}  // namespace lily::cpu_fast
