// test_decode_tasks.cpp: the decode step as a task list (backend/cuda/persistent/decode_tasks.h),
// on the CPU. The lists of the full-size model and of lily-tiny, with the default tiling and with
// odd tiles on few blocks, must pass check_task_list; every op must write each element of its
// output exactly once a layer (the downs: once per expert slot), every access must stay inside its
// buffer; with a block per task, dropping any one wait must be refused, and
// tilings that would split a DeltaNet key head's channels are refused when built.
// Steps of T = 1..8 rows (verify and parallel) on tiny-a, lily-tiny and a short full-size config:
// one row is exactly the one-token step, every list passes the check, every row's part of every
// output is written once (each sequence's state once), every wait is needed, and the task counts
// follow from the config (the MoE's slots: the union of the rows' experts, min(E, T k)).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <tuple>

#include "../model/fixture.h"
#include "backend/cuda/persistent/decode_tasks.h"
#include "base/error.h"
#include "short_full_size.h"

namespace lily::test {
namespace {

using namespace cuda::persistent;

std::string refusal(const TaskList& list) {
  try {
    check_task_list(list);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

ModelConfig tiny() { return load_model_config(std::string(LILY_SOURCE_DIR) + "/models/lily-tiny"); }
ModelConfig tiny_a() { return load_model_config(fixture_dir("tiny-a") + "/mlx-q4"); }

std::vector<const Task*> all_tasks(const TaskList& l) {
  std::vector<const Task*> tasks;
  for (const auto& block : l.blocks)
    for (const Task& t : block) tasks.push_back(&t);
  return tasks;
}

TEST(DecodeTasks, TheFullSizeStepPasses) {
  const ModelConfig c = qwen36_35b_a3b_config();
  const DecodeTiling t;
  const DecodeTasks d = build_decode_tasks(c, t);
  EXPECT_EQ(refusal(d.list), "");
  // Counted from the config: per DeltaNet layer 12352/96 in_proj + 4096/32 cores, per attention
  // layer 9216/96 + 16 splits + 1 combine; per layer 2048/32 out_proj, 257/32 router
  // tiles, 1 top_k, 9 slots x (512/32 gate_up + 2048/128 down); 248320/2048 lm_head, embed, advance.
  const size_t deltanet = 129 + 128, attention = 96 + 16 + 1, moe = 64 + 9 + 1 + 9 * (16 + 16);
  EXPECT_EQ(d.list.tasks(), 30 * deltanet + 10 * attention + 40 * moe + 122 + 2);
  // Round-robin: no block has more than one task above another.
  size_t most = 0, least = SIZE_MAX;
  for (const auto& block : d.list.blocks) most = std::max(most, block.size()), least = std::min(least, block.size());
  EXPECT_LE(most - least, 1u);
}

TEST(DecodeTasks, OddTilesOnFewBlocksPass) {
  DecodeTiling t;
  t.blocks = 5, t.in_proj_rows = 77, t.out_proj_rows = 100, t.router_rows = 7, t.expert_rows = 33;
  t.down_rows = 300, t.lm_head_rows = 10007, t.deltanet_columns = 768, t.attention_splits = 3;
  EXPECT_EQ(refusal(build_decode_tasks(short_full_size(4), t).list), "");
  t.blocks = 1;  // one block runs everything in order
  EXPECT_EQ(refusal(build_decode_tasks(short_full_size(4), t).list), "");
  DecodeTiling small;
  small.blocks = 7, small.in_proj_rows = 16, small.out_proj_rows = 16, small.expert_rows = 16, small.down_rows = 16;
  small.lm_head_rows = 64;
  EXPECT_EQ(refusal(build_decode_tasks(tiny(), small).list), "");
}

// Every op writes (or accumulates into) each element of its output the same number of times a
// layer: once, and once per expert slot for the downs; every access inside its buffer.
TEST(DecodeTasks, EveryOutputIsCoveredOnceALayer) {
  const ModelConfig c = short_full_size(4);
  DecodeTiling t;
  t.in_proj_rows = 100, t.out_proj_rows = 48, t.expert_rows = 24, t.down_rows = 200;  // tiles that do not divide
  const DecodeTasks d = build_decode_tasks(c, t);
  // (layer, op, buffer) -> intervals written or accumulated
  std::map<std::tuple<int, int, uint32_t>, std::vector<std::pair<uint64_t, uint64_t>>> writes;
  for (const Task* task : all_tasks(d.list))
    for (const Access& a : task->accesses) {
      ASSERT_LT(a.buffer, d.buffer_bytes.size()) << task->name;
      EXPECT_LE(a.end, d.buffer_bytes[a.buffer]) << task->name << " buffer " << a.buffer;
      if (a.kind != Access::Kind::read) writes[{task->layer, task->op, a.buffer}].push_back({a.begin, a.end});
    }
  auto covered = [&](int layer, DecodeOp op, uint32_t buffer, uint64_t begin, uint64_t end, int times) {
    SCOPED_TRACE(testing::Message() << "layer " << layer << " " << op_name(op) << " buffer " << buffer);
    auto it = writes.find({layer, int(op), buffer});
    ASSERT_NE(it, writes.end());
    std::map<uint64_t, int> delta;  // coverage count changes at each boundary
    for (auto [b, e] : it->second) ++delta[b], --delta[e];
    int depth = 0;
    uint64_t at = begin;
    for (auto [x, change] : delta) {
      if (x > at) {
        EXPECT_EQ(depth, times) << "bytes " << at << ".." << x;
      }
      depth += change, at = x;
    }
    EXPECT_EQ(delta.begin()->first, begin);
    EXPECT_EQ(delta.rbegin()->first, end);
  };
  const uint64_t H = uint64_t(c.hidden_size) * 4, k = uint64_t(c.num_experts_per_tok);
  const uint64_t I = uint64_t(c.moe_intermediate_size) * 4;
  for (int l = 0; l < c.num_layers; ++l) {
    const bool attention = c.layer_types[size_t(l)] == LayerKind::full_attention;
    const uint64_t in_rows = attention ? 2 * uint64_t(c.attention_q_width()) + 2 * uint64_t(c.attention_kv_width())
                                       : uint64_t(c.linear_conv_dim()) + c.linear_value_dim() +
                                             2 * uint64_t(c.linear_num_value_heads);
    covered(l, DecodeOp::in_proj, kProj, 0, in_rows * 4, 1);
    if (attention) covered(l, DecodeOp::attention_combine, kMixer, 0, uint64_t(c.attention_q_width()) * 4, 1);
    else covered(l, DecodeOp::deltanet_core, kMixer, 0, uint64_t(c.linear_value_dim()) * 4, 1);
    covered(l, DecodeOp::out_proj, kHidden, 0, H, 1);
    covered(l, DecodeOp::router, kMoeInput, 0, H, 1);
    covered(l, DecodeOp::router, kRouterLogits, 0, (uint64_t(c.num_experts) + 1) * 4, 1);
    covered(l, DecodeOp::top_k, kTopK, 0, k * 8, 1);
    covered(l, DecodeOp::gate_up, kAct, 0, (k + 1) * I, 1);
    covered(l, DecodeOp::down, kHidden, 0, H, int(k) + 1);
  }
  covered(0, DecodeOp::lm_head, kLogits, 0, uint64_t(c.vocab_size) * 4, 1);
}

// Drops every wait of every task of `good`, one at a time, and expects each such list refused;
// returns how many were dropped.
size_t expect_every_wait_needed(const TaskList& good, const std::string& what) {
  size_t dropped = 0;
  for (size_t b = 0; b < good.blocks.size(); ++b)
    for (size_t i = 0; i < good.blocks[b].size(); ++i)
      for (size_t w = 0; w < good.blocks[b][i].waits.size(); ++w) {
        TaskList bad = good;
        auto& waits = bad.blocks[b][i].waits;
        waits.erase(waits.begin() + long(w));
        EXPECT_NE(refusal(bad), "") << what << good.blocks[b][i].name << " without wait " << w;
        ++dropped;
      }
  return dropped;
}

// With a block for every task, program order orders nothing: every wait is needed, and a list
// without any one of them must be refused.
TEST(DecodeTasks, DroppingAnyWaitIsRefused) {
  DecodeTiling t;
  t.blocks = 256, t.in_proj_rows = 1024, t.out_proj_rows = 512, t.router_rows = 64, t.expert_rows = 256;
  t.down_rows = 1024, t.lm_head_rows = 65536, t.deltanet_columns = 1024, t.attention_splits = 2;
  const TaskList good = build_decode_tasks(short_full_size(2), t).list;
  ASSERT_EQ(refusal(good), "");
  ASSERT_LE(good.tasks(), good.blocks.size());
  EXPECT_GT(expect_every_wait_needed(good, ""), 100u);
}

TEST(DecodeTasks, TilingsThatCannotWorkAreRefused) {
  DecodeTiling t;
  t.deltanet_columns = 48;  // heads of 128 columns: tasks of 48 would straddle two heads
  EXPECT_THROW(build_decode_tasks(qwen36_35b_a3b_config(), t), Error);
  t = DecodeTiling{};
  t.blocks = 0;
  EXPECT_THROW(build_decode_tasks(qwen36_35b_a3b_config(), t), Error);
  t = DecodeTiling{};
  t.expert_rows = -4;
  EXPECT_THROW(build_decode_tasks(qwen36_35b_a3b_config(), t), Error);
  ModelConfig c = qwen36_35b_a3b_config();
  c.layer_types.pop_back();  // 39 types for 40 layers
  EXPECT_THROW(build_decode_tasks(c, DecodeTiling{}), Error);
}

// ---- Steps of several rows ----------------------------------------------------------------

constexpr DecodeRows::Kind kBothKinds[] = {DecodeRows::Kind::verify, DecodeRows::Kind::parallel};

const char* kind_name(DecodeRows::Kind k) { return k == DecodeRows::Kind::verify ? "verify" : "parallel"; }

// Task by task, every field; "" when equal, else what differs first.
std::string first_difference(const TaskList& a, const TaskList& b) {
  if (a.counters != b.counters || a.blocks.size() != b.blocks.size())
    return testing::PrintToString(std::make_pair(a.counters, a.blocks.size())) + " counters, blocks vs " +
           testing::PrintToString(std::make_pair(b.counters, b.blocks.size()));
  for (size_t k = 0; k < a.blocks.size(); ++k) {
    if (a.blocks[k].size() != b.blocks[k].size()) return "block " + std::to_string(k) + " lengths";
    for (size_t i = 0; i < a.blocks[k].size(); ++i) {
      const Task &x = a.blocks[k][i], &y = b.blocks[k][i];
      auto waits = [](const Task& t) {
        std::vector<std::pair<uint32_t, uint32_t>> w;
        for (const Wait& v : t.waits) w.push_back({v.counter, v.count});
        return w;
      };
      auto accesses = [](const Task& t) {
        std::vector<std::tuple<int, uint32_t, uint64_t, uint64_t>> u;
        for (const Access& a : t.accesses) u.push_back({int(a.kind), a.buffer, a.begin, a.end});
        return u;
      };
      if (std::tie(x.op, x.layer, x.slot, x.first, x.count, x.row, x.rows, x.signal, x.name) !=
              std::tie(y.op, y.layer, y.slot, y.first, y.count, y.row, y.rows, y.signal, y.name) ||
          waits(x) != waits(y) || accesses(x) != accesses(y))
        return "'" + x.name + "' vs '" + y.name + "'";
    }
  }
  return "";
}

DecodeTiling odd_tiles(int blocks) {
  DecodeTiling t;
  t.blocks = blocks, t.in_proj_rows = 77, t.out_proj_rows = 100, t.router_rows = 7, t.expert_rows = 33;
  t.down_rows = 300, t.lm_head_rows = 1009, t.deltanet_columns = 384, t.attention_splits = 3, t.attention_kv_heads = 1,
  t.combine_heads = 3;
  return t;
}

// One row is the one-token step, of either kind and with the rows left out.
TEST(DecodeTasks, OneRowIsTheOneTokenStep) {
  for (const ModelConfig& c : {short_full_size(4), tiny(), tiny_a()})
    for (const DecodeTiling& t : {DecodeTiling{}, odd_tiles(5)}) {
      const DecodeTasks plain = build_decode_tasks(c, t);
      for (DecodeRows::Kind kind : kBothKinds) {
        const DecodeTasks one = build_decode_tasks(c, t, {1, kind});
        EXPECT_EQ(first_difference(one.list, plain.list), "") << kind_name(kind);
        EXPECT_EQ(one.buffer_bytes, plain.buffer_bytes) << kind_name(kind);
      }
      EXPECT_EQ(expert_slots(c, {}), c.num_experts_per_tok);
    }
}

// T = 1..8 of both kinds pass the check, default and odd tiles, on the small configs and a short
// full-size one.
TEST(DecodeTasks, StepsOfSeveralRowsPass) {
  const std::vector<std::pair<std::string, ModelConfig>> configs = {
      {"tiny-a", tiny_a()}, {"lily-tiny", tiny()}, {"full size, 4 layers", short_full_size(4)}};
  DecodeTiling small = odd_tiles(7);
  small.in_proj_rows = 16, small.out_proj_rows = 16, small.expert_rows = 16, small.down_rows = 16;
  small.lm_head_rows = 64, small.deltanet_columns = 64, small.attention_splits = 5;
  for (const auto& [config_name, c] : configs)
    for (const DecodeTiling& t : {DecodeTiling{}, odd_tiles(5), odd_tiles(1), small})
      for (DecodeRows::Kind kind : kBothKinds)
        for (int T = 1; T <= kMaxDecodeRows; ++T) {
          // The full size's widths in small tiles are tens of thousands of tasks: only time.
          if (config_name[0] == 'f' && (t.blocks == 1 || t.blocks == small.blocks)) continue;
          const DecodeTasks d = build_decode_tasks(c, t, {T, kind});
          EXPECT_EQ(refusal(d.list), "") << config_name << ", " << kind_name(kind) << ", T " << T << ", " << t.blocks
                                         << " blocks";
          EXPECT_EQ(d.rows.count, T);
          if (kind == DecodeRows::Kind::parallel) continue;
          const DecodeTasks kept = build_decode_tasks(c, t, {T, kind, true});  // with the states after each row
          EXPECT_EQ(refusal(kept.list), "") << config_name << ", kept states, T " << T << ", " << t.blocks << " blocks";
        }
}

// The whole model at 8 rows, as a persistent kernel's loader would check it (tens of thousands of
// tasks on 132 blocks): the check's happens-before is a clock a task (tasks x blocks counts) and
// its race scan goes by cells of bytes, not by pairs of accesses, so it is a matter of seconds.
TEST(DecodeTasks, TheFullSizeStepOfEightRowsPasses) {
  const ModelConfig c = qwen36_35b_a3b_config();
  for (DecodeRows::Kind kind : kBothKinds) {
    const DecodeTasks d = build_decode_tasks(c, DecodeTiling{}, {kMaxDecodeRows, kind});
    EXPECT_EQ(refusal(d.list), "") << kind_name(kind);
  }
}

// Tasks a layer for T rows, counted from tiny-a's config: the dense ops and the verify step's
// DeltaNet and attention once for all rows, the parallel step's once a sequence, the MoE's slots
// the union of the rows' experts (min(E, T k)) and the shared expert.
TEST(DecodeTasks, TaskCountsFollowFromTheRows) {
  const ModelConfig c = tiny_a();  // 3 DeltaNet layers, 1 attention; H 128, E 8 (top 2), I 64, V 384
  ASSERT_EQ(c.num_layers_of(LayerKind::linear_attention), 3);
  DecodeTiling t;
  t.in_proj_rows = 64, t.out_proj_rows = 32, t.router_rows = 4, t.expert_rows = 16, t.down_rows = 64;
  t.lm_head_rows = 100, t.deltanet_columns = 256, t.attention_splits = 3;
  const size_t in_deltanet = (c.linear_conv_dim() + c.linear_value_dim() + 2 * c.linear_num_value_heads + 63) / 64;
  const size_t in_attention = (2 * c.attention_q_width() + 2 * c.attention_kv_width() + 63) / 64;
  for (DecodeRows::Kind kind : kBothKinds)
    for (int T = 1; T <= kMaxDecodeRows; ++T) {
      const size_t sequences = kind == DecodeRows::Kind::parallel ? size_t(T) : 1;
      const size_t slots = size_t(std::min(8, 2 * T));
      const size_t moe = 4 + 3 + 1 + (slots + 1) * (4 + 2);
      const size_t deltanet = in_deltanet + sequences * 2, attention = in_attention + sequences * (3 + 1);
      const DecodeTasks d = build_decode_tasks(c, t, {T, kind});
      EXPECT_EQ(expert_slots(c, {T, kind}), int(slots));
      EXPECT_EQ(d.list.tasks(), 3 * deltanet + attention + 4 * moe + 4 + 2) << kind_name(kind) << ", T " << T;
    }
}

// The ranges the tasks of one (layer, op) write or accumulate into a buffer, as a step function of
// how many times each byte is written (runs of equal counts merged, zeros dropped).
using Coverage = std::map<uint64_t, int>;  // boundary -> count from there on
Coverage coverage(const std::vector<std::pair<uint64_t, uint64_t>>& ranges) {
  std::map<uint64_t, int> delta;
  for (auto [b, e] : ranges) ++delta[b], --delta[e];
  Coverage c;
  int depth = 0, last = 0;
  for (auto [x, change] : delta) {
    depth += change;
    if (depth != last) c[x] = depth, last = depth;
  }
  return c;
}

// Every row's part of every output is written once a layer (h by the downs once per slot), each
// sequence's state once, every access inside its buffer.
TEST(DecodeTasks, EveryRowsOutputIsCoveredOnceALayer) {
  const ModelConfig c = short_full_size(4);
  DecodeTiling t;
  t.in_proj_rows = 100, t.out_proj_rows = 48, t.expert_rows = 24, t.down_rows = 200;  // tiles that do not divide
  t.attention_splits = 3;
  const uint64_t H = uint64_t(c.hidden_size) * 4, E = uint64_t(c.num_experts), I = uint64_t(c.moe_intermediate_size);
  const uint64_t V = uint64_t(c.vocab_size) * 4, q = uint64_t(c.attention_q_width()) * 4;
  const uint64_t value_dim = uint64_t(c.linear_value_dim()) * 4, kv_row = 2 * uint64_t(c.attention_kv_width()) * 2;
  const uint64_t attention_rows = 2 * uint64_t(c.attention_q_width()) + 2 * uint64_t(c.attention_kv_width());
  const uint64_t deltanet_rows = uint64_t(c.linear_conv_dim()) + c.linear_value_dim() + 2 * c.linear_num_value_heads;
  const uint64_t proj = std::max(attention_rows, deltanet_rows) * 4, mixer = std::max(value_dim, q);
  const uint64_t partials = uint64_t(t.attention_splits) * c.num_attention_heads * (uint64_t(c.head_dim) + 2) * 4;
  const uint64_t deltanet_state = uint64_t(c.linear_conv_dim()) * uint64_t(c.linear_conv_kernel_dim - 1) * 4 +
                                  uint64_t(c.linear_num_value_heads) * c.linear_key_head_dim * c.linear_value_head_dim *
                                      4;
  for (DecodeRows::Kind kind : kBothKinds)
    for (int T : {1, 3, 8}) {
      SCOPED_TRACE(testing::Message() << kind_name(kind) << ", T " << T);
      const DecodeTasks d = build_decode_tasks(c, t, {T, kind});
      const uint64_t rows = uint64_t(T), sequences = uint64_t(d.rows.sequences()),
                     U = uint64_t(expert_slots(c, d.rows));
      const uint64_t new_rows = kind == DecodeRows::Kind::verify ? rows : 1;
      const uint64_t attention_state = (kCacheRows + new_rows) * kv_row;
      std::map<std::tuple<int, int, uint32_t>, std::vector<std::pair<uint64_t, uint64_t>>> writes;
      for (const Task* task : all_tasks(d.list))
        for (const Access& a : task->accesses) {
          ASSERT_LT(a.buffer, d.buffer_bytes.size()) << task->name;
          EXPECT_LE(a.end, d.buffer_bytes[a.buffer]) << task->name << " buffer " << a.buffer;
          if (a.kind != Access::Kind::read) writes[{task->layer, task->op, a.buffer}].push_back({a.begin, a.end});
        }
      // What (layer, op) must write: [begin, end) of every one of n parts `stride` bytes apart, `times` times.
      auto expect = [&](int layer, DecodeOp op, uint32_t buffer, uint64_t n, uint64_t stride, uint64_t begin,
                        uint64_t end, int times = 1) {
        std::vector<std::pair<uint64_t, uint64_t>> want;
        for (uint64_t i = 0; i < n; ++i)
          for (int k = 0; k < times; ++k) want.push_back({i * stride + begin, i * stride + end});
        EXPECT_EQ(coverage(writes[{layer, int(op), buffer}]), coverage(want))
            << "layer " << layer << " " << op_name(op) << " buffer " << buffer;
      };
      expect(0, DecodeOp::embed, kHidden, 1, 0, 0, rows * H);
      for (int l = 0; l < c.num_layers; ++l) {
        const bool attention = c.layer_types[size_t(l)] == LayerKind::full_attention;
        const uint32_t state = kLayerState + uint32_t(l);
        expect(l, DecodeOp::in_proj, kProj, rows, proj, 0, (attention ? attention_rows : deltanet_rows) * 4);
        if (attention) {
          expect(l, DecodeOp::attention_split, kPartials, rows, partials, 0, partials);
          expect(l, DecodeOp::attention_split, state, sequences, attention_state, kCacheRows * kv_row, attention_state);
          expect(l, DecodeOp::attention_combine, kMixer, rows, mixer, 0, q);
        } else {
          // The conv state by the input projection (its conv channels), the recurrent state by the cores.
          const uint64_t conv_state = uint64_t(c.linear_conv_dim()) * uint64_t(c.linear_conv_kernel_dim - 1) * 4;
          expect(l, DecodeOp::in_proj, state, sequences, deltanet_state, 0, conv_state);
          expect(l, DecodeOp::deltanet_core, kMixer, rows, mixer, 0, value_dim);
          expect(l, DecodeOp::deltanet_core, state, sequences, deltanet_state, conv_state, deltanet_state);
          if (kind == DecodeRows::Kind::verify) {  // the states after rows 0..T-2 after the sequence's, kept
            const DecodeTasks k = build_decode_tasks(c, t, {T, kind, true});
            std::map<uint32_t, std::vector<std::pair<uint64_t, uint64_t>>> in_proj, core;  // by buffer
            for (const Task* task : all_tasks(k.list))
              for (const Access& a : task->accesses)
                if (a.kind == Access::Kind::write && a.buffer == state && task->layer == l)
                  (task->op == uint16_t(DecodeOp::in_proj) ? in_proj : core)[a.buffer].push_back({a.begin, a.end});
            std::vector<std::pair<uint64_t, uint64_t>> want_conv, want_core;
            for (uint64_t i = 0; i < rows; ++i) {
              want_conv.push_back({i * deltanet_state, i * deltanet_state + conv_state});
              want_core.push_back({i * deltanet_state + conv_state, (i + 1) * deltanet_state});
            }
            EXPECT_EQ(coverage(in_proj[state]), coverage(want_conv)) << "layer " << l << " kept conv states";
            EXPECT_EQ(coverage(core[state]), coverage(want_core)) << "layer " << l << " kept recurrent states";
            EXPECT_EQ(k.buffer_bytes[state], rows * deltanet_state);
          }
        }
        expect(l, DecodeOp::out_proj, kHidden, rows, H, 0, H);
        expect(l, DecodeOp::router, kMoeInput, 1, 0, 0, rows * H);
        expect(l, DecodeOp::router, kRouterLogits, rows, (E + 1) * 4, 0, (E + 1) * 4);
        expect(l, DecodeOp::top_k, kTopK, 1, 0, 0, U * 4 + U * rows * 4);
        expect(l, DecodeOp::gate_up, kAct, 1, 0, 0, (U + 1) * rows * I * 4);
        expect(l, DecodeOp::down, kHidden, rows, H, 0, H, int(U) + 1);
      }
      expect(0, DecodeOp::lm_head, kLogits, rows, V, 0, V);
      expect(0, DecodeOp::advance, kPosition, 1, 0, 0, sequences * 4);
    }
}

// With a block for every task, every wait of a step of several rows is needed too.
TEST(DecodeTasks, DroppingAnyWaitOfSeveralRowsIsRefused) {
  DecodeTiling t;
  t.blocks = 512, t.in_proj_rows = 1024, t.out_proj_rows = 1024, t.router_rows = 128, t.expert_rows = 512;
  t.down_rows = 2048, t.lm_head_rows = 65536, t.deltanet_columns = 2048, t.attention_splits = 2;
  ModelConfig c = short_full_size(2);
  c.num_experts_per_tok = 2;  // fewer slots, so that a block a task fits
  for (DecodeRows::Kind kind : kBothKinds) {
    const TaskList good = build_decode_tasks(c, t, {3, kind}).list;
    ASSERT_EQ(refusal(good), "") << kind_name(kind);
    ASSERT_LE(good.tasks(), good.blocks.size()) << kind_name(kind);
    EXPECT_GT(expect_every_wait_needed(good, std::string(kind_name(kind)) + ": "), 50u) << kind_name(kind);
  }
}

TEST(DecodeTasks, RowsThatCannotWorkAreRefused) {
  for (int T : {0, -1, kMaxDecodeRows + 1})
    for (DecodeRows::Kind kind : kBothKinds)
      EXPECT_THROW(build_decode_tasks(tiny(), DecodeTiling{}, {T, kind}), Error) << T;
}

}  // namespace
}  // namespace lily::test
