// gemv_avx2.cpp: the GEMV kernels on AVX2 + FMA (256-bit). See gemv.h for the formula.
//
// integer (groups of 64): a group's 32 code bytes (4-bit) are split into low and high nibbles,
// which line up with the int8 halves a, b of x16 = 254 a + b in nibble order
// (quantized_input.h); vpmaddubsw multiplies the unsigned codes by each signed half into int16
// pairs, vpmaddwd sums those to 8 int32 lanes, times 254 for a. 8-bit codes (255 * 127 * 2
// would saturate vpmaddubsw) are widened to int16 and multiplied with x16 by vpmaddwd. Each
// group's int32 lanes are converted and scaled by scale * unit in one FMA; scale * unit and the
// bias term are computed for 8 groups at a time.
// fp32: one uint32 word (8 4-bit columns) is broadcast to the 8 lanes, shifted by 0, 4, .., 28,
// masked and converted; 8-bit codes are widened by vpmovzxbd; one FMA per 8 columns.
// gemv_tokens_avx2_integer: the integer kernel for up to 4 tokens at once (a prefill block, a
// batch or verify step), each group's codes loaded and split once for all of them.
// Every function carries the target attribute, so nothing here runs without the check of
// isa_supported(Isa::avx2).
#include <immintrin.h>

#include <algorithm>
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
LILY_AVX2 void rows_fp32(const Matrix& W, const QuantizedInput& in, int64_t r0, int64_t r1, float* y) {
  const int64_t cols = W.cols, G = W.group_size, groups = cols / G;
  const int64_t row_bytes = cols * kBits / 8;
  const float* x = in.x;
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
      bias_term += to_float(biases[g]) * in.sum[size_t(g)];
    }
    y[r] = sum_lanes(acc) + bias_term;
  }
}

// n <= 8 bf16 values from p as fp32 lanes, 0 beyond n.
LILY_AVX2 inline __m256 load_bf16x8(const bf16* p, int64_t n) {
  uint16_t bits[8] = {};
  if (n < 8) std::memcpy(bits, p, size_t(n) * sizeof(bf16));  // no read past the row's last group
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(n < 8 ? static_cast<const void*>(bits) : p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// int16 lanes: the sums of two adjacent products lo * v + two of hi * v[64..] (at most
// 4 * 15 * 127: no saturation).
LILY_AVX2 inline __m256i pair_sums(__m256i lo, __m256i hi, const int8_t* v) {
  return _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v))),
                          _mm256_maddubs_epi16(hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + 64))));
}

// 8 int32 lanes summing to dot(codes, x16) over one group of 64 4-bit codes (32 bytes at p);
// a and b: the group's int8 halves of x16 in nibble order (the low nibbles' columns, then 64
// values on, the high nibbles').
LILY_AVX2 inline __m256i dot_group_q4(const uint8_t* p, const int8_t* a, const int8_t* b) {
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  const __m256i codes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m256i lo = _mm256_and_si256(codes, nibble);
  const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(codes, 4), nibble);
  return _mm256_add_epi32(_mm256_madd_epi16(pair_sums(lo, hi, a), _mm256_set1_epi16(254)),
                          _mm256_madd_epi16(pair_sums(lo, hi, b), _mm256_set1_epi16(1)));
}

// 16 8-bit codes times 16 x16 values, as 8 int32 lanes of pair sums.
LILY_AVX2 inline __m256i dot16_q8(const uint8_t* p, const int16_t* x16) {
  const __m256i codes = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_madd_epi16(codes, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x16)));
}

// 8 int32 lanes summing to dot(codes, x16) over one group of 64 8-bit codes.
LILY_AVX2 inline __m256i dot_group_q8(const uint8_t* p, const int16_t* x16) {
  const __m256i a = _mm256_add_epi32(dot16_q8(p, x16), dot16_q8(p + 16, x16 + 16));
  const __m256i b = _mm256_add_epi32(dot16_q8(p + 32, x16 + 32), dot16_q8(p + 48, x16 + 48));
  return _mm256_add_epi32(a, b);
}

// The codes kPrefetchBytes on from p towards L1: the short streams of a decode step (each
// member's rows of each expert) start faster; see gemv_avx512.cpp for the measurement.
constexpr int64_t kPrefetchBytes = 2048;
LILY_AVX2 inline void prefetch_ahead(const uint8_t* p) {
  _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchBytes), _MM_HINT_T0);
}

template <int kBits>
LILY_AVX2 float row_integer(const uint8_t* codes, const bf16* scales, const bf16* biases, int64_t groups,
                            const QuantizedInput& in) {
  constexpr int64_t kGroupBytes = kInputGroup * kBits / 8;
  __m256 acc = _mm256_setzero_ps(), bias_acc = _mm256_setzero_ps();
  for (int64_t g0 = 0; g0 < groups; g0 += 8) {
    const int64_t n = std::min<int64_t>(8, groups - g0);
    // d[j] = scale * unit of group g0 + j; in.unit and in.qsum are 0 past the last group.
    const __m256 d = _mm256_mul_ps(load_bf16x8(scales + g0, n), _mm256_loadu_ps(in.unit.data() + g0));
    bias_acc = _mm256_fmadd_ps(load_bf16x8(biases + g0, n), _mm256_loadu_ps(in.qsum.data() + g0), bias_acc);
    for (int64_t j = 0; j < n; ++j) {
      const int64_t g = g0 + j;
      if (kBits == 8 || g % 2 == 0) prefetch_ahead(codes + g * kGroupBytes);  // one 64-byte line at a time
      __m256i dot;
      if constexpr (kBits == 4) {
        const int64_t at = 128 * (g / 2) + 32 * (g % 2);  // the group's columns in nibble order
        dot = dot_group_q4(codes + g * kGroupBytes, in.a_nibbles.data() + at, in.b_nibbles.data() + at);
      } else {
        dot = dot_group_q8(codes + g * kGroupBytes, in.x16.data() + g * kInputGroup);
      }
      const __m256 dj = _mm256_permutevar8x32_ps(d, _mm256_set1_epi32(int(j)));
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), dj, acc);
    }
  }
  return sum_lanes(acc) + sum_lanes(bias_acc);
}

