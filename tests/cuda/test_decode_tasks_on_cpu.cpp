// test_decode_tasks_on_cpu.cpp: the decode task list (backend/cuda/persistent/decode_tasks.h) run on
// the CPU, as the oracle of the persistent kernel that will run it on the GPU (issue 16).
//
// Every task's body is written here in plain C++ over the step's buffers, reading and writing only
// what its Access list declares, and the tasks run in an order the kernel could take: at each turn
// a random block whose next task has all its waits met. Before each step every scratch buffer is
// poisoned with NaN (expert ids with -1), so a task that reads what no task before it wrote shows.
// The logits of every step must match the CPU reference backend's decode step (fp32 both; only
// the order of the sums differs) on tiny-a and lily-tiny, with the default tiling and with odd
// tiles on few blocks (more attention splits than cached rows included). That proves the
// decomposition computes the model: the fused input projection's row order, DeltaNet head groups
// with their key heads and conv channels, attention splits and their combine, the router's last
// row as the shared expert's gate, and every expert slot's down added into h. A list with one
// task's rows shifted must fail the comparison (the test can fail).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>

#include "../model/fixture.h"
#include "backend/backend.h"
#include "backend/cpu/ops.h"
#include "backend/cuda/persistent/decode_tasks.h"
#include "base/error.h"
#include "model/checkpoint/load.h"

namespace lily::test {
namespace {

using namespace cuda::persistent;

// The step's buffers (DecodeBuffer), on the host in fp32.
struct StepBuffers {
  int32_t token = 0;
  int64_t position = 0;                                              // rows in the KV caches
  std::vector<float> hidden, proj, mixer, moe_input, router_logits;  // [H], [rows], [width], [H], [E + 1]
  std::vector<int32_t> top_ids;                                      // [k]
  std::vector<float> top_weights, act, partials, logits;             // [k], [k + 1, I], [splits, nq, d + 2], [V]
  std::vector<std::vector<float>> conv, ssm;                         // DeltaNet layer: [C][K - 1], [Hv, dk, dv]
  std::vector<std::vector<float>> k_cache, v_cache;                  // attention layer: [capacity, nkv * d]
};

float dot(const Matrix& m, int64_t row, const float* x, std::vector<float>& scratch) {
  scratch.resize(size_t(m.cols));
  m.dequantize_row(row, scratch.data());
  double s = 0;
  for (int64_t i = 0; i < m.cols; ++i) s += double(scratch[size_t(i)]) * x[i];
  return float(s);
}

// The task bodies. Each reads and writes only what decode_tasks.cpp declares for it.
class TaskBodies {
 public:
  TaskBodies(const ModelWeights& w, const DecodeTiling& t) : w_(w), c_(w.config), t_(t) {}

  StepBuffers new_buffers(int64_t capacity) const {
    StepBuffers b;
    const int64_t H = c_.hidden_size, I = moe_rows();
    const int64_t in_rows = std::max<int64_t>(2 * c_.attention_q_width() + 2 * c_.attention_kv_width(),
                                              c_.linear_conv_dim() + c_.linear_value_dim() + 2 * value_heads());
    b.hidden.resize(size_t(H));
    b.proj.resize(size_t(in_rows));
    b.mixer.resize(size_t(std::max(c_.linear_value_dim(), c_.attention_q_width())));
    b.moe_input.resize(size_t(H));
    b.router_logits.resize(size_t(c_.num_experts + 1));
    b.top_ids.resize(size_t(c_.num_experts_per_tok));
    b.top_weights.resize(size_t(c_.num_experts_per_tok));
    b.act.resize(size_t((c_.num_experts_per_tok + 1) * I));
    b.partials.resize(size_t(t_.attention_splits * c_.num_attention_heads * (c_.head_dim + 2)));
    b.logits.resize(size_t(c_.vocab_size));
    for (int l = 0; l < c_.num_layers; ++l) {
      const bool attention = c_.layer_types[size_t(l)] == LayerKind::full_attention;
      const int64_t kv = attention ? capacity * c_.attention_kv_width() : 0;
      b.k_cache.emplace_back(size_t(kv), NAN);
      b.v_cache.emplace_back(size_t(kv), NAN);
      b.conv.emplace_back(attention ? 0 : size_t(c_.linear_conv_dim() * taps()), 0.f);
      b.ssm.emplace_back(attention ? 0 : size_t(value_heads() * c_.linear_key_head_dim * c_.linear_value_head_dim),
                         0.f);
    }
    return b;
  }

