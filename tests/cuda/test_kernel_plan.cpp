// test_kernel_plan.cpp: the one place that picks the kernels (backend/cuda/kernel_plan.h), from
// the weights' formats and a described device: no GPU needed, so this runs in CI. The weights are
// descriptions only (shapes, bits, aligned addresses that are never read).
#include <gtest/gtest.h>

#include "backend/cuda/kernel_plan.h"
#include "base/error.h"
#include "model/config.h"
#include "plan_test_weights.h"

namespace lily::test {
namespace {

using cuda::GateUpKernel;
using cuda::GemvKernel;

const cuda::DeviceLimits kH200{132};
using Weights = PlanTestWeights;

// Qwen3.6-35B-A3B on an H200: the input projections bulk-copied before their wait, the rest on
// the tensor cores, gate/up staged in shared memory, 254 launches, flash attention in prefill.
TEST(KernelPlan, TheModelOnAnH200) {
  const ModelConfig c = qwen36_35b_a3b_config();
  const Weights w(c);
  const cuda::KernelPlan plan = cuda::plan_kernels(*w.w, kH200, 8192);
  ASSERT_EQ(plan.decode.layers.size(), 40u);
  for (const cuda::DecodeLayerPlan& l : plan.decode.layers) {
    ASSERT_EQ(l.input.size(), 1u);
    EXPECT_EQ(l.input[0].kernel, GemvKernel::prefetch);
    EXPECT_EQ(l.input[0].W.rows, l.kind == LayerKind::full_attention ? 9216 : 12352);
    EXPECT_EQ(l.output.kernel, GemvKernel::mma);
    EXPECT_EQ(l.gate_up, GateUpKernel::staged);
  }
  EXPECT_EQ(plan.decode.lm_head.kernel, GemvKernel::mma);
  EXPECT_EQ(plan.decode.launches(), 254);
  EXPECT_EQ(plan.prefill.chunk_tokens, 8192);
  EXPECT_EQ(plan.prefill.attention, cuda::AttentionPrefillKernel::flash);
  EXPECT_EQ(plan.prefill.attention_kernel(32), cuda::AttentionPrefillKernel::split);
  EXPECT_EQ(plan.prefill.attention_kernel(33), cuda::AttentionPrefillKernel::flash);
  EXPECT_EQ(plan.prefill.delta_rule(16), cuda::DeltaRulePrefill::rows);
  EXPECT_EQ(plan.prefill.delta_rule(17), cuda::DeltaRulePrefill::recurrent);
  EXPECT_EQ(plan.prefill.delta_rule(47), cuda::DeltaRulePrefill::recurrent);
  EXPECT_EQ(plan.prefill.delta_rule(48), cuda::DeltaRulePrefill::chunked);
  EXPECT_TRUE(plan.prefill.dense_rows(16));  // the fused projections as gemv_rows
  EXPECT_FALSE(plan.prefill.dense_rows(17));
  EXPECT_EQ(plan.prefill.moe_experts(16), cuda::MoeExpertKernels::rows);
  EXPECT_EQ(plan.prefill.moe_experts(17), cuda::MoeExpertKernels::gemm);
  EXPECT_EQ(plan.prefill.moe_experts(511), cuda::MoeExpertKernels::gemm);
  EXPECT_EQ(plan.prefill.moe_experts(512), cuda::MoeExpertKernels::wgmma);
  EXPECT_FALSE(plan.prefill.wgmma(255));
  EXPECT_TRUE(plan.prefill.wgmma(256));
  const std::string text = plan.describe();
  EXPECT_NE(text.find("rms_norm + gemm_w4_wgmma projections"), std::string::npos) << text;
  EXPECT_NE(text.find("254 launches"), std::string::npos) << text;
  EXPECT_NE(text.find("prefetch_rms_norm_gemv [12352, 2048] q4"), std::string::npos) << text;
  EXPECT_NE(text.find("moe_gate_up_staged"), std::string::npos) << text;
}

// Before Hopper (no wgmma) every prefill product stays on gemm_q4.
TEST(KernelPlan, NoWgmmaBeforeHopper) {
  const ModelConfig c = qwen36_35b_a3b_config();
  const Weights w(c);
  std::vector<std::string> gaps;  // the decode cores (test_device_profile.cpp)
  const cuda::KernelPlan plan = cuda::plan_kernels_with_gaps(*w.w, cuda::DeviceLimits{108, 80}, 8192, gaps);
  EXPECT_FALSE(gaps.empty());
  EXPECT_FALSE(plan.prefill.wgmma(8192));
  EXPECT_EQ(plan.prefill.moe_experts(8192), cuda::MoeExpertKernels::gemm);
  EXPECT_NE(plan.describe().find("rms_norm + gemm_q4"), std::string::npos) << plan.describe();
}

// On a device with fewer SMs a block holds more rows: past its shared memory, the input
// projections go to mma_gemv.
TEST(KernelPlan, FewerMultiprocessorsMoveTheInputProjections) {
  const ModelConfig c = qwen36_35b_a3b_config();
  const Weights w(c);
  const cuda::KernelPlan plan = cuda::plan_kernels(*w.w, cuda::DeviceLimits{16}, 8192);
  for (const cuda::DecodeLayerPlan& l : plan.decode.layers) EXPECT_EQ(l.input[0].kernel, GemvKernel::mma);
}

// A checkpoint that keeps in_proj_b / in_proj_a at 8 bits: no fused matrix, four launches with
// the 8-bit parts on the FP32 kernel; an 8-bit lm_head on it too.
TEST(KernelPlan, EightBitPartsTakeTheFp32Kernel) {
  const ModelConfig c = qwen36_35b_a3b_config();
  const Weights w(c, 4, 8, 8);
  const cuda::KernelPlan plan = cuda::plan_kernels(*w.w, kH200, 8192);
  for (const cuda::DecodeLayerPlan& l : plan.decode.layers) {
    if (l.kind == LayerKind::full_attention) continue;
    ASSERT_EQ(l.input.size(), 4u);
    EXPECT_EQ(l.input[0].kernel, GemvKernel::prefetch);  // qkv [8192, 2048]
    EXPECT_EQ(l.input[1].kernel, GemvKernel::prefetch);  // z [4096, 2048]
    EXPECT_EQ(l.input[2].kernel, GemvKernel::fp32);
    EXPECT_EQ(l.input[3].kernel, GemvKernel::fp32);
  }
  EXPECT_EQ(plan.decode.lm_head.kernel, GemvKernel::fp32);
  EXPECT_EQ(plan.decode.launches(), 254 + 30 * 3);
  EXPECT_FALSE(plan.prefill.dense_rows(1));  // no fused DeltaNet input matrix: gemm_q4 at every length
  EXPECT_FALSE(plan.prefill.wgmma(8192));    // nor wgmma: it takes 4-bit matrices only
}

// lily-tiny's geometry (hidden 256, 16 experts of 128): gate/up on the mma kernel.
TEST(KernelPlan, SmallModelsTakeTheMmaGateUp) {
  ModelConfig c = qwen36_35b_a3b_config();
  c.hidden_size = 256, c.num_experts = 16, c.num_experts_per_tok = 4, c.moe_intermediate_size = 128;
  c.shared_expert_intermediate_size = 128, c.vocab_size = 1920, c.num_layers = 8;
  c.layer_types.resize(8);
  c.num_attention_heads = 2, c.num_key_value_heads = 1;
  c.linear_num_key_heads = 2, c.linear_num_value_heads = 4;
  const Weights w(c);
  const cuda::KernelPlan plan = cuda::plan_kernels(*w.w, kH200, 8192);
  for (const cuda::DecodeLayerPlan& l : plan.decode.layers) EXPECT_EQ(l.gate_up, GateUpKernel::mma);
}

// What no kernel takes is refused when the backend is built, naming the part.
TEST(KernelPlan, RefusesWhatNoKernelTakes) {
  const ModelConfig c = qwen36_35b_a3b_config();
  try {
    cuda::plan_kernels(*Weights(c, 8).w, kH200, 8192);
    ADD_FAILURE() << "8-bit experts were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer 0: the MoE block"), std::string::npos) << e.what();
  }
  ModelConfig odd_heads = c;
  odd_heads.head_dim = 128;
  EXPECT_THROW(cuda::plan_kernels(*Weights(odd_heads).w, kH200, 8192), Error);
  ModelConfig wide = c;
  wide.hidden_size = 4160;  // more columns than the decode GEMVs stage
  EXPECT_THROW(cuda::plan_kernels(*Weights(wide).w, kH200, 8192), Error);
  for (int chunk : {0, 63, 100, 32768}) EXPECT_THROW(cuda::plan_kernels(*Weights(c).w, kH200, chunk), Error) << chunk;
}

