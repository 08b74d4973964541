// attention.h: the parameters of a gated full-attention layer's core on the GPU (spec §2.4),
// everything between the q/k/v projections and o_proj, appending to the KV cache included.
// The two paths: attention/attention_decode.h (one token), attention/attention_prefill.h (T tokens).
#pragma once

#include <cstdint>

#include "backend/cuda/common/gpu_types.h"

namespace lily::cuda {

struct AttentionParams {
  int T = 1;             // tokens in this block
  int num_heads = 16;    // nq
  int num_kv_heads = 2;  // nkv; q head h uses kv head h / (nq / nkv)
  int head_dim = 256;
  int rotary_dim = 64;  // NEOX rotate-half on dims [0, rotary_dim), pairs (j, j + rotary_dim/2)
  float rope_theta = 1e7f;
  float eps = 1e-6f;
  const float* q_norm = nullptr;      // [head_dim] effective gain (1 + w)
  const float* k_norm = nullptr;      // [head_dim] effective gain
  const int32_t* position = nullptr;  // device: position of the block's first token (= cached length)
  int capacity = 0;                   // rows the caches can hold
};

// Throws lily::Error naming what the kernels do not implement (head_dim other than 256, more than
// 8 query heads per KV head, ...). Both paths call it; so does the kernel plan, at load.
void check_attention_params(const AttentionParams& p);

}  // namespace lily::cuda
