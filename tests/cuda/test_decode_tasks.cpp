// test_decode_tasks.cpp: the decode step as a task list (backend/cuda/persistent/decode_tasks.h),
// on the CPU. The lists of the full-size model and of lily-tiny, with the default tiling and with
// odd tiles on few blocks, must pass check_task_list; every op must write each element of its
// output exactly once a layer (the downs: once per expert slot), every access must stay inside its
// buffer; with a block per task, dropping any one wait must be refused, and
// tilings that would split a DeltaNet key head's channels are refused when built.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <tuple>

#include "backend/cuda/persistent/decode_tasks.h"
#include "base/error.h"

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

// A config of few layers of both kinds (the full size's widths), for the exhaustive tests.
ModelConfig short_full_size(int layers) {
  ModelConfig c = qwen36_35b_a3b_config();
  c.layer_types.resize(size_t(layers));
  c.num_layers = layers;
  c.layer_types.back() = LayerKind::full_attention;
  return c;
}

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
  // Counted from the config: per DeltaNet layer 12352/96 in_proj + 32/2 cores, per attention
  // layer 9216/96 + 16 splits + 1 combine; per layer 2048/32 out_proj, 1 norm, 257/32 router
  // tiles, 1 top_k, 9 slots x (512/32 gate_up + 2048/128 down); 248320/2048 lm_head, embed, advance.
  const size_t deltanet = 129 + 16, attention = 96 + 16 + 1, moe = 64 + 1 + 9 + 1 + 9 * (16 + 16);
  EXPECT_EQ(d.list.tasks(), 30 * deltanet + 10 * attention + 40 * moe + 122 + 2);
  // Round-robin: no block has more than one task above another.
  size_t most = 0, least = SIZE_MAX;
  for (const auto& block : d.list.blocks) most = std::max(most, block.size()), least = std::min(least, block.size());
  EXPECT_LE(most - least, 1u);
}

TEST(DecodeTasks, OddTilesOnFewBlocksPass) {
  DecodeTiling t;
  t.blocks = 5, t.in_proj_rows = 77, t.out_proj_rows = 100, t.router_rows = 7, t.expert_rows = 33;
  t.down_rows = 300, t.lm_head_rows = 10007, t.deltanet_heads = 6, t.attention_splits = 3;
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
    covered(l, DecodeOp::moe_norm, kMoeInput, 0, H, 1);
    covered(l, DecodeOp::router, kRouterLogits, 0, (uint64_t(c.num_experts) + 1) * 4, 1);
    covered(l, DecodeOp::top_k, kTopK, 0, k * 8, 1);
    covered(l, DecodeOp::gate_up, kAct, 0, (k + 1) * I, 1);
    covered(l, DecodeOp::down, kHidden, 0, H, int(k) + 1);
  }
  covered(0, DecodeOp::lm_head, kLogits, 0, uint64_t(c.vocab_size) * 4, 1);
}

// With a block for every task, program order orders nothing: every wait is needed, and a list
// without any one of them must be refused.
TEST(DecodeTasks, DroppingAnyWaitIsRefused) {
  DecodeTiling t;
  t.blocks = 256, t.in_proj_rows = 1024, t.out_proj_rows = 512, t.router_rows = 64, t.expert_rows = 256;
  t.down_rows = 1024, t.lm_head_rows = 65536, t.deltanet_heads = 8, t.attention_splits = 2;
  const TaskList good = build_decode_tasks(short_full_size(2), t).list;
  ASSERT_EQ(refusal(good), "");
  ASSERT_LE(good.tasks(), good.blocks.size());
  // Every wait of every task, dropped one at a time.
  size_t dropped = 0;
  for (size_t b = 0; b < good.blocks.size(); ++b)
    for (size_t i = 0; i < good.blocks[b].size(); ++i)
      for (size_t w = 0; w < good.blocks[b][i].waits.size(); ++w) {
        TaskList bad = good;
        auto& waits = bad.blocks[b][i].waits;
        waits.erase(waits.begin() + long(w));
        EXPECT_NE(refusal(bad), "") << good.blocks[b][i].name << " without wait " << w;
        ++dropped;
      }
  EXPECT_GT(dropped, 100u);
}

TEST(DecodeTasks, TilingsThatCannotWorkAreRefused) {
  DecodeTiling t;
  t.deltanet_heads = 3;  // 2 value heads a key head: 3 would split one's q and k channels
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

}  // namespace
}  // namespace lily::test
