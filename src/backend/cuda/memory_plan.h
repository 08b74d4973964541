// memory_plan.h: what the CUDA backend's device memory holds, computed before anything is
// allocated, and the largest context that fits a budget (issue 39: a 24 GB card).
//
//   weights            GpuWeights::bytes() (the full model at 4 bits: ~19.5 GB)
//   KV cache           per slot: context x (attention layers x 2 x nkv x head_dim x 2 bytes) (20 KiB a
//                      token for the full model, 22 with the MTP head's); sized to the context asked for,
//                      not a larger capacity
//   recurrent state    per slot: DeltaNet layers x (Hv x 128 x 128 fp32 + (K-1) x conv_dim fp32) (63 MiB)
//   prefill workspace  prefill_pass.h's PrefillWorkspace for plan.prefill.chunk_tokens (8192: ~1.8 GB;
//                      it scales with the chunk: LILY_PREFILL_CHUNK, or under a cap prefill_chunk_for)
//   decode workspace   the decode step's and graph's buffers (a few MB) and the split attention's partials
//   reserve            the CUDA context, graphs and the allocator's slack (kReserveBytes), never planned into
// A budget is the free device memory, or less under a cap (`--gpu-memory GB`).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>

#include "model/config.h"

namespace lily::cuda {

class GpuWeights;
struct KernelPlan;

constexpr uint64_t kReserveBytes = uint64_t(512) << 20;  // the CUDA context, graphs, allocator slack

struct MemoryNeeds {
  uint64_t weights = 0;
  uint64_t kv_per_token = 0;        // one slot's KV cache per token of context
  uint64_t recurrent_per_slot = 0;  // one slot's DeltaNet conv and recurrent state
  uint64_t prefill_workspace = 0;
  uint64_t decode_workspace = 0;
  uint64_t reserve = kReserveBytes;
};

struct MemoryRequest {
  int64_t context = 0;  // tokens per slot; 0: the largest that fits the budget
  int slots = 1;        // sequences held at once (--parallel)
  uint64_t budget = 0;  // bytes lily may use on the device (free memory, or the --gpu-memory cap)
};

struct MemoryPlan {
  MemoryNeeds needs;
  int64_t context = 0;  // tokens per slot
  int slots = 1;
  uint64_t budget = 0;
  uint64_t kv_cache() const { return needs.kv_per_token * uint64_t(context) * uint64_t(slots); }
  uint64_t recurrent() const { return needs.recurrent_per_slot * uint64_t(slots); }
  uint64_t total() const;
  std::string describe() const;  // where the bytes go, for people
};

// One slot's KV cache per token, and its recurrent state (the config's arithmetic; equal to what
// CudaSequenceState allocates).
uint64_t kv_cache_bytes_per_token(const ModelConfig& c);
uint64_t mtp_cache_bytes_per_token(const ModelConfig& c);  // the MTP head's cache (2 KiB a token for the model)
uint64_t recurrent_state_bytes(const ModelConfig& c);

// The needs of weights `w` (weight_bytes: what the upload holds) under `plan`.
MemoryNeeds memory_needs(const GpuWeights& w, uint64_t weight_bytes, const KernelPlan& plan);

// The plan for `request` within its budget: the context asked for (throws lily::Error when it does
// not fit, saying the longest context and the most slots that would), or the largest context that
// fits (a multiple of 256 tokens, at most max_context; throws when not even 256 tokens fit).
MemoryPlan plan_memory(const MemoryNeeds& needs, const MemoryRequest& request, int64_t max_context);

// The prefill chunks a cap chooses among, largest first (8192: the default without one).
constexpr std::array<int, 5> kPrefillChunkChoices = {8192, 4096, 2048, 1024, 512};

// The prefill chunk under a cap (`budget`, 0: none): the largest of kPrefillChunkChoices for which
// one sequence of `context` tokens (at least 256) fits beside the weights and workspaces,
// needs_of(chunk) being the needs of the plan with that chunk; the smallest when none does (the
// caller's check then says what does not fit). No cap: the first. As llama.cpp's fit lowers its
// batch: the full model and 32K of context in 22 GB take 2048 (the workspace of 8192 is 2 GiB).
int prefill_chunk_for(const std::function<MemoryNeeds(int)>& needs_of, int64_t context, uint64_t budget);

}  // namespace lily::cuda
