// test_persistent_decode.cpp: the decode step as one persistent kernel (issue 16,
// persistent/persistent_decode.h) against the chain of decode kernels that test_cuda_forward holds
// to the CPU backend and transformers. Every step's logits within 2e-3 of max |logit| and the same
// arg max, from an empty state and from a filled KV cache (the attention splits then all hold
// rows), on lily-tiny and on the full-size geometry (4 layers, random weights); after the steps both
// paths' DeltaNet states and KV caches agree; lily-tiny's greedy tokens equal the CPU backend's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>

#include "backend/backend.h"
#include "backend/cuda/bench/cuda_bench.h"
#include "backend/cuda/common/device_info.h"
#include "backend/cuda/decode_step.h"
#include "backend/cuda/gpu_weights.h"
#include "backend/cuda/kernel_plan.h"
#include "backend/cuda/persistent/persistent_decode.h"
#include "backend/cuda/sequence_state.h"
#include "base/bf16.h"
#include "cuda_test_util.h"
#include "model/checkpoint/load.h"
#include "short_full_size.h"

namespace lily {
namespace {

using namespace cuda;

// The chain of kernels and the persistent kernel over the same weights.
struct TwoSteps {
  std::unique_ptr<GpuWeights> w;
  KernelPlan plan;
  DecodePlan persistent_plan;
  std::unique_ptr<DecodeStep> chain, persistent;

