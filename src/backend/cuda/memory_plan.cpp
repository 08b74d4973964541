// memory_plan.cpp: see memory_plan.h.
#include "backend/cuda/memory_plan.h"

#include <fmt/format.h>

#include <algorithm>

#include "backend/cuda/attention/attention_decode.h"
#include "backend/cuda/decode_step.h"
#include "backend/cuda/gpu_weights.h"
#include "backend/cuda/kernel_plan.h"
#include "backend/cuda/prefill_pass.h"
#include "base/error.h"

namespace lily::cuda {

namespace {

constexpr int64_t kContextStep = 256;  // the largest context is chosen in steps of this many tokens

double gib(uint64_t bytes) { return double(bytes) / double(1ull << 30); }

}  // namespace

uint64_t kv_cache_bytes_per_token(const ModelConfig& c) {
  return uint64_t(c.num_layers_of(LayerKind::full_attention)) * 2 * uint64_t(c.num_key_value_heads) *
         uint64_t(c.head_dim) * 2;  // K and V, bf16
}

uint64_t mtp_cache_bytes_per_token(const ModelConfig& c) {
  return 2 * uint64_t(c.num_key_value_heads) * uint64_t(c.head_dim) * 2;  // one layer's K and V, bf16
}

uint64_t recurrent_state_bytes(const ModelConfig& c) {
  const uint64_t conv = uint64_t(c.linear_conv_kernel_dim - 1) * uint64_t(c.linear_conv_dim()) * 4;
  const uint64_t ssm = uint64_t(c.linear_num_value_heads) * uint64_t(c.linear_key_head_dim) *
                       uint64_t(c.linear_value_head_dim) * 4;
  return uint64_t(c.num_layers_of(LayerKind::linear_attention)) * (conv + ssm);
}

MemoryNeeds memory_needs(const GpuWeights& w, uint64_t weight_bytes, const KernelPlan& plan) {
  const ModelConfig& c = w.config();
  MemoryNeeds n;
  n.weights = weight_bytes;
  n.kv_per_token = kv_cache_bytes_per_token(c);
  if (w.mtp && plan.decode.mtp) n.kv_per_token += mtp_cache_bytes_per_token(c);
  n.recurrent_per_slot = recurrent_state_bytes(c);
  n.prefill_workspace = prefill_workspace(w, plan).total();
  n.decode_workspace = decode_step_workspace_bytes(c, plan.decode);
  return n;
}

uint64_t MemoryPlan::total() const {
  return needs.weights + kv_cache() + recurrent() + needs.prefill_workspace + needs.decode_workspace + needs.reserve;
}

std::string MemoryPlan::describe() const {
  return fmt::format("{:.2f} GiB of {:.2f}: weights {:.2f}, KV cache {:.2f} ({} slot(s) x {} tokens x {} KiB), "
                     "recurrent state {:.2f} ({} x {:.0f} MiB), prefill workspace {:.2f}, decode workspace {:.2f}, "
                     "reserve {:.2f}",
                     gib(total()), gib(budget), gib(needs.weights), gib(kv_cache()), slots, context,
                     needs.kv_per_token / 1024, gib(recurrent()), slots, double(needs.recurrent_per_slot) / (1 << 20),
                     gib(needs.prefill_workspace), gib(needs.decode_workspace), gib(needs.reserve));
}

MemoryPlan plan_memory(const MemoryNeeds& needs, const MemoryRequest& request, int64_t max_context) {
  LILY_CHECK(request.slots >= 1, "{} slots: at least 1", request.slots);
  LILY_CHECK(request.context >= 0, "a context of {} tokens", request.context);
  MemoryPlan plan;
  plan.needs = needs, plan.slots = request.slots, plan.budget = request.budget;
  const uint64_t fixed = needs.weights + needs.prefill_workspace + needs.decode_workspace + needs.reserve;
  const uint64_t per_slot_fixed = needs.recurrent_per_slot;
  // The longest context of `slots` slots within the budget (0 when not even the fixed part fits).
  auto longest = [&](int slots) -> int64_t {
    const uint64_t used = fixed + per_slot_fixed * uint64_t(slots);
    if (used >= request.budget || needs.kv_per_token == 0) return 0;
    return int64_t((request.budget - used) / (needs.kv_per_token * uint64_t(slots)));
  };
  if (request.context > 0) {
    plan.context = request.context;
    if (plan.total() <= request.budget) return plan;
    int most_slots = 0;
    while (longest(most_slots + 1) >= request.context) ++most_slots;
    const int64_t fits = longest(request.slots);
    fail("a context of {} tokens x {} slot(s) needs {:.2f} GiB of device memory, {:.2f} GiB available ({}); {}",
         request.context, request.slots, gib(plan.total()), gib(request.budget), plan.describe(),
         fits >= kContextStep
             ? fmt::format("a context of up to {} tokens fits{}", fits / kContextStep * kContextStep,
                           most_slots >= 1 ? fmt::format(", or {} slot(s) of {} tokens", most_slots, request.context)
                                           : std::string())
             : std::string("not even 256 tokens fit: lower the prefill chunk (LILY_PREFILL_CHUNK) or free memory"));
  }
  const int64_t fits = std::min(longest(request.slots), max_context) / kContextStep * kContextStep;
  plan.context = std::max<int64_t>(fits, kContextStep);
  LILY_CHECK(fits >= kContextStep,
             "{} slot(s) leave no room for a context of {} tokens in {:.2f} GiB of device memory ({}): fewer slots "
             "(--parallel), a smaller prefill chunk (LILY_PREFILL_CHUNK) or more memory",
             request.slots, kContextStep, gib(request.budget), plan.describe());
  return plan;
}

int prefill_chunk_for(const std::function<MemoryNeeds(int)>& needs_of, int64_t context, uint64_t budget) {
  if (budget == 0) return kPrefillChunkChoices.front();
  for (int chunk : kPrefillChunkChoices) {
    MemoryPlan plan;
    plan.needs = needs_of(chunk);
    plan.context = std::max<int64_t>(context, kContextStep);
    if (plan.total() <= budget) return chunk;
  }
  return kPrefillChunkChoices.back();
}

}  // namespace lily::cuda