template <int kBits>
LILY_AVX2 void rows_integer(const Matrix& W, const QuantizedInput& in, int64_t r0, int64_t r1, float* y) {
  const int64_t groups = W.cols / kInputGroup, row_bytes = W.cols * kBits / 8;
  for (int64_t r = r0; r < r1; ++r)
    y[r] = row_integer<kBits>(static_cast<const uint8_t*>(W.data) + r * row_bytes, W.scales + r * groups,
                              W.biases + r * groups, groups, in);
}

// Row r of W against kTokens tokens at once (4-bit codes): each group's codes are loaded and
// split into nibbles once for all of them, and each token's int32 sums scaled as row_integer's.
template <int kTokens>
LILY_AVX2 void row_integer_tokens(const uint8_t* codes, const bf16* scales, const bf16* biases, int64_t groups,
                                  const QuantizedInput* const* in, float* y, int64_t y_stride) {
  constexpr int64_t kGroupBytes = kInputGroup / 2;
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  __m256 acc[kTokens], bias_acc[kTokens];
  for (int t = 0; t < kTokens; ++t) acc[t] = _mm256_setzero_ps(), bias_acc[t] = _mm256_setzero_ps();
  for (int64_t g0 = 0; g0 < groups; g0 += 8) {
    const int64_t n = std::min<int64_t>(8, groups - g0);
    const __m256 s = load_bf16x8(scales + g0, n), b = load_bf16x8(biases + g0, n);
    __m256 d[kTokens];
    for (int t = 0; t < kTokens; ++t) {
      d[t] = _mm256_mul_ps(s, _mm256_loadu_ps(in[t]->unit.data() + g0));
      bias_acc[t] = _mm256_fmadd_ps(b, _mm256_loadu_ps(in[t]->qsum.data() + g0), bias_acc[t]);
    }
    for (int64_t j = 0; j < n; ++j) {
      const int64_t g = g0 + j;
      if (g % 2 == 0) prefetch_ahead(codes + g * kGroupBytes);
      const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + g * kGroupBytes));
      const __m256i lo = _mm256_and_si256(c, nibble), hi = _mm256_and_si256(_mm256_srli_epi16(c, 4), nibble);
      const int64_t at = 128 * (g / 2) + 32 * (g % 2);  // the group's columns in nibble order
      const __m256i jj = _mm256_set1_epi32(int(j));
      for (int t = 0; t < kTokens; ++t) {
        const __m256i dot = _mm256_add_epi32(
            _mm256_madd_epi16(pair_sums(lo, hi, in[t]->a_nibbles.data() + at), _mm256_set1_epi16(254)),
            _mm256_madd_epi16(pair_sums(lo, hi, in[t]->b_nibbles.data() + at), _mm256_set1_epi16(1)));
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_permutevar8x32_ps(d[t], jj), acc[t]);
      }
    }
  }
  for (int t = 0; t < kTokens; ++t) y[t * y_stride] = sum_lanes(acc[t]) + sum_lanes(bias_acc[t]);
}

template <int kTokens>
LILY_AVX2 void rows_integer_tokens(const Matrix& W, const QuantizedInput* const* in, int64_t r0, int64_t r1, float* y,
                                   int64_t y_stride) {
  const int64_t groups = W.cols / kInputGroup, row_bytes = W.cols / 2;
  for (int64_t r = r0; r < r1; ++r)
    row_integer_tokens<kTokens>(static_cast<const uint8_t*>(W.data) + r * row_bytes, W.scales + r * groups,
                                W.biases + r * groups, groups, in, y + r, y_stride);
}

}  // namespace

void gemv_tokens_avx2_integer(const Matrix& W, const QuantizedInput* const* x, int n, int64_t r0, int64_t r1, float* y,
                              int64_t y_stride) {
  if (W.bits != 4) {  // 8-bit codes: token by token
    for (int t = 0; t < n; ++t) rows_integer<8>(W, *x[t], r0, r1, y + t * y_stride);
    return;
  }
  int t = 0;
  for (; t + 4 <= n; t += 4) rows_integer_tokens<4>(W, x + t, r0, r1, y + t * y_stride, y_stride);
  switch (n - t) {
    case 3: rows_integer_tokens<3>(W, x + t, r0, r1, y + t * y_stride, y_stride); break;
    case 2: rows_integer_tokens<2>(W, x + t, r0, r1, y + t * y_stride, y_stride); break;
    case 1: rows_integer<4>(W, *x[t], r0, r1, y + t * y_stride); break;
    default: break;
  }
}

void gemv_rows_avx2_fp32(const Matrix& W, const QuantizedInput& x, int64_t r0, int64_t r1, float* y) {
  if (W.bits == 4) rows_fp32<4>(W, x, r0, r1, y);
  else rows_fp32<8>(W, x, r0, r1, y);
}

void gemv_rows_avx2_integer(const Matrix& W, const QuantizedInput& x, int64_t r0, int64_t r1, float* y) {
  if (W.bits == 4) rows_integer<4>(W, x, r0, r1, y);
  else rows_integer<8>(W, x, r0, r1, y);
}

}  // namespace lily::cpu_fast::detail
