// test_device_profile.cpp: the device profiles (backend/cuda/device_profile.h) and the kernel
// plan's choices under each (kernel_plan.h): host only, no GPU needed, so this runs in CI. The
// weights are descriptions (test_kernel_plan.cpp's, shapes and aligned addresses never read).
#include <gtest/gtest.h>

#include "backend/cuda/attention/attention_decode.h"
#include "backend/cuda/device_profile.h"
#include "backend/cuda/kernel_plan.h"
#include "base/error.h"
#include "model/config.h"
#include "plan_test_weights.h"

namespace lily::test {
namespace {

using cuda::DeviceProfile;

// The H100 as a query would describe it, with this build's sm_90a code.
DeviceProfile h100() {
  DeviceProfile d = cuda::known_device_profile("sm90");
  d.name = "device", d.card = "NVIDIA H100 80GB HBM3", d.sm90a_code = true;
  return d;
}

TEST(DeviceProfile, TheTableHoldsEachCardsLimits) {
  struct Want {
    const char* name;
    int cc, shared_kb, sms;
  };
  for (const Want& want : {Want{"sm80", 80, 163, 108}, Want{"sm86", 86, 99, 82}, Want{"sm89", 89, 99, 128},
                           Want{"sm90", 90, 227, 132}, Want{"sm120", 120, 99, 170}}) {
    const DeviceProfile p = cuda::known_device_profile(want.name);
    EXPECT_EQ(p.compute_capability, want.cc) << want.name;
    EXPECT_EQ(p.shared_per_block, want.shared_kb * 1024) << want.name;
    EXPECT_EQ(p.multiprocessors, want.sms) << want.name;
    EXPECT_GT(p.bandwidth_gbs, 900) << want.name;
    EXPECT_GE(p.memory_bytes, int64_t(24) << 30) << want.name;
  }
  EXPECT_EQ(cuda::known_device_profiles().size(), 5u);
  try {
    cuda::known_device_profile("sm70");
    ADD_FAILURE() << "sm70 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sm86"), std::string::npos) << e.what();
  }
}

// Only compute 9.0 with sm_90a machine code in the build is Hopper; every other card, and an
// H100 under a build without sm_90a (compute_80 PTX only), takes the portable kernels.
TEST(DeviceProfile, HopperNeedsComputeNineAndTheSm90aCode) {
  EXPECT_TRUE(h100().hopper());
  DeviceProfile ptx_only = h100();
  ptx_only.sm90a_code = false;
  EXPECT_FALSE(ptx_only.hopper());
  for (const char* name : {"sm80", "sm86", "sm89", "sm120"}) {
    DeviceProfile p = cuda::known_device_profile(name);
    p.sm90a_code = true;
    EXPECT_FALSE(p.hopper()) << name;
  }
}

// The default runs the Hopper path only; a portable one runs only when asked for.
TEST(DeviceProfile, ThePortablePathRunsOnlyWhenAskedFor) {
  EXPECT_TRUE(cuda::runs_by_default(cuda::resolve_device_profile(h100(), "")));
  DeviceProfile rtx3090 = cuda::known_device_profile("sm86");
  rtx3090.name = "device";
  EXPECT_FALSE(cuda::runs_by_default(cuda::resolve_device_profile(rtx3090, "")));
  EXPECT_TRUE(cuda::runs_by_default(cuda::resolve_device_profile(rtx3090, "device")));
  EXPECT_TRUE(cuda::runs_by_default(cuda::resolve_device_profile(rtx3090, "sm86")));
}

// A forced profile on the H100: the consumer card's compute capability, SMs and shared-memory
// limit, the H100's bandwidth and memory; never more shared memory than the card running it has.
TEST(DeviceProfile, AForcedProfileTakesTheCardsLimits) {
  const DeviceProfile p = cuda::resolve_device_profile(h100(), "sm86");
  EXPECT_TRUE(p.forced);
  EXPECT_EQ(p.name, "sm86");
  EXPECT_EQ(p.compute_capability, 86);
  EXPECT_EQ(p.shared_per_block, 99 * 1024);
  EXPECT_EQ(p.multiprocessors, 82);
  EXPECT_EQ(p.bandwidth_gbs, h100().bandwidth_gbs);
  EXPECT_FALSE(p.hopper());
  EXPECT_NE(p.describe().find("sm86 forced"), std::string::npos) << p.describe();
  DeviceProfile small = h100();
  small.shared_per_block = 64 * 1024;
  EXPECT_EQ(cuda::resolve_device_profile(small, "sm80").shared_per_block, 64 * 1024);
  const DeviceProfile same = cuda::resolve_device_profile(h100(), "sm90");
  EXPECT_TRUE(same.hopper());
  EXPECT_THROW(cuda::resolve_device_profile(h100(), "h100"), Error);
}

