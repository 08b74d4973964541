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
// The math and its order per token are the decode step's (attention_step.cpp). A block of
// several sequences (attention_runs: runs of rows, each with its cache and first position) does
// steps 3 and 4 per run: each token at its own position, over its own cache; a run of one token
// reads its keys in place (attend_heads, as the decode step), a longer one transposes them first.
#include <algorithm>
#include <cmath>

#include "backend/cpu_fast/prefill.h"
#include "base/thread_team.h"

namespace lily::cpu_fast {

namespace {

// Where each row of the block is: its run and its position (the runs checked against the block).
struct RowPlaces {
  std::vector<int32_t> run;  // [T]
  std::vector<int64_t> position;
};

RowPlaces place_rows(std::span<const AttentionRun> runs, int64_t T) {
  check_runs(runs, T, "attention_runs");
  RowPlaces p;
  for (size_t r = 0; r < runs.size(); ++r)
    for (int64_t t = 0; t < runs[r].rows; ++t) {
      p.run.push_back(int32_t(r));
      p.position.push_back(runs[r].first_position + t);
    }
  return p;
}

}  // namespace

void attention_prefill(const AttentionWeights& w, const ModelConfig& c, cpu::AttentionCache& cache,
                       int64_t first_position, const float* x, int64_t T, float* out, PrefillScratch& s) {
  const AttentionRun run{&cache, first_position, 0, T};
  attention_runs(w, c, std::span(&run, 1), x, T, out, s);
}

void attention_runs(const AttentionWeights& w, const ModelConfig& c, std::span<const AttentionRun> runs, const float* x,
                    int64_t T, float* out, PrefillScratch& s) {
  const int64_t H = c.hidden_size, nq = c.num_attention_heads, nkv = c.num_key_value_heads, d = c.head_dim;
  const int64_t group = nq / nkv;
  const RowPlaces rows = place_rows(runs, T);
  ThreadTeam& team = cpu_team();
  std::vector<float>&qg = s.a, &q = s.b, &k = s.c, &v = s.d,
  &o = s.e;  // [T, nq, 2d], [T, nq, d], [T, nkv, d] x 2, [T, nq, d]
  qg.resize(size_t(T * nq * 2 * d));
  q.resize(size_t(T * nq * d));
  k.resize(size_t(T * nkv * d));
  v.resize(size_t(T * nkv * d));
  o.resize(size_t(T * nq * d));
  s.gemm.resize(size_t(team.size()));
  // The AVX-512 heads read each KV head's keys transposed, [d, keys] padded with zeros to 16: a
  // run of several tokens has them at keys_at[run] (keys[run] a row), one of a token none.
  const bool avx512_heads = active_isa() == Isa::avx512 && group <= 8 && d % 32 == 0;
  std::vector<int64_t> keys(runs.size(), 0), keys_at(runs.size() + 1, 0);
  int64_t member_scores = 0;  // floats of a member's scores
  for (size_t r = 0; r < runs.size(); ++r) {
    const int64_t length = runs[r].first_position + runs[r].rows;
    if (avx512_heads && runs[r].rows > 1) keys[r] = (length + 15) / 16 * 16;
    keys_at[r + 1] = keys_at[r] + nkv * d * keys[r];
    member_scores = std::max({member_scores, group * length, group * keys[r]});
  }
  // Sized by the context, not the block: this call's own (the backend keeps the others).
  std::vector<float> keys_t(size_t(keys_at.back()), 0.f);          // per run [nkv, d, keys]
  std::vector<float> scores(size_t(team.size() * member_scores));  // [members, ...]
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
      const int64_t position = rows.position[size_t(t)];
      for (int64_t h = 0; h < nq; ++h) std::copy_n(qg.data() + (t * nq + h) * 2 * d, d, qt + h * d);
      cpu::rms_norm(qt, w.q_norm.data(), nq, d, c.rms_norm_eps, qt);
      cpu::rms_norm(kt, w.k_norm.data(), nkv, d, c.rms_norm_eps, kt);
      cpu::apply_rope(qt, 1, nq, d, c.rotary_dim, c.rope_theta, position);
      cpu::apply_rope(kt, 1, nkv, d, c.rotary_dim, c.rope_theta, position);
    }
    m.barrier();
    if (m.index() == 0) {  // each run's rows [first_position, first_position + rows) of its cache
      for (const AttentionRun& run : runs) {
        const auto from = ptrdiff_t(run.row * nkv * d), to = ptrdiff_t((run.row + run.rows) * nkv * d);
        run.cache->k.insert(run.cache->k.end(), k.begin() + from, k.begin() + to);
        run.cache->v.insert(run.cache->v.end(), v.begin() + from, v.begin() + to);
      }
    }
    m.barrier();

    if (keys_at.back() > 0) {
      for (size_t run = 0; run < runs.size(); ++run) {
        if (keys[run] == 0) continue;
        const int64_t length = runs[run].first_position + runs[run].rows;
        const std::vector<float>& cached = runs[run].cache->k;
        float* run_keys = keys_t.data() + keys_at[run];
        const auto [r0, r1] = m.share(nkv * d);  // rows (g, e) of the transposed keys
        for (int64_t r = r0; r < r1; ++r) {
          const int64_t g = r / d, e = r % d;
          for (int64_t j = 0; j < length; ++j) run_keys[r * keys[run] + j] = cached[size_t((j * nkv + g) * d + e)];
        }
      }
      m.barrier();
    }

    // A token's work grows with its position: (token, KV head) pairs dealt in turn keep the
    // members even.
    float* own_scores = scores.data() + m.index() * member_scores;
    for (int64_t i = m.index(); i < T * nkv; i += m.count()) {
      const int64_t t = i / nkv, g = i % nkv, visible = rows.position[size_t(t)] + 1, h0 = t * nq + g * group;
      const size_t run = size_t(rows.run[size_t(t)]);
      const cpu::AttentionCache& cache = *runs[run].cache;
      if (keys[run] > 0) {
        const AttentionHeads heads{q.data() + h0 * d,
                                   d,
                                   qg.data() + h0 * 2 * d + d,
                                   2 * d,
                                   keys_t.data() + keys_at[run] + g * d * keys[run],
                                   keys[run],
                                   cache.v.data() + g * d,
                                   nkv * d,
                                   o.data() + h0 * d,
                                   d,
                                   group,
                                   visible,
                                   d};
        if (detail::attend_heads_avx512(heads, own_scores)) continue;
      }
      attend_heads(q.data() + t * nq * d, qg.data() + t * nq * 2 * d, cache, visible, nkv, g, d, g * group,
                   (g + 1) * group, own_scores, o.data() + t * nq * d);
    }
    m.barrier();

    prepare_share(s.y, m);
    m.barrier();
    const PreparedGemm o_proj[] = {{&w.o_proj, &s.y, out}};
    gemm_share(o_proj, 1, m, scratch);
  });
}

}  // namespace lily::cpu_fast
