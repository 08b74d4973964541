// delta_rule_avx512.cpp: the delta rule over a block of tokens of one value head (spec §3.1) on
// AVX-512 F, for dv a multiple of 16 up to 128 (the model's: 128), the state S [dk, dv] read
// and written once per token:
//
//   token t, given m = S^T k_t and r = S^T q_t (S before t's update):
//     d = beta (v - alpha m),   o = alpha r + d (k_t . q_t)            (deltanet_step.cpp)
//     for each row a of S:  S[a] = alpha S[a] + k_t[a] d,  and with the new row at once
//                           m' += S[a] k_{t+1}[a],  r' += S[a] q_{t+1}[a]   (the next token's sums)
//
// so the update of one token and the sums of the next share the pass over S (64 KB at 128 x
// 128: twice the L1), where delta_rule_step reads S twice and writes it once per token. m, r,
// d and the sums of the next token stay in registers (4 x dv / 16 of them). A block of one
// token (a decode step) reads S for its sums and once more for its update. A token whose state
// is kept (KeptStates, layers.h) stores each updated row of S a second time, into its slot.
#include <immintrin.h>

#include <cmath>

#include "backend/cpu_fast/layers.h"

#define LILY_AVX512_F __attribute__((target("avx512f")))

namespace lily::cpu_fast::detail {

namespace {

// m = S^T k, r = S^T q over the dk rows of S [dk, 16 kV].
template <int kV>
LILY_AVX512_F void sums(const float* S, const float* k, const float* q, int64_t dk, __m512 m[kV], __m512 r[kV]) {
  for (int j = 0; j < kV; ++j) m[j] = r[j] = _mm512_setzero_ps();
  for (int64_t a = 0; a < dk; ++a) {
    const __m512 ka = _mm512_set1_ps(k[a]), qa = _mm512_set1_ps(q[a]);
    for (int j = 0; j < kV; ++j) {
      const __m512 s = _mm512_loadu_ps(S + a * 16 * kV + 16 * j);
      m[j] = _mm512_fmadd_ps(s, ka, m[j]);
      r[j] = _mm512_fmadd_ps(s, qa, r[j]);
    }
  }
}

// Each row a of S updated, S[a] = alpha S[a] + k[a] d, into S (and into `keep` with kKeep); with
// kSums the next token's sums m += S[a] k1[a], r += S[a] q1[a] from the new row.
template <int kV, bool kSums, bool kKeep>
LILY_AVX512_F __attribute__((always_inline)) inline void update(float* S, float* keep, const float* k, const float* k1,
                                                                const float* q1, int64_t dk, __m512 va,
                                                                const __m512 d[kV], __m512 m[kV], __m512 r[kV]) {
  constexpr int64_t dv = 16 * kV;
  for (int64_t a = 0; a < dk; ++a) {
    const __m512 ka = _mm512_set1_ps(k[a]);
    float* Sa = S + a * dv;
    for (int j = 0; j < kV; ++j) {
      const __m512 s = _mm512_fmadd_ps(ka, d[j], _mm512_mul_ps(va, _mm512_loadu_ps(Sa + 16 * j)));
      _mm512_storeu_ps(Sa + 16 * j, s);
      if constexpr (kKeep) _mm512_storeu_ps(keep + a * dv + 16 * j, s);
      if constexpr (kSums) {
        m[j] = _mm512_fmadd_ps(s, _mm512_set1_ps(k1[a]), m[j]);
        r[j] = _mm512_fmadd_ps(s, _mm512_set1_ps(q1[a]), r[j]);
      }
    }
  }
}

template <int kV>
LILY_AVX512_F void tokens(const cpu::DeltaRuleInputs& in, float* S, float* o, int64_t o_stride,
                          const KeptStates& kept) {
  const int64_t dk = in.dk;
  __m512 m[kV], r[kV], d[kV];
  sums<kV>(S, in.k, in.q, dk, m, r);
  for (int64_t t = 0; t < in.T; ++t) {
    const float* k = in.k + t * in.k_stride;
    const float* q = in.q + t * in.q_stride;
    const float* v = in.v + t * in.v_stride;
    const float alpha = std::exp(in.g[t * in.g_stride]), beta = in.beta[t * in.g_stride];
    float kq = 0;
    for (int64_t a = 0; a < dk; ++a) kq += k[a] * q[a];
    const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta), vkq = _mm512_set1_ps(kq);
    float* ot = o + t * o_stride;
    for (int j = 0; j < kV; ++j) {
      d[j] = _mm512_mul_ps(vb, _mm512_fnmadd_ps(va, m[j], _mm512_loadu_ps(v + 16 * j)));
      _mm512_storeu_ps(ot + 16 * j, _mm512_fmadd_ps(va, r[j], _mm512_mul_ps(d[j], vkq)));
    }
    float* keep = t >= kept.first && t < kept.first + kept.count ? kept.states + (t - kept.first) * kept.stride
                                                                 : nullptr;
    if (t + 1 == in.T) {  // the last token: the update alone
      if (keep) update<kV, false, true>(S, keep, k, nullptr, nullptr, dk, va, d, m, r);
      else update<kV, false, false>(S, nullptr, k, nullptr, nullptr, dk, va, d, m, r);
      break;
    }
    const float *k1 = k + in.k_stride, *q1 = q + in.q_stride;  // the next token's
    for (int j = 0; j < kV; ++j) m[j] = r[j] = _mm512_setzero_ps();
    if (keep) update<kV, true, true>(S, keep, k, k1, q1, dk, va, d, m, r);
    else update<kV, true, false>(S, nullptr, k, k1, q1, dk, va, d, m, r);
  }
}

}  // namespace

bool delta_rule_tokens_avx512(const cpu::DeltaRuleInputs& in, float* S, float* o, int64_t o_stride,
                              const KeptStates& kept) {
  if (in.T <= 0) return true;
  switch (in.dv) {
    case 16: tokens<1>(in, S, o, o_stride, kept); return true;
    case 32: tokens<2>(in, S, o, o_stride, kept); return true;
    case 48: tokens<3>(in, S, o, o_stride, kept); return true;
    case 64: tokens<4>(in, S, o, o_stride, kept); return true;
    case 80: tokens<5>(in, S, o, o_stride, kept); return true;
    case 96: tokens<6>(in, S, o, o_stride, kept); return true;
    case 112: tokens<7>(in, S, o, o_stride, kept); return true;
    case 128: tokens<8>(in, S, o, o_stride, kept); return true;
    default: return false;
  }
}

}  // namespace lily::cpu_fast::detail
