// layers.cpp: the decode step of each layer kind on the GEMV kernels (see layers.h). Beyond the
// projections, the math is the reference's (backend/cpu/attention.cpp, deltanet.cpp, moe.cpp)
// in the same order of operations, so the two differ only by the GEMV's rounding.
#include "backend/cpu_fast/layers.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/cpu_fast/gemv.h"
#include "base/thread_pool.h"

namespace lily::cpu_fast {

namespace {

using cpu::sigmoid;
using cpu::silu;
using cpu::softplus;

// The recurrent state of all heads is worth a fork-join from this many values on.
constexpr int64_t kParallelStateValues = 256 * 1024;

// x * rsqrt(sum(x^2) + 1e-6) * scale, over n values (as deltanet.cpp).
void l2_normalize(float* x, int64_t n, float scale) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += double(x[i]) * x[i];
  const float inv = 1.f / std::sqrt(float(ss) + 1e-6f) * scale;
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

}  // namespace

void attention_step(const AttentionWeights& w, const ModelConfig& c, cpu::AttentionCache& cache, int64_t position,
                    const float* x, float* out) {
  const int64_t nq = c.num_attention_heads, nkv = c.num_key_value_heads, d = c.head_dim;
  const int64_t group = nq / nkv;
  std::vector<float> qg(size_t(nq * 2 * d)), q(size_t(nq * d)), gate(size_t(nq * d));
  std::vector<float> k(size_t(nkv * d)), v(size_t(nkv * d));
  const GemvTask projections[] = {{&w.q_proj, x, qg.data()}, {&w.k_proj, x, k.data()}, {&w.v_proj, x, v.data()}};
  gemv_parallel(projections);
  for (int64_t h = 0; h < nq; ++h) {
    const float* src = qg.data() + h * 2 * d;
    std::copy(src, src + d, q.data() + h * d);
    std::copy(src + d, src + 2 * d, gate.data() + h * d);
  }
  cpu::rms_norm(q.data(), w.q_norm.data(), nq, d, c.rms_norm_eps, q.data());
  cpu::rms_norm(k.data(), w.k_norm.data(), nkv, d, c.rms_norm_eps, k.data());
  cpu::apply_rope(q.data(), 1, nq, d, c.rotary_dim, c.rope_theta, position);
  cpu::apply_rope(k.data(), 1, nkv, d, c.rotary_dim, c.rope_theta, position);
  cache.k.insert(cache.k.end(), k.begin(), k.end());
  cache.v.insert(cache.v.end(), v.begin(), v.end());

  const int64_t visible = position + 1;
  std::vector<float> o(static_cast<size_t>(nq * d)), scores(static_cast<size_t>(visible));
  const float scale = 1.f / std::sqrt(float(d));
  for (int64_t h = 0; h < nq; ++h) {
    const int64_t g = h / group;
    const float* qh = q.data() + h * d;
    float max_score = -INFINITY;
    for (int64_t j = 0; j < visible; ++j) {
      const float* kj = cache.k.data() + (j * nkv + g) * d;
      float s = 0;
      for (int64_t e = 0; e < d; ++e) s += qh[e] * kj[e];
      scores[size_t(j)] = s * scale;
      max_score = std::max(max_score, scores[size_t(j)]);
    }
    double sum = 0;
    for (int64_t j = 0; j < visible; ++j) sum += (scores[size_t(j)] = std::exp(scores[size_t(j)] - max_score));
    float* oh = o.data() + h * d;
    for (int64_t j = 0; j < visible; ++j) {
      const float p = float(scores[size_t(j)] / sum);
      const float* vj = cache.v.data() + (j * nkv + g) * d;
      for (int64_t e = 0; e < d; ++e) oh[e] += p * vj[e];
    }
    const float* gh = gate.data() + h * d;
    for (int64_t e = 0; e < d; ++e) oh[e] *= sigmoid(gh[e]);
  }
  linear(w.o_proj, o.data(), 1, out);
}

void delta_rule_step(const float* q, const float* k, const float* v, float g, float beta, int64_t dk, int64_t dv,
                     float* S, float* o) {
  const float alpha = std::exp(g);
  std::vector<float> m(size_t(dv), 0.f);
  for (int64_t a = 0; a < dk; ++a) {
    float* Sa = S + a * dv;
    const float ka = k[a];
    for (int64_t b = 0; b < dv; ++b) {
      Sa[b] *= alpha;
      m[size_t(b)] += Sa[b] * ka;
    }
  }
  for (int64_t b = 0; b < dv; ++b) m[size_t(b)] = beta * (v[b] - m[size_t(b)]);
  std::fill(o, o + dv, 0.f);
  for (int64_t a = 0; a < dk; ++a) {
    float* Sa = S + a * dv;
    const float ka = k[a], qa = q[a];
    for (int64_t b = 0; b < dv; ++b) {
      Sa[b] += ka * m[size_t(b)];
      o[b] += Sa[b] * qa;
    }
  }
}

void deltanet_step(const DeltaNetWeights& w, const ModelConfig& c, cpu::DeltaNetCache& cache, const float* x,
                   float* out) {
  const int64_t Hk = c.linear_num_key_heads, Hv = c.linear_num_value_heads;
  const int64_t dk = c.linear_key_head_dim, dv = c.linear_value_head_dim;
  const int64_t C = c.linear_conv_dim(), K = c.linear_conv_kernel_dim, key_dim = Hk * dk;
  std::vector<float> mixed(static_cast<size_t>(C)), z(size_t(Hv * dv)), b(static_cast<size_t>(Hv)),
      a(static_cast<size_t>(Hv));
  const GemvTask projections[] = {{&w.in_proj_qkv, x, mixed.data()},
                                  {&w.in_proj_z, x, z.data()},
                                  {&w.in_proj_b, x, b.data()},
                                  {&w.in_proj_a, x, a.data()}};
  gemv_parallel(projections);

  // Causal depthwise conv over [state (K-1 rows) ; mixed], then SiLU; the state drops its oldest row.
  std::vector<float> u(static_cast<size_t>(C));
  float* state = cache.conv.data();
  for (int64_t ch = 0; ch < C; ++ch) {
    const float* wc = w.conv1d.data() + ch * K;
    float s = 0;
    for (int64_t i = 0; i < K - 1; ++i) s += wc[i] * state[i * C + ch];
    s += wc[K - 1] * mixed[size_t(ch)];
    u[size_t(ch)] = silu(s);
  }
  if (K > 1) {
    std::copy(state + C, state + (K - 1) * C, state);
    std::copy(mixed.begin(), mixed.end(), state + (K - 2) * C);
  }

  const float q_scale = 1.f / std::sqrt(float(dk));
  for (int64_t h = 0; h < Hk; ++h) {
    l2_normalize(u.data() + h * dk, dk, q_scale);
    l2_normalize(u.data() + key_dim + h * dk, dk, 1.f);
  }
  std::vector<float> o(size_t(Hv * dv));
  const int64_t heads_per_key = Hv / Hk;
  auto heads = [&](int64_t h0, int64_t h1) {
    for (int64_t h = h0; h < h1; ++h) {
      const int64_t kh = h / heads_per_key;
      const float beta = sigmoid(b[size_t(h)]);
      const float g = -std::exp(w.A_log[size_t(h)]) * softplus(a[size_t(h)] + w.dt_bias[size_t(h)]);
      delta_rule_step(u.data() + kh * dk, u.data() + key_dim + kh * dk, u.data() + 2 * key_dim + h * dv, g, beta, dk,
                      dv, cache.ssm.data() + h * dk * dv, o.data() + h * dv);
    }
  };
  if (Hv * dk * dv >= kParallelStateValues) parallel_for(Hv, 1, heads);
  else heads(0, Hv);

  std::vector<float> y(size_t(Hv * dv));
  cpu::gated_rms_norm(o.data(), z.data(), w.norm.data(), Hv, dv, c.rms_norm_eps, y.data());
  linear(w.out_proj, y.data(), 1, out);
}

void moe_step(const MoeWeights& w, const ModelConfig& c, const float* x, float* out) {
  const int64_t H = c.hidden_size, E = c.num_experts, k = c.num_experts_per_tok;
  // Routing as moe.cpp: softmax in fp32 with a double sum, top-k with ties to the lower index, renormalised.
  std::vector<float> p(static_cast<size_t>(E));
  gemv(w.router, x, p.data());
  const float max_logit = *std::max_element(p.begin(), p.end());
  double sum = 0;
  for (auto& v : p) sum += (v = std::exp(v - max_logit));
  for (auto& v : p) v = float(v / sum);
  std::vector<int> order(static_cast<size_t>(E));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int i, int j) {
    return p[size_t(i)] > p[size_t(j)] || (p[size_t(i)] == p[size_t(j)] && i < j);
  });
  float chosen = 0;
  for (int64_t i = 0; i < k; ++i) chosen += p[size_t(order[size_t(i)])];
  std::sort(order.begin(), order.begin() + k);  // the reference adds experts in index order

  // Tasks 0..k-1: routed experts; task k: the shared expert. Each streams its own matrices.
  const int64_t I_max = std::max<int64_t>(c.moe_intermediate_size, c.shared_expert_intermediate_size);
  std::vector<float> ys(size_t((k + 1) * H)), gu(size_t((k + 1) * 2 * I_max));
  auto expert = [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const bool shared = i == k;
      const size_t e = shared ? 0 : size_t(order[size_t(i)]);
      const Matrix& gate = shared ? w.shared_gate_proj : w.experts.gate_proj[e];
      const Matrix& up = shared ? w.shared_up_proj : w.experts.up_proj[e];
      const Matrix& down = shared ? w.shared_down_proj : w.experts.down_proj[e];
      float* g = gu.data() + i * 2 * I_max;
      float* u = g + I_max;
      gemv(gate, x, g);
      gemv(up, x, u);
      for (int64_t j = 0; j < gate.rows; ++j) g[j] = silu(g[j]) * u[j];
      gemv(down, g, ys.data() + i * H);
    }
  };
  parallel_for(k + 1, 1, expert);

  float gate_logit = 0;
  gemv(w.shared_expert_gate, x, &gate_logit);
  const float shared_weight = sigmoid(gate_logit);
  const float* shared = ys.data() + k * H;
  for (int64_t j = 0; j < H; ++j) out[j] = shared[j] * shared_weight;
  for (int64_t i = 0; i < k; ++i) {
    const float weight = p[size_t(order[size_t(i)])] / chosen;
    const float* y = ys.data() + i * H;
    for (int64_t j = 0; j < H; ++j) out[j] += weight * y[j];
  }
}

}  // namespace lily::cpu_fast
