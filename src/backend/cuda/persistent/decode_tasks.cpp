// decode_tasks.cpp: see decode_tasks.h.
#include "backend/cuda/persistent/decode_tasks.h"

#include <fmt/format.h>

#include <algorithm>

#include "base/error.h"

namespace lily::cuda::persistent {

namespace {

Access read(uint32_t buffer, uint64_t begin, uint64_t end) { return {Access::Kind::read, buffer, begin, end}; }
Access write(uint32_t buffer, uint64_t begin, uint64_t end) { return {Access::Kind::write, buffer, begin, end}; }

// Sizes of the step (floats unless named), from the config.
struct Shape {
  uint64_t H, E, k, I, V;
  uint64_t attention_rows, deltanet_rows;  // of the fused input projections
  uint64_t q_width, kv_width, heads;
  uint64_t key_heads, value_heads, dk, dv, key_dim, value_dim, conv_dim, conv_taps;

  explicit Shape(const ModelConfig& c)
      : H(c.hidden_size),
        E(c.num_experts),
        k(c.num_experts_per_tok),
        I(std::max(c.moe_intermediate_size, c.shared_expert_intermediate_size)),
        V(c.vocab_size),
        attention_rows(2 * uint64_t(c.attention_q_width()) + 2 * uint64_t(c.attention_kv_width())),
        deltanet_rows(uint64_t(c.linear_conv_dim()) + c.linear_value_dim() + 2 * uint64_t(c.linear_num_value_heads)),
        q_width(c.attention_q_width()),
        kv_width(c.attention_kv_width()),
        heads(c.num_attention_heads),
        key_heads(c.linear_num_key_heads),
        value_heads(c.linear_num_value_heads),
        dk(c.linear_key_head_dim),
        dv(c.linear_value_head_dim),
        key_dim(c.linear_key_dim()),
        value_dim(c.linear_value_dim()),
        conv_dim(c.linear_conv_dim()),
        conv_taps(std::max(1, c.linear_conv_kernel_dim - 1)) {}
};

// Builds the list: counters handed out in step order, tasks dealt to blocks round-robin. Buffers of
// T rows hold row t's part at t * stride (the strides below, in bytes).
class Builder {
 public:
  Builder(const ModelConfig& c, const DecodeTiling& t, const DecodeRows& rows)
      : c_(c),
        t_(t),
        s_(c),
        T_(uint64_t(rows.count)),
        sequences_(uint64_t(rows.sequences())),
        new_rows_(rows.kind == DecodeRows::Kind::verify ? T_ : 1),
        snapshots_(uint64_t(rows.snapshots())),
        slots_(uint64_t(expert_slots(c, rows))),
        proj_stride_(std::max(s_.attention_rows, s_.deltanet_rows) * 4),
        mixer_stride_(std::max(s_.value_dim, s_.q_width) * 4),
        partial_(s_.heads * (uint64_t(c.head_dim) + 2) * 4) {
    out_.list.blocks.resize(size_t(t.blocks));
    out_.rows = rows;
    const uint64_t splits = uint64_t(t.attention_splits);
    out_.buffer_bytes = {T_ * 4,
                         T_ * s_.H * 4,
                         T_ * proj_stride_,
                         T_ * mixer_stride_,
                         T_ * s_.H * 4,
                         T_ * (s_.E + 1) * 4,
                         slots_ * 4 + slots_ * T_ * 4,
                         (slots_ + 1) * T_ * s_.I * 4,
                         T_ * splits * partial_,
                         T_ * s_.V * 4,
                         sequences_ * 4};
    for (int l = 0; l < c.num_layers; ++l) {
      const LayerKind kind = c.layer_types[size_t(l)];
      const uint64_t snapshots = kind == LayerKind::linear_attention ? snapshots_ : 0;
      out_.buffer_bytes.push_back((sequences_ + snapshots) * state_bytes(kind));
    }
  }