  // The scratch buffers to NaN (and expert ids to -1) before a step.
  static void poison(StepBuffers& b) {
    for (auto* v : {&b.proj, &b.mixer, &b.moe_input, &b.router_logits, &b.top_weights, &b.act, &b.partials, &b.logits})
      std::fill(v->begin(), v->end(), NAN);
    std::fill(b.top_ids.begin(), b.top_ids.end(), -1);
  }

  void run(const Task& t, StepBuffers& b) {
    const LayerWeights& layer = w_.layers[t.layer];
    switch (DecodeOp(t.op)) {
      case DecodeOp::embed: return w_.embed_tokens.dequantize_row(b.token, b.hidden.data());
      case DecodeOp::in_proj: return in_proj(layer, t, b);
      case DecodeOp::deltanet_core: return deltanet_core(layer.deltanet, t, b);
      case DecodeOp::attention_split: return attention_split(layer.attention, t, b);
      case DecodeOp::attention_combine: return attention_combine(b);
      case DecodeOp::out_proj: return out_proj(layer, t, b);
      case DecodeOp::moe_norm:
        return cpu::rms_norm(b.hidden.data(), layer.post_attention_layernorm.data(), 1, c_.hidden_size, c_.rms_norm_eps,
                             b.moe_input.data());
      case DecodeOp::router: return router(layer.moe, t, b);
      case DecodeOp::top_k: return top_k(b);
      case DecodeOp::gate_up: return gate_up(layer.moe, t, b);
      case DecodeOp::down: return down(layer.moe, t, b);
      case DecodeOp::lm_head: return lm_head(t, b);
      case DecodeOp::advance: ++b.position; return;
    }
    FAIL() << "unknown op " << t.op;
  }

 private:
  int64_t value_heads() const { return c_.linear_num_value_heads; }
  int64_t taps() const { return std::max(1, c_.linear_conv_kernel_dim - 1); }
  int64_t moe_rows() const { return std::max(c_.moe_intermediate_size, c_.shared_expert_intermediate_size); }
  bool is_shared(const Task& t) const { return t.slot == c_.num_experts_per_tok; }

  // Row r of the layer's fused input projection: attention q (per head d query rows then d gate
  // rows) | k | v; DeltaNet qkv | z | b | a.
  const Matrix& fused_row(const LayerWeights& layer, int64_t& r) const {
    std::vector<const Matrix*> parts;
    if (layer.kind == LayerKind::full_attention)
      parts = {&layer.attention.q_proj, &layer.attention.k_proj, &layer.attention.v_proj};
    else
      parts = {&layer.deltanet.in_proj_qkv, &layer.deltanet.in_proj_z, &layer.deltanet.in_proj_b,
               &layer.deltanet.in_proj_a};
    for (const Matrix* m : parts) {
      if (r < m->rows) return *m;
      r -= m->rows;
    }
    throw Error("in_proj row past the fused projection");
  }

  // proj[r] = RMSNorm(h) . W_in[r]
  void in_proj(const LayerWeights& layer, const Task& t, StepBuffers& b) {
    normed_.resize(size_t(c_.hidden_size));
    cpu::rms_norm(b.hidden.data(), layer.input_layernorm.data(), 1, c_.hidden_size, c_.rms_norm_eps, normed_.data());
    for (int64_t r = t.first; r < int64_t(t.first + t.count); ++r) {
      int64_t local = r;
      const Matrix& m = fused_row(layer, local);
      b.proj[size_t(r)] = dot(m, local, normed_.data(), row_);
    }
  }

