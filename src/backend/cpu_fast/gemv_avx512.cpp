// gemv_avx512.cpp: the GEMV kernel on AVX-512 F + BW (16 fp32 lanes). See gemv.h for the formula.
//
// 4-bit: two uint32 words hold 16 consecutive columns; vpermd spreads word 0 to lanes 0-7 and
// word 1 to lanes 8-15, vpsrlvd shifts lane i by 4 * (i % 8), then mask and convert, so the
// lanes line up with x as stored. 8-bit: 16 bytes widened (vpmovzxbd). As in the AVX2 kernel,
// a group's products are scaled by one FMA and the bias term is sum_g bias * xsum.
// g++ 12 reports the deliberately undefined registers inside its own AVX-512 intrinsics
// (_mm512_undefined_*) as maybe-uninitialized (GCC PR 105593, fixed in g++ 13); the pragma
// must be in force where the header is read.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstring>

#include "backend/cpu_fast/gemv.h"

#define LILY_AVX512 __attribute__((target("avx512f,avx512bw")))

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
LILY_AVX512 void rows(const Matrix& W, const float* x, const float* xsum, int64_t r0, int64_t r1, float* y) {
  const int64_t cols = W.cols, G = W.group_size, groups = cols / G;
  const int64_t row_bytes = cols * kBits / 8;
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
      bias_term += to_float(biases[g]) * xsum[g];
    }
    y[r] = _mm512_reduce_add_ps(acc) + bias_term;
  }
}

}  // namespace

void gemv_rows_avx512(const Matrix& W, const float* x, const float* xsum, int64_t r0, int64_t r1, float* y) {
  if (W.bits == 4) rows<4>(W, x, xsum, r0, r1, y);
  else rows<8>(W, x, xsum, r0, r1, y);
}

}  // namespace lily::cpu_fast::detail
