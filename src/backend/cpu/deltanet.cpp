// deltanet.cpp: the Gated DeltaNet layer (spec §2.6).
//
//   mixed = x @ Wqkv^T [T, conv_dim]      z = x @ Wz^T [T, Hv, 128]   b, a = x @ Wb^T, x @ Wa^T [T, Hv]
//   u = silu(causal depthwise conv_K(mixed) with the carried K-1 inputs)
//   q, k, v = u split [Hk*128 | Hk*128 | Hv*128];  q = l2norm(q) / sqrt(128), k = l2norm(k)
//   beta = sigmoid(b);  g = -exp(A_log) * softplus(a + dt_bias)
//   o = delta rule (v-head n reads q/k head n / (Hv/Hk))
//   y = gated_rms_norm(o, z) @ Wout^T
#include <algorithm>
#include <cmath>

#include "backend/cpu/ops.h"
#include "base/thread_pool.h"

namespace lily::cpu {

namespace {

// Causal depthwise conv over channels with the carried state, then SiLU.
// mixed: [T, C] pre-conv; conv_state: [K-1, C] (oldest first), updated; u: [T, C].
void causal_conv_silu(const std::vector<float>& weight, int64_t K, std::vector<float>& conv_state, const float* mixed,
                      int64_t T, int64_t C, float* u) {
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
  // The new state is the last K-1 rows of X.
  std::vector<float> next(size_t((K - 1) * C));
  for (int64_t r = 0; r < K - 1; ++r)
    for (int64_t ch = 0; ch < C; ++ch) next[size_t(r * C + ch)] = X(T + r, ch);
  conv_state.swap(next);
}

}  // namespace

void l2_normalize(float* x, int64_t n, float scale) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += double(x[i]) * x[i];
  const float inv = 1.f / std::sqrt(float(ss) + 1e-6f) * scale;
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void gated_deltanet(const DeltaNetWeights& w, const ModelConfig& c, DeltaNetCache& cache, const float* x, int64_t T,
                    float* out) {
  const int64_t Hk = c.linear_num_key_heads, Hv = c.linear_num_value_heads;
  const int64_t dk = c.linear_key_head_dim, dv = c.linear_value_head_dim;
  const int64_t C = c.linear_conv_dim(), K = c.linear_conv_kernel_dim, key_dim = Hk * dk;

  std::vector<float> mixed(size_t(T * C)), z(size_t(T * Hv * dv)), b(size_t(T * Hv)), a(size_t(T * Hv));
  linear(w.in_proj_qkv, x, T, mixed.data());
  linear(w.in_proj_z, x, T, z.data());
  linear(w.in_proj_b, x, T, b.data());
  linear(w.in_proj_a, x, T, a.data());

  std::vector<float> u(size_t(T * C));  // [T, q | k | v]
  causal_conv_silu(w.conv1d, K, cache.conv, mixed.data(), T, C, u.data());
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
      float* S = cache.ssm.data() + h * dk * dv;
      if (T == 1) delta_rule_recurrent(in, S, o.data() + h * dv, Hv * dv);
      else delta_rule_chunked(in, S, o.data() + h * dv, Hv * dv);
    }
  });

  std::vector<float> y(size_t(T * Hv * dv));
  gated_rms_norm(o.data(), z.data(), w.norm.data(), T * Hv, dv, c.rms_norm_eps, y.data());
  linear(w.out_proj, y.data(), T, out);
}

}  // namespace lily::cpu
