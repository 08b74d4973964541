// attention_avx512.cpp: one query token's heads of one KV head over its visible keys, on
// AVX-512 F (the prefill's attention, attention_prefill.cpp): up to 8 query heads share every
// key and value they read.
//
//   scores[h, j] = q_h . k_j / sqrt(d)         16 keys a register: K transposed [d, keys], each
//                                              row of 16 keys times q_h[e] broadcast, 8 heads
//   p = softmax(scores[h])                     per head, exp_approx (fast_math.h), a double sum
//   o_h = (sum_j p[h, j] v_j) * sigmoid(gate_h) 32 values of d at a time for all heads
//
// Each key costs 2 x 16 FMA per head (d = 256) and is loaded once for all heads, where attend
// (attention_step.cpp) reads it per head and sums each dot product across its lanes.
//
// One token's heads with the keys in place (attend_in_place_avx512: a decode step, a batch's row,
// where a transpose would cost as much as the attention):
//   scores[h, j] = q_h . k_j / sqrt(d)         4 keys at a time, 4 sums per head along d (16
//                                              lanes), each summed across its lanes
//   p, o_h                                     as above; the values 16 x kVecs of d at a time for
//                                              all heads (kHeads x kVecs sums: 16 zmm), so each
//                                              key and value row is read once for the group
//                                              (attend: once per head), in d / (16 kVecs) pieces
// Tested against attend and the reference through the decode step (tests/cpu_fast/test_attention.cpp,
// test_backend.cpp, test_batch.cpp).
// g++ 12 reports the deliberately undefined registers inside its own AVX-512 intrinsics
// (_mm512_reduce_add_ps) as maybe-uninitialized (GCC PR 105593, fixed in g++ 13); the pragmas
// must be in force where the header is read.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "backend/cpu_fast/fast_math.h"
#include "backend/cpu_fast/prefill.h"

#define LILY_AVX512_F __attribute__((target("avx512f")))