  explicit TwoSteps(std::unique_ptr<GpuWeights> weights) : w(std::move(weights)) {
    plan = plan_kernels(*w, current_device_limits(), 1024);
    EXPECT_EQ(persistent::persistent_decode_refusal(*w), "");
    persistent_plan = plan.decode;
    persistent_plan.persistent = true;
    chain = std::make_unique<DecodeStep>(*w, plan.decode);
    persistent = std::make_unique<DecodeStep>(*w, persistent_plan);
  }
};

std::vector<float> step(DecodeStep& d, CudaSequenceState& s, int32_t token, int vocab) {
  CUDA_CHECK(cudaMemcpy(d.token(), &token, 4, cudaMemcpyHostToDevice));
  d.record(s, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> logits(static_cast<size_t>(vocab));
  CUDA_CHECK(cudaMemcpy(logits.data(), d.logits(), logits.size() * 4, cudaMemcpyDeviceToHost));
  s.advance_host(1);
  return logits;
}

template <class T>
std::vector<T> download(const T* p, size_t n) {
  std::vector<T> v(n);
  CUDA_CHECK(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

// n bf16 values of a cache on the device, as floats.
std::vector<float> cache_floats(const bf16* p, size_t n) {
  const std::vector<bf16> v = download(p, n);
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) f[i] = to_float(v[i]);
  return f;
}

// `steps` tokens through both paths from `filled` cached rows; every step's logits compared, then
// the states.
void expect_same_steps(TwoSteps& two, int64_t filled, int steps, uint32_t seed) {
  const ModelConfig& c = two.w->config();
  CudaSequenceState a(c, filled + steps + 8);
  if (filled > 0) bench::fake_fill(a, filled);
  auto b_owner = a.clone();
  CudaSequenceState& b = as_cuda(*b_owner);
  std::mt19937 rng(seed);
  double worst = 0;
  for (int i = 0; i < steps; ++i) {
    const int32_t token = int32_t(rng() % uint32_t(c.vocab_size));
    const std::vector<float> want = step(*two.chain, a, token, c.vocab_size);
    const std::vector<float> got = step(*two.persistent, b, token, c.vocab_size);
    const double d = test::relative_error(got, want);  // max |got - want| / max |want|
    worst = std::max(worst, d);
    ASSERT_LE(d, 2e-3) << "step " << i << " after " << filled << " rows";
    EXPECT_EQ(std::max_element(want.begin(), want.end()) - want.begin(),
              std::max_element(got.begin(), got.end()) - got.begin())
        << "step " << i;
  }
  std::printf("%lld cached rows, %d steps: worst max |diff| %.3g of max |logit|\n", (long long)filled, steps, worst);
  EXPECT_EQ(download(a.position(), 1), download(b.position(), 1));
  size_t attention = 0, deltanet = 0;
  const size_t conv = size_t(c.linear_conv_dim()) * size_t(c.linear_conv_kernel_dim - 1);
  const size_t ssm = size_t(c.linear_num_value_heads) * 128 * 128;
  for (LayerKind kind : c.layer_types) {
    if (kind == LayerKind::full_attention) {
      const size_t n = size_t(filled + steps) * size_t(c.attention_kv_width());
      const auto ka = cache_floats(a.k_cache(attention), n);
      const auto kb = cache_floats(b.k_cache(attention), n);
      const auto va = cache_floats(a.v_cache(attention), n);
      const auto vb = cache_floats(b.v_cache(attention++), n);
      // Rows the two paths computed from fp32 values that differ in their last bits may round to
      // neighbouring bf16 values: at most one bf16 step (2^-7 of the largest magnitude) apart.
      EXPECT_LE(test::relative_error(kb, ka), 1.0 / 128) << "k cache of attention layer " << attention - 1;
      EXPECT_LE(test::relative_error(vb, va), 1.0 / 128) << "v cache of attention layer " << attention - 1;
    } else {
      EXPECT_LE(test::relative_error(download(b.conv(deltanet), conv), download(a.conv(deltanet), conv)), 2e-3)
          << "conv state " << deltanet;
      EXPECT_LE(test::relative_error(download(b.ssm(deltanet), ssm), download(a.ssm(deltanet), ssm)), 2e-3)
          << "ssm state " << deltanet;
      ++deltanet;
    }
  }
}

// On the host: the tiling the kernel uses gives lists that pass the checker and fit the kernel (a
// block's list in shared memory, at most two waits a task) for the model and lily-tiny, on the
// H200's 132 SMs and on fewer.
TEST(PersistentDecode, TheTilingFitsTheKernel) {
  const ModelConfig tiny = load_model(std::string(LILY_SOURCE_DIR) + "/models/lily-tiny")->config;
  for (const ModelConfig& c : {qwen36_35b_a3b_config(), tiny})
    for (int blocks : {132, 114}) {
      SCOPED_TRACE(testing::Message() << c.num_layers << " layers, " << blocks << " blocks");
      const persistent::DecodeTiling tiling = persistent::persistent_decode_tiling(c, blocks);
      const persistent::DecodeTasks d = persistent::build_decode_tasks(c, tiling);
      EXPECT_NO_THROW(persistent::check_task_list(d.list));
      size_t most = 0;
      for (const auto& block : d.list.blocks) {
        most = std::max(most, block.size());
        for (const persistent::Task& t : block) EXPECT_LE(t.waits.size(), 2u) << t.name;
      }
      EXPECT_LE(most, size_t(persistent::kMaxBlockTasks));
      // A layer's gate/up tasks, and its down tasks, fit on distinct blocks.
      std::map<std::pair<int, uint16_t>, int> per_layer_op;
      for (const auto& block : d.list.blocks)
        for (const persistent::Task& t : block) ++per_layer_op[{t.layer, t.op}];
      for (persistent::DecodeOp op : {persistent::DecodeOp::gate_up, persistent::DecodeOp::down})
        EXPECT_LE(per_layer_op[std::make_pair(0, uint16_t(op))], blocks) << persistent::op_name(op);
      std::printf("%d layers on %d blocks: %zu tasks, at most %zu a block\n", c.num_layers, blocks, d.list.tasks(),
                  most);
    }
}

QMatrix shape(int rows, int cols, int bits = 4, int batch = 1) {
  QMatrix m;
  m.batch = batch, m.rows = rows, m.cols = cols, m.bits = bits, m.group_size = 64;
  return m;
}

// Weights of config c's shapes in mlx's formats (no memory: the refusal reads only shapes).
std::unique_ptr<GpuWeights> shapes_of(const ModelConfig& c) {
  auto w = std::make_unique<GpuWeights>(c);
  const int H = c.hidden_size, E = c.num_experts, I = c.moe_intermediate_size, Is = c.shared_expert_intermediate_size;
  w->embed_tokens = shape(c.vocab_size, H), w->lm_head = shape(c.vocab_size, H);
  for (LayerKind kind : c.layer_types) {
    GpuLayer l;
    l.kind = kind;
    if (kind == LayerKind::full_attention) {
      l.attention.qkv_proj = shape(2 * c.attention_q_width() + 2 * c.attention_kv_width(), H);
      l.attention.o_proj = shape(H, c.attention_q_width());
    } else {
      l.deltanet.in_proj_all = shape(c.linear_conv_dim() + c.linear_value_dim() + 2 * c.linear_num_value_heads, H);
      l.deltanet.out_proj = shape(H, c.linear_value_dim());
    }
    l.moe.router = shape(E, H, 8), l.moe.shared_expert_gate = shape(1, H, 8);
    l.moe.experts_gate = shape(I, H, 4, E), l.moe.experts_up = shape(I, H, 4, E),
    l.moe.experts_down = shape(H, I, 4, E);
    l.moe.shared_gate = shape(Is, H), l.moe.shared_up = shape(Is, H), l.moe.shared_down = shape(H, Is);
    w->layers.push_back(l);
  }
  return w;
}

// Weights the kernel does not take are refused with the part and its layer named (the plan then
// keeps the chain of kernels); the model's own shapes are taken.
TEST(PersistentDecode, WeightsItDoesNotTakeAreRefused) {
  const ModelConfig c = test::short_full_size(4);
  EXPECT_EQ(persistent::persistent_decode_refusal(*shapes_of(c)), "");
  auto refusal = [&](auto edit) {
    auto w = shapes_of(c);
    edit(*w);
    return persistent::persistent_decode_refusal(*w);
  };
  auto names = [](const std::string& why, const std::string& part) {
    EXPECT_NE(why.find(part), std::string::npos) << "'" << why << "' does not name '" << part << "'";
  };
  names(refusal([](GpuWeights& w) { w.layers[1].deltanet.in_proj_all.rows = 0; }),
        "layer 1: the fused input projection");
  names(refusal([](GpuWeights& w) { w.layers[3].moe.router.bits = 4; }), "layer 3: the router");
  names(refusal([](GpuWeights& w) { w.layers[0].moe.experts_down.bits = 8; }), "layer 0: experts' down");
  names(refusal([](GpuWeights& w) { w.layers[3].attention.o_proj.group_size = 32; }), "layer 3: the output projection");
  names(refusal([](GpuWeights& w) { w.lm_head.bits = 8; }), "lm_head");
  names(refusal([](GpuWeights& w) { w.embed_tokens.bits = 8; }), "embed_tokens");
  ModelConfig wide = c;
  wide.hidden_size = 5120;
  names(persistent::persistent_decode_refusal(*shapes_of(wide)), "hidden size");
  ModelConfig heads = c;
  heads.head_dim = 128;
  names(persistent::persistent_decode_refusal(*shapes_of(heads)), "attention");
}

TEST(PersistentDecode, LilyTinyStepsMatchTheChain) {
  REQUIRE_GPU();
  auto weights = load_model(std::string(LILY_SOURCE_DIR) + "/models/lily-tiny");
  TwoSteps two(GpuWeights::upload(*weights));
  expect_same_steps(two, 0, 40, 1);
  expect_same_steps(two, 1000, 8, 2);
}

TEST(PersistentDecode, FullSizeGeometryStepsMatchTheChain) {
  REQUIRE_GPU();
  TwoSteps two(bench::synthetic_weights(test::short_full_size(4), 7));
  expect_same_steps(two, 0, 6, 3);
  expect_same_steps(two, 63, 3, 4);
  expect_same_steps(two, 4096, 4, 5);
}

// Greedy tokens of the persistent step (arg max on the host) against the CPU backend.
TEST(PersistentDecode, LilyTinyGreedyMatchesCpu) {
  REQUIRE_GPU();
  auto weights = load_model(std::string(LILY_SOURCE_DIR) + "/models/lily-tiny");
  TwoSteps two(GpuWeights::upload(*weights));
  auto cpu = make_cpu_backend(weights);
  auto cs = cpu->new_sequence(128);
  CudaSequenceState gs(weights->config, 128);
  int32_t cpu_token = 17, gpu_token = 17;
  std::vector<float> row;
  for (int i = 0; i < 48; ++i) {
    cpu->forward(*cs, std::span<const int32_t>(&cpu_token, 1), LogitsWanted::last, row);
    cpu_token = int32_t(std::max_element(row.begin(), row.end()) - row.begin());
    const std::vector<float> g = step(*two.persistent, gs, gpu_token, weights->config.vocab_size);
    gpu_token = int32_t(std::max_element(g.begin(), g.end()) - g.begin());
    ASSERT_EQ(cpu_token, gpu_token) << "token " << i;
  }
}

}  // namespace
}  // namespace lily