  // Value heads [first, first + count): their key heads' q and k channels and their v channels
  // through the conv (state [channel][tap], oldest tap first) and SiLU, q and k l2-normalised,
  // the delta rule step of each head, then the gated RMSNorm with its z.
  void deltanet_core(const DeltaNetWeights& w, const Task& t, StepBuffers& b) {
    const int64_t Hk = c_.linear_num_key_heads, Hv = value_heads(), dk = c_.linear_key_head_dim;
    const int64_t dv = c_.linear_value_head_dim, K = c_.linear_conv_kernel_dim, key_dim = Hk * dk;
    const int64_t C = c_.linear_conv_dim(), per_key = Hv / Hk, v0 = t.first, v1 = t.first + t.count;
    const int64_t k0 = v0 / per_key, k1 = v1 / per_key;
    std::vector<float>& state = b.conv[t.layer];
    u_.assign(size_t(C), NAN);
    auto conv = [&](int64_t c0, int64_t c1) {
      for (int64_t ch = c0; ch < c1; ++ch) {
        float* taps_of = state.data() + ch * (K - 1);
        float s = w.conv1d[size_t(ch * K + K - 1)] * b.proj[size_t(ch)];
        for (int64_t i = 0; i < K - 1; ++i) s += w.conv1d[size_t(ch * K + i)] * taps_of[i];
        for (int64_t i = 0; i + 1 < K - 1; ++i) taps_of[i] = taps_of[i + 1];
        if (K > 1) taps_of[K - 2] = b.proj[size_t(ch)];
        u_[size_t(ch)] = cpu::silu(s);
      }
    };
    conv(k0 * dk, k1 * dk);
    conv(key_dim + k0 * dk, key_dim + k1 * dk);
    conv(2 * key_dim + v0 * dv, 2 * key_dim + v1 * dv);
    for (int64_t h = k0; h < k1; ++h) {
      cpu::l2_normalize(u_.data() + h * dk, dk, 1.f / std::sqrt(float(dk)));
      cpu::l2_normalize(u_.data() + key_dim + h * dk, dk, 1.f);
    }
    const int64_t z0 = C, b0 = z0 + Hv * dv, a0 = b0 + Hv;
    for (int64_t h = v0; h < v1; ++h) {
      const int64_t kh = h / per_key;
      const float beta = cpu::sigmoid(b.proj[size_t(b0 + h)]);
      const float g = -std::exp(w.A_log[size_t(h)]) * cpu::softplus(b.proj[size_t(a0 + h)] + w.dt_bias[size_t(h)]);
      const cpu::DeltaRuleInputs in{u_.data() + kh * dk,
                                    u_.data() + key_dim + kh * dk,
                                    u_.data() + 2 * key_dim + h * dv,
                                    &g,
                                    &beta,
                                    C,
                                    C,
                                    C,
                                    1,
                                    1,
                                    dk,
                                    dv};
      std::vector<float> o(static_cast<size_t>(dv));
      cpu::delta_rule_recurrent(in, b.ssm[t.layer].data() + h * dk * dv, o.data(), dv);
      cpu::gated_rms_norm(o.data(), b.proj.data() + z0 + h * dv, w.norm.data(), 1, dv, c_.rms_norm_eps,
                          b.mixer.data() + h * dv);
    }
  }

  // q of every head normalised and rotated at this position.
  std::vector<float> rotated_q(const AttentionWeights& w, const StepBuffers& b) const {
    const int64_t nq = c_.num_attention_heads, d = c_.head_dim;
    std::vector<float> q(static_cast<size_t>(nq * d));
    for (int64_t h = 0; h < nq; ++h) std::copy_n(b.proj.data() + h * 2 * d, d, q.data() + h * d);
    cpu::rms_norm(q.data(), w.q_norm.data(), nq, d, c_.rms_norm_eps, q.data());
    cpu::apply_rope(q.data(), 1, nq, d, c_.rotary_dim, c_.rope_theta, b.position);
    return q;
  }

  // Split s of the cache rows [0, n): rows [s n / S, (s + 1) n / S); split 0 first appends this
  // token's k and v as row n and takes it too. Per head: max score m, sum l of exp(score - m),
  // o = sum exp(score - m) v, at partials[s][head] = [o (d), m, l].
  void attention_split(const AttentionWeights& w, const Task& t, StepBuffers& b) {
    const int64_t nq = c_.num_attention_heads, nkv = c_.num_key_value_heads, d = c_.head_dim;
    const int64_t kv = nkv * d, n = b.position, S = t_.attention_splits, s = t.first;
    std::vector<float>& K = b.k_cache[t.layer];
    std::vector<float>& V = b.v_cache[t.layer];
    if (s == 0) {
      const float* k = b.proj.data() + 2 * c_.attention_q_width();
      cpu::rms_norm(k, w.k_norm.data(), nkv, d, c_.rms_norm_eps, K.data() + n * kv);
      cpu::apply_rope(K.data() + n * kv, 1, nkv, d, c_.rotary_dim, c_.rope_theta, n);
      std::copy_n(k + kv, kv, V.data() + n * kv);
    }
    std::vector<int64_t> rows;
    for (int64_t j = s * n / S; j < (s + 1) * n / S; ++j) rows.push_back(j);
    if (s == 0) rows.push_back(n);
    const std::vector<float> q = rotated_q(w, b);
    const float scale = 1.f / std::sqrt(float(d));
    for (int64_t h = 0; h < nq; ++h) {
      const int64_t g = h / (nq / nkv);
      float* out = b.partials.data() + (s * nq + h) * (d + 2);
      float m = -INFINITY;
      std::vector<float> scores;
      for (int64_t j : rows) {
        float sc = 0;
        for (int64_t e = 0; e < d; ++e) sc += q[size_t(h * d + e)] * K[size_t(j * kv + g * d + e)];
        scores.push_back(sc * scale);
        m = std::max(m, scores.back());
      }
      double l = 0;
      std::fill(out, out + d, 0.f);
      for (size_t i = 0; i < rows.size(); ++i) {
        const float p = std::exp(scores[i] - m);
        l += p;
        for (int64_t e = 0; e < d; ++e) out[e] += p * V[size_t(rows[i] * kv + g * d + e)];
      }
      out[d] = m, out[d + 1] = float(l);
    }
  }

