// decode_task_bodies.h: the decode task list's bodies (backend/cuda/persistent/decode_tasks.h) in
// plain C++ over a step's buffers on the host, each reading and writing only what its Access list
// declares: the oracle test_decode_tasks_on_cpu.cpp runs the task lists with, in a random ready
// order, against the CPU reference backend. Faults get chosen bodies wrong on purpose, to show
// that comparison can fail.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cuda/persistent/decode_tasks.h"
#include "base/error.h"
#include "model/weights.h"

namespace lily::test {

using namespace cuda::persistent;

// One sequence's state: its position (rows in its KV caches) and per layer the DeltaNet conv and
// recurrent state or the KV cache.
struct SequenceBuffers {
  int64_t position = 0;
  std::vector<std::vector<float>> conv, ssm;         // DeltaNet layer: [C][K - 1], [Hv, dk, dv]
  std::vector<std::vector<float>> k_cache, v_cache;  // attention layer: [capacity, nkv * d]
};

// The step's buffers (DecodeBuffer), on the host in fp32: T rows, S splits, U expert slots; P and M
// the widths of a row of proj and mixer (TaskBodies::proj_stride, mixer_stride).
struct StepBuffers {
  DecodeRows rows;
  std::vector<int32_t> tokens;                                       // [T]
  std::vector<SequenceBuffers> seqs;                                 // verify: 1; parallel: T
  std::vector<float> hidden, proj, mixer, moe_input, router_logits;  // [T, H], [T, P], [T, M], [T, H], [T, E + 1]
  std::vector<int32_t> slot_ids;                                     // [U] (-1: an empty slot)
  std::vector<float> slot_weights;                                   // [U, T] (0: the row did not choose it)
  std::vector<float> act, partials, logits;                          // [U + 1, T, I], [T, S, nq, d + 2], [T, V]
  // keep_states: per layer the DeltaNet state after rows 0..T-2 (as SequenceBuffers' conv, ssm)
  std::vector<std::vector<std::vector<float>>> conv_after, ssm_after;  // [layer][row]

  int64_t T() const { return rows.count; }
  bool parallel() const { return rows.kind == DecodeRows::Kind::parallel; }
  // Row r's sequence and position: verify rows follow each other in the one sequence.
  SequenceBuffers& sequence_of(int64_t r) { return seqs[size_t(parallel() ? r : 0)]; }
  int64_t position_of(int64_t r) const { return parallel() ? seqs[size_t(r)].position : seqs[0].position + r; }
};

// What the task bodies get wrong on purpose, to show the comparison catches it.
struct Faults {
  bool deltanet_restarts_each_row = false;  // a verify row's DeltaNet step from the state before the step
  bool attention_sees_later_rows = false;   // a verify row attends to the step's rows after it too
};

// Slot ids before top_k writes them: neither an expert nor the empty slot.
constexpr int32_t kUnsetSlot = INT32_MIN;

inline float dot(const Matrix& m, int64_t row, const float* x, std::vector<float>& scratch) {
  scratch.resize(size_t(m.cols));
  m.dequantize_row(row, scratch.data());
  double s = 0;
  for (int64_t i = 0; i < m.cols; ++i) s += double(scratch[size_t(i)]) * x[i];
  return float(s);
}

// The task bodies. Each reads and writes only what decode_tasks.cpp declares for it, for the step's
// rows [task.row, task.row + task.rows).
class TaskBodies {
 public:
  TaskBodies(const ModelWeights& w, const DecodeTiling& t, Faults faults = {})
      : w_(w), c_(w.config), t_(t), faults_(faults) {}

