// moe_prefill.cpp: the sparse MoE block with its gated shared expert (spec §2.7) over T tokens,
// as one parallel region of cpu_team():
//
//   1. x's tokens prepared                                                  tokens split
//   2. router, the shared expert's gate logit, its gate and up projections  panels split
//   3. routing (softmax, top-k in index order) and the shared expert's
//      act = silu(gate x) * up x, prepared for its down projection           tokens split
//   4. member 0: each expert's list of tokens (first[e] .. first[e] + count[e] in `tokens`)
//   5. the shared expert's down projection (panels split), then routed experts taken whole from
//      a shared counter, most tokens first: each gathers its tokens' x, runs gate and up
//      against them only, act, and down into rows first[e] .. of the experts' outputs
//   6. out = sigmoid(gate logit) shared + sum over the token's experts in index order of
//      weight * output                                                   tokens split
//
// Every expert's weights are read once whatever the number of tokens routed to it; the outputs
// land in rows of their own, so the sum of step 6 is in the reference's order whichever member
// ran which expert.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/cpu_fast/fast_math.h"
#include "backend/cpu_fast/prefill.h"
#include "base/cpu_clones.h"
#include "base/thread_team.h"

namespace lily::cpu_fast {

namespace {

using cpu::sigmoid;

// g[i] = silu(g[i]) * u[i], i < n; cloned per x86-64 level so the SiLUs vectorize.
LILY_CPU_CLONES void silu_times(float* g, const float* u, int64_t n) {
  for (int64_t i = 0; i < n; ++i) g[i] = silu_approx(g[i]) * u[i];
}

// Expert e against its n tokens (token ids `ids`): its outputs [n, H] into y. `then`: the
// matrix this member multiplies next (fetched ahead during the last rows of down).
void run_expert(const MoeWeights& w, int64_t e, const int32_t* ids, int64_t n, const TokenBatch& x, float* y, int64_t H,
                ExpertScratch& s, GemmScratch& scratch, const Matrix* then) {
  const Matrix &gate = w.experts.gate_proj[size_t(e)], &up = w.experts.up_proj[size_t(e)];
  const Matrix& down = w.experts.down_proj[size_t(e)];
  const int64_t I = gate.rows;
  gather_tokens(x, ids, n, s.x, s.rows);
  s.gate.resize(size_t(n * I));
  s.up.resize(size_t(n * I));
  gemm_rows(gate, s.x, 0, I, s.gate.data(), I, scratch, &up);
  gemm_rows(up, s.x, 0, I, s.up.data(), I, scratch, &down);
  silu_times(s.gate.data(), s.up.data(), n * I);
  prepare_tokens(s.gate.data(), n, I, s.act);
  gemm_rows(down, s.act, 0, H, y, H, scratch, then);
}

}  // namespace

void moe_prefill(const MoeWeights& w, const ModelConfig& c, const float* x, int64_t T, float* out, PrefillScratch& s) {
  const int64_t H = c.hidden_size, E = c.num_experts, k = c.num_experts_per_tok;
  const int64_t Is = c.shared_expert_intermediate_size;
  ThreadTeam& team = cpu_team();
  std::vector<float>&sg = s.a, &su = s.b, &shared = s.c, &ys = s.d;  // [T, Is] x 2, [T, H], [T k, H]
  sg.resize(size_t(T * Is));
  su.resize(size_t(T * Is));
  shared.resize(size_t(T * H));
  ys.resize(size_t(T * k * H));
  s.logits.resize(size_t(T * (E + 1)));
  if (int64_t(s.routing.size()) < T) s.routing.resize(size_t(T));  // grows only: a Routing keeps its vectors
  s.count.assign(size_t(E), 0);
  s.first.resize(size_t(E));
  s.tokens.resize(size_t(T * k));
  s.slot_of.resize(size_t(T * k));  // [T, k]: the row of ys of the token's i-th expert
  s.order.resize(size_t(E));
  s.gemm.resize(size_t(team.size()));
  s.experts.resize(size_t(team.size()));
  s.next.store(0);
  reset_tokens(x, T, H, s.x);
  reset_tokens(sg.data(), T, Is, s.y);
  float* gate_logit = s.logits.data() + T * E;  // [T]

  team.run([&](ThreadTeam::Member& m) {
    GemmScratch& scratch = s.gemm[size_t(m.index())];
    prepare_share(s.x, m);
    m.barrier();
    const PreparedGemm first[] = {{&w.router, &s.x, s.logits.data()},
                                  {&w.shared_expert_gate, &s.x, gate_logit},
                                  {&w.shared_gate_proj, &s.x, sg.data()},
                                  {&w.shared_up_proj, &s.x, su.data()}};
    gemm_share(first, 4, m, scratch);
    m.barrier();

    const auto [t0, t1] = m.share(T);
    for (int64_t t = t0; t < t1; ++t) {
      route(s.logits.data() + t * E, E, k, s.routing[size_t(t)]);
      silu_times(sg.data() + t * Is, su.data() + t * Is, Is);
    }
    prepare_tokens(s.y, t0, t1);
    m.barrier();

    if (m.index() == 0) {
      for (int64_t t = 0; t < T; ++t)
        for (int64_t i = 0; i < k; ++i) ++s.count[size_t(s.routing[size_t(t)].order[size_t(i)])];
      int32_t at = 0;
      for (int64_t e = 0; e < E; ++e) s.first[size_t(e)] = at, at += s.count[size_t(e)];
      std::vector<int32_t> filled(size_t(E), 0);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t i = 0; i < k; ++i) {
          const int64_t e = s.routing[size_t(t)].order[size_t(i)];
          const int32_t row = s.first[size_t(e)] + filled[size_t(e)]++;
          s.tokens[size_t(row)] = int32_t(t);
          s.slot_of[size_t(t * k + i)] = row;
        }
      std::iota(s.order.begin(), s.order.end(), 0);
      std::stable_sort(s.order.begin(), s.order.end(),
                       [&](int32_t a, int32_t b) { return s.count[size_t(a)] > s.count[size_t(b)]; });
    }
    m.barrier();

    const PreparedGemm shared_down[] = {{&w.shared_down_proj, &s.y, shared.data()}};
    gemm_share(shared_down, 1, m, scratch);
    // Each member claims its next expert before it runs the current one, to fetch it ahead.
    auto claim = [&] {
      const int64_t j = s.next.fetch_add(1);
      return j < E && s.count[size_t(s.order[size_t(j)])] > 0 ? s.order[size_t(j)] : -1;  // none left
    };
    for (int64_t e = claim(), then = e < 0 ? -1 : claim(); e >= 0; e = then, then = e < 0 ? -1 : claim()) {
      const int64_t row = s.first[size_t(e)];
      run_expert(w, e, s.tokens.data() + row, s.count[size_t(e)], s.x, ys.data() + row * H, H,
                 s.experts[size_t(m.index())], scratch, then < 0 ? nullptr : &w.experts.gate_proj[size_t(then)]);
    }
    m.barrier();

    for (int64_t t = t0; t < t1; ++t) {
      const Routing& r = s.routing[size_t(t)];
      float* ot = out + t * H;
      const float shared_weight = sigmoid(gate_logit[t]);
      for (int64_t j = 0; j < H; ++j) ot[j] = shared[size_t(t * H + j)] * shared_weight;
      for (int64_t i = 0; i < k; ++i) {
        const float weight = r.p[size_t(r.order[size_t(i)])] / r.chosen_sum;
        const float* y = ys.data() + s.slot_of[size_t(t * k + i)] * H;
        for (int64_t j = 0; j < H; ++j) ot[j] += weight * y[j];
      }
    }
  });
}

}  // namespace lily::cpu_fast