  // o = sum_s o_s e^(m_s - M) / sum_s l_s e^(m_s - M), gated: mixer = o * sigmoid(gate).
  void attention_combine(StepBuffers& b) {
    const int64_t nq = c_.num_attention_heads, d = c_.head_dim, S = t_.attention_splits;
    for (int64_t h = 0; h < nq; ++h) {
      float M = -INFINITY;
      for (int64_t s = 0; s < S; ++s) {
        const float* p = b.partials.data() + (s * nq + h) * (d + 2);
        if (p[d + 1] > 0) M = std::max(M, p[d]);
      }
      std::vector<double> o(size_t(d), 0.0);
      double L = 0;
      for (int64_t s = 0; s < S; ++s) {
        const float* p = b.partials.data() + (s * nq + h) * (d + 2);
        if (p[d + 1] == 0) continue;  // an empty split; NaN poison still propagates
        const double f = std::exp(double(p[d]) - M);
        L += p[d + 1] * f;
        for (int64_t e = 0; e < d; ++e) o[size_t(e)] += p[e] * f;
      }
      for (int64_t e = 0; e < d; ++e)
        b.mixer[size_t(h * d + e)] = float(o[size_t(e)] / L) * cpu::sigmoid(b.proj[size_t(h * 2 * d + d + e)]);
    }
  }

  // h[r] += W_out[r] . mixer
  void out_proj(const LayerWeights& layer, const Task& t, StepBuffers& b) {
    const Matrix& W = layer.kind == LayerKind::full_attention ? layer.attention.o_proj : layer.deltanet.out_proj;
    for (int64_t r = t.first; r < int64_t(t.first + t.count); ++r)
      b.hidden[size_t(r)] += dot(W, r, b.mixer.data(), row_);
  }

  // Rows of [router; shared_expert_gate] . x
  void router(const MoeWeights& w, const Task& t, StepBuffers& b) {
    for (int64_t r = t.first; r < int64_t(t.first + t.count); ++r) {
      const bool gate = r == c_.num_experts;
      b.router_logits[size_t(r)] = dot(gate ? w.shared_expert_gate : w.router, gate ? 0 : r, b.moe_input.data(), row_);
    }
  }

  // softmax over the experts' logits, the k largest (ties to the lower id), renormalised.
  void top_k(StepBuffers& b) {
    cpu::route_top_k(b.router_logits.data(), c_.num_experts, c_.num_experts_per_tok, b.top_ids.data(),
                     b.top_weights.data());
  }

  int expert_of(const StepBuffers& b, int s) const {
    const int id = b.top_ids[size_t(s)];
    if (id < 0 || id >= c_.num_experts) throw Error("slot " + std::to_string(s) + " read before top_k chose it");
    return id;
  }

  // act[slot][r] = silu(G[r] . x) * (U[r] . x), for the rows the slot's expert has.
  void gate_up(const MoeWeights& w, const Task& t, StepBuffers& b) {
    const int s = t.slot;
    const bool shared = is_shared(t);
    const Matrix& G = shared ? w.shared_gate_proj : w.experts.gate_proj[size_t(expert_of(b, s))];
    const Matrix& U = shared ? w.shared_up_proj : w.experts.up_proj[size_t(expert_of(b, s))];
    for (int64_t r = t.first; r < std::min<int64_t>(t.first + t.count, G.rows); ++r) {
      b.act[size_t(s * moe_rows() + r)] = cpu::silu(dot(G, r, b.moe_input.data(), row_)) *
                                          dot(U, r, b.moe_input.data(), row_);
    }
  }