  SequenceBuffers new_sequence(int64_t capacity) const {
    SequenceBuffers s;
    for (int l = 0; l < c_.num_layers; ++l) {
      const bool attention = c_.layer_types[size_t(l)] == LayerKind::full_attention;
      const int64_t kv = attention ? capacity * c_.attention_kv_width() : 0;
      s.k_cache.emplace_back(size_t(kv), NAN);
      s.v_cache.emplace_back(size_t(kv), NAN);
      s.conv.emplace_back(attention ? 0 : size_t(c_.linear_conv_dim() * taps()), 0.f);
      s.ssm.emplace_back(attention ? 0 : size_t(value_heads() * c_.linear_key_head_dim * c_.linear_value_head_dim),
                         0.f);
    }
    return s;
  }

  // A step of `rows` over `seqs` (one sequence for verify, T for parallel), every scratch buffer
  // poisoned: NaN, expert slots kUnsetSlot.
  StepBuffers new_step(const DecodeRows& rows, std::vector<int32_t> tokens, std::vector<SequenceBuffers> seqs) const {
    StepBuffers b;
    b.rows = rows, b.tokens = std::move(tokens), b.seqs = std::move(seqs);
    const size_t T = size_t(rows.count), U = size_t(expert_slots(c_, rows)), H = size_t(c_.hidden_size);
    b.hidden.assign(T * H, NAN);
    b.proj.assign(T * size_t(proj_stride()), NAN);
    b.mixer.assign(T * size_t(mixer_stride()), NAN);
    b.moe_input.assign(T * H, NAN);
    b.router_logits.assign(T * size_t(c_.num_experts + 1), NAN);
    b.slot_ids.assign(U, kUnsetSlot);
    b.slot_weights.assign(U * T, NAN);
    b.act.assign((U + 1) * T * size_t(moe_rows()), NAN);
    b.partials.assign(T * size_t(t_.attention_splits * c_.num_attention_heads * (c_.head_dim + 2)), NAN);
    b.logits.assign(T * size_t(c_.vocab_size), NAN);
    b.conv_after.resize(size_t(c_.num_layers)), b.ssm_after.resize(size_t(c_.num_layers));
    for (int l = 0; l < c_.num_layers; ++l)
      for (int r = 0; r < rows.snapshots(); ++r) {
        b.conv_after[size_t(l)].emplace_back(b.seqs[0].conv[size_t(l)].size(), NAN);
        b.ssm_after[size_t(l)].emplace_back(b.seqs[0].ssm[size_t(l)].size(), NAN);
      }
    return b;
  }

  void run(const Task& t, StepBuffers& b) {
    const LayerWeights& layer = w_.layers[t.layer];
    switch (DecodeOp(t.op)) {
      case DecodeOp::embed:
        for (int64_t r = t.row; r < t.row + t.rows; ++r)
          w_.embed_tokens.dequantize_row(b.tokens[size_t(r)], b.hidden.data() + r * c_.hidden_size);
        return;
      case DecodeOp::in_proj: return in_proj(layer, t, b);
      case DecodeOp::deltanet_core: return deltanet_core(layer.deltanet, t, b);
      case DecodeOp::attention_split: return attention_split(layer.attention, t, b);
      case DecodeOp::attention_combine: return attention_combine(t, b);
      case DecodeOp::out_proj: return out_proj(layer, t, b);
      case DecodeOp::router: return router(layer, t, b);
      case DecodeOp::top_k: return top_k(t, b);
      case DecodeOp::gate_up: return gate_up(layer.moe, t, b);
      case DecodeOp::down: return down(layer.moe, t, b);
      case DecodeOp::lm_head: return lm_head(t, b);
      case DecodeOp::advance:
        if (b.parallel())
          for (SequenceBuffers& s : b.seqs) ++s.position;
        else b.seqs[0].position += b.T();
        return;
    }
    FAIL() << "unknown op " << t.op;
  }