namespace lily::cpu_fast::detail {

namespace {

template <int kHeads>
LILY_AVX512_F void heads(const AttentionHeads& a, float* scores) {
  const int64_t n = a.visible, d = a.d, ld = a.keys_stride;
  const float scale = 1.f / std::sqrt(float(d));
  for (int64_t j0 = 0; j0 < n; j0 += 16) {  // keys past n are the transposed keys' zero padding
    __m512 acc[kHeads];
    for (int h = 0; h < kHeads; ++h) acc[h] = _mm512_setzero_ps();
    for (int64_t e = 0; e < d; ++e) {
      const __m512 k = _mm512_loadu_ps(a.keys_t + e * ld + j0);
      for (int h = 0; h < kHeads; ++h) acc[h] = _mm512_fmadd_ps(_mm512_set1_ps(a.q[h * a.q_stride + e]), k, acc[h]);
    }
    for (int h = 0; h < kHeads; ++h)
      _mm512_storeu_ps(scores + h * ld + j0, _mm512_mul_ps(acc[h], _mm512_set1_ps(scale)));
  }
  for (int h = 0; h < kHeads; ++h) {
    float* s = scores + h * ld;
    const float max_score = *std::max_element(s, s + n);
    for (int64_t j = 0; j < n; ++j) s[j] = exp_approx(s[j] - max_score);
    double sum = 0;  // as attend: a double sum
    for (int64_t j = 0; j < n; ++j) sum += s[j];
    const float inv = float(1.0 / sum);
    for (int64_t j = 0; j < n; ++j) s[j] *= inv;
  }
  for (int64_t c = 0; c < d; c += 32) {
    __m512 acc[kHeads][2];
    for (int h = 0; h < kHeads; ++h) acc[h][0] = acc[h][1] = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; ++j) {
      const float* vj = a.values + j * a.values_stride + c;
      const __m512 v0 = _mm512_loadu_ps(vj), v1 = _mm512_loadu_ps(vj + 16);
      for (int h = 0; h < kHeads; ++h) {
        const __m512 p = _mm512_set1_ps(scores[h * ld + j]);
        acc[h][0] = _mm512_fmadd_ps(p, v0, acc[h][0]);
        acc[h][1] = _mm512_fmadd_ps(p, v1, acc[h][1]);
      }
    }
    for (int h = 0; h < kHeads; ++h) {
      float* o = a.o + h * a.o_stride + c;
      const float* gate = a.gate + h * a.gate_stride + c;
      _mm512_storeu_ps(o, acc[h][0]);
      _mm512_storeu_ps(o + 16, acc[h][1]);
      for (int e = 0; e < 32; ++e) o[e] *= sigmoid_approx(gate[e]);
    }
  }
}

// p = softmax(scores) of the heads' n scores, in place (a double sum, as attend).
LILY_AVX512_F void softmax_rows(float* scores, int64_t heads, int64_t n, int64_t stride) {
  for (int64_t h = 0; h < heads; ++h) {
    float* s = scores + h * stride;
    const float max_score = *std::max_element(s, s + n);
    for (int64_t j = 0; j < n; ++j) s[j] = exp_approx(s[j] - max_score);
    double sum = 0;
    for (int64_t j = 0; j < n; ++j) sum += s[j];
    const float inv = float(1.0 / sum);
    for (int64_t j = 0; j < n; ++j) s[j] *= inv;
  }
}

// kKeys keys from `keys` (rows at `stride`) against each head's query: scores[h * n + j].
template <int kHeads, int kKeys>
LILY_AVX512_F void scores_in_place(const AttentionHeads& a, const float* keys, float* scores, int64_t j) {
  const int64_t d = a.d, n = a.visible;
  const float scale = 1.f / std::sqrt(float(d));
  for (int h = 0; h < kHeads; ++h) {
    const float* q = a.q + h * a.q_stride;
    __m512 acc[kKeys];
    for (int i = 0; i < kKeys; ++i) acc[i] = _mm512_setzero_ps();
    for (int64_t e = 0; e < d; e += 16) {
      const __m512 qe = _mm512_loadu_ps(q + e);
      for (int i = 0; i < kKeys; ++i)
        acc[i] = _mm512_fmadd_ps(qe, _mm512_loadu_ps(keys + i * a.keys_stride + e), acc[i]);
    }
    for (int i = 0; i < kKeys; ++i) scores[h * n + j + i] = _mm512_reduce_add_ps(acc[i]) * scale;
  }
}

// o_h = (sum_k p[h, k] v_k) * sigmoid(gate_h) for all heads, 16 x kVecs of d a pass over the
// values: each value row read in d / (16 kVecs) pieces, one a pass.
template <int kHeads, int kVecs>
LILY_AVX512_F void weighted_values(const AttentionHeads& a, const float* scores) {
  const int64_t n = a.visible, d = a.d;
  for (int64_t c = 0; c < d; c += 16 * kVecs) {
    __m512 acc[kHeads][kVecs];
    for (int h = 0; h < kHeads; ++h)
      for (int v = 0; v < kVecs; ++v) acc[h][v] = _mm512_setzero_ps();
    for (int64_t k = 0; k < n; ++k) {
      const float* vk = a.values + k * a.values_stride + c;
      __m512 row[kVecs];
      for (int v = 0; v < kVecs; ++v) row[v] = _mm512_loadu_ps(vk + 16 * v);
      for (int h = 0; h < kHeads; ++h) {
        const __m512 p = _mm512_set1_ps(scores[h * n + k]);
        for (int v = 0; v < kVecs; ++v) acc[h][v] = _mm512_fmadd_ps(p, row[v], acc[h][v]);
      }
    }
    for (int h = 0; h < kHeads; ++h) {
      float* o = a.o + h * a.o_stride + c;
      const float* gate = a.gate + h * a.gate_stride + c;
      for (int v = 0; v < kVecs; ++v) _mm512_storeu_ps(o + 16 * v, acc[h][v]);
      for (int e = 0; e < 16 * kVecs; ++e) o[e] *= sigmoid_approx(gate[e]);
    }
  }
}

template <int kHeads>
LILY_AVX512_F void in_place(const AttentionHeads& a, float* scores) {
  const int64_t n = a.visible, d = a.d;
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) scores_in_place<kHeads, 4>(a, a.keys_t + j * a.keys_stride, scores, j);
  for (; j < n; ++j) scores_in_place<kHeads, 1>(a, a.keys_t + j * a.keys_stride, scores, j);
  softmax_rows(scores, kHeads, n, n);
  // The widest pass that holds 16 sums (kHeads x kVecs zmm) and divides d (a multiple of 64):
  // a value row of d = 256 is read in one pass for 1 head, two for 2, eight for 8, where a
  // narrower pass walks the cache at the row stride once per piece.
  constexpr int kWidest = kHeads == 1 ? 16 : kHeads == 2 ? 8 : kHeads <= 4 ? 4 : 2;
  if constexpr (kWidest >= 16)
    if (d % 256 == 0) return weighted_values<kHeads, 16>(a, scores);
  if constexpr (kWidest >= 8)
    if (d % 128 == 0) return weighted_values<kHeads, 8>(a, scores);
  if constexpr (kWidest >= 4) return weighted_values<kHeads, 4>(a, scores);
  else return weighted_values<kHeads, kWidest>(a, scores);
}

}  // namespace

bool attend_in_place_avx512(const AttentionHeads& a, float* scores) {
  if (a.d % 64 != 0) return false;
  switch (a.heads) {
    case 1: in_place<1>(a, scores); return true;
    case 2: in_place<2>(a, scores); return true;
    case 3: in_place<3>(a, scores); return true;
    case 4: in_place<4>(a, scores); return true;
    case 5: in_place<5>(a, scores); return true;
    case 6: in_place<6>(a, scores); return true;
    case 7: in_place<7>(a, scores); return true;
    case 8: in_place<8>(a, scores); return true;
    default: return false;
  }
}

bool attend_heads_avx512(const AttentionHeads& a, float* scores) {
  if (a.d % 32 != 0) return false;
  switch (a.heads) {
    case 1: heads<1>(a, scores); return true;
    case 2: heads<2>(a, scores); return true;
    case 3: heads<3>(a, scores); return true;
    case 4: heads<4>(a, scores); return true;
    case 5: heads<5>(a, scores); return true;
    case 6: heads<6>(a, scores); return true;
    case 7: heads<7>(a, scores); return true;
    case 8: heads<8>(a, scores); return true;
    default: return false;
  }
}

}  // namespace lily::cpu_fast::detail