// The plan under a forced sm90 on the H100 is the Hopper plan of today.
TEST(DeviceProfile, TheHopperPlanIsTodays) {
  const PlanTestWeights w(qwen36_35b_a3b_config());
  const cuda::KernelPlan plan = cuda::plan_kernels(*w.w, cuda::resolve_device_profile(h100(), "sm90"), 8192);
  EXPECT_TRUE(plan.decode.pdl);
  EXPECT_EQ(plan.decode.layers[0].input[0].kernel, cuda::GemvKernel::prefetch);
  EXPECT_EQ(plan.decode.layers[0].gate_up, cuda::GateUpKernel::staged);
  EXPECT_EQ(plan.prefill.programmatic_below, 33);
  EXPECT_EQ(plan.prefill.delta_rule(16), cuda::DeltaRulePrefill::rows);
  EXPECT_EQ(plan.prefill.delta_rule(48), cuda::DeltaRulePrefill::chunked);
  EXPECT_EQ(plan.prefill.attention, cuda::AttentionPrefillKernel::flash);
  EXPECT_TRUE(plan.prefill.wgmma(256));
  EXPECT_EQ(plan.prefill.batch_rows_limit, cuda::kMaxBatchRows);
  EXPECT_NE(plan.describe().find("device profile sm90"), std::string::npos) << plan.describe();
}

// Every portable profile: no PDL, no bulk copies, clusters or wgmma, the forms that fit its shared
// memory; and refused while the decode step's DeltaNet core has no portable kernel.
TEST(DeviceProfile, PortableProfilesTakeThePortableKernels) {
  const PlanTestWeights w(qwen36_35b_a3b_config());
  for (const char* name : {"sm80", "sm86", "sm89", "sm120"}) {
    const DeviceProfile p = cuda::resolve_device_profile(h100(), name);
    std::vector<std::string> gaps;
    cuda::KernelPlan plan = cuda::plan_kernels_with_gaps(*w.w, p, 8192, gaps);
    EXPECT_FALSE(plan.decode.pdl) << name;
    for (const cuda::DecodeLayerPlan& l : plan.decode.layers) {
      EXPECT_EQ(l.input[0].kernel, cuda::GemvKernel::mma) << name;
      EXPECT_EQ(l.gate_up, cuda::GateUpKernel::mma) << name;
    }
    EXPECT_EQ(plan.prefill.programmatic_below, 0) << name;
    EXPECT_FALSE(plan.prefill.wgmma(8192)) << name;
    EXPECT_EQ(plan.prefill.moe_experts(8192), cuda::MoeExpertKernels::gemm) << name;
    EXPECT_EQ(plan.prefill.delta_rule(1), cuda::DeltaRulePrefill::recurrent) << name;  // no cluster rows
    // The chunked rule's 188,928 bytes and flash's 173,056 fit none of them (163 KB at most).
    EXPECT_EQ(plan.prefill.delta_rule(4096), cuda::DeltaRulePrefill::recurrent) << name;
    EXPECT_EQ(plan.prefill.attention, cuda::AttentionPrefillKernel::simple) << name;
    EXPECT_EQ(plan.prefill.batch_rows_limit, 0) << name;
    EXPECT_THROW(cuda::edit_plan(plan, "batch_rows_up_to=2"), Error) << name;
    ASSERT_EQ(gaps.size(), 1u) << name;  // attention_split fits with fewer stages (below)
    EXPECT_NE(gaps[0].find("deltanet_decode needs thread-block clusters"), std::string::npos) << gaps[0];
    try {
      cuda::plan_kernels(*w.w, p, 8192);
      ADD_FAILURE() << name << " was accepted";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(std::string("device profile ") + name), std::string::npos) << what;
      EXPECT_NE(what.find("no portable kernel yet"), std::string::npos) << what;
      EXPECT_NE(what.find("--backend cpu"), std::string::npos) << what;
    }
  }
}

// The decode attention's split kernel holds as many stages of K and V tiles as the profile's
// shared memory allows, with 20 KiB for its static memory: 3 (202,752 bytes) on Hopper, 2 on sm_80,
// 1 on the 99 KB cards; more than the limit where not even one fits.
TEST(DeviceProfile, DecodeAttentionTakesTheStagesThatFit) {
  constexpr size_t kStatic = 20480, kStage = 67584;
  EXPECT_EQ(cuda::attention_decode_shared_bytes(232448), 3 * kStage + kStatic);                // sm90: 227 KB
  EXPECT_EQ(cuda::attention_decode_shared_bytes(166912), 2 * kStage + kStatic);                // sm80: 163 KB
  EXPECT_EQ(cuda::attention_decode_shared_bytes(101376), kStage + kStatic);                    // sm86 / 89 / 120: 99 KB
  EXPECT_EQ(cuda::attention_decode_shared_bytes(3 * kStage + kStatic), 3 * kStage + kStatic);  // edges
  EXPECT_EQ(cuda::attention_decode_shared_bytes(3 * kStage + kStatic - 1), 2 * kStage + kStatic);
  EXPECT_GT(cuda::attention_decode_shared_bytes(49152), size_t(49152));  // 48 KB: none fits
}

}  // namespace
}  // namespace lily::test