 private:
  int64_t value_heads() const { return c_.linear_num_value_heads; }
  int64_t taps() const { return std::max(1, c_.linear_conv_kernel_dim - 1); }
  int64_t moe_rows() const { return std::max(c_.moe_intermediate_size, c_.shared_expert_intermediate_size); }
  // Floats a row of proj and of mixer (decode_tasks.h: kProj, kMixer).
  int64_t proj_stride() const {
    return std::max<int64_t>(2 * c_.attention_q_width() + 2 * c_.attention_kv_width(),
                             c_.linear_conv_dim() + c_.linear_value_dim() + 2 * value_heads());
  }
  int64_t mixer_stride() const { return std::max(c_.linear_value_dim(), c_.attention_q_width()); }
  float* proj(StepBuffers& b, int64_t r) const { return b.proj.data() + r * proj_stride(); }
  float* mixer(StepBuffers& b, int64_t r) const { return b.mixer.data() + r * mixer_stride(); }
  float* hidden(StepBuffers& b, int64_t r) const { return b.hidden.data() + r * c_.hidden_size; }
  float* moe_input(StepBuffers& b, int64_t r) const { return b.moe_input.data() + r * c_.hidden_size; }
  float* act(StepBuffers& b, int64_t slot, int64_t r) const { return b.act.data() + (slot * b.T() + r) * moe_rows(); }
  bool is_shared(const Task& t, const StepBuffers& b) const { return t.slot == expert_slots(c_, b.rows); }

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

  // proj[t][i] = RMSNorm(h[t]) . W_in[i]; a DeltaNet layer's conv channels then through the conv
  // and SiLU, row after row, updating their taps in row t's sequence's conv state.
  void in_proj(const LayerWeights& layer, const Task& t, StepBuffers& b) {
    normed_.resize(size_t(c_.hidden_size));
    for (int64_t row = t.row; row < t.row + t.rows; ++row) {
      cpu::rms_norm(hidden(b, row), layer.input_layernorm.data(), 1, c_.hidden_size, c_.rms_norm_eps, normed_.data());
      for (int64_t r = t.first; r < int64_t(t.first + t.count); ++r) {
        int64_t local = r;
        const Matrix& m = fused_row(layer, local);
        proj(b, row)[r] = dot(m, local, normed_.data(), row_);
      }
      if (layer.kind == LayerKind::full_attention) continue;
      const int64_t C = c_.linear_conv_dim(), end = std::min<int64_t>(C, t.first + t.count);
      std::vector<float>& state = b.sequence_of(row).conv[t.layer];
      for (int64_t ch = t.first; ch < end; ++ch)
        proj(b, row)[ch] = conv_channel(layer.deltanet, ch, proj(b, row)[ch], state);
      if (row < b.rows.snapshots()) {  // these channels' taps after this row
        const int64_t taps = c_.linear_conv_kernel_dim - 1;
        std::copy(state.begin() + t.first * taps, state.begin() + std::max<int64_t>(t.first, end) * taps,
                  b.conv_after[t.layer][size_t(row)].begin() + t.first * taps);
      }
    }
  }

  // u = silu(conv over the channel's taps (state [channel][tap], oldest first) and x); the taps
  // shift by one.
  float conv_channel(const DeltaNetWeights& w, int64_t ch, float x, std::vector<float>& state) const {
    const int64_t K = c_.linear_conv_kernel_dim;
    float* taps_of = state.data() + ch * (K - 1);
    float s = w.conv1d[size_t(ch * K + K - 1)] * x;
    for (int64_t i = 0; i < K - 1; ++i) s += w.conv1d[size_t(ch * K + i)] * taps_of[i];
    for (int64_t i = 0; i + 1 < K - 1; ++i) taps_of[i] = taps_of[i + 1];
    if (K > 1) taps_of[K - 2] = x;
    return cpu::silu(s);
  }

