// deltanet.cpp: the Gated DeltaNet layer (spec §2.6).
//
//   mixed = x @ Wqkv^T [T, conv_dim]      z = x @ Wz^T [T, Hv, 128]   b, a = x @ Wb^T, x @ Wa^T [T, Hv]
//   u = silu(causal depthwise conv_K(mixed) with the carried K-1 inputs)
//   q, k, v = u split [Hk*128 | Hk*128 | Hv*128];  q = l2norm(q) / sqrt(128), k = l2norm(k)
//   beta = sigmoid(b);  g = -exp(A_log) * softplus(a + dt_bias)
//   o = delta rule (v-head n reads q/k head n / (Hv/Hk))
//   y = gated_rms_norm(o, z) @ Wout^T
// With states to keep (DeltaNetKept, for SequenceState::rewind), the conv's rows X behind each kept
// row are copied out, and the delta rule runs chunked up to the first kept row, then row by row
// (recurrent form), copying S after each kept row.
#include <algorithm>
#include <cmath>

#include "backend/cpu/ops.h"
#include "base/error.h"
#include "base/thread_pool.h"

namespace lily::cpu {

namespace {

// Causal depthwise conv over channels with the carried state, then SiLU.
// mixed: [T, C] pre-conv; conv_state: [K-1, C] (oldest first), updated; u: [T, C]; kept.conv:
// rows kept.first_row + 1 .. of X (ops.h) when kept.rows > 0.
void causal_conv_silu(const std::vector<float>& weight, int64_t K, std::vector<float>& conv_state, const float* mixed,
                      int64_t T, int64_t C, float* u, const DeltaNetKept& kept) {
  // X = [conv_state ; mixed]  rows: K-1 + T
  auto X = [&](int64_t row, int64_t ch) {
    return row < K - 1 ? conv_state[size_t(row * C + ch)] : mixed[(row - (K - 1)) * C + ch];
  };
  for (int64_t t = 0; t < T; ++t)
    for (int64_t ch = 0; ch < C; ++ch) {
      float s = 0;
      for (int64_t i = 0; i < K; ++i) s += weight[size_t(ch * K + i)] * X(t + i, ch);
      u[t * C + ch] = silu(s);
    }
  if (kept.rows > 0)
    for (int64_t r = 0; r < kept.rows + K - 2; ++r)
      for (int64_t ch = 0; ch < C; ++ch) kept.conv[r * C + ch] = X(kept.first_row + 1 + r, ch);
  // The new state is the last K-1 rows of X.
  std::vector<float> next(size_t((K - 1) * C));
  for (int64_t r = 0; r < K - 1; ++r)
    for (int64_t ch = 0; ch < C; ++ch) next[size_t(r * C + ch)] = X(T + r, ch);
  conv_state.swap(next);
}

// Rows [t0, t0 + n) of `in`.
DeltaRuleInputs rows_of(const DeltaRuleInputs& in, int64_t t0, int64_t n) {
  DeltaRuleInputs r = in;
  r.q += t0 * in.q_stride, r.k += t0 * in.k_stride, r.v += t0 * in.v_stride;
  r.g += t0 * in.g_stride, r.beta += t0 * in.g_stride;
  r.T = n;
  return r;
}

// The delta rule of one value head over its T rows; S: [dk, dv] in place, o: [T, o_stride]. The
// states after rows [kept.first_row, + kept.rows) into `kept_S` ([kept.rows, state_stride]).
void delta_rule_head(const DeltaRuleInputs& in, float* S, float* o, int64_t o_stride, const DeltaNetKept& kept,
                     float* kept_S, int64_t state_stride) {
  if (kept.rows == 0) {
    if (in.T == 1) delta_rule_recurrent(in, S, o, o_stride);
    else delta_rule_chunked(in, S, o, o_stride);
    return;
  }
  const int64_t first = kept.first_row, size = in.dk * in.dv;
  if (first > 0) delta_rule_chunked(rows_of(in, 0, first), S, o, o_stride);
  for (int64_t t = first; t < in.T; ++t) {
    delta_rule_recurrent(rows_of(in, t, 1), S, o + t * o_stride, o_stride);
    if (t < first + kept.rows) std::copy(S, S + size, kept_S + (t - first) * state_stride);
  }
}

}  // namespace

void l2_normalize(float* x, int64_t n, float scale) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += double(x[i]) * x[i];
  const float inv = 1.f / std::sqrt(float(ss) + 1e-6f) * scale;
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void gated_deltanet(const DeltaNetWeights& w, const ModelConfig& c, DeltaNetCache& cache, const float* x, int64_t T,
                    float* out, const DeltaNetKept& kept) {
  const int64_t Hk = c.linear_num_key_heads, Hv = c.linear_num_value_heads;
  const int64_t dk = c.linear_key_head_dim, dv = c.linear_value_head_dim;
  const int64_t C = c.linear_conv_dim(), K = c.linear_conv_kernel_dim, key_dim = Hk * dk;
  LILY_CHECK(kept.rows == 0 || (kept.first_row >= 0 && kept.first_row + kept.rows <= T && kept.conv && kept.ssm),
             "internal: DeltaNet states kept after rows [{}, +{}) of a block of {}", kept.first_row, kept.rows, T);

  std::vector<float> mixed(size_t(T * C)), z(size_t(T * Hv * dv)), b(size_t(T * Hv)), a(size_t(T * Hv));
  linear(w.in_proj_qkv, x, T, mixed.data());
  linear(w.in_proj_z, x, T, z.data());
  linear(w.in_proj_b, x, T, b.data());
  linear(w.in_proj_a, x, T, a.data());

  std::vector<float> u(size_t(T * C));  // [T, q | k | v]
  causal_conv_silu(w.conv1d, K, cache.conv, mixed.data(), T, C, u.data(), kept);
  const float q_scale = 1.f / std::sqrt(float(dk));
  for (int64_t t = 0; t < T; ++t) {
    float* row = u.data() + t * C;
    for (int64_t h = 0; h < Hk; ++h) {
      l2_normalize(row + h * dk, dk, q_scale);        // q
      l2_normalize(row + key_dim + h * dk, dk, 1.f);  // k
    }
  }
  std::vector<float> beta(size_t(T * Hv)), g(size_t(T * Hv));  // [T, Hv]
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < Hv; ++h) {
      const int64_t i = t * Hv + h;
      beta[size_t(i)] = sigmoid(b[size_t(i)]);
      g[size_t(i)] = -std::exp(w.A_log[size_t(h)]) * softplus(a[size_t(i)] + w.dt_bias[size_t(h)]);
    }

  std::vector<float> o(size_t(T * Hv * dv));  // [T, Hv, dv]
  const int64_t heads_per_key = Hv / Hk;
  parallel_for(Hv, 1, [&](int64_t h0, int64_t h1) {
    for (int64_t h = h0; h < h1; ++h) {
      const int64_t kh = h / heads_per_key;
      DeltaRuleInputs in{u.data() + kh * dk,
                         u.data() + key_dim + kh * dk,
                         u.data() + 2 * key_dim + h * dv,
                         g.data() + h,
                         beta.data() + h,
                         C,
                         C,
                         C,
                         Hv,
                         T,
                         dk,
                         dv};
      delta_rule_head(in, cache.ssm.data() + h * dk * dv, o.data() + h * dv, Hv * dv, kept,
                      kept.ssm ? kept.ssm + h * dk * dv : nullptr, Hv * dk * dv);
    }
  });

  std::vector<float> y(size_t(T * Hv * dv));
  gated_rms_norm(o.data(), z.data(), w.norm.data(), T * Hv, dv, c.rms_norm_eps, y.data());
  linear(w.out_proj, y.data(), T, out);
}

}  // namespace lily::cpu
