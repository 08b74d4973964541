// attention_step.cpp: gated full attention (spec §2.4), one token at `position`, as one
// parallel region of cpu_team() in four phases:
//
//   1. q_proj (queries and gates), k_proj, v_proj               rows split between the members
//   -- barrier --
//   2. member 0: q and k RMSNorm, RoPE, k and v appended to the cache (which may move)
//   -- barrier --
//   3. per query head: softmax(q k^T / sqrt(d)) v, times sigmoid(gate), and the head's part of
//      o_proj's input quantized                 KV heads split (each with its query heads: its
//                                               keys read once), or their query heads where
//                                               there are fewer KV heads than members
//   -- barrier --
//   4. o_proj                                                      rows split
//
// Beyond the projections, the math and its order are the reference's (backend/cpu/attention.cpp).
#include <algorithm>
#include <cmath>

#include "backend/cpu/ops.h"
#include "backend/cpu_fast/gemv.h"
#include "backend/cpu_fast/layers.h"
#include "backend/cpu_fast/prefill.h"
#include "base/cpu_clones.h"
#include "base/thread_team.h"

namespace lily::cpu_fast {

// The scores' dot products in eight partial sums and the value sums along d, so the compiler
// vectorizes both; cloned per x86-64 level (base/cpu_clones.h).
LILY_CPU_CLONES void attend(const float* qh, const float* gh, const cpu::AttentionCache& cache, int64_t visible,
                            int64_t nkv, int64_t g, int64_t d, float* scores, float* oh) {
  const float scale = 1.f / std::sqrt(float(d));
  float max_score = -INFINITY;
  for (int64_t j = 0; j < visible; ++j) {
    const float* kj = cache.k.data() + (j * nkv + g) * d;
    float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t e = 0;
    for (; e + 8 <= d; e += 8)
      for (int i = 0; i < 8; ++i) part[i] += qh[e + i] * kj[e + i];
    float s = ((part[0] + part[4]) + (part[1] + part[5])) + ((part[2] + part[6]) + (part[3] + part[7]));
    for (; e < d; ++e) s += qh[e] * kj[e];
    scores[j] = s * scale;
    max_score = std::max(max_score, scores[j]);
  }
  double sum = 0;
  for (int64_t j = 0; j < visible; ++j) sum += (scores[j] = std::exp(scores[j] - max_score));
  std::fill(oh, oh + d, 0.f);
  for (int64_t j = 0; j < visible; ++j) {
    const float p = float(scores[j] / sum);
    const float* vj = cache.v.data() + (j * nkv + g) * d;
    for (int64_t e = 0; e < d; ++e) oh[e] += p * vj[e];
  }
  for (int64_t e = 0; e < d; ++e) oh[e] *= cpu::sigmoid(gh[e]);
}

void attend_heads(const float* q, const float* qg, const cpu::AttentionCache& cache, int64_t visible, int64_t nkv,
                  int64_t g, int64_t d, int64_t h0, int64_t h1, float* scores, float* o) {
  if (active_isa() == Isa::avx512) {
    const AttentionHeads heads{q + h0 * d,
                               d,
                               qg + h0 * 2 * d + d,
                               2 * d,
                               cache.k.data() + g * d,
                               nkv * d,
                               cache.v.data() + g * d,
                               nkv * d,
                               o + h0 * d,
                               d,
                               h1 - h0,
                               visible,
                               d};
    if (detail::attend_in_place_avx512(heads, scores)) return;
  }
  for (int64_t h = h0; h < h1; ++h) attend(q + h * d, qg + h * 2 * d + d, cache, visible, nkv, g, d, scores, o + h * d);
}

void attention_step(const AttentionWeights& w, const ModelConfig& c, cpu::AttentionCache& cache, int64_t position,
                    const float* x, float* out, AttentionScratch& s) {
  const int64_t nq = c.num_attention_heads, nkv = c.num_key_value_heads, d = c.head_dim;
  const int64_t group = nq / nkv, visible = position + 1;
  ThreadTeam& team = cpu_team();
  s.qg.resize(size_t(nq * 2 * d));
  s.q.resize(size_t(nq * d));
  s.o.resize(size_t(nq * d));
  s.k.resize(size_t(nkv * d));
  s.v.resize(size_t(nkv * d));
  s.scores.resize(size_t(team.size()));
  for (auto& row : s.scores) row.resize(size_t(group * visible));
  prepare_input(w.q_proj, x, s.x_in);
  reset_input_for(w.o_proj, s.o.data(), s.o_in);
  const int64_t G = s.o_in.group_size;
  const bool heads_quantize = G == 0 || d % G == 0;  // a head's part of o is whole groups

  team.run([&](ThreadTeam::Member& m) {
    const PreparedGemv projections[] = {
        {&w.q_proj, &s.x_in, s.qg.data()}, {&w.k_proj, &s.x_in, s.k.data()}, {&w.v_proj, &s.x_in, s.v.data()}};
    gemv_share(projections, m);
    m.barrier();

    if (m.index() == 0) {
      for (int64_t h = 0; h < nq; ++h) std::copy_n(s.qg.data() + h * 2 * d, d, s.q.data() + h * d);
      cpu::rms_norm(s.q.data(), w.q_norm.data(), nq, d, c.rms_norm_eps, s.q.data());
      cpu::rms_norm(s.k.data(), w.k_norm.data(), nkv, d, c.rms_norm_eps, s.k.data());
      cpu::apply_rope(s.q.data(), 1, nq, d, c.rotary_dim, c.rope_theta, position);
      cpu::apply_rope(s.k.data(), 1, nkv, d, c.rotary_dim, c.rope_theta, position);
      cache.k.insert(cache.k.end(), s.k.begin(), s.k.end());
      cache.v.insert(cache.v.end(), s.v.begin(), s.v.end());
    }
    m.barrier();

    // Each KV head's query heads together (its keys and values read once), cut in `parts` where
    // there are fewer KV heads than members.
    const int64_t parts = std::clamp<int64_t>((m.count() + nkv - 1) / nkv, 1, group);
    const auto [u0, u1] = m.share(nkv * parts);
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t g = u / parts, h0 = g * group + group * (u % parts) / parts;
      const int64_t h1 = g * group + group * (u % parts + 1) / parts;
      attend_heads(s.q.data(), s.qg.data(), cache, visible, nkv, g, d, h0, h1, s.scores[size_t(m.index())].data(),
                   s.o.data());
      if (G > 0 && heads_quantize) quantize_groups(s.o_in, h0 * d / G, h1 * d / G);
    }
    if (G > 0 && !heads_quantize) {
      m.barrier();
      if (m.index() == 0) quantize_groups(s.o_in, 0, nq * d / G);
    }
    m.barrier();

    const PreparedGemv o_proj[] = {{&w.o_proj, &s.o_in, out}};
    gemv_share(o_proj, m);
  });
}

}  // namespace lily::cpu_fast
