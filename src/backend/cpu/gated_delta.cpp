// gated_delta.cpp: the delta rule in its recurrent and chunked forms (spec §3).
//
//   per value head, per token t:   S <- exp(g_t) S
//                                  delta = beta_t (v_t - S^T k_t)
//                                  S <- S + k_t delta^T
//                                  o_t = S^T q_t                 S: [dk, dv] fp32
// The chunked form computes the same thing 64 tokens at a time with matrix products
// (HF torch_chunk_gated_delta_rule, FLA chunk_gated_delta_rule); the token loop is the
// ground truth it is tested against.
#include <algorithm>
#include <cmath>

#include "backend/cpu/ops.h"
#include "base/cpu_clones.h"

namespace lily::cpu {

LILY_CPU_CLONES void delta_rule_recurrent(const DeltaRuleInputs& in, float* S, float* o, int64_t o_stride) {
  const int64_t dk = in.dk, dv = in.dv;
  std::vector<float> m(static_cast<size_t>(dv));
  for (int64_t t = 0; t < in.T; ++t) {
    const float* q = in.q + t * in.q_stride;
    const float* k = in.k + t * in.k_stride;
    const float* v = in.v + t * in.v_stride;
    const float alpha = std::exp(in.g[t * in.g_stride]);
    const float beta = in.beta[t * in.g_stride];
    for (int64_t i = 0; i < dk * dv; ++i) S[i] *= alpha;  // decay first
    std::fill(m.begin(), m.end(), 0.f);                   // m = S^T k
    for (int64_t a = 0; a < dk; ++a)
      for (int64_t b = 0; b < dv; ++b) m[size_t(b)] += S[a * dv + b] * k[a];
    for (int64_t b = 0; b < dv; ++b) m[size_t(b)] = beta * (v[b] - m[size_t(b)]);  // delta
    for (int64_t a = 0; a < dk; ++a)                                               // S += k delta^T
      for (int64_t b = 0; b < dv; ++b) S[a * dv + b] += k[a] * m[size_t(b)];
    float* ot = o + t * o_stride;  // o = S^T q (updated state)
    std::fill(ot, ot + dv, 0.f);
    for (int64_t a = 0; a < dk; ++a)
      for (int64_t b = 0; b < dv; ++b) ot[b] += S[a * dv + b] * q[a];
  }
}

// One chunk of n <= C tokens (spec §3.2), rows i, j in [0, n):
//   gamma_i = sum_{s<=i} g_s            A[i,j] = beta_i (k_i . k_j) exp(gamma_i - gamma_j), j < i
//   (I + A) U = diag(beta) V            (I + A) W = diag(beta exp(gamma)) K
//   V' = U - W S
//   O_i = exp(gamma_i) q_i^T S + sum_{j<=i} (q_i . k_j) exp(gamma_i - gamma_j) V'_j
//   S  <- exp(gamma_{n-1}) S + sum_j exp(gamma_{n-1} - gamma_j) k_j V'_j^T
// Padding a chunk with zero rows changes none of the first n rows, so a short last chunk is
// processed as is.
LILY_CPU_CLONES void delta_rule_chunked(const DeltaRuleInputs& in, float* S, float* o, int64_t o_stride,
                                        int64_t chunk) {
  const int64_t dk = in.dk, dv = in.dv;
  std::vector<float> gamma(static_cast<size_t>(chunk)), A(size_t(chunk * chunk)), U(size_t(chunk * dv)),
      W(size_t(chunk * dk));
  std::vector<float> S_next(size_t(dk * dv));
  for (int64_t t0 = 0; t0 < in.T; t0 += chunk) {
    const int64_t n = std::min(chunk, in.T - t0);
    auto q = [&](int64_t i) { return in.q + (t0 + i) * in.q_stride; };
    auto k = [&](int64_t i) { return in.k + (t0 + i) * in.k_stride; };
    auto v = [&](int64_t i) { return in.v + (t0 + i) * in.v_stride; };
    auto beta = [&](int64_t i) { return in.beta[(t0 + i) * in.g_stride]; };
    float cumulative = 0;
    for (int64_t i = 0; i < n; ++i) gamma[size_t(i)] = (cumulative += in.g[(t0 + i) * in.g_stride]);

    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < i; ++j) {
        float kk = 0;
        for (int64_t a = 0; a < dk; ++a) kk += k(i)[a] * k(j)[a];
        A[size_t(i * chunk + j)] = beta(i) * kk * std::exp(gamma[size_t(i)] - gamma[size_t(j)]);
      }
    // Forward substitution through the unit lower-triangular (I + A).
    for (int64_t i = 0; i < n; ++i) {
      float* u = &U[size_t(i * dv)];
      float* w = &W[size_t(i * dk)];
      const float decay_i = std::exp(gamma[size_t(i)]);
      for (int64_t b = 0; b < dv; ++b) u[b] = beta(i) * v(i)[b];
      for (int64_t a = 0; a < dk; ++a) w[a] = beta(i) * decay_i * k(i)[a];
      for (int64_t j = 0; j < i; ++j) {
        const float aij = A[size_t(i * chunk + j)];
        for (int64_t b = 0; b < dv; ++b) u[b] -= aij * U[size_t(j * dv + b)];
        for (int64_t a = 0; a < dk; ++a) w[a] -= aij * W[size_t(j * dk + a)];
      }
    }
    // V' = U - W S  (stored in U)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t a = 0; a < dk; ++a) {
        const float wa = W[size_t(i * dk + a)];
        for (int64_t b = 0; b < dv; ++b) U[size_t(i * dv + b)] -= wa * S[a * dv + b];
      }
    // Outputs: inter-chunk (through S) + intra-chunk (through V').
    for (int64_t i = 0; i < n; ++i) {
      float* out = o + (t0 + i) * o_stride;
      std::fill(out, out + dv, 0.f);
      const float decay_i = std::exp(gamma[size_t(i)]);
      for (int64_t a = 0; a < dk; ++a) {
        const float qa = q(i)[a] * decay_i;
        for (int64_t b = 0; b < dv; ++b) out[b] += qa * S[a * dv + b];
      }
      for (int64_t j = 0; j <= i; ++j) {
        float qk = 0;
        for (int64_t a = 0; a < dk; ++a) qk += q(i)[a] * k(j)[a];
        const float coef = qk * std::exp(gamma[size_t(i)] - gamma[size_t(j)]);
        for (int64_t b = 0; b < dv; ++b) out[b] += coef * U[size_t(j * dv + b)];
      }
    }
    // State to the end of the chunk.
    const float last = gamma[size_t(n - 1)];
    const float decay_all = std::exp(last);
    for (int64_t i = 0; i < dk * dv; ++i) S_next[size_t(i)] = decay_all * S[i];
    for (int64_t j = 0; j < n; ++j) {
      const float decay_j = std::exp(last - gamma[size_t(j)]);
      for (int64_t a = 0; a < dk; ++a) {
        const float ka = decay_j * k(j)[a];
        for (int64_t b = 0; b < dv; ++b) S_next[size_t(a * dv + b)] += ka * U[size_t(j * dv + b)];
      }
    }
    std::copy(S_next.begin(), S_next.end(), S);
  }
}

}  // namespace lily::cpu