// The thresholds tests and `lily bench --kernel-plan` may set: by default the MoE slots up to 4
// rows, the pass graphs up to 16 and the chain on (measured, session 25), the batch steps off (not
// yet right), set within what the weights allow, anything else refused with the names that can be
// set.
TEST(KernelPlan, EditsSetThresholdsWithinWhatTheWeightsAllow) {
  const Weights w(qwen36_35b_a3b_config());
  cuda::KernelPlan plan = cuda::plan_kernels(*w.w, kH200, 8192);
  EXPECT_EQ(plan.prefill.moe_slots_up_to, 4);
  EXPECT_EQ(plan.prefill.pass_graphs_up_to, 16);
  EXPECT_EQ(plan.prefill.batch_rows_up_to, 0);
  EXPECT_TRUE(plan.decode.chain);
  cuda::edit_plan(plan, "chain=0");
  EXPECT_FALSE(plan.decode.chain);
  EXPECT_TRUE(plan.prefill.moe_slots(2));
  EXPECT_TRUE(plan.prefill.moe_slots(4));
  EXPECT_FALSE(plan.prefill.moe_slots(5));
  cuda::edit_plan(plan, "chain=1");
  EXPECT_TRUE(plan.decode.chain);
  EXPECT_THROW(cuda::edit_plan(plan, "chain=2"), Error);
  cuda::edit_plan(plan, "moe_slots_up_to=8");
  cuda::edit_plan(plan, "pass_graphs_up_to=16");
  cuda::edit_plan(plan, "split_attention_up_to=0");
  EXPECT_EQ(plan.prefill.moe_slots_up_to, 8);
  EXPECT_TRUE(plan.prefill.moe_slots(8));
  EXPECT_FALSE(plan.prefill.moe_slots(9));
  EXPECT_EQ(plan.prefill.pass_graphs_up_to, 16);
  EXPECT_EQ(plan.prefill.split_attention_up_to, 0);
  EXPECT_NE(plan.describe().find("graphs up to 16"), std::string::npos) << plan.describe();
  for (const char* bad : {"moe_slots_up_to=17", "pass_graphs_up_to=17", "moe_slots_up_to=-1", "moe_slots_up_to=8x",
                          "moe_slots_up_to=", "moe_slots_up_to", "=8", "no_such_threshold=1"})
    EXPECT_THROW(cuda::edit_plan(plan, bad), Error) << bad;
  EXPECT_EQ(plan.prefill.moe_slots_up_to, 8) << "a refused edit changes nothing";
  try {
    cuda::edit_plan(plan, "no_such_threshold=1");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("moe_slots_up_to"), std::string::npos) << e.what();
  }
}