  DecodeTasks build() {
    const int32_t embedded = counter();
    add(DecodeOp::embed, 0, 0, 1, "embed", {}, embedded, {read(kToken, 0, T_ * 4), write(kHidden, 0, T_ * s_.H * 4)});
    Wait h_ready{uint32_t(embedded), 1};
    for (int l = 0; l < c_.num_layers; ++l) h_ready = layer(l, h_ready);
    for (uint64_t r = 0; r < s_.V; r += uint64_t(t_.lm_head_rows)) {
      const uint64_t e = std::min(s_.V, r + uint64_t(t_.lm_head_rows));
      std::vector<Access> use = {read(kHidden, 0, T_ * s_.H * 4)};
      each_row(use, Access::Kind::write, kLogits, s_.V * 4, r * 4, e * 4);
      add(DecodeOp::lm_head, 0, r, e - r, fmt::format("lm_head rows {}..{}", r, e), {h_ready}, -1, std::move(use));
    }
    add(DecodeOp::advance, 0, 0, 1, "advance", {h_ready}, -1, {write(kPosition, 0, sequences_ * 4)});
    return std::move(out_);
  }

 private:
  // One sequence's state of a layer: the conv and recurrent state, or the KV cache with the rows
  // this step appends.
  uint64_t state_bytes(LayerKind kind) const {
    if (kind == LayerKind::full_attention) return (kCacheRows + new_rows_) * kv_row();  // k and v, bf16
    return s_.conv_dim * s_.conv_taps * 4 + s_.value_heads * s_.dk * s_.dv * 4;
  }
  uint64_t kv_row() const { return 2 * s_.kv_width * 2; }

  int32_t counter() {
    producers_.push_back(0);
    return int32_t(out_.list.counters++);
  }

  // A task on the step's rows [row, row + rows); by default all of them.
  Task& add(DecodeOp op, int layer, uint64_t first, uint64_t count, std::string name, std::vector<Wait> waits,
            int32_t signal, std::vector<Access> accesses, uint64_t row = 0, uint64_t rows = 0) {
    Task task;
    task.op = uint16_t(op), task.layer = uint16_t(layer), task.first = uint32_t(first), task.count = uint32_t(count);
    task.row = uint16_t(row), task.rows = uint16_t(rows == 0 ? T_ : rows);
    task.waits = std::move(waits), task.signal = signal, task.accesses = std::move(accesses);
    task.name = std::move(name);
    auto& block = out_.list.blocks[cursor_++ % out_.list.blocks.size()];
    block.push_back(std::move(task));
    if (signal >= 0) ++producers_[signal];
    return block.back();
  }

  // Bytes [begin, end) of every row's part of a buffer of `stride` bytes a row.
  void each_row(std::vector<Access>& use, Access::Kind kind, uint32_t buffer, uint64_t stride, uint64_t begin,
                uint64_t end) const {
    for (uint64_t t = 0; t < T_; ++t) use.push_back({kind, buffer, t * stride + begin, t * stride + end});
  }

  // "row 2 " in the names of a parallel step's per-sequence tasks; nothing for one sequence.
  std::string sequence_name(uint64_t t) const { return sequences_ > 1 ? fmt::format("row {} ", t) : ""; }

  // The wait for every task that signalled `counter` so far.
  Wait all_of(int32_t counter) { return {uint32_t(counter), producers_[counter]}; }

  // Tiles of [0, n) by `rows`, each task made by f(begin, end).
  template <class F>
  void tiles(uint64_t n, int rows, F f) {
    for (uint64_t r = 0; r < n; r += uint64_t(rows)) f(r, std::min(n, r + uint64_t(rows)));
  }

