// gemv_gguf_avx512.cpp: integer dot products of GGUF block rows with x quantized to 16 bits,
// AVX-512 F + BW + VL + VNNI (gemv_gguf.h has the formula and the error bound).
//
// x comes as quantized_input.h prepares it for the mlx kernels: x16[c] = round(x[c] / unit[g])
// in column order, unit[g] = max |x| / 32258 over each group g of 64 columns. Each block type
// is read as the file stores it (model/gguf_dequant.cpp decodes the same layouts value by
// value); the codes, times the sub-block's integer scale where the format has one, are widened
// to int16 and multiplied with x16 by vpdpwssd (two products into each int32 lane); the int32
// sums of one group of 64 columns are converted once and scaled by d * unit[g] in one FMA.
//   Q4_K  a group is 32 code bytes: low nibbles sub-block 2i (columns 0-31 of the group), high
//         nibbles 2i + 1 (32-63); the codes times the 6-bit scale (<= 15 * 63); the mins as
//         dmin * m * unit * sum x16, the sums of x16 over each sub-block once a call.
//   Q5_K  Q4_K's groups with the fifth bit of each code from qh (codes 0-31, times the scale
//         <= 31 * 63).
//   Q6_K  a group is k = 2j, 2j + 1 of one half of 128 (32 columns each): ql nibbles, qh bits,
//         minus 32, times the int8 scale of each 16 (|.| <= 32 * 128).
//   Q8_0  one block a half group: int8 codes widened; d * unit per block.
//   Q4_0  one block a half group: low nibbles columns 0-15, high 16-31, minus 8.
// int32 range: a lane sums 4 products per group of at most 4096 * 32258 (Q6_K): 5.3e8 < 2^31.
// Tested (tests/cpu_fast/test_gemv_gguf.cpp, IntegerKernels*): each type against the reference
// decoding times x within gemv_gguf.h's bound, quantized rows at 1-257 rows and 1-257 blocks,
// random bytes block by block (Q5_K also against a decoder written in the test from the
// format's definition), slices of the rows, outputs poisoned with NaN.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <cstring>
#include <vector>

#include "backend/cpu_fast/gemv.h"
#include "backend/cpu_fast/gemv_gguf.h"
#include "model/gguf_dequant.h"

#define LILY_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")))

