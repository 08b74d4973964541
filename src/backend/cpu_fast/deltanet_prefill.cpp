// deltanet_prefill.cpp: the Gated DeltaNet layer (spec §2.6) over T tokens, as one parallel
// region of cpu_team():
//
//   1. x's tokens prepared                                              tokens split
//   2. in_proj_qkv, in_proj_z, in_proj_b, in_proj_a against all tokens   panels split
//   3. causal conv + SiLU over the tokens, the conv state to the last K-1 inputs, q and k heads
//      l2-normalised                                                    channels split by key head
//   4. per value head, token by token: the delta rule on its state (delta_rule_tokens), the
//      gated RMSNorm                                                    heads split
//   5. y's tokens prepared; out_proj against all tokens                 tokens, then panels split
//
// The math and its order per token are the decode step's (deltanet_step.cpp). A block of
// several sequences (deltanet_runs: runs of rows, each with its state) does steps 3 and 4 per
// run, on the run's own conv and SSM state. A run with states to keep (DeltaNetRun::kept, for
// SequenceState::rewind) copies its rows of X in step 3 and the kept rows' S in step 4.
#include <algorithm>
#include <cmath>

#include "backend/cpu_fast/fast_math.h"
#include "backend/cpu_fast/prefill.h"
#include "base/cpu_clones.h"
#include "base/thread_team.h"

namespace lily::cpu_fast {

namespace {

using cpu::l2_normalize;
using cpu::sigmoid;
using cpu::softplus;

// The conv weights of channels c0 .. c1 by tap, wt [K, c1 - c0]: once a layer, for every run.
void taps_by_channel(const float* weight, int64_t K, int64_t c0, int64_t c1, float* wt) {
  const int64_t n = c1 - c0;
  for (int64_t i = 0; i < K; ++i)
    for (int64_t ch = 0; ch < n; ++ch) wt[i * n + ch] = weight[(c0 + ch) * K + i];
}

// Channels [c0, c1) of the causal depthwise conv over X = [state (K-1 rows) ; mixed (T rows)],
// then SiLU: u[t, ch] = silu(sum_i w[ch, i] X[t + i, ch]); the state becomes X's last K-1 rows.
// Token by token along the channels, which the compiler vectorizes (cloned per x86-64 level).
// wt: [K, c1 - c0], the weights by tap (taps_by_channel). With kept.rows > 0, X's rows
// kept.first_row + 1 .. into kept.conv (ops.h's DeltaNetKept), before the state moves.
LILY_CPU_CLONES void conv_channels(const float* wt, int64_t C, int64_t K, float* state, const float* mixed, int64_t T,
                                   int64_t c0, int64_t c1, float* u, const cpu::DeltaNetKept& kept) {
  const int64_t n = c1 - c0;
  auto X = [&](int64_t row) { return row < K - 1 ? state + row * C + c0 : mixed + (row - (K - 1)) * C + c0; };
  for (int64_t t = 0; t < T; ++t) {
    float* ut = u + t * C + c0;
    for (int64_t ch = 0; ch < n; ++ch) ut[ch] = 0.f;
    for (int64_t i = 0; i < K; ++i) {
      const float* xi = X(t + i);
      const float* wi = wt + i * n;
      for (int64_t ch = 0; ch < n; ++ch) ut[ch] += wi[ch] * xi[ch];
    }
    for (int64_t ch = 0; ch < n; ++ch) ut[ch] = silu_approx(ut[ch]);
  }
  for (int64_t r = 0; kept.rows > 0 && r < kept.rows + K - 2; ++r)
    std::copy_n(X(kept.first_row + 1 + r), n, kept.conv + r * C + c0);
  // The new state: rows T .. T + K - 2 of X, oldest first (state rows are read before written).
  for (int64_t r = 0; r < K - 1; ++r) {
    const float* src = X(T + r);
    float* dst = state + r * C + c0;
    if (src != dst) std::copy_n(src, n, dst);
  }
}

// The gated RMSNorm of one head's row (spec §2.2.2, as cpu::gated_rms_norm, the sum of squares
// in float partial sums): y = (o * rsqrt(mean(o^2) + eps) * w) * silu(z).
LILY_CPU_CLONES void gated_norm(const float* o, const float* z, const float* w, int64_t n, float eps, float* y) {
  float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) part[j] += o[i + j] * o[i + j];
  float ss = ((part[0] + part[4]) + (part[1] + part[5])) + ((part[2] + part[6]) + (part[3] + part[7]));
  for (; i < n; ++i) ss += o[i] * o[i];
  const float inv = 1.f / std::sqrt(ss / float(n) + eps);
  for (i = 0; i < n; ++i) y[i] = w[i] * (o[i] * inv) * silu_approx(z[i]);
}

}  // namespace

void prepare_share(TokenBatch& x, const ThreadTeam::Member& m) {
  const auto [t0, t1] = m.share(x.n);
  prepare_tokens(x, t0, t1);
}

void deltanet_prefill(const DeltaNetWeights& w, const ModelConfig& c, cpu::DeltaNetCache& cache, const float* x,
                      int64_t T, float* out, PrefillScratch& s) {
  const DeltaNetRun run{&cache, 0, T, {}};
  deltanet_runs(w, c, std::span(&run, 1), x, T, out, s);
}

