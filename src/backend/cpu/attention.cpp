// attention.cpp: the gated full-attention layer (spec §2.4), prefill and decode alike.
//
//   qg = x @ Wq^T viewed [T, nq, 2*256]: q = qg[..., :256], gate = qg[..., 256:]  (per head)
//   q, k = RMSNorm_zc(q; q_norm), RMSNorm_zc(k; k_norm), then partial RoPE (64 of 256 dims)
//   o_h = softmax(q_h K_g^T / 16) V_g     causal; g = h / (nq / nkv)
//   y = (o * sigmoid(gate)) @ Wo^T
#include <algorithm>
#include <cmath>

#include "backend/cpu/ops.h"
#include "base/thread_pool.h"

namespace lily::cpu {

void gated_attention(const AttentionWeights& w, const ModelConfig& c, AttentionCache& cache, int64_t first_position,
                     const float* x, int64_t T, float* out) {
  const int64_t H = c.hidden_size, nq = c.num_attention_heads, nkv = c.num_key_value_heads, d = c.head_dim;
  const int64_t group = nq / nkv;

  std::vector<float> qg(size_t(T * nq * 2 * d));  // [T, nq, 2d]
  std::vector<float> q(size_t(T * nq * d));       // [T, nq, d]
  std::vector<float> gate(size_t(T * nq * d));    // [T, nq, d]
  std::vector<float> k(size_t(T * nkv * d));      // [T, nkv, d]
  std::vector<float> v(size_t(T * nkv * d));      // [T, nkv, d]
  linear(w.q_proj, x, T, qg.data());
  linear(w.k_proj, x, T, k.data());
  linear(w.v_proj, x, T, v.data());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < nq; ++h) {
      const float* src = qg.data() + (t * nq + h) * 2 * d;
      std::copy(src, src + d, q.data() + (t * nq + h) * d);
      std::copy(src + d, src + 2 * d, gate.data() + (t * nq + h) * d);
    }
  rms_norm(q.data(), w.q_norm.data(), T * nq, d, c.rms_norm_eps, q.data());
  rms_norm(k.data(), w.k_norm.data(), T * nkv, d, c.rms_norm_eps, k.data());
  apply_rope(q.data(), T, nq, d, c.rotary_dim, c.rope_theta, first_position);
  apply_rope(k.data(), T, nkv, d, c.rotary_dim, c.rope_theta, first_position);

  // Append to the cache: rows [first_position, first_position + T).
  cache.k.insert(cache.k.end(), k.begin(), k.end());
  cache.v.insert(cache.v.end(), v.begin(), v.end());
  const int64_t length = first_position + T;

  std::vector<float> o(size_t(T * nq * d));  // [T, nq, d]
  const float scale = 1.f / std::sqrt(float(d));
  parallel_for(T * nq, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(static_cast<size_t>(length));
    for (int64_t i = begin; i < end; ++i) {
      const int64_t t = i / nq, h = i % nq, g = h / group;
      const int64_t visible = first_position + t + 1;  // causal: keys 0..position
      const float* qh = q.data() + (t * nq + h) * d;
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
      float* oh = o.data() + (t * nq + h) * d;
      std::fill(oh, oh + d, 0.f);
      for (int64_t j = 0; j < visible; ++j) {
        const float p = float(scores[size_t(j)] / sum);
        const float* vj = cache.v.data() + (j * nkv + g) * d;
        for (int64_t e = 0; e < d; ++e) oh[e] += p * vj[e];
      }
      const float* gh = gate.data() + (t * nq + h) * d;
      for (int64_t e = 0; e < d; ++e) oh[e] *= sigmoid(gh[e]);
    }
  });
  linear(w.o_proj, o.data(), T, out);
  (void)H;
}

}  // namespace lily::cpu