namespace lily::cpu_fast::detail {

namespace {

LILY_AVX512 inline float f16_at(const uint8_t* p) {  // vcvtph2ps (every AVX-512 processor has F16C)
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// The 8 sub-blocks' 6-bit scales and mins of a Q4_K / Q5_K block (its 12 bytes at q), a byte
// each, sub-block j in byte j: gguf_scale_min_k4 for all of them at once, on 32-bit words.
//   j < 4:  scale = q[j] & 63,                              min = q[j + 4] & 63
//   j >= 4: scale = (q[j + 4] & 15) | (q[j - 4] >> 6) << 4,  min = q[j + 4] >> 4 | (q[j] >> 6) << 4
inline void k_scales_mins(const uint8_t* q, uint64_t* scales, uint64_t* mins) {
  uint32_t a, b, c;  // q[0..3], q[4..7], q[8..11]
  std::memcpy(&a, q, 4);
  std::memcpy(&b, q + 4, 4);
  std::memcpy(&c, q + 8, 4);
  const uint32_t scale_hi = (c & 0x0F0F0F0Fu) | ((a >> 2) & 0x30303030u);
  const uint32_t min_hi = ((c >> 4) & 0x0F0F0F0Fu) | ((b >> 2) & 0x30303030u);
  *scales = uint64_t(a & 0x3F3F3F3Fu) | uint64_t(scale_hi) << 32;
  *mins = uint64_t(b & 0x3F3F3F3Fu) | uint64_t(min_hi) << 32;
}

LILY_AVX512 inline __m512i load_x16(const int16_t* p) { return _mm512_loadu_si512(p); }
LILY_AVX512 inline __m512i widen32(const uint8_t* p) {  // 32 bytes -> 32 uint16
  return _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
LILY_AVX512 inline float reduce(__m512 v) { return _mm512_reduce_add_ps(v); }

// xsum[s] = unit * sum of x16 over sub-block s of 32 columns: the same for every row.
LILY_AVX512 void sub_block_sums(const QuantizedInput& in, float* xsum) {
  for (int64_t s = 0; s < in.cols / 32; ++s) {
    const __m512i ones = _mm512_set1_epi16(1);
    xsum[s] = in.unit[size_t(s / 2)] *
              float(_mm512_reduce_add_epi32(_mm512_madd_epi16(ones, load_x16(in.x16.data() + 32 * s))));
  }
}

// Q4_K (144-byte blocks) and Q5_K (176: qh[32] before qs): group i of a block is qs[32i ..
// 32i + 31], low nibbles sub-block 2i, high nibbles 2i + 1; Q5_K's fifth bits are bits 2i and
// 2i + 1 of qh[l], read from qh widened once a block and shifted left by 4 (bit 0 -> bit 4).
template <bool kFiveBits>
LILY_AVX512 inline float dot_k(const uint8_t* row, const QuantizedInput& in, const float* xsum, int64_t blocks) {
  constexpr int kBlockBytes = kFiveBits ? 176 : 144;
  const __m512i nibble = _mm512_set1_epi16(0xF), bit4 = _mm512_set1_epi16(0x10);
  __m512 acc = _mm512_setzero_ps();
  __m256 min_acc = _mm256_setzero_ps();  // dmin * m[s] * xsum[s], lane s of each block
  for (int64_t b = 0; b < blocks; ++b, row += kBlockBytes) {
    const float d = f16_at(row), dmin = f16_at(row + 2);
    uint64_t scales, mins;
    k_scales_mins(row + 4, &scales, &mins);
    const __m256 m = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(int64_t(mins))));
    min_acc = _mm256_fmadd_ps(_mm256_mul_ps(m, _mm256_set1_ps(dmin)), _mm256_loadu_ps(xsum + 8 * b), min_acc);
    const uint8_t* qs = row + (kFiveBits ? 48 : 16);
    [[maybe_unused]] __m512i high = _mm512_setzero_si512();
    if constexpr (kFiveBits) high = _mm512_slli_epi16(widen32(row + 16), 4);
    for (int i = 0; i < 4; ++i) {
      const int64_t g = 4 * b + i;
      const __m512i q = widen32(qs + 32 * i);
      __m512i q0 = _mm512_and_si512(q, nibble), q1 = _mm512_srli_epi16(q, 4);
      if constexpr (kFiveBits) {
        q0 = _mm512_or_si512(q0, _mm512_and_si512(_mm512_srli_epi16(high, unsigned(2 * i)), bit4));
        q1 = _mm512_or_si512(q1, _mm512_and_si512(_mm512_srli_epi16(high, unsigned(2 * i + 1)), bit4));
      }
      const __m512i lo = _mm512_mullo_epi16(q0, _mm512_set1_epi16(short((scales >> (16 * i)) & 0xFF)));
      const __m512i hi = _mm512_mullo_epi16(q1, _mm512_set1_epi16(short((scales >> (16 * i + 8)) & 0xFF)));
      const __m512i x0 = load_x16(in.x16.data() + 64 * g), x1 = load_x16(in.x16.data() + 64 * g + 32);
      const __m512i dot = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(_mm512_setzero_si512(), lo, x0), hi, x1);
      acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_set1_ps(d * in.unit[size_t(g)]), acc);
    }
  }
  return reduce(acc) - reduce(_mm512_zextps256_ps512(min_acc));
}