  // One layer after h is ready; returns the wait for the layer's output h.
  Wait layer(int l, Wait h_ready) {
    const bool attention = c_.layer_types[size_t(l)] == LayerKind::full_attention;
    const uint64_t in_rows = attention ? s_.attention_rows : s_.deltanet_rows;
    const std::string at = fmt::format("layer {} ", l);

    const int32_t projected = counter();
    tiles(in_rows, t_.in_proj_rows, [&](uint64_t r, uint64_t e) {
      std::vector<Access> use = {read(kHidden, 0, T_ * s_.H * 4)};
      each_row(use, Access::Kind::write, kProj, proj_stride_, r * 4, e * 4);
      if (!attention && r < s_.conv_dim) {  // the conv state of its conv channels: every sequence's, snapshots
        const uint64_t c1 = std::min(e, s_.conv_dim), size = state_bytes(LayerKind::linear_attention);
        for (uint64_t i = 0; i < sequences_ + snapshots_; ++i)
          use.push_back(
              write(kLayerState + uint32_t(l), i * size + r * s_.conv_taps * 4, i * size + c1 * s_.conv_taps * 4));
      }
      add(DecodeOp::in_proj, l, r, e - r, at + fmt::format("in_proj rows {}..{}", r, e), {h_ready}, projected,
          std::move(use));
    });
    const int32_t mixed = attention ? attention_core(l, all_of(projected)) : deltanet_core(l, all_of(projected));

    const int32_t out = counter();
    const uint64_t mixer_width = attention ? s_.q_width : s_.value_dim;
    tiles(s_.H, t_.out_proj_rows, [&](uint64_t r, uint64_t e) {
      std::vector<Access> use;
      each_row(use, Access::Kind::read, kMixer, mixer_stride_, 0, mixer_width * 4);
      if (!attention)  // z, for the gated norm
        each_row(use, Access::Kind::read, kProj, proj_stride_, s_.conv_dim * 4, (s_.conv_dim + s_.value_dim) * 4);
      each_row(use, Access::Kind::accumulate, kHidden, s_.H * 4, r * 4, e * 4);
      add(DecodeOp::out_proj, l, r, e - r, at + fmt::format("out_proj rows {}..{}", r, e), {all_of(mixed)}, out,
          std::move(use));
    });
    return moe(l, all_of(out));
  }

  // DeltaNet: a task a range of columns of the value heads (flattened [Hv, dv]; within one head or
  // whole heads) reads the u (after the conv) of their key heads' q and k, their v columns, b and a,
  // and updates those columns of the recurrent state (symbolically [Hv, dv, dk] here: a column's
  // dk rows together); it writes o before the gated norm. Verify: one task steps through all rows
  // on the one state (program order inside the task orders the rows); parallel: a task a
  // sequence, on that sequence's state.
  int32_t deltanet_core(int l, Wait projected) {
    const int32_t done = counter();
    const uint64_t per_key = s_.value_heads / s_.key_heads, state = kLayerState + uint32_t(l);
    const uint64_t ssm_at = s_.conv_dim * s_.conv_taps * 4, state_size = state_bytes(LayerKind::linear_attention);
    for (uint64_t seq = 0; seq < sequences_; ++seq) {
      // The rows this sequence's tasks step through: all (verify) or its own (parallel).
      const uint64_t row = sequences_ > 1 ? seq : 0, rows = sequences_ > 1 ? 1 : T_, at = seq * state_size;
      tiles(s_.value_dim, t_.deltanet_columns, [&](uint64_t c0, uint64_t c1) {
        const uint64_t v0 = c0 / s_.dv, v1 = (c1 + s_.dv - 1) / s_.dv;  // value heads touched
        const uint64_t k0 = v0 / per_key, k1 = (v1 + per_key - 1) / per_key;
        const uint64_t b0 = s_.conv_dim + s_.value_dim, a0 = b0 + s_.value_heads;
        const uint64_t ranges[5][2] = {{k0 * s_.dk, k1 * s_.dk},
                                       {s_.key_dim + k0 * s_.dk, s_.key_dim + k1 * s_.dk},
                                       {2 * s_.key_dim + c0, 2 * s_.key_dim + c1},
                                       {b0 + v0, b0 + v1},
                                       {a0 + v0, a0 + v1}};
        std::vector<Access> use;
        for (const auto& [begin, end] : ranges)
          for (uint64_t t = row; t < row + rows; ++t)
            use.push_back(read(kProj, t * proj_stride_ + begin * 4, t * proj_stride_ + end * 4));
        use.push_back(write(state, at + ssm_at + c0 * s_.dk * 4, at + ssm_at + c1 * s_.dk * 4));
        for (uint64_t i = 1; i <= snapshots_; ++i)  // (verify: after the one sequence's state)
          use.push_back(
              write(state, i * state_size + ssm_at + c0 * s_.dk * 4, i * state_size + ssm_at + c1 * s_.dk * 4));
        for (uint64_t t = row; t < row + rows; ++t)
          use.push_back(write(kMixer, t * mixer_stride_ + c0 * 4, t * mixer_stride_ + c1 * 4));
        add(DecodeOp::deltanet_core, l, c0, c1 - c0,
            fmt::format("layer {} deltanet {}columns {}..{}", l, sequence_name(seq), c0, c1), {projected}, done,
            std::move(use), row, rows);
      });
    }
    return done;
  }

