// gemv_avx512.cpp: the GEMV kernels on AVX-512 F + BW + VL + VNNI (512-bit). See gemv.h for
// the formula.
//
// integer (groups of 64): one 64-byte load holds two groups of 4-bit codes (128 columns); their
// low and high nibbles line up with the int8 halves a, b of x16 = 254 a + b in nibble order
// (quantized_input.h), and vpdpbusd multiplies the unsigned codes by each signed half, summing
// 4 products into each int32 lane (lanes 0-7 the first group, 8-15 the second); a's sums are
// multiplied by 254. The lanes are converted and scaled by scale * unit of their group in one
// FMA: scale * unit and the bias term are computed for 16 groups at a time and spread to the
// lanes by vpermps. 8-bit codes: one group per load, widened to int16 and multiplied with x16
// by vpdpwssd.
// fp32: two uint32 words (16 4-bit columns) spread by vpermd to lanes 0-7 and 8-15, shifted by
// 4 * (lane % 8), masked and converted; 8-bit codes widened by vpmovzxbd; one FMA per 16.
// g++ 12 reports the deliberately undefined registers inside its own AVX-512 intrinsics
// (_mm512_undefined_*) as maybe-uninitialized or uninitialized (GCC PR 105593, fixed in g++ 13);
// the pragmas must be in force where the header is read.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "backend/cpu_fast/gemv.h"

#define LILY_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))

namespace lily::cpu_fast::detail {

namespace {

// Columns 16i .. 16i+15 of a 4-bit row from words 2i, 2i+1 at p.
LILY_AVX512 inline __m512 widen_codes4(const uint8_t* p) {
  const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  const __m512i shifts = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28);
  int64_t words;
  std::memcpy(&words, p, 8);
  const __m512i v = _mm512_permutexvar_epi32(spread, _mm512_zextsi128_si512(_mm_cvtsi64_si128(words)));
  return _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srlv_epi32(v, shifts), _mm512_set1_epi32(0xF)));
}

// Sixteen 8-bit codes from p.
LILY_AVX512 inline __m512 widen_codes8(const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

template <int kBits>
LILY_AVX512 void rows_fp32(const Matrix& W, const QuantizedInput& in, int64_t r0, int64_t r1, float* y) {
  const int64_t cols = W.cols, G = W.group_size, groups = cols / G;
  const int64_t row_bytes = cols * kBits / 8;
  const float* x = in.x;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* codes = static_cast<const uint8_t*>(W.data) + r * row_bytes;
    const bf16* scales = W.scales + r * groups;
    const bf16* biases = W.biases + r * groups;
    __m512 acc = _mm512_setzero_ps();
    float bias_term = 0;
    for (int64_t g = 0; g < groups; ++g) {
      const uint8_t* cg = codes + g * G * kBits / 8;
      const float* xg = x + g * G;
      __m512 p0 = _mm512_setzero_ps(), p1 = _mm512_setzero_ps();
      int64_t c = 0;
      for (; c + 32 <= G; c += 32) {
        if constexpr (kBits == 4) {
          p0 = _mm512_fmadd_ps(widen_codes4(cg + c / 2), _mm512_loadu_ps(xg + c), p0);
          p1 = _mm512_fmadd_ps(widen_codes4(cg + c / 2 + 8), _mm512_loadu_ps(xg + c + 16), p1);
        } else {
          p0 = _mm512_fmadd_ps(widen_codes8(cg + c), _mm512_loadu_ps(xg + c), p0);
          p1 = _mm512_fmadd_ps(widen_codes8(cg + c + 16), _mm512_loadu_ps(xg + c + 16), p1);
        }
      }
      if (c < G) {  // a group of 16 * odd columns
        if constexpr (kBits == 4) p0 = _mm512_fmadd_ps(widen_codes4(cg + c / 2), _mm512_loadu_ps(xg + c), p0);
        else p0 = _mm512_fmadd_ps(widen_codes8(cg + c), _mm512_loadu_ps(xg + c), p0);
      }
      acc = _mm512_fmadd_ps(_mm512_add_ps(p0, p1), _mm512_set1_ps(to_float(scales[g])), acc);
      bias_term += to_float(biases[g]) * in.sum[size_t(g)];
    }
    y[r] = _mm512_reduce_add_ps(acc) + bias_term;
  }
}

// n <= 16 bf16 values from p as fp32 lanes, 0 beyond n (a masked load reads nothing past them).
LILY_AVX512 inline __m512 load_bf16x16(const bf16* p, int64_t n) {
  const __m256i h = _mm256_maskz_loadu_epi16(__mmask16((1u << n) - 1u), p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// 16 int32 lanes summing to dot(codes, v) over two groups of 4-bit codes: lanes 0-7 the first
// group, 8-15 the second; v: 128 int8 values in nibble order (the low nibbles' columns, then
// the high nibbles').
LILY_AVX512 inline __m512i dot_nibbles(__m512i lo, __m512i hi, const int8_t* v) {
  const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(v));
  return _mm512_dpbusd_epi32(dot, hi, _mm512_loadu_si512(v + 64));
}

// dot(codes, x16) over two groups of 4-bit codes (lanes as dot_nibbles), x16 = 254 a + b;
// a and b at the groups' block of 128 in nibble order.
LILY_AVX512 inline __m512i dot_group_pair_q4(__m512i codes, const int8_t* a, const int8_t* b) {
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  const __m512i lo = _mm512_and_si512(codes, nibble);
  const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(codes, 4), nibble);
  return _mm512_add_epi32(_mm512_mullo_epi32(dot_nibbles(lo, hi, a), _mm512_set1_epi32(254)), dot_nibbles(lo, hi, b));
}