  // Value columns [first, first + count) (of [Hv, dv]) of the task's rows, in order: verify rows
  // one after another on the one state, parallel rows each on its own sequence's.
  void deltanet_core(const DeltaNetWeights& w, const Task& t, StepBuffers& b) {
    std::vector<float> ssm_before;  // Faults::deltanet_restarts_each_row
    for (int64_t r = t.row; r < t.row + t.rows; ++r) {
      SequenceBuffers& s = b.sequence_of(r);
      if (faults_.deltanet_restarts_each_row && r == t.row) ssm_before = s.ssm[t.layer];
      else if (faults_.deltanet_restarts_each_row) s.ssm[t.layer] = ssm_before;
      deltanet_row(w, t, proj(b, r), s.ssm[t.layer], mixer(b, r));
      if (r < b.rows.snapshots()) {  // these columns' state after this row
        const int64_t dk = c_.linear_key_head_dim, dv = c_.linear_value_head_dim;
        for (int64_t col = t.first; col < int64_t(t.first + t.count); ++col)
          for (int64_t i = 0; i < dk; ++i) {
            const size_t at = size_t((col / dv) * dk * dv + i * dv + col % dv);
            b.ssm_after[t.layer][size_t(r)][at] = s.ssm[t.layer][at];
          }
      }
    }
  }

  // One row: q and k (u, after the conv) of each column's key head l2-normalised, then per column
  // j of head h the delta rule (spec §2.6): S <- alpha S; delta = beta (v_j - S[:, j] . k);
  // S[:, j] += k delta; o_j = S[:, j] . q. The gated norm is out_proj's.
  void deltanet_row(const DeltaNetWeights& w, const Task& t, const float* proj, std::vector<float>& ssm, float* mixer) {
    const int64_t Hk = c_.linear_num_key_heads, Hv = value_heads(), dk = c_.linear_key_head_dim;
    const int64_t dv = c_.linear_value_head_dim, key_dim = Hk * dk, C = c_.linear_conv_dim();
    const int64_t per_key = Hv / Hk, b0 = C + Hv * dv, a0 = b0 + Hv;
    std::vector<float> q(static_cast<size_t>(dk)), k(static_cast<size_t>(dk));
    for (int64_t col = t.first; col < int64_t(t.first + t.count); ++col) {
      const int64_t h = col / dv, j = col % dv, kh = h / per_key;
      std::copy_n(proj + kh * dk, dk, q.data());
      std::copy_n(proj + key_dim + kh * dk, dk, k.data());
      cpu::l2_normalize(q.data(), dk, 1.f / std::sqrt(float(dk)));
      cpu::l2_normalize(k.data(), dk, 1.f);
      const float beta = cpu::sigmoid(proj[b0 + h]);
      const float alpha = std::exp(-std::exp(w.A_log[size_t(h)]) * cpu::softplus(proj[a0 + h] + w.dt_bias[size_t(h)]));
      float* S = ssm.data() + h * dk * dv;  // [dk][dv]
      double kv = 0;
      for (int64_t i = 0; i < dk; ++i) kv += double(alpha * S[i * dv + j]) * k[size_t(i)];
      const float delta = beta * (proj[2 * key_dim + col] - float(kv));
      double o = 0;
      for (int64_t i = 0; i < dk; ++i) {
        S[i * dv + j] = alpha * S[i * dv + j] + k[size_t(i)] * delta;
        o += double(S[i * dv + j]) * q[size_t(i)];
      }
      mixer[col] = float(o);
    }
  }

  // q of every head of row r normalised and rotated at its position.
  std::vector<float> rotated_q(const AttentionWeights& w, StepBuffers& b, int64_t r) const {
    const int64_t nq = c_.num_attention_heads, d = c_.head_dim;
    std::vector<float> q(static_cast<size_t>(nq * d));
    for (int64_t h = 0; h < nq; ++h) std::copy_n(proj(b, r) + h * 2 * d, d, q.data() + h * d);
    cpu::rms_norm(q.data(), w.q_norm.data(), nq, d, c_.rms_norm_eps, q.data());
    cpu::apply_rope(q.data(), 1, nq, d, c_.rotary_dim, c_.rope_theta, b.position_of(r));
    return q;
  }