  // Attention: each split reads its part of the cache (the first also appends the step's k and v),
  // the q, k, v of its rows, and writes its partial outputs; the combine writes the gated output.
  // Verify: the splits of the one cache, each for all rows (split 0 masks the step's own rows
  // causally), one combine; parallel: splits and a combine a sequence (its own counter, so that a
  // combine waits only for its sequence's splits).
  int32_t attention_core(int l, Wait projected) {
    std::vector<int32_t> split_done;
    for (uint64_t seq = 0; seq < sequences_; ++seq) split_done.push_back(counter());
    const int32_t done = counter();
    const uint64_t state = kLayerState + uint32_t(l), state_size = state_bytes(LayerKind::full_attention);
    const uint64_t splits = uint64_t(t_.attention_splits), row_stride = splits * partial_;
    const uint64_t nkv = uint64_t(c_.num_key_value_heads), group = s_.heads / nkv, head_bytes = partial_ / s_.heads;
    const uint64_t kv_head = kv_row() / nkv;  // a KV head's k and v of a cache row (symbolic)
    for (uint64_t seq = 0; seq < sequences_; ++seq) {
      const uint64_t row = sequences_ > 1 ? seq : 0, rows = sequences_ > 1 ? 1 : T_, at = seq * state_size;
      for (uint64_t sp = 0; sp < splits; ++sp)
        tiles(nkv, t_.attention_kv_heads, [&](uint64_t g0, uint64_t g1) {
          std::vector<Access> use;
          for (uint64_t t = row; t < row + rows; ++t)
            use.push_back(read(kProj, t * proj_stride_, t * proj_stride_ + s_.attention_rows * 4));
          use.push_back(read(state, at, at + kCacheRows * kv_row()));
          use.push_back(read(kPosition, seq * 4, (seq + 1) * 4));
          for (uint64_t t = row; t < row + rows; ++t) {
            const uint64_t part = t * row_stride + sp * partial_;
            use.push_back(write(kPartials, part + g0 * group * head_bytes, part + g1 * group * head_bytes));
          }
          if (sp == 0)
            for (uint64_t r = 0; r < new_rows_; ++r) {
              const uint64_t cache_row = at + (kCacheRows + r) * kv_row();
              use.push_back(write(state, cache_row + g0 * kv_head, cache_row + g1 * kv_head));
            }
          add(DecodeOp::attention_split, l, sp, g1 - g0,
              fmt::format("layer {} attention {}split {} kv heads {}..{}", l, sequence_name(seq), sp, g0, g1),
              {projected}, split_done[seq], std::move(use), row, rows)
              .slot = uint16_t(g0);
        });
    }
    const uint64_t d = uint64_t(c_.head_dim);
    for (uint64_t seq = 0; seq < sequences_; ++seq) {
      const uint64_t row = sequences_ > 1 ? seq : 0, rows = sequences_ > 1 ? 1 : T_;
      tiles(s_.heads, t_.combine_heads, [&](uint64_t h0, uint64_t h1) {
        std::vector<Access> use = {read(kPartials, row * row_stride, (row + rows) * row_stride)};
        for (uint64_t t = row; t < row + rows; ++t)
          use.push_back(read(kProj, t * proj_stride_, t * proj_stride_ + 2 * s_.q_width * 4));
        for (uint64_t t = row; t < row + rows; ++t)
          use.push_back(write(kMixer, t * mixer_stride_ + h0 * d * 4, t * mixer_stride_ + h1 * d * 4));
        add(DecodeOp::attention_combine, l, h0, h1 - h0,
            fmt::format("layer {} attention {}combine heads {}..{}", l, sequence_name(seq), h0, h1),
            {all_of(split_done[seq])}, done, std::move(use), row, rows);
      });
    }
    return done;
  }