// The codes kPrefetchBytes on from p towards L1. The hardware prefetchers follow one long
// stream, but a decode step reads hundreds of short ones (each member's rows of each expert,
// ~290 KB): 4 full-size layers from memory, 1 thread, CPU time per step 15.6 and 16.5 ms
// without, 13.8 and 13.8 ms at 2 KB ahead (0.5 KB: 16.8, 16.2; 8 KB: 14.0, 15.1); one long
// 151 MB matrix unchanged (10.6 -> 10.6, 13.1 -> 11.3 ms).
constexpr int64_t kPrefetchBytes = 2048;
LILY_AVX512 inline void prefetch_ahead(const uint8_t* p) {
  _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchBytes), _MM_HINT_T0);
}

// Two groups of 4-bit codes at p, or one (the row's last, odd group: a masked load).
LILY_AVX512 inline __m512i load_group_pair_q4(const uint8_t* p, bool both) {
  return both ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi8(__mmask64(0xFFFFFFFFu), p);
}

// 16 int32 lanes summing to dot(codes, x16) over one group of 64 8-bit codes: the codes
// widened to int16, then vpdpwssd.
LILY_AVX512 inline __m512i dot_group_q8(const uint8_t* p, const int16_t* x16) {
  const __m512i c0 = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  const __m512i c1 = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32)));
  const __m512i dot = _mm512_dpwssd_epi32(_mm512_setzero_si512(), c0, _mm512_loadu_si512(x16));
  return _mm512_dpwssd_epi32(dot, c1, _mm512_loadu_si512(x16 + 32));
}

template <int kBits>
LILY_AVX512 float row_integer(const uint8_t* codes, const bf16* scales, const bf16* biases, int64_t groups,
                              const QuantizedInput& in) {
  constexpr int64_t kGroupBytes = kInputGroup * kBits / 8;
  const __m512i pair_lanes = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps(), bias_acc = _mm512_setzero_ps();
  for (int64_t g0 = 0; g0 < groups; g0 += 16) {
    const int64_t n = std::min<int64_t>(16, groups - g0);
    // d[j] = scale * unit of group g0 + j; in.unit and in.qsum are 0 past the last group.
    const __m512 d = _mm512_mul_ps(load_bf16x16(scales + g0, n), _mm512_loadu_ps(in.unit.data() + g0));
    bias_acc = _mm512_fmadd_ps(load_bf16x16(biases + g0, n), _mm512_loadu_ps(in.qsum.data() + g0), bias_acc);
    if constexpr (kBits == 4) {
      for (int64_t j = 0; j < n; j += 2) {  // two accumulators: consecutive FMAs do not wait on each other
        const int64_t g = g0 + j;
        prefetch_ahead(codes + g * kGroupBytes);  // one 64-byte line a pair
        const __m512i dot = dot_group_pair_q4(load_group_pair_q4(codes + g * kGroupBytes, j + 1 < n),
                                              in.a_nibbles.data() + g * kInputGroup,
                                              in.b_nibbles.data() + g * kInputGroup);
        const __m512 dj = _mm512_permutexvar_ps(_mm512_add_epi32(_mm512_set1_epi32(int(j)), pair_lanes), d);
        if (j % 4 == 0) acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), dj, acc0);
        else acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), dj, acc1);
      }
    } else {
      for (int64_t j = 0; j < n; ++j) {
        const int64_t g = g0 + j;
        prefetch_ahead(codes + g * kGroupBytes);
        const __m512i dot = dot_group_q8(codes + g * kGroupBytes, in.x16.data() + g * kInputGroup);
        const __m512 dj = _mm512_permutexvar_ps(_mm512_set1_epi32(int(j)), d);
        if (j % 2 == 0) acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), dj, acc0);
        else acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), dj, acc1);
      }
    }
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) + _mm512_reduce_add_ps(bias_acc);
}

template <int kBits>
LILY_AVX512 void rows_integer(const Matrix& W, const QuantizedInput& in, int64_t r0, int64_t r1, float* y) {
  const int64_t groups = W.cols / kInputGroup, row_bytes = W.cols * kBits / 8;
  for (int64_t r = r0; r < r1; ++r)
    y[r] = row_integer<kBits>(static_cast<const uint8_t*>(W.data) + r * row_bytes, W.scales + r * groups,
                              W.biases + r * groups, groups, in);
}

}  // namespace

void gemv_rows_avx512_fp32(const Matrix& W, const QuantizedInput& x, int64_t r0, int64_t r1, float* y) {
  if (W.bits == 4) rows_fp32<4>(W, x, r0, r1, y);
  else rows_fp32<8>(W, x, r0, r1, y);
}

void gemv_rows_avx512_integer(const Matrix& W, const QuantizedInput& x, int64_t r0, int64_t r1, float* y) {
  if (W.bits == 4) rows_integer<4>(W, x, r0, r1, y);
  else rows_integer<8>(W, x, r0, r1, y);
}

}  // namespace lily::cpu_fast::detail