// The MTP head: planned where the weights have one (its layer like the model's), off by default
// until it has run on a GPU, "mtp=1" turning it on; refused where the weights have none.
TEST(KernelPlan, TheMtpHeadIsOffUntilItHasRun) {
  Weights w(qwen36_35b_a3b_config());
  cuda::KernelPlan plain = cuda::plan_kernels(*w.w, kH200, 8192);
  EXPECT_FALSE(plain.decode.mtp);
  EXPECT_EQ(plain.decode.mtp_limit, 0);
  EXPECT_THROW(cuda::edit_plan(plain, "mtp=1"), Error);
  EXPECT_EQ(plain.describe().find("MTP head"), std::string::npos) << plain.describe();
  w.add_mtp();
  cuda::KernelPlan plan = cuda::plan_kernels(*w.w, kH200, 8192);
  EXPECT_FALSE(plan.decode.mtp);
  EXPECT_EQ(plan.decode.mtp_limit, 1);
  EXPECT_EQ(plan.decode.mtp_layer.kind, LayerKind::full_attention);
  EXPECT_EQ(plan.decode.mtp_layer.gate_up, plan.decode.layers[3].gate_up);  // layer 3: full attention
  EXPECT_NE(plan.describe().find("MTP head: off"), std::string::npos) << plan.describe();
  // The head's layer takes the same few-row and tensor-core kernels as the model's.
  EXPECT_EQ(plan.prefill.dense_rows_up_to, plain.prefill.dense_rows_up_to);
  EXPECT_EQ(plan.prefill.wgmma_from, plain.prefill.wgmma_from);
  cuda::edit_plan(plan, "mtp=1");
  EXPECT_TRUE(plan.decode.mtp);
  EXPECT_NE(plan.describe().find("MTP head: prefill passes"), std::string::npos) << plan.describe();
  EXPECT_THROW(cuda::edit_plan(plan, "mtp=2"), Error);
  // A head whose experts no kernel takes is refused, naming it.
  w.w->mtp->layer.moe.experts_gate.bits = 3;
  try {
    cuda::plan_kernels(*w.w, kH200, 8192);
    ADD_FAILURE() << "3-bit MTP experts planned";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("MTP head"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lily::test
