// attention.h: the core of a gated full-attention layer on the GPU (spec §2.4): everything
// between the q/k/v projections and o_proj, including appending to the KV cache.
#pragma once

#include <cstddef>

#include "backend/cuda/common/gpu_types.h"

namespace lily::cuda {

struct AttentionParams {
  int T = 1;                  // tokens in this block
  int num_heads = 16;         // nq
  int num_kv_heads = 2;       // nkv; q head h uses kv head h / (nq / nkv)
  int head_dim = 256;
  int rotary_dim = 64;        // NEOX rotate-half on dims [0, rotary_dim), pairs (j, j + rotary_dim/2)
  float rope_theta = 1e7f;
  float eps = 1e-6f;
  const float* q_norm = nullptr;     // [head_dim] effective gain (1 + w)
  const float* k_norm = nullptr;     // [head_dim] effective gain
  const int32_t* position = nullptr; // device: position of the block's first token (= cached length)
  int capacity = 0;                  // rows the caches can hold
};

// qg: [T, nq * 2 * head_dim] raw q_proj output (per head: 256 query values, then 256 gate values)
// k, v: [T, nkv * head_dim] raw k_proj / v_proj outputs
// k_cache, v_cache: [capacity, nkv, head_dim] bf16; rows [position, position + T) are written
//   (k after k_norm and RoPE; v as is)
// out: [T, nq * head_dim] = softmax_causal(q K^T / sqrt(head_dim)) V * sigmoid(gate), ready for o_proj.
void gated_attention_core(const AttentionParams& p, const float* qg, const float* k, const float* v, bf16* k_cache,
                          bf16* v_cache, float* out, cudaStream_t stream);

// Device scratch of the split-KV decode (T = 1), in bytes: per KV head a counter and, per
// split, the 8 query heads' partial (max, sum, accumulator). Fixed by `capacity` alone, so
// one buffer serves every layer and every decode step; prefill (T > 1) does not use it.
size_t gated_attention_scratch_bytes(const AttentionParams& p);

// The same with caller-owned scratch of at least gated_attention_scratch_bytes(p) bytes,
// zero-filled once before its first use (the kernels leave their counters at zero again).
// The overload above keeps a grow-only buffer of its own, allocated on `stream` (one stream at
// a time); call it once before capturing a CUDA graph, since allocating during capture fails.
void gated_attention_core(const AttentionParams& p, const float* qg, const float* k, const float* v, bf16* k_cache,
                          bf16* v_cache, float* out, void* scratch, cudaStream_t stream);

}  // namespace lily::cuda
