// attention_prefill.h: the gated attention of a block of T tokens (prefill): their K/V rows into
// the caches, then causal attention over everything cached (attention_prefill.cu).
#pragma once

#include <cstddef>

#include "backend/cuda/attention/attention.h"

namespace lily::cuda {

enum class AttentionPrefillKernel {
  flash,   // tensor cores, 64 query rows x 64-key tiles: query heads per KV head must divide 64
  simple,  // one block per (token, KV head) walking every visible key: any group size
  split,   // the simple walk split over the keys (blocks per (token, KV head) to fill the SMs),
           // then a merge: a few tokens at depth; needs scratch
};

const char* kernel_name(AttentionPrefillKernel kernel);
bool attention_prefill_supports(AttentionPrefillKernel kernel, const AttentionParams& p);
// Dynamic shared memory a block of the flash kernel asks for (173,056 bytes; the others use less than 48 KB).
size_t flash_prefill_shared_bytes();

// Device scratch of gated_attention_prefill for p.T tokens (the split form's partial states).
size_t attention_prefill_scratch_bytes(AttentionPrefillKernel kernel, const AttentionParams& p);

// qg: [T, nq * 2 * head_dim] raw q_proj output (per head: 256 query values, then 256 gate values)
// k, v: [T, nkv * head_dim] raw k_proj / v_proj outputs
// k_cache, v_cache: [capacity, nkv, head_dim] bf16; rows [position, position + T) are written
//   (k after k_norm and RoPE; v as is)
// out: [T, nq * head_dim] = softmax_causal(q K^T / sqrt(head_dim)) V * sigmoid(gate), ready for o_proj.
// scratch: attention_prefill_scratch_bytes(kernel, p) bytes (the split form; 16-byte aligned).
void gated_attention_prefill(AttentionPrefillKernel kernel, const AttentionParams& p, const float* qg, const float* k,
                             const float* v, bf16* k_cache, bf16* v_cache, float* out, cudaStream_t stream,
                             void* scratch = nullptr);

}  // namespace lily::cuda
