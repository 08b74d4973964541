// test_cost_model.cpp: the bytes and FLOPs lily bench states its speed against
// (runtime/cost_model.h), on the full-size geometry: known totals, and how a step of several
// rows grows.
#include "runtime/cost_model.h"

#include <gtest/gtest.h>

#include <cmath>

#include "model/config.h"

namespace lily {
namespace {

// A 4K decode step of the full-size model moves about 2.0 GB (issue 16's figure: 1.8 GB of
// weights, the KV cache and the DeltaNet state read and written).
TEST(CostModel, DecodeStepOfTheFullSizeModel) {
  const ModelConfig c = qwen36_35b_a3b_config();
  const double bytes = decode_bytes_per_token(c, 4096);
  EXPECT_GT(bytes, 1.8e9);
  EXPECT_LT(bytes, 2.2e9);
  // Each token of depth adds one K and one V row (bf16) in each of the 10 attention layers.
  EXPECT_NEAR(decode_bytes_per_token(c, 4097) - bytes, 10 * 2.0 * c.attention_kv_width() * 2.0, 1e-3);
}

// One row is the decode step; more rows read the union of their experts (uniform routing:
// 8 of 256 for one row, E (1 - (1 - k/E)^T) for T), the KV rows they append, and nothing twice.
TEST(CostModel, StepsOfSeveralRows) {
  const ModelConfig c = qwen36_35b_a3b_config();
  EXPECT_EQ(decode_step_bytes(c, 4096, 1), decode_bytes_per_token(c, 4096));
  EXPECT_DOUBLE_EQ(expected_experts(c, 1), 8.0);
  EXPECT_NEAR(expected_experts(c, 2), 256.0 * (1.0 - std::pow(31.0 / 32.0, 2)), 1e-9);  // 15.75
  EXPECT_NEAR(expected_experts(c, 4), 30.53, 0.01);
  EXPECT_NEAR(expected_experts(c, 8), 57.42, 0.01);
  double last = decode_step_bytes(c, 4096, 1);
  for (int rows = 2; rows <= 8; ++rows) {
    const double b = decode_step_bytes(c, 4096, rows);
    EXPECT_GT(b, last) << rows;
    EXPECT_LT(b, rows * decode_bytes_per_token(c, 4096)) << rows;  // the dense weights are read once
    last = b;
  }
  // Issue 16's estimate: 4 rows ~1.9x the bytes of one, 8 rows ~3x.
  EXPECT_NEAR(decode_step_bytes(c, 4096, 4) / decode_step_bytes(c, 4096, 1), 1.9, 0.25);
  EXPECT_NEAR(decode_step_bytes(c, 4096, 8) / decode_step_bytes(c, 4096, 1), 3.0, 0.4);
}

// A step of several sequences reads the weights and the experts' union once, like the rows of
// one, but every sequence's own DeltaNet state and KV cache: n - 1 more of them than n rows of
// one sequence at depth 0 (where the caches are nearly empty), and each exactly one decode
// step's state (63 MB of DeltaNet state read and written, 84 MB of KV at 4K).
TEST(CostModel, StepsOfSeveralSequences) {
  const ModelConfig c = qwen36_35b_a3b_config();
  EXPECT_DOUBLE_EQ(batch_step_bytes(c, 4096, 1), decode_step_bytes(c, 4096, 1));
  const double state = double(c.num_layers_of(LayerKind::linear_attention)) * 2.0 * c.linear_num_value_heads *
                       c.linear_key_head_dim * c.linear_value_head_dim * 4.0;
  const double kv_row = double(c.num_layers_of(LayerKind::full_attention)) * 2.0 * c.attention_kv_width() * 2.0;
  for (int n : {2, 4, 8}) {
    const double one_sequence = state + kv_row * 4097;
    EXPECT_NEAR(batch_step_bytes(c, 4096, n) - batch_step_bytes(c, 4096, n - 1),
                one_sequence + (decode_step_bytes(c, 0, n) - decode_step_bytes(c, 0, n - 1)) -
                    kv_row,  // the rows of one sequence at depth 0 append one more KV row each
                1.0)
        << n;
    EXPECT_GT(batch_step_bytes(c, 4096, n), decode_step_bytes(c, 4096, n)) << n;
  }
}

}  // namespace
}  // namespace lily
