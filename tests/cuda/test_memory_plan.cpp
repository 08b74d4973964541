// test_memory_plan.cpp: the device-memory arithmetic of the CUDA backend (backend/cuda/memory_plan.h)
// on the full-size geometry, host only (described weights: shapes, never read), so this runs in CI.
// The goal of issue 39: the full model with a 32K context in at most 22 GB, 64K in at most 23 GB.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>

#include "backend/cuda/common/device_info.h"
#include "backend/cuda/kernel_plan.h"
#include "backend/cuda/memory_plan.h"
#include "base/error.h"
#include "model/config.h"
#include "plan_test_weights.h"

namespace lily::test {
namespace {

constexpr uint64_t kGB = 1000ull * 1000 * 1000;

// The bytes of a 4/8-bit group-64 matrix as uploaded: codes, bf16 scales and biases.
uint64_t matrix_bytes(const cuda::QMatrix& m) {
  const uint64_t n = uint64_t(m.batch) * uint64_t(m.rows) * uint64_t(m.cols);
  return n * uint64_t(m.bits) / 8 + 2 * (n / 64) * 2;
}

// The described model's matrices (the norms, conv weights and gates are < 0.1%: left out).
uint64_t weight_bytes(const cuda::GpuWeights& w) {
  uint64_t n = matrix_bytes(w.embed_tokens) + matrix_bytes(w.lm_head);
  for (const cuda::GpuLayer& l : w.layers) {
    for (const cuda::QMatrix* m :
         {&l.attention.q_proj, &l.attention.k_proj, &l.attention.v_proj, &l.attention.o_proj, &l.deltanet.in_proj_qkv,
          &l.deltanet.in_proj_z, &l.deltanet.in_proj_b, &l.deltanet.in_proj_a, &l.deltanet.out_proj, &l.moe.router,
          &l.moe.shared_expert_gate, &l.moe.experts_gate, &l.moe.experts_up, &l.moe.experts_down, &l.moe.shared_gate,
          &l.moe.shared_up, &l.moe.shared_down})
      if (m->rows > 0) n += matrix_bytes(*m);
  }
  return n;
}

struct FullSize {
  ModelConfig c = qwen36_35b_a3b_config();
  PlanTestWeights w{c};
  // The H200's profile: the workspaces' split counts follow its SMs, and nothing queries a device.
  FullSize() { cuda::set_current_device_profile(cuda::DeviceLimits{132}); }
  cuda::MemoryNeeds needs(int chunk) const {
    const cuda::KernelPlan plan = cuda::plan_kernels(*w.w, cuda::DeviceLimits{132}, chunk);
    return cuda::memory_needs(*w.w, weight_bytes(*w.w), plan);
  }
};

TEST(MemoryPlan, TheStateOfOneSlot) {
  const ModelConfig c = qwen36_35b_a3b_config();
  EXPECT_EQ(cuda::kv_cache_bytes_per_token(c), 20u * 1024);            // 10 layers x K, V x 2 x 256 x bf16
  EXPECT_EQ(cuda::recurrent_state_bytes(c), 30u * (2097152 + 98304));  // 30 x (32 x 128 x 128 + 3 x 8192) fp32
}

// The MTP head's cache (one attention layer's K and V) counts per token only when the plan runs it.
TEST(MemoryPlan, TheMtpHeadsCacheCountsWhenItRuns) {
  const ModelConfig c = qwen36_35b_a3b_config();
  EXPECT_EQ(cuda::mtp_cache_bytes_per_token(c), 2u * 1024);
  PlanTestWeights w(c);
  w.add_mtp();
  const cuda::DeviceLimits h200{132};
  cuda::set_current_device_profile(h200);
  cuda::KernelPlan plan = cuda::plan_kernels(*w.w, h200, 2048);
  EXPECT_EQ(cuda::memory_needs(*w.w, 0, plan).kv_per_token, 20u * 1024);  // off: no cache
  cuda::edit_plan(plan, "mtp=1");
  EXPECT_EQ(cuda::memory_needs(*w.w, 0, plan).kv_per_token, 22u * 1024);
}

// Where the bytes go at 32K and 64K, and the prefill chunk that meets the goal.
TEST(MemoryPlan, TheFullModelFitsTheGoal) {
  const FullSize m;
  for (int chunk : {8192, 4096, 2048, 1024}) {
    const cuda::MemoryNeeds n = m.needs(chunk);
    for (int64_t ctx : {32768, 65536}) {
      cuda::MemoryPlan p;
      p.needs = n, p.context = ctx, p.budget = 24 * kGB;
      std::printf("chunk %5d, context %6lld: %.2f GB = %s\n", chunk, (long long)ctx, double(p.total()) / 1e9,
                  p.describe().c_str());
    }
  }
  const cuda::MemoryNeeds n = m.needs(2048);
  EXPECT_GT(n.weights, 19 * kGB);
  EXPECT_LT(n.weights, 20 * kGB);
  cuda::MemoryPlan p32, p64;
  p32.needs = p64.needs = n;
  p32.context = 32768, p64.context = 65536;
  EXPECT_LE(p32.total(), 22 * kGB) << p32.describe();
  EXPECT_LE(p64.total(), 23 * kGB) << p64.describe();
  // Today's default chunk of 8192 tokens holds 2.0 GiB of prefill workspace: 22.95 GB at 32K, over the goal.
  cuda::MemoryPlan today;
  today.needs = m.needs(8192), today.context = 32768;
  EXPECT_GT(today.needs.prefill_workspace, 2 * (1ull << 30));
  EXPECT_GT(today.total(), 22 * kGB) << today.describe();
}

// Under a cap the prefill chunk shrinks until one sequence of the context fits: 32K in 22 GB takes
// 2048 or more, never a chunk that does not fit, the largest that does; no cap keeps 8192.
TEST(MemoryPlan, TheCapChoosesThePrefillChunk) {
  const FullSize m;
  auto needs_of = [&](int chunk) { return m.needs(chunk); };
  EXPECT_EQ(cuda::prefill_chunk_for(needs_of, 32768, 0), 8192);
  EXPECT_EQ(cuda::prefill_chunk_for(needs_of, 32768, 200 * kGB), 8192);
  for (int64_t ctx : {0, 4096, 32768, 65536}) {
    for (uint64_t budget : {22 * kGB, 23 * kGB, 24 * kGB}) {
      SCOPED_TRACE(testing::Message() << ctx << " tokens in " << budget / kGB << " GB");
      const int chunk = cuda::prefill_chunk_for(needs_of, ctx, budget);
      auto total = [&](int c) {
        cuda::MemoryPlan p;
        p.needs = m.needs(c), p.context = std::max<int64_t>(ctx, 256);
        return p.total();
      };
      if (total(chunk) > budget) {  // none fits: the smallest, and then the smallest does not
        EXPECT_EQ(chunk, cuda::kPrefillChunkChoices.back());
        continue;
      }
      for (int larger : cuda::kPrefillChunkChoices) {
        if (larger > chunk) {
          EXPECT_GT(total(larger), budget) << "chunk " << larger << " fits too";
        }
      }
    }
  }
  EXPECT_GE(cuda::prefill_chunk_for(needs_of, 32768, 22 * kGB), 2048);
  EXPECT_EQ(cuda::prefill_chunk_for(needs_of, 32768, 10 * kGB), 512);  // nothing fits: the smallest
}

// No context given: the largest that fits the budget, in steps of 256 tokens, at most the model's.
TEST(MemoryPlan, TheLargestContextThatFits) {
  const cuda::MemoryNeeds n = FullSize().needs(2048);
  cuda::MemoryRequest r;
  r.budget = 22 * kGB;
  const cuda::MemoryPlan p = cuda::plan_memory(n, r, 262144);
  EXPECT_EQ(p.context % 256, 0);
  EXPECT_GE(p.context, 32768);
  EXPECT_LE(p.total(), r.budget);
  cuda::MemoryPlan more = p;
  more.context += 256;
  EXPECT_GT(more.total(), r.budget);
  r.budget = 200 * kGB;  // the model's own limit caps it
  EXPECT_EQ(cuda::plan_memory(n, r, 262144).context, 262144);
}

// Too long a context: refused, saying what would fit (a shorter context, fewer slots).
TEST(MemoryPlan, TooLongAContextSaysWhatWouldFit) {
  const cuda::MemoryNeeds n = FullSize().needs(2048);
  cuda::MemoryRequest r;
  r.budget = 22 * kGB, r.context = 262144;
  try {
    cuda::plan_memory(n, r, 262144);
    ADD_FAILURE() << "262144 tokens fit 22 GB";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("a context of 262144 tokens x 1 slot(s) needs"), std::string::npos) << what;
    EXPECT_NE(what.find("a context of up to "), std::string::npos) << what;
  }
  r.context = 32768, r.slots = 8;  // fits one slot, not eight
  try {
    cuda::plan_memory(n, r, 262144);
    ADD_FAILURE() << "8 slots of 32768 tokens fit 22 GB";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("slot(s) of 32768 tokens"), std::string::npos) << what;
  }
  r.budget = 10 * kGB, r.slots = 1, r.context = 0;  // not even the weights
  EXPECT_THROW(cuda::plan_memory(n, r, 262144), Error);
}

}  // namespace
}  // namespace lily::test