  // Split s of the n rows the cache had before the step, for the task's KV heads [slot, slot +
  // count) and their query heads: rows [s n / S, (s + 1) n / S); split 0 first appends the task's
  // rows' k and v of those heads at their positions (n, n + 1, ...) and takes those rows too, each
  // query row the ones at its position and before (causal). Per head: max score m, sum l
  // of exp(score - m), o = sum exp(score - m) v, at partials[row][s][head] = [o (d), m, l].
  void attention_split(const AttentionWeights& w, const Task& t, StepBuffers& b) {
    const int64_t nq = c_.num_attention_heads, nkv = c_.num_key_value_heads, d = c_.head_dim;
    const int64_t kv = nkv * d, S = t_.attention_splits, s = t.first;
    SequenceBuffers& seq = b.sequence_of(t.row);
    const int64_t n = seq.position;
    std::vector<float>& K = seq.k_cache[t.layer];
    std::vector<float>& V = seq.v_cache[t.layer];
    const int64_t g0 = t.slot, g1 = t.slot + t.count;  // the task's KV heads
    if (s == 0)
      for (int64_t r = t.row; r < t.row + t.rows; ++r) {
        const int64_t at = b.position_of(r);
        const float* k = proj(b, r) + 2 * c_.attention_q_width();
        for (int64_t g = g0; g < g1; ++g) {
          float* k_row = K.data() + at * kv + g * d;
          cpu::rms_norm(k + g * d, w.k_norm.data(), 1, d, c_.rms_norm_eps, k_row);
          cpu::apply_rope(k_row, 1, 1, d, c_.rotary_dim, c_.rope_theta, at);
          std::copy_n(k + kv + g * d, d, V.data() + at * kv + g * d);
        }
      }
    const float scale = 1.f / std::sqrt(float(d));
    for (int64_t r = t.row; r < t.row + t.rows; ++r) {
      std::vector<int64_t> rows;
      for (int64_t j = s * n / S; j < (s + 1) * n / S; ++j) rows.push_back(j);
      const int64_t last = faults_.attention_sees_later_rows ? b.position_of(t.row + t.rows - 1) : b.position_of(r);
      if (s == 0)
        for (int64_t j = n; j <= last; ++j) rows.push_back(j);
      const std::vector<float> q = rotated_q(w, b, r);
      for (int64_t h = g0 * (nq / nkv); h < g1 * (nq / nkv); ++h) {
        const int64_t g = h / (nq / nkv);
        float* out = b.partials.data() + ((r * S + s) * nq + h) * (d + 2);
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
  }

  // Per row and query head of the task: o = sum_s o_s e^(m_s - M) / sum_s l_s e^(m_s - M), gated: mixer = o *
  // sigmoid(gate).
  void attention_combine(const Task& t, StepBuffers& b) {
    const int64_t nq = c_.num_attention_heads, d = c_.head_dim, S = t_.attention_splits;
    for (int64_t r = t.row; r < t.row + t.rows; ++r)
      for (int64_t h = t.first; h < int64_t(t.first + t.count); ++h) {
        auto partial = [&](int64_t s) { return b.partials.data() + ((r * S + s) * nq + h) * (d + 2); };
        float M = -INFINITY;
        for (int64_t s = 0; s < S; ++s)
          if (partial(s)[d + 1] > 0) M = std::max(M, partial(s)[d]);
        std::vector<double> o(size_t(d), 0.0);
        double L = 0;
        for (int64_t s = 0; s < S; ++s) {
          const float* p = partial(s);
          if (p[d + 1] == 0) continue;  // an empty split; NaN poison still propagates
          const double f = std::exp(double(p[d]) - M);
          L += p[d + 1] * f;
          for (int64_t e = 0; e < d; ++e) o[size_t(e)] += p[e] * f;
        }
        for (int64_t e = 0; e < d; ++e)
          mixer(b, r)[h * d + e] = float(o[size_t(e)] / L) * cpu::sigmoid(proj(b, r)[h * 2 * d + d + e]);
      }
  }

  // h[t][i] += W_out[i] . y[t], y = mixer (attention) or, for DeltaNet, per value head
  // gated_rms_norm(o, z) (spec §2.2.2).
  void out_proj(const LayerWeights& layer, const Task& t, StepBuffers& b) {
    const bool attention = layer.kind == LayerKind::full_attention;
    const Matrix& W = attention ? layer.attention.o_proj : layer.deltanet.out_proj;
    std::vector<float> y;
    for (int64_t row = t.row; row < t.row + t.rows; ++row) {
      const float* in = mixer(b, row);
      if (!attention) {
        const int64_t dv = c_.linear_value_head_dim, Hv = value_heads();
        y.resize(size_t(Hv * dv));
        for (int64_t h = 0; h < Hv; ++h)
          cpu::gated_rms_norm(in + h * dv, proj(b, row) + c_.linear_conv_dim() + h * dv, layer.deltanet.norm.data(), 1,
                              dv, c_.rms_norm_eps, y.data() + h * dv);
        in = y.data();
      }
      for (int64_t r = t.first; r < int64_t(t.first + t.count); ++r) hidden(b, row)[r] += dot(W, r, in, row_);
    }
  }

  // Rows of [router; shared_expert_gate] . x[t], x[t] = RMSNorm(h[t]) (the first task also keeps x)
  void router(const LayerWeights& layer, const Task& t, StepBuffers& b) {
    const MoeWeights& w = layer.moe;
    normed_.resize(size_t(c_.hidden_size));
    for (int64_t row = t.row; row < t.row + t.rows; ++row) {
      cpu::rms_norm(hidden(b, row), layer.post_attention_layernorm.data(), 1, c_.hidden_size, c_.rms_norm_eps,
                    normed_.data());
      if (t.first == 0) std::copy(normed_.begin(), normed_.end(), moe_input(b, row));
      for (int64_t r = t.first; r < int64_t(t.first + t.count); ++r) {
        const bool gate = r == c_.num_experts;
        b.router_logits[size_t(row * (c_.num_experts + 1) + r)] = dot(gate ? w.shared_expert_gate : w.router,
                                                                      gate ? 0 : r, normed_.data(), row_);
      }
    }
  }

  // Each row's k experts (softmax over its logits, the k largest, ties to the lower id,
  // renormalised), gathered into the union: slots in order of first choice (rows in order, each
  // row's choices by weight), every row's weight for each slot's expert (0: not chosen).
  void top_k(const Task& t, StepBuffers& b) {
    const int64_t E = c_.num_experts, k = c_.num_experts_per_tok, T = b.T();
    std::fill(b.slot_ids.begin(), b.slot_ids.end(), -1);
    std::fill(b.slot_weights.begin(), b.slot_weights.end(), 0.f);
    std::vector<int> ids(static_cast<size_t>(k));
    std::vector<float> weights(static_cast<size_t>(k));
    size_t used = 0;
    for (int64_t r = t.row; r < t.row + t.rows; ++r) {
      cpu::route_top_k(b.router_logits.data() + r * (E + 1), E, k, ids.data(), weights.data());
      for (int64_t j = 0; j < k; ++j) {
        const size_t u = size_t(std::find(b.slot_ids.begin(), b.slot_ids.begin() + long(used), ids[size_t(j)]) -
                                b.slot_ids.begin());
        ASSERT_LT(u, b.slot_ids.size()) << "more distinct experts than slots";
        if (u == used) b.slot_ids[used++] = ids[size_t(j)];
        b.slot_weights[u * size_t(T) + size_t(r)] = weights[size_t(j)];
      }
    }
  }

  // The slot's expert: -1 for an empty slot; throws for a slot top_k has not written.
  int expert_of(const StepBuffers& b, int s) const {
    const int id = b.slot_ids[size_t(s)];
    if (id == kUnsetSlot || id < -1 || id >= c_.num_experts)
      throw Error("slot " + std::to_string(s) + " read before top_k chose it");
    return id;
  }

  // The expert at rank s of the one row's choice, from its logits (poisoned ones give a wrong
  // choice, which the comparison catches).
  int own_choice(const StepBuffers& b, int s) const {
    const int64_t E = c_.num_experts, k = c_.num_experts_per_tok;
    std::vector<int> ids(static_cast<size_t>(k));
    std::vector<float> weights(static_cast<size_t>(k));
    cpu::route_top_k(b.router_logits.data(), E, k, ids.data(), weights.data());
    return ids[size_t(s)];
  }

  // The rows the slot works on: all for the shared expert, else those that chose its expert (one
  // row: it chose every routed slot's).
  bool slot_has_row(const Task& t, const StepBuffers& b, int64_t r) const {
    return is_shared(t, b) || b.T() == 1 || b.slot_weights[size_t(t.slot * b.T() + r)] != 0.f;
  }

  // act[slot][t][i] = silu(G[i] . x[t]) * (U[i] . x[t]), for the rows the slot's expert has.
  // One row: a routed slot's task chooses the expert itself from the row's logits (decode_tasks.h),
  // the top-k rule's rank `slot`; several rows: the union top_k gathered.
  void gate_up(const MoeWeights& w, const Task& t, StepBuffers& b) {
    const int s = t.slot;
    const bool shared = is_shared(t, b);
    const int id = shared ? 0 : b.T() == 1 ? own_choice(b, s) : expert_of(b, s);
    if (id < 0) return;  // an empty slot
    const Matrix& G = shared ? w.shared_gate_proj : w.experts.gate_proj[size_t(id)];
    const Matrix& U = shared ? w.shared_up_proj : w.experts.up_proj[size_t(id)];
    for (int64_t row = t.row; row < t.row + t.rows; ++row) {
      if (!slot_has_row(t, b, row)) continue;
      for (int64_t r = t.first; r < std::min<int64_t>(t.first + t.count, G.rows); ++r)
        act(b, s, row)[r] = cpu::silu(dot(G, r, moe_input(b, row), row_)) * dot(U, r, moe_input(b, row), row_);
    }
  }

  // h[t][i] += weight * D[i] . act[slot][t]; weight: the row's routing weight of the slot's
  // expert, or sigmoid of the shared expert's gate (the router's last row).
  void down(const MoeWeights& w, const Task& t, StepBuffers& b) {
    const int s = t.slot;
    const bool shared = is_shared(t, b);
    const int id = shared ? 0 : expert_of(b, s);
    if (id < 0) return;  // an empty slot
    const Matrix& D = shared ? w.shared_down_proj : w.experts.down_proj[size_t(id)];
    for (int64_t row = t.row; row < t.row + t.rows; ++row) {
      if (!slot_has_row(t, b, row)) continue;
      const float weight = shared ? cpu::sigmoid(b.router_logits[size_t(row * (c_.num_experts + 1) + c_.num_experts)])
                                  : b.slot_weights[size_t(s * b.T() + row)];
      for (int64_t r = t.first; r < int64_t(t.first + t.count); ++r)
        hidden(b, row)[r] += weight * dot(D, r, act(b, s, row), row_);
    }
  }

  // logits[t][i] = RMSNorm(h[t]; final norm) . lm_head[i]
  void lm_head(const Task& t, StepBuffers& b) {
    normed_.resize(size_t(c_.hidden_size));
    for (int64_t row = t.row; row < t.row + t.rows; ++row) {
      cpu::rms_norm(hidden(b, row), w_.final_norm.data(), 1, c_.hidden_size, c_.rms_norm_eps, normed_.data());
      for (int64_t r = t.first; r < int64_t(t.first + t.count); ++r)
        b.logits[size_t(row * c_.vocab_size + r)] = dot(w_.lm_head, r, normed_.data(), row_);
    }
  }

  const ModelWeights& w_;
  const ModelConfig& c_;
  const DecodeTiling t_;
  const Faults faults_;
  std::vector<float> normed_, row_, u_;
};

}  // namespace lily::test