  // h[r] += weight * D[r] . act[slot]; weight: the slot's routing weight, or sigmoid of the
  // shared expert's gate (the router's last row).
  void down(const MoeWeights& w, const Task& t, StepBuffers& b) {
    const int s = t.slot;
    const bool shared = is_shared(t);
    const Matrix& D = shared ? w.shared_down_proj : w.experts.down_proj[size_t(expert_of(b, s))];
    const float weight = shared ? cpu::sigmoid(b.router_logits[size_t(c_.num_experts)]) : b.top_weights[size_t(s)];
    for (int64_t r = t.first; r < int64_t(t.first + t.count); ++r)
      b.hidden[size_t(r)] += weight * dot(D, r, b.act.data() + s * moe_rows(), row_);
  }

  // logits[r] = RMSNorm(h; final norm) . lm_head[r]
  void lm_head(const Task& t, StepBuffers& b) {
    normed_.resize(size_t(c_.hidden_size));
    cpu::rms_norm(b.hidden.data(), w_.final_norm.data(), 1, c_.hidden_size, c_.rms_norm_eps, normed_.data());
    for (int64_t r = t.first; r < int64_t(t.first + t.count); ++r)
      b.logits[size_t(r)] = dot(w_.lm_head, r, normed_.data(), row_);
  }

