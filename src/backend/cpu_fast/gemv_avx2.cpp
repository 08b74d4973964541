// gemv_avx2.cpp: the GEMV kernel on AVX2 + FMA (8 fp32 lanes). See gemv.h for the formula.
//
// 4-bit: one uint32 word holds 8 consecutive columns; it is broadcast to the 8 lanes and
// shifted right by 0, 4, .., 28 (vpsrlvd), masked and converted, so the lanes line up with
// x as stored. 8-bit: 8 bytes widened (vpmovzxbd). Each group's products accumulate in two
// registers, then one FMA with the group's scale; the bias term is sum_g bias * xsum.
// Every function carries the target attribute, so nothing here runs without the check of
// isa_supported(Isa::avx2).
#include <immintrin.h>

#include <cstring>

#include "backend/cpu_fast/gemv.h"

#define LILY_AVX2 __attribute__((target("avx2,fma")))

namespace lily::cpu_fast::detail {

namespace {

// Columns 8i .. 8i+7 of a 4-bit row from word i.
LILY_AVX2 inline __m256 widen_codes4(uint32_t word) {
  const __m256i shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
  const __m256i v = _mm256_srlv_epi32(_mm256_set1_epi32(int(word)), shifts);
  return _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(0xF)));
}

// Eight 8-bit codes from p.
LILY_AVX2 inline __m256 widen_codes8(const uint8_t* p) {
  int64_t bytes;
  std::memcpy(&bytes, p, 8);
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(bytes)));
}

LILY_AVX2 inline float sum_lanes(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

template <int kBits>
LILY_AVX2 void rows(const Matrix& W, const float* x, const float* xsum, int64_t r0, int64_t r1, float* y) {
  const int64_t cols = W.cols, G = W.group_size, groups = cols / G;
  const int64_t row_bytes = cols * kBits / 8;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* codes = static_cast<const uint8_t*>(W.data) + r * row_bytes;
    const bf16* scales = W.scales + r * groups;
    const bf16* biases = W.biases + r * groups;
    __m256 acc = _mm256_setzero_ps();
    float bias_term = 0;
    for (int64_t g = 0; g < groups; ++g) {
      const uint8_t* cg = codes + g * G * kBits / 8;
      const float* xg = x + g * G;
      __m256 p0 = _mm256_setzero_ps(), p1 = _mm256_setzero_ps();
      for (int64_t c = 0; c < G; c += 16) {
        if constexpr (kBits == 4) {
          uint32_t w[2];
          std::memcpy(w, cg + c / 2, 8);
          p0 = _mm256_fmadd_ps(widen_codes4(w[0]), _mm256_loadu_ps(xg + c), p0);
          p1 = _mm256_fmadd_ps(widen_codes4(w[1]), _mm256_loadu_ps(xg + c + 8), p1);
        } else {
          p0 = _mm256_fmadd_ps(widen_codes8(cg + c), _mm256_loadu_ps(xg + c), p0);
          p1 = _mm256_fmadd_ps(widen_codes8(cg + c + 8), _mm256_loadu_ps(xg + c + 8), p1);
        }
      }
      acc = _mm256_fmadd_ps(_mm256_add_ps(p0, p1), _mm256_set1_ps(to_float(scales[g])), acc);
      bias_term += to_float(biases[g]) * xsum[g];
    }
    y[r] = sum_lanes(acc) + bias_term;
  }
}

}  // namespace

void gemv_rows_avx2(const Matrix& W, const float* x, const float* xsum, int64_t r0, int64_t r1, float* y) {
  if (W.bits == 4) rows<4>(W, x, xsum, r0, r1, y);
  else rows<8>(W, x, xsum, r0, r1, y);
}

}  // namespace lily::cpu_fast::detail
