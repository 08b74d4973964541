// deltanet_step.cpp: the Gated DeltaNet layer (spec §2.6), one token, as one parallel region of
// cpu_team() in four phases:
//
//   1. in_proj_qkv, in_proj_z, in_proj_b, in_proj_a            rows split between the members
//   -- barrier --
//   2. causal conv + SiLU, conv state shifted; q and k heads l2-normalised   channels split in
//      blocks of one key head
//   -- barrier --
//   3. per value head: the delta rule step on its state (delta_rule_tokens), the gated
//      RMSNorm, and the head's part of out_proj's input quantized     heads split
//   -- barrier --
//   4. out_proj                                                  rows split
//
// Beyond the projections, the math and its order are the reference's (backend/cpu/deltanet.cpp).
#include <algorithm>
#include <cmath>

#include "backend/cpu/ops.h"
#include "backend/cpu_fast/gemv.h"
#include "backend/cpu_fast/layers.h"
#include "base/cpu_clones.h"
#include "base/thread_team.h"

namespace lily::cpu_fast {

namespace {

using cpu::l2_normalize;
using cpu::sigmoid;
using cpu::silu;
using cpu::softplus;

// Channels [c0, c1) of the causal depthwise conv over [state (K-1 rows) ; mixed], then SiLU;
// the state drops its oldest row.
void conv_channels(const DeltaNetWeights& w, int64_t C, int64_t K, float* state, const float* mixed, int64_t c0,
                   int64_t c1, float* u) {
  for (int64_t ch = c0; ch < c1; ++ch) {
    const float* wc = w.conv1d.data() + ch * K;
    float s = 0;
    for (int64_t i = 0; i < K - 1; ++i) s += wc[i] * state[i * C + ch];
    s += wc[K - 1] * mixed[ch];
    u[ch] = silu(s);
    for (int64_t i = 0; i + 2 < K; ++i) state[i * C + ch] = state[(i + 1) * C + ch];
    if (K > 1) state[(K - 2) * C + ch] = mixed[ch];
  }
}

}  // namespace

// Pass 1 reads S only, pass 2 writes it once (the reference's form, backend/cpu/gated_delta.cpp,
// scales S, then reads it for S^T k, writes the update, reads it again for S^T q):
//   m = alpha S^T k,  r = alpha S^T q                  S before this token's update
//   d = beta (v - m)                                   the delta rule's correction
//   o = (alpha S + k d^T)^T q = r + d (k . q)          S' = alpha S + k d^T    (pass 2)
// Both passes run along the rows of S (dv contiguous values), which the compiler vectorizes;
// the clones give AVX2 or AVX-512 where the processor has them.
LILY_CPU_CLONES void delta_rule_step(const float* q, const float* k, const float* v, float g, float beta, int64_t dk,
                                     int64_t dv, float* S, float* o, float* __restrict m, float* __restrict r) {
  const float alpha = std::exp(g);
  std::fill(m, m + dv, 0.f);
  std::fill(r, r + dv, 0.f);
  float kq = 0;
  for (int64_t a = 0; a < dk; ++a) {
    const float* __restrict Sa = S + a * dv;
    const float ka = k[a], qa = q[a];
    kq += ka * qa;
    for (int64_t b = 0; b < dv; ++b) {
      m[b] += Sa[b] * ka;
      r[b] += Sa[b] * qa;
    }
  }
  for (int64_t b = 0; b < dv; ++b) {
    m[b] = beta * (v[b] - alpha * m[b]);  // m now holds d
    o[b] = alpha * r[b] + m[b] * kq;
  }
  for (int64_t a = 0; a < dk; ++a) {
    float* __restrict Sa = S + a * dv;
    const float ka = k[a];
    for (int64_t b = 0; b < dv; ++b) Sa[b] = alpha * Sa[b] + ka * m[b];
  }
}

void delta_rule_tokens(const cpu::DeltaRuleInputs& in, float* S, float* o, int64_t o_stride, float* m, float* r,
                       const KeptStates& kept) {
  if (active_isa() == Isa::avx512 && detail::delta_rule_tokens_avx512(in, S, o, o_stride, kept)) return;
  for (int64_t t = 0; t < in.T; ++t) {
    delta_rule_step(in.q + t * in.q_stride, in.k + t * in.k_stride, in.v + t * in.v_stride, in.g[t * in.g_stride],
                    in.beta[t * in.g_stride], in.dk, in.dv, S, o + t * o_stride, m, r);
    if (t >= kept.first && t < kept.first + kept.count)
      std::copy_n(S, in.dk * in.dv, kept.states + (t - kept.first) * kept.stride);
  }
}

void deltanet_step(const DeltaNetWeights& w, const ModelConfig& c, cpu::DeltaNetCache& cache, const float* x,
                   float* out, DeltaNetScratch& s) {
  const int64_t Hk = c.linear_num_key_heads, Hv = c.linear_num_value_heads;
  const int64_t dk = c.linear_key_head_dim, dv = c.linear_value_head_dim;
  const int64_t C = c.linear_conv_dim(), K = c.linear_conv_kernel_dim, key_dim = Hk * dk;
  s.mixed.resize(size_t(C));
  s.u.resize(size_t(C));
  s.z.resize(size_t(Hv * dv));
  s.o.resize(size_t(Hv * dv));
  s.y.resize(size_t(Hv * dv));
  s.m.resize(size_t(Hv * dv));
  s.r.resize(size_t(Hv * dv));
  s.b.resize(size_t(Hv));
  s.a.resize(size_t(Hv));
  prepare_input(w.in_proj_qkv, x, s.x_in);
  reset_input_for(w.out_proj, s.y.data(), s.y_in);
  // A head's part of y is whole groups of out_proj's input when dv is a multiple of the group.
  const int64_t G = s.y_in.group_size;
  const bool heads_quantize = G == 0 || dv % G == 0;

  cpu_team().run([&](ThreadTeam::Member& m) {
    const PreparedGemv projections[] = {{&w.in_proj_qkv, &s.x_in, s.mixed.data()},
                                        {&w.in_proj_z, &s.x_in, s.z.data()},
                                        {&w.in_proj_b, &s.x_in, s.b.data()},
                                        {&w.in_proj_a, &s.x_in, s.a.data()}};
    gemv_share(projections, m);
    m.barrier();

    const float q_scale = 1.f / std::sqrt(float(dk));
    const auto [c0, c1] = m.share(C, dk);  // whole key heads: q and k heads start at multiples of dk
    conv_channels(w, C, K, cache.conv.data(), s.mixed.data(), c0, c1, s.u.data());
    for (int64_t ch = c0; ch < std::min(c1, 2 * key_dim); ch += dk)
      l2_normalize(s.u.data() + ch, dk, ch < key_dim ? q_scale : 1.f);
    m.barrier();

    const int64_t heads_per_key = Hv / Hk;
    const auto [h0, h1] = m.share(Hv);
    for (int64_t h = h0; h < h1; ++h) {
      const int64_t kh = h / heads_per_key;
      const float beta = sigmoid(s.b[size_t(h)]);
      const float g = -std::exp(w.A_log[size_t(h)]) * softplus(s.a[size_t(h)] + w.dt_bias[size_t(h)]);
      const cpu::DeltaRuleInputs in{s.u.data() + kh * dk,
                                    s.u.data() + key_dim + kh * dk,
                                    s.u.data() + 2 * key_dim + h * dv,
                                    &g,
                                    &beta,
                                    0,
                                    0,
                                    0,
                                    0,
                                    1,
                                    dk,
                                    dv};
      delta_rule_tokens(in, cache.ssm.data() + h * dk * dv, s.o.data() + h * dv, 0, s.m.data() + h * dv,
                        s.r.data() + h * dv);
      cpu::gated_rms_norm(s.o.data() + h * dv, s.z.data() + h * dv, w.norm.data(), 1, dv, c.rms_norm_eps,
                          s.y.data() + h * dv);
      if (G > 0 && heads_quantize) quantize_groups(s.y_in, h * dv / G, (h + 1) * dv / G);
    }
    if (G > 0 && !heads_quantize) {
      m.barrier();
      if (m.index() == 0) quantize_groups(s.y_in, 0, Hv * dv / G);
    }
    m.barrier();

    const PreparedGemv out_proj[] = {{&w.out_proj, &s.y_in, out}};
    gemv_share(out_proj, m);
  });
}

}  // namespace lily::cpu_fast