  const ModelWeights& w_;
  const ModelConfig& c_;
  const DecodeTiling t_;
  std::vector<float> normed_, row_, u_;
};

// One step's tasks in a random order the kernel could take: each turn, one of the blocks whose
// next task has every wait met runs that task, then adds to its counter.
void run_step(const TaskList& list, TaskBodies& bodies, StepBuffers& b, std::mt19937& rng) {
  std::vector<size_t> next(list.blocks.size(), 0);
  std::vector<uint32_t> counters(list.counters, 0);
  std::vector<size_t> ready;
  for (size_t left = list.tasks(); left > 0; --left) {
    ready.clear();
    for (size_t k = 0; k < list.blocks.size(); ++k) {
      if (next[k] == list.blocks[k].size()) continue;
      const Task& t = list.blocks[k][next[k]];
      if (std::all_of(t.waits.begin(), t.waits.end(), [&](const Wait& w) { return counters[w.counter] >= w.count; }))
        ready.push_back(k);
    }
    ASSERT_FALSE(ready.empty()) << "no block can go on with " << left << " tasks left";
    const size_t k = ready[std::uniform_int_distribution<size_t>(0, ready.size() - 1)(rng)];
    const Task& t = list.blocks[k][next[k]++];
    bodies.run(t, b);
    if (t.signal >= 0) ++counters[size_t(t.signal)];
  }
}

struct Mismatch {
  double max_abs_diff = 0, max_abs_ref = 0;
  int argmax_differs = 0;
};

// Every token of `ids` as a decode step through the task list and through the CPU backend.
Mismatch decode_both_ways(const std::shared_ptr<const ModelWeights>& weights, const DecodeTiling& tiling,
                          const std::vector<int32_t>& ids, const TaskList* list_override = nullptr) {
  const ModelConfig& c = weights->config;
  const DecodeTasks tasks = build_decode_tasks(c, tiling);
  const TaskList& list = list_override ? *list_override : tasks.list;
  TaskBodies bodies(*weights, tiling);
  StepBuffers b = bodies.new_buffers(int64_t(ids.size()));
  auto reference = make_cpu_backend(weights);
  auto seq = reference->new_sequence(int64_t(ids.size()));
  std::mt19937 rng(uint32_t(ids.size() * 7919 + size_t(tiling.blocks)));
  Mismatch m;
  std::vector<float> want;
  for (int32_t id : ids) {
    TaskBodies::poison(b);
    b.token = id;
    run_step(list, bodies, b, rng);
    reference->forward(*seq, std::span<const int32_t>(&id, 1), LogitsWanted::last, want);
    for (size_t i = 0; i < want.size(); ++i) {
      const double diff = std::fabs(double(b.logits[i]) - want[i]);
      m.max_abs_diff = std::max(m.max_abs_diff, std::isfinite(diff) ? diff : INFINITY);
      m.max_abs_ref = std::max(m.max_abs_ref, double(std::fabs(want[i])));
    }
    m.argmax_differs += std::max_element(b.logits.begin(), b.logits.end()) - b.logits.begin() !=
                        std::max_element(want.begin(), want.end()) - want.begin();
  }
  EXPECT_EQ(b.position, int64_t(ids.size()));
  return m;
}

DecodeTiling odd_tiling(int blocks, int splits) {
  DecodeTiling t;
  t.blocks = blocks, t.in_proj_rows = 7, t.out_proj_rows = 5, t.router_rows = 3, t.expert_rows = 5;
  t.down_rows = 9, t.lm_head_rows = 50, t.attention_splits = splits;
  return t;
}

std::vector<int32_t> fixture_ids() {
  return read_json(fixture_dir("tiny-a") + "/reference.json")["ids"].get<std::vector<int32_t>>();
}

void expect_equal_logits(const Mismatch& m, const std::string& what) {
  std::printf("[%s] max |diff| %.3g of max |ref| %.3g, argmax differs %d\n", what.c_str(), m.max_abs_diff,
              m.max_abs_ref, m.argmax_differs);
  EXPECT_LE(m.max_abs_diff, 1e-4 * m.max_abs_ref) << what;
  EXPECT_EQ(m.argmax_differs, 0) << what;
}

TEST(DecodeTasksOnCpu, TinyAMatchesTheReferenceBackend) {
  auto weights = load_model(fixture_dir("tiny-a") + "/mlx-q4");
  const std::vector<int32_t> ids = fixture_ids();
  ASSERT_GE(ids.size(), 8u);
  DecodeTiling t;
  t.deltanet_heads = 2;
  expect_equal_logits(decode_both_ways(weights, t, ids), "tiny-a, default tiles, 132 blocks");
  DecodeTiling odd = odd_tiling(3, 5);
  expect_equal_logits(decode_both_ways(weights, odd, ids), "tiny-a, odd tiles, 3 blocks, 5 splits");
  odd = odd_tiling(1, 1);
  odd.deltanet_heads = 4;
  expect_equal_logits(decode_both_ways(weights, odd, ids), "tiny-a, one block, one split");
  odd = odd_tiling(7, 64);  // more splits than cached rows: most splits are empty
  expect_equal_logits(decode_both_ways(weights, odd, ids), "tiny-a, 7 blocks, 64 splits");
}

TEST(DecodeTasksOnCpu, LilyTinyMatchesTheReferenceBackend) {
  auto weights = load_model(std::string(LILY_SOURCE_DIR) + "/models/lily-tiny");
  std::vector<int32_t> ids;
  std::mt19937 rng(5);
  for (int i = 0; i < 12; ++i) ids.push_back(int32_t(rng() % uint32_t(weights->config.vocab_size)));
  DecodeTiling t;
  t.deltanet_heads = weights->config.linear_num_value_heads / weights->config.linear_num_key_heads;
  expect_equal_logits(decode_both_ways(weights, t, ids), "lily-tiny, default tiles");
  DecodeTiling odd = odd_tiling(5, 3);
  odd.deltanet_heads = t.deltanet_heads;
  expect_equal_logits(decode_both_ways(weights, odd, ids), "lily-tiny, odd tiles, 5 blocks, 3 splits");
}

// The comparison catches a wrong list: the rows of one task of each kind moved by one (the list
// stays well-formed; only what the task computes is wrong).
TEST(DecodeTasksOnCpu, AShiftedTaskFailsTheComparison) {
  auto weights = load_model(fixture_dir("tiny-a") + "/mlx-q4");
  const std::vector<int32_t> ids = fixture_ids();
  const DecodeTiling odd = odd_tiling(3, 2);
  for (DecodeOp op : {DecodeOp::in_proj, DecodeOp::out_proj, DecodeOp::router, DecodeOp::gate_up, DecodeOp::down,
                      DecodeOp::lm_head}) {
    TaskList list = build_decode_tasks(weights->config, odd).list;
    bool shifted = false;
    for (auto& block : list.blocks)
      for (Task& t : block)
        if (!shifted && DecodeOp(t.op) == op && t.first > 0) --t.first, shifted = true;
    ASSERT_TRUE(shifted) << op_name(op);
    const Mismatch m = decode_both_ways(weights, odd, ids, &list);
    EXPECT_FALSE(m.max_abs_diff <= 1e-4 * m.max_abs_ref && m.argmax_differs == 0)
        << op_name(op) << ": a shifted task went unnoticed";
  }
}

}  // namespace
}  // namespace lily::test
