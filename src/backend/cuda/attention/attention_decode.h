// attention_decode.h: the gated attention of one new token (T = 1) over the KV cache: flash
// decoding on the tensor cores in two launches (attention_decode.cu).
#pragma once

#include <cstddef>

#include "backend/cuda/attention/attention.h"
#include "backend/cuda/common/row_tables.h"

namespace lily::cuda {

// Device scratch of the split-KV decode, in bytes: per KV head and split the 8 query heads'
// partial (max, sum, accumulator). Fixed by p.capacity alone, so one buffer serves every layer
// and every step.
size_t attention_decode_scratch_bytes(const AttentionParams& p);

// Shared memory a block of the split kernel takes on a device that allows `shared_per_block`
// bytes a block (kernel_plan.cpp checks it against the device profile): its cp.async pipeline
// holds as many stages of 64-key K and V tiles as fit, 3 to 1 (218 KB on Hopper, 152 KB on
// sm_80, 86 KB on the 99 KB cards); more than shared_per_block where not even one fits.
size_t attention_decode_shared_bytes(size_t shared_per_block);

// qg: [nq * 2 * head_dim] raw q_proj output (per head: 256 query values, then 256 gate values);
// k, v: [nkv * head_dim] raw k_proj / v_proj outputs; k_cache, v_cache: [capacity, nkv, head_dim]
// bf16, row *p.position written (k after k_norm and RoPE; v as is); out: [nq * head_dim] =
// softmax(q K^T / sqrt(head_dim)) V * sigmoid(gate) over rows [0, position]. p.T must be 1.
// scratch: attention_decode_scratch_bytes(p) bytes, zero-filled once before its first use (the
// kernels leave their counters at zero again).
void gated_attention_decode(const AttentionParams& p, const float* qg, const float* k, const float* v, bf16* k_cache,
                            bf16* v_cache, float* out, void* scratch, cudaStream_t stream);

// A batch step's attention: one new token of each of N sequences (N <= kMaxBatchRows), row r
// over its own cache and position (rows' tables; p's position and capacity are not read):
// qg [N, nq * 512], k, v [N, nkv * 256], out [N, nq * 256], as gated_attention_decode row by row.
// The grid's splits are the ones that can run at once (the SMs of a KV head's share), whatever
// the rows' capacities. scratch: attention_decode_rows_scratch_bytes(p, N), as that of the
// one-row form.
size_t attention_decode_rows_scratch_bytes(const AttentionParams& p, int N);
void gated_attention_decode_rows(const AttentionParams& p, const AttentionRows& rows, int N, const float* qg,
                                 const float* k, const float* v, float* out, void* scratch, cudaStream_t stream);

}  // namespace lily::cuda
