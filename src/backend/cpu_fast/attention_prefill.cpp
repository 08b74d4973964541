// attention_prefill.cpp: gated full attention (spec §2.4) over T tokens, as one parallel
// region of cpu_team():
//
//   1. x's tokens prepared                                              tokens split
//   2. q_proj (queries and gates), k_proj, v_proj against all tokens     panels split
//   3. q and k RMSNorm and RoPE                                          tokens split
//      member 0: k and v appended to the cache (which may move)
//   4. per (token, KV head), its query heads together: softmax(q k^T / sqrt(d)) v over the
//      positions up to the token's, times sigmoid(gate) (AVX-512: attention_avx512.cpp, the
//      keys transposed first; else attend per head)                     pairs dealt in turn
//   5. o's tokens prepared; o_proj against all tokens                   tokens, then panels split
//
// The math and its order per token are the decode step's (attention_step.cpp).
#include <algorithm>
#include <cmath>

#include "backend/cpu_fast/prefill.h"
#include "base/thread_team.h"

namespace lily::cpu_fast {

void attention_prefill(const AttentionWeights& w, const ModelConfig& c, cpu::AttentionCache& cache,
                       int64_t first_position, const float* x, int64_t T, float* out, PrefillScratch& s) {
  const int64_t H = c.hidden_size, nq = c.num_attention_heads, nkv = c.num_key_value_heads, d = c.head_dim;
  const int64_t group = nq / nkv, length = first_position + T;
  ThreadTeam& team = cpu_team();
  std::vector<float>&qg = s.a, &q = s.b, &k = s.c, &v = s.d,
  &o = s.e;  // [T, nq, 2d], [T, nq, d], [T, nkv, d] x 2, [T, nq, d]
  qg.resize(size_t(T * nq * 2 * d));
  q.resize(size_t(T * nq * d));
  k.resize(size_t(T * nkv * d));
  v.resize(size_t(T * nkv * d));
  o.resize(size_t(T * nq * d));
  s.gemm.resize(size_t(team.size()));
  // The AVX-512 heads read each KV head's keys transposed, [d, keys] padded with zeros to 16.
  const bool grouped = active_isa() == Isa::avx512 && group <= 8 && d % 32 == 0;
  const int64_t keys = (length + 15) / 16 * 16;
  // Sized by the context, not the block: this call's own (the backend keeps the others).
  std::vector<float> keys_t(grouped ? size_t(nkv * d * keys) : 0, 0.f);             // [nkv, d, keys]
  std::vector<float> scores(size_t(team.size() * std::max(length, group * keys)));  // [members, ...]
  reset_tokens(x, T, H, s.x);
  reset_tokens(o.data(), T, nq * d, s.y);

  team.run([&](ThreadTeam::Member& m) {
    GemmScratch& scratch = s.gemm[size_t(m.index())];
    prepare_share(s.x, m);
    m.barrier();
    const PreparedGemm projections[] = {
        {&w.q_proj, &s.x, qg.data()}, {&w.k_proj, &s.x, k.data()}, {&w.v_proj, &s.x, v.data()}};
    gemm_share(projections, 3, m, scratch);
    m.barrier();

    const auto [t0, t1] = m.share(T);
    for (int64_t t = t0; t < t1; ++t) {
      float *qt = q.data() + t * nq * d, *kt = k.data() + t * nkv * d;
      for (int64_t h = 0; h < nq; ++h) std::copy_n(qg.data() + (t * nq + h) * 2 * d, d, qt + h * d);
      cpu::rms_norm(qt, w.q_norm.data(), nq, d, c.rms_norm_eps, qt);
      cpu::rms_norm(kt, w.k_norm.data(), nkv, d, c.rms_norm_eps, kt);
      cpu::apply_rope(qt, 1, nq, d, c.rotary_dim, c.rope_theta, first_position + t);
      cpu::apply_rope(kt, 1, nkv, d, c.rotary_dim, c.rope_theta, first_position + t);
    }
    m.barrier();
    if (m.index() == 0) {  // rows [first_position, length) of the cache
      cache.k.insert(cache.k.end(), k.begin(), k.end());
      cache.v.insert(cache.v.end(), v.begin(), v.end());
    }
    m.barrier();

    if (grouped) {
      const auto [r0, r1] = m.share(nkv * d);  // rows (g, e) of the transposed keys
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t g = r / d, e = r % d;
        for (int64_t j = 0; j < length; ++j) keys_t[size_t(r * keys + j)] = cache.k[size_t((j * nkv + g) * d + e)];
      }
      m.barrier();
    }

    // A token's work grows with its position: (token, KV head) pairs dealt in turn keep the
    // members even.
    float* member_scores = scores.data() + m.index() * std::max(length, group * keys);
    for (int64_t i = m.index(); i < T * nkv; i += m.count()) {
      const int64_t t = i / nkv, g = i % nkv, visible = first_position + t + 1, h0 = t * nq + g * group;
      const AttentionHeads heads{q.data() + h0 * d,
                                 d,
                                 qg.data() + h0 * 2 * d + d,
                                 2 * d,
                                 keys_t.data() + g * d * keys,
                                 keys,
                                 cache.v.data() + g * d,
                                 nkv * d,
                                 o.data() + h0 * d,
                                 d,
                                 group,
                                 visible,
                                 d};
      if (grouped && detail::attend_heads_avx512(heads, member_scores)) continue;
      for (int64_t h = h0; h < h0 + group; ++h)
        attend(q.data() + h * d, qg.data() + h * 2 * d + d, cache, visible, nkv, g, d, member_scores, o.data() + h * d);
    }
    m.barrier();

    prepare_share(s.y, m);
    m.barrier();
    const PreparedGemm o_proj[] = {{&w.o_proj, &s.y, out}};
    gemm_share(o_proj, 1, m, scratch);
  });
}

}  // namespace lily::cpu_fast