LILY_AVX512 float dot_q6_k(const uint8_t* row, const QuantizedInput& in, int64_t blocks) {
  const __m512i nibble = _mm512_set1_epi16(0xF), two = _mm512_set1_epi16(3), bias = _mm512_set1_epi16(32);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b, row += 210) {
    const float d = f16_at(row + 208);
    const int8_t* sc = reinterpret_cast<const int8_t*>(row + 192);
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = row + 64 * half;
      const __m512i qh = widen32(row + 128 + 32 * half);
      const __m512i low[2] = {widen32(ql), widen32(ql + 32)};
      for (int j = 0; j < 2; ++j) {  // the group of k = 2j, 2j + 1
        const int64_t g = 4 * b + 2 * half + j;
        __m512i dot = _mm512_setzero_si512();
        for (int kk = 0; kk < 2; ++kk) {
          const int k = 2 * j + kk;
          const __m512i nib = k < 2 ? _mm512_and_si512(low[k % 2], nibble) : _mm512_srli_epi16(low[k % 2], 4);
          const __m512i high = _mm512_and_si512(_mm512_srli_epi16(qh, 2 * k), two);
          const __m512i q = _mm512_sub_epi16(_mm512_or_si512(nib, _mm512_slli_epi16(high, 4)), bias);
          const __m512i s = _mm512_mask_blend_epi16(0xFFFF0000u, _mm512_set1_epi16(sc[8 * half + 2 * k]),
                                                    _mm512_set1_epi16(sc[8 * half + 2 * k + 1]));
          dot = _mm512_dpwssd_epi32(dot, _mm512_mullo_epi16(q, s), load_x16(in.x16.data() + 64 * g + 32 * kk));
        }
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_set1_ps(d * in.unit[size_t(g)]), acc);
      }
    }
  }
  return reduce(acc);
}

LILY_AVX512 float dot_q8_0(const uint8_t* row, const QuantizedInput& in, int64_t blocks) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b, row += 34) {
    const __m512i q = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2)));
    const __m512i dot = _mm512_madd_epi16(q, load_x16(in.x16.data() + 32 * b));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_set1_ps(f16_at(row) * in.unit[size_t(b / 2)]), acc);
  }
  return reduce(acc);
}

LILY_AVX512 float dot_q4_0(const uint8_t* row, const QuantizedInput& in, int64_t blocks) {
  const __m256i nibble = _mm256_set1_epi16(0xF);
  const __m512i eight = _mm512_set1_epi16(8);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b, row += 18) {
    const __m256i q = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2)));
    const __m512i codes = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(q, nibble)),
                                             _mm256_srli_epi16(q, 4), 1);
    const __m512i dot = _mm512_madd_epi16(_mm512_sub_epi16(codes, eight), load_x16(in.x16.data() + 32 * b));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_set1_ps(f16_at(row) * in.unit[size_t(b / 2)]), acc);
  }
  return reduce(acc);
}

}  // namespace

LILY_AVX512 void gguf_rows_avx512_integer(const Matrix& W, const QuantizedInput& x, int64_t r0, int64_t r1, float* y) {
  const int64_t row_bytes = ggml_row_bytes(W.gguf_type, W.cols);
  const int64_t blocks = W.cols / ggml_type_info(W.gguf_type).block_size;
  const auto* data = static_cast<const uint8_t*>(W.data);
  thread_local std::vector<float> xsum;
  if (W.gguf_type == GgmlType::Q4_K || W.gguf_type == GgmlType::Q5_K) {
    xsum.resize(size_t(W.cols / 32));
    sub_block_sums(x, xsum.data());
  }
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = data + r * row_bytes;
    switch (W.gguf_type) {
      case GgmlType::Q4_K: y[r] = dot_k<false>(row, x, xsum.data(), blocks); break;
      case GgmlType::Q5_K: y[r] = dot_k<true>(row, x, xsum.data(), blocks); break;
      case GgmlType::Q6_K: y[r] = dot_q6_k(row, x, blocks); break;
      case GgmlType::Q8_0: y[r] = dot_q8_0(row, x, blocks); break;
      case GgmlType::Q4_0: y[r] = dot_q4_0(row, x, blocks); break;
      default: y[r] = 0;  // gguf_integer_supported() refuses every other type
    }
  }
}

}  // namespace lily::cpu_fast::detail

namespace lily::cpu_fast {

bool gguf_integer_supported(const Matrix& W) {
  if (W.format != MatrixFormat::gguf || W.cols % kInputGroup != 0 || active_isa() != Isa::avx512) return false;
  switch (W.gguf_type) {
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
    case GgmlType::Q6_K:
    case GgmlType::Q8_0:
    case GgmlType::Q4_0: return true;
    default: return false;
  }
}

void gguf_gemv_rows(const Matrix& W, const QuantizedInput& x, int64_t r0, int64_t r1, float* y) {
  if (x.quantized && x.group_size == kInputGroup && x.cols == W.cols && gguf_integer_supported(W))
    return detail::gguf_rows_avx512_integer(W, x, r0, r1, y);
  gguf_gemv_rows(W, x.x, r0, r1, y);
}

}  // namespace lily::cpu_fast