  // The expert slots, the shared expert's (U) first.
  std::vector<uint64_t> shared_first() const {
    std::vector<uint64_t> order = {slots_};
    for (uint64_t slot = 0; slot < slots_; ++slot) order.push_back(slot);
    return order;
  }

  // The MoE after out_proj; returns the wait for h with every slot's down added.
  Wait moe(int l, Wait h_ready) {
    const std::string at = fmt::format("layer {} ", l);
    const uint64_t act_slot = T_ * s_.I * 4, top_k_bytes = slots_ * 4 + slots_ * T_ * 4;
    const int32_t routed = counter(), chosen = counter(), down = counter();
    // Every router task normalizes h itself (no hop for a norm task); the first also writes x.
    tiles(s_.E + 1, t_.router_rows, [&](uint64_t r, uint64_t e) {
      std::vector<Access> use = {read(kHidden, 0, T_ * s_.H * 4)};
      if (r == 0) use.push_back(write(kMoeInput, 0, T_ * s_.H * 4));
      each_row(use, Access::Kind::write, kRouterLogits, (s_.E + 1) * 4, r * 4, e * 4);
      add(DecodeOp::router, l, r, e - r, at + fmt::format("router rows {}..{}", r, e), {h_ready}, routed,
          std::move(use));
    });
    std::vector<Access> top_k_use;
    each_row(top_k_use, Access::Kind::read, kRouterLogits, (s_.E + 1) * 4, 0, s_.E * 4);
    top_k_use.push_back(write(kTopK, 0, top_k_bytes));
    add(DecodeOp::top_k, l, 0, 1, at + "top_k", {all_of(routed)}, chosen, std::move(top_k_use));
    // Slots 0..U-1: the union of the rows' experts; slot U: the shared expert (needs x, from the
    // routers, not the choice). A slot's gate/up writes act[slot][t] of every row (those that chose its expert).
    // The shared expert's tasks are dealt first: they are ready a hop earlier (no top-k), so the
    // blocks that hold them run them while the top-k runs, ahead of their routed tasks.
    // One row: a routed slot's gate/up tasks choose its expert themselves from the row's logits
    // (rank `slot` of the top-k rule), so they too wait only for the routers, a hop earlier; the
    // top-k task still writes the ids and weights that the downs read. Several rows: the union
    // is the top-k task's to gather.
    const bool own_choice = T_ == 1;
    std::vector<int32_t> acted(slots_ + 1);
    for (uint64_t slot : shared_first()) {
      const bool shared = slot == slots_;
      const int32_t act = counter();
      acted[slot] = act;
      tiles(s_.I, t_.expert_rows, [&](uint64_t r, uint64_t e) {
        std::vector<Access> use = {read(kMoeInput, 0, T_ * s_.H * 4)};
        each_row(use, Access::Kind::write, kAct, s_.I * 4, slot * act_slot + r * 4, slot * act_slot + e * 4);
        if (!shared) use.push_back(own_choice ? read(kRouterLogits, 0, s_.E * 4) : read(kTopK, 0, top_k_bytes));
        add(DecodeOp::gate_up, l, r, e - r, at + fmt::format("gate_up slot {} rows {}..{}", slot, r, e),
            {shared || own_choice ? all_of(routed) : all_of(chosen)}, act, std::move(use))
            .slot = uint16_t(slot);
      });
    }
    for (uint64_t slot : shared_first()) {
      const bool shared = slot == slots_;
      std::vector<Wait> waits = {all_of(acted[slot])};
      if (!shared && own_choice) waits.push_back(all_of(chosen));  // the slot's weight
      tiles(s_.H, t_.down_rows, [&](uint64_t r, uint64_t e) {
        std::vector<Access> use = {read(kAct, slot * act_slot, (slot + 1) * act_slot)};
        if (shared) each_row(use, Access::Kind::read, kRouterLogits, (s_.E + 1) * 4, s_.E * 4, (s_.E + 1) * 4);
        else use.push_back(read(kTopK, 0, top_k_bytes));
        each_row(use, Access::Kind::accumulate, kHidden, s_.H * 4, r * 4, e * 4);
        // (The shared expert's gate, the router's last row, is ordered before through its gate/up.)
        add(DecodeOp::down, l, r, e - r, at + fmt::format("down slot {} rows {}..{}", slot, r, e), waits, down,
            std::move(use))
            .slot = uint16_t(slot);
      });
    }
    return all_of(down);
  }

