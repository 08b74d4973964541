// moe_step.cpp: the sparse MoE block with its gated shared expert (spec §2.7), one token, as
// one parallel region of cpu_team() in three phases:
//
//   1. router logits and the shared expert's gate logit      rows split between the members
//   -- barrier --
//   2. every member routes (softmax, top-k: the same result in each, no extra barrier), then
//      gate/up of the k routed experts and the shared one in blocks of 64 rows, each block's
//      act = silu(gate x) * up x quantized as the down projection's input by its member
//   -- barrier --
//   3. out = sigmoid(gate logit) shared(x) + sum_e w_e down_e(act_e), rows of out split
//
// Each member streams its own rows of every matrix; the expert outputs meet in phase 3 without
// a separate sum. Same math and order of sums as the reference (backend/cpu/moe.cpp).
#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/cpu/ops.h"
#include "backend/cpu_fast/gemv.h"
#include "backend/cpu_fast/layers.h"
#include "base/thread_team.h"

namespace lily::cpu_fast {

namespace {

using cpu::sigmoid;
using cpu::silu;

struct ExpertMatrices {
  const Matrix *gate, *up, *down;
};

// Expert slot i of the token: 0..k-1 the routed ones (routing order), k the shared one.
ExpertMatrices expert(const MoeWeights& w, const Routing& r, int64_t k, int64_t i) {
  if (i == k) return {&w.shared_gate_proj, &w.shared_up_proj, &w.shared_down_proj};
  const size_t e = size_t(r.order[size_t(i)]);
  return {&w.experts.gate_proj[e], &w.experts.up_proj[e], &w.experts.down_proj[e]};
}

}  // namespace

// As moe.cpp: softmax in fp32 with a double sum, top-k with ties to the lower index.
void route(const float* logits, int64_t E, int64_t k, Routing& r) {
  r.p.resize(size_t(E));
  r.order.resize(size_t(E));
  const float max_logit = *std::max_element(logits, logits + E);
  double sum = 0;
  for (int64_t e = 0; e < E; ++e) sum += (r.p[size_t(e)] = std::exp(logits[e] - max_logit));
  for (auto& v : r.p) v = float(v / sum);
  std::iota(r.order.begin(), r.order.end(), 0);
  const auto& p = r.p;
  std::partial_sort(r.order.begin(), r.order.begin() + k, r.order.end(), [&](int i, int j) {
    return p[size_t(i)] > p[size_t(j)] || (p[size_t(i)] == p[size_t(j)] && i < j);
  });
  r.chosen_sum = 0;
  for (int64_t i = 0; i < k; ++i) r.chosen_sum += p[size_t(r.order[size_t(i)])];
  std::sort(r.order.begin(), r.order.begin() + k);  // the reference adds experts in index order
}

void moe_step(const MoeWeights& w, const ModelConfig& c, const float* x, float* out, MoeScratch& s) {
  const int64_t H = c.hidden_size, E = c.num_experts, k = c.num_experts_per_tok;
  const int64_t I = c.moe_intermediate_size, Is = c.shared_expert_intermediate_size, I_max = std::max(I, Is);
  ThreadTeam& team = cpu_team();
  s.logits.resize(size_t(E + 1));
  s.routing.resize(size_t(team.size()));
  s.gate.resize(size_t((k + 1) * I_max));
  s.up.resize(s.gate.size());
  s.act.resize(s.gate.size());
  s.ys.resize(size_t((k + 1) * H));
  s.act_in.resize(size_t(k + 1));
  prepare_input(w.experts.gate_proj[0], x, s.x_in);
  // act's buffers sized now; the members fill their groups. Every routed down has one format.
  for (int64_t i = 0; i <= k; ++i)
    reset_input_for(i == k ? w.shared_down_proj : w.experts.down_proj[0], s.act.data() + i * I_max,
                    s.act_in[size_t(i)]);

  team.run([&](ThreadTeam::Member& m) {
    const PreparedGemv router[] = {{&w.router, &s.x_in, s.logits.data()},
                                   {&w.shared_expert_gate, &s.x_in, s.logits.data() + E}};
    gemv_share(router, m);
    m.barrier();

    Routing& r = s.routing[size_t(m.index())];
    route(s.logits.data(), E, k, r);
    // Blocks of rows of gate/up over the k + 1 experts: whole groups of the down projections'
    // inputs (64), which the block's member quantizes.
    const int64_t block = std::lcm<int64_t>(std::lcm<int64_t>(16, std::max(1, s.act_in[0].group_size)),
                                            std::max(1, s.act_in[size_t(k)].group_size));
    const int64_t routed_blocks = (I + block - 1) / block, shared_blocks = (Is + block - 1) / block;
    const auto [b0, b1] = m.share(k * routed_blocks + shared_blocks);
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t i = std::min(k, b / routed_blocks);  // expert slot
      const int64_t rows = i == k ? Is : I, r0 = (b - i * routed_blocks) * block, r1 = std::min(rows, r0 + block);
      const ExpertMatrices e = expert(w, r, k, i);
      float *g = s.gate.data() + i * I_max, *u = s.up.data() + i * I_max, *a = s.act.data() + i * I_max;
      gemv_rows(*e.gate, s.x_in, r0, r1, g);
      gemv_rows(*e.up, s.x_in, r0, r1, u);
      for (int64_t j = r0; j < r1; ++j) a[j] = silu(g[j]) * u[j];
      QuantizedInput& in = s.act_in[size_t(i)];
      if (in.group_size > 0) quantize_groups(in, r0 / in.group_size, r1 / in.group_size);
    }
    m.barrier();

    const auto [h0, h1] = m.share(H, 16);
    for (int64_t i = 0; i <= k; ++i)
      gemv_rows(*expert(w, r, k, i).down, s.act_in[size_t(i)], h0, h1, s.ys.data() + i * H);
    const float shared_weight = sigmoid(s.logits[size_t(E)]);
    const float* shared = s.ys.data() + k * H;
    for (int64_t j = h0; j < h1; ++j) out[j] = shared[j] * shared_weight;
    for (int64_t i = 0; i < k; ++i) {
      const float weight = r.p[size_t(r.order[size_t(i)])] / r.chosen_sum;
      const float* y = s.ys.data() + i * H;
      for (int64_t j = h0; j < h1; ++j) out[j] += weight * y[j];
    }
  });
}

}  // namespace lily::cpu_fast