void deltanet_runs(const DeltaNetWeights& w, const ModelConfig& c, std::span<const DeltaNetRun> runs, const float* x,
                   int64_t T, float* out, PrefillScratch& s) {
  const int64_t H = c.hidden_size, Hk = c.linear_num_key_heads, Hv = c.linear_num_value_heads;
  const int64_t dk = c.linear_key_head_dim, dv = c.linear_value_head_dim;
  const int64_t C = c.linear_conv_dim(), K = c.linear_conv_kernel_dim, key_dim = Hk * dk, V = Hv * dv;
  check_runs(runs, T, "deltanet_runs");
  for (const DeltaNetRun& run : runs)
    LILY_CHECK(run.kept.rows == 0 || (run.kept.first_row >= 0 && run.kept.first_row + run.kept.rows <= run.rows &&
                                      run.kept.conv && run.kept.ssm),
               "internal: DeltaNet states kept after rows [{}, +{}) of a run of {}", run.kept.first_row, run.kept.rows,
               run.rows);
  ThreadTeam& team = cpu_team();
  std::vector<float>&mixed = s.a, &z = s.b, &ba = s.c, &u = s.d, &o = s.e;  // [T, C], [T, V], [T, 2 Hv], [T, C], [T, V]
  mixed.resize(size_t(T * C));
  z.resize(size_t(T * V));
  ba.resize(size_t(T * 2 * Hv));
  u.resize(size_t(T * C));
  o.resize(size_t(2 * T * V));  // o, then y = gated_rms_norm(o, z)
  float *b = ba.data(), *a = ba.data() + T * Hv, *y = o.data() + T * V;
  s.gemm.resize(size_t(team.size()));
  s.member.resize(size_t(team.size()));
  for (auto& m : s.member) m.resize(size_t(std::max(2 * dv + 2 * T, K * C)));
  reset_tokens(x, T, H, s.x);
  reset_tokens(y, T, V, s.y);
  // A conv state shifted in place needs all of the old rows read before any is written: a
  // member's channels are its own, so each member's conv_channels reads and writes only them.

  team.run([&](ThreadTeam::Member& m) {
    GemmScratch& scratch = s.gemm[size_t(m.index())];
    prepare_share(s.x, m);
    m.barrier();
    const PreparedGemm projections[] = {{&w.in_proj_qkv, &s.x, mixed.data()},
                                        {&w.in_proj_z, &s.x, z.data()},
                                        {&w.in_proj_b, &s.x, b},
                                        {&w.in_proj_a, &s.x, a}};
    gemm_share(projections, 4, m, scratch);
    m.barrier();

    const float q_scale = 1.f / std::sqrt(float(dk));
    const auto [c0, c1] = m.share(C, dk);  // whole key heads: q and k heads start at multiples of dk
    if (c0 < c1) {
      float* wt = s.member[size_t(m.index())].data();
      taps_by_channel(w.conv1d.data(), K, c0, c1, wt);
      for (const DeltaNetRun& run : runs)
        conv_channels(wt, C, K, run.cache->conv.data(), mixed.data() + run.row * C, run.rows, c0, c1,
                      u.data() + run.row * C, run.kept);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t ch = c0; ch < std::min(c1, 2 * key_dim); ch += dk)
          l2_normalize(u.data() + t * C + ch, dk, ch < key_dim ? q_scale : 1.f);
    }
    m.barrier();

    const int64_t heads_per_key = Hv / Hk;
    float* scratch_m = s.member[size_t(m.index())].data();  // [2 dv] delta_rule_step's m and r, then [2 T] g, beta
    float *g = scratch_m + 2 * dv, *beta = g + T;
    const auto [h0, h1] = m.share(Hv);
    for (int64_t h = h0; h < h1; ++h) {
      const int64_t kh = h / heads_per_key;
      for (const DeltaNetRun& run : runs) {
        for (int64_t t = 0; t < run.rows; ++t) {
          const int64_t row = run.row + t;
          beta[t] = sigmoid(b[row * Hv + h]);
          g[t] = -std::exp(w.A_log[size_t(h)]) * softplus(a[row * Hv + h] + w.dt_bias[size_t(h)]);
        }
        const float* ut = u.data() + run.row * C;
        const cpu::DeltaRuleInputs in{
            ut + kh * dk, ut + key_dim + kh * dk, ut + 2 * key_dim + h * dv, g, beta, C, C, C, 1, run.rows, dk, dv};
        const KeptStates kept{run.kept.ssm ? run.kept.ssm + h * dk * dv : nullptr, run.kept.first_row, run.kept.rows,
                              Hv * dk * dv};
        delta_rule_tokens(in, run.cache->ssm.data() + h * dk * dv, o.data() + run.row * V + h * dv, V, scratch_m,
                          scratch_m + dv, kept);
      }
      for (int64_t t = 0; t < T; ++t)
        gated_norm(o.data() + t * V + h * dv, z.data() + t * V + h * dv, w.norm.data(), dv, c.rms_norm_eps,
                   y + t * V + h * dv);
    }
    m.barrier();

    prepare_share(s.y, m);
    m.barrier();
    const PreparedGemm out_proj[] = {{&w.out_proj, &s.y, out}};
    gemm_share(out_proj, 1, m, scratch);
  });
}

}  // namespace lily::cpu_fast
