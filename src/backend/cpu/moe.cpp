// moe.cpp: the sparse MoE block with its gated shared expert (spec §2.7).
//
//   p = softmax(x @ Wr^T)                        fp32 over E experts
//   S = top-k of p;  w_e = p_e / sum_{S} p       (always renormalised)
//   y = sum_{e in S} w_e * down_e(silu(gate_e x) * up_e x)  +  sigmoid(x . w_sg) * shared(x)
// Tokens are grouped by expert so each expert's weights are expanded once per block.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/cpu/ops.h"

namespace lily::cpu {

namespace {

struct Routing {
  std::vector<int> experts;    // [T, k]
  std::vector<float> weights;  // [T, k]
};

Routing route(const MoeWeights& w, const ModelConfig& c, const float* x, int64_t T) {
  const int64_t E = c.num_experts, k = c.num_experts_per_tok;
  std::vector<float> logits(size_t(T * E));
  linear(w.router, x, T, logits.data());
  Routing r;
  r.experts.resize(size_t(T * k));
  r.weights.resize(size_t(T * k));
  for (int64_t t = 0; t < T; ++t)
    route_top_k(logits.data() + t * E, E, k, r.experts.data() + t * k, r.weights.data() + t * k);
  return r;
}

}  // namespace

void route_top_k(const float* logits, int64_t E, int64_t k, int* experts, float* weights) {
  const float max_logit = *std::max_element(logits, logits + E);
  std::vector<float> p(static_cast<size_t>(E));
  double sum = 0;
  for (int64_t e = 0; e < E; ++e) sum += (p[size_t(e)] = std::exp(logits[e] - max_logit));
  for (auto& v : p) v = float(v / sum);
  std::vector<int> order(static_cast<size_t>(E));
  std::iota(order.begin(), order.end(), 0);
  // Ties go to the lower expert index.
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int a, int b) {
    return p[size_t(a)] > p[size_t(b)] || (p[size_t(a)] == p[size_t(b)] && a < b);
  });
  float chosen = 0;
  for (int64_t i = 0; i < k; ++i) chosen += p[size_t(order[size_t(i)])];
  for (int64_t i = 0; i < k; ++i) {
    experts[i] = order[size_t(i)];
    weights[i] = p[size_t(order[size_t(i)])] / chosen;
  }
}

namespace {

// SwiGLU MLP on n rows: out[n, H] = down(silu(gate x) * up x).
void swiglu_mlp(const Matrix& gate, const Matrix& up, const Matrix& down, const float* x, int64_t n, float* out) {
  const int64_t I = gate.rows;
  std::vector<float> g(size_t(n * I)), u(size_t(n * I));
  linear(gate, x, n, g.data());
  linear(up, x, n, u.data());
  for (size_t i = 0; i < g.size(); ++i) g[i] = silu(g[i]) * u[i];
  linear(down, g.data(), n, out);
}

}  // namespace

void sparse_moe(const MoeWeights& w, const ModelConfig& c, const float* x, int64_t T, float* out) {
  const int64_t H = c.hidden_size, E = c.num_experts, k = c.num_experts_per_tok;
  const Routing r = route(w, c, x, T);

  // Shared expert, gated per token: out = sigmoid(x . w_sg) * shared(x).
  swiglu_mlp(w.shared_gate_proj, w.shared_up_proj, w.shared_down_proj, x, T, out);
  std::vector<float> gate_logit(static_cast<size_t>(T));
  linear(w.shared_expert_gate, x, T, gate_logit.data());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < H; ++i) out[t * H + i] *= sigmoid(gate_logit[size_t(t)]);

  // Routed experts: gather each expert's tokens, run its MLP once, scatter-add weighted rows.
  std::vector<std::vector<std::pair<int64_t, float>>> assigned(static_cast<size_t>(E));  // expert -> (token, weight)
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < k; ++i)
      assigned[size_t(r.experts[size_t(t * k + i)])].push_back({t, r.weights[size_t(t * k + i)]});
  std::vector<float> xs, ys;
  for (int64_t e = 0; e < E; ++e) {
    const auto& rows = assigned[size_t(e)];
    if (rows.empty()) continue;
    const int64_t n = int64_t(rows.size());
    xs.resize(size_t(n * H));
    ys.resize(size_t(n * H));
    for (int64_t i = 0; i < n; ++i)
      std::copy(x + rows[size_t(i)].first * H, x + (rows[size_t(i)].first + 1) * H, xs.begin() + i * H);
    swiglu_mlp(w.experts.gate_proj[size_t(e)], w.experts.up_proj[size_t(e)], w.experts.down_proj[size_t(e)], xs.data(),
               n, ys.data());
    for (int64_t i = 0; i < n; ++i) {
      float* dst = out + rows[size_t(i)].first * H;
      const float weight = rows[size_t(i)].second;
      for (int64_t j = 0; j < H; ++j) dst[j] += weight * ys[size_t(i * H + j)];
    }
  }
}

}  // namespace lily::cpu