  const ModelConfig& c_;
  const DecodeTiling t_;
  const Shape s_;
  const uint64_t T_;          // rows of the step
  const uint64_t sequences_;  // 1 (verify) or T (parallel)
  const uint64_t new_rows_;   // KV rows a sequence's cache gains this step: T (verify) or 1
  const uint64_t snapshots_;  // DeltaNet states kept after rows 0..T-2 (verify, keep_states), after the sequence's
  const uint64_t slots_;      // routed expert slots (expert_slots)
  const uint64_t proj_stride_, mixer_stride_,
      partial_;  // bytes: a row of kProj, of kMixer; a split's partials of a row
  DecodeTasks out_;
  size_t cursor_ = 0;
  std::vector<uint32_t> producers_;  // by counter: the tasks that signal it so far
};

}  // namespace

const char* op_name(DecodeOp op) {
  switch (op) {
    case DecodeOp::embed: return "embed";
    case DecodeOp::in_proj: return "in_proj";
    case DecodeOp::deltanet_core: return "deltanet_core";
    case DecodeOp::attention_split: return "attention_split";
    case DecodeOp::attention_combine: return "attention_combine";
    case DecodeOp::out_proj: return "out_proj";
    case DecodeOp::router: return "router";
    case DecodeOp::top_k: return "top_k";
    case DecodeOp::gate_up: return "gate_up";
    case DecodeOp::down: return "down";
    case DecodeOp::lm_head: return "lm_head";
    case DecodeOp::advance: return "advance";
  }
  return "?";
}

int expert_slots(const ModelConfig& c, const DecodeRows& rows) {
  return std::min(c.num_experts, rows.count * c.num_experts_per_tok);
}

DecodeTasks build_decode_tasks(const ModelConfig& c, const DecodeTiling& t, const DecodeRows& rows) {
  LILY_CHECK(t.blocks > 0 && t.in_proj_rows > 0 && t.out_proj_rows > 0 && t.router_rows > 0 && t.expert_rows > 0 &&
                 t.down_rows > 0 && t.lm_head_rows > 0 && t.deltanet_columns > 0 && t.attention_splits > 0 &&
                 t.combine_heads > 0,
             "decode tasks: every tile size and the block count must be positive");
  LILY_CHECK(rows.count >= 1 && rows.count <= kMaxDecodeRows, "decode tasks: {} rows a step (1..{})", rows.count,
             kMaxDecodeRows);
  LILY_CHECK(!rows.keep_states || rows.kind == DecodeRows::Kind::verify,
             "decode tasks: states kept after each row of a parallel step (one row a sequence: nothing to take back)");
  LILY_CHECK(c.num_layers > 0 && size_t(c.num_layers) == c.layer_types.size() && c.hidden_size > 0 &&
                 c.num_experts_per_tok > 0 && c.num_experts >= c.num_experts_per_tok && c.vocab_size > 0,
             "decode tasks: config with {} layers ({} layer types), hidden {}, {} experts (top {}), vocabulary {}",
             c.num_layers, c.layer_types.size(), c.hidden_size, c.num_experts, c.num_experts_per_tok, c.vocab_size);
  if (c.num_layers_of(LayerKind::linear_attention) > 0) {
    LILY_CHECK(c.linear_num_key_heads > 0 && c.linear_num_value_heads % c.linear_num_key_heads == 0,
               "decode tasks: {} DeltaNet value heads over {} key heads", c.linear_num_value_heads,
               c.linear_num_key_heads);
    const int dv = c.linear_value_head_dim;
    LILY_CHECK(dv % t.deltanet_columns == 0 || t.deltanet_columns % dv == 0,
               "decode tasks: DeltaNet tasks of {} columns would cut a head of {} columns unevenly", t.deltanet_columns,
               dv);
  }
  return Builder(c, t, rows).build();
}

}  // namespace lily::cuda::persistent
