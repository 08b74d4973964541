// layer_params.h: the parameters of the attention and DeltaNet cores for this model's layers,
// as the decode step, the prefill pass and the kernel plan pass them to the launchers.
#pragma once

#include "backend/cuda/attention/attention.h"
#include "backend/cuda/deltanet/deltanet.h"
#include "backend/cuda/gpu_weights.h"
#include "model/config.h"

namespace lily::cuda {

// The gated attention of one layer for T tokens of a sequence whose caches hold `capacity` rows
// and whose next position is at `position` (device memory).
inline AttentionParams attention_params(const ModelConfig& c, const GpuAttention& a, int T, int capacity,
                                        const int32_t* position) {
  AttentionParams p;
  p.T = T;
  p.num_heads = c.num_attention_heads;
  p.num_kv_heads = c.num_key_value_heads;
  p.head_dim = c.head_dim;
  p.rotary_dim = c.rotary_dim;
  p.rope_theta = c.rope_theta;
  p.eps = c.rms_norm_eps;
  p.q_norm = a.q_norm;
  p.k_norm = a.k_norm;
  p.position = position;
  p.capacity = capacity;
  return p;
}

// The Gated DeltaNet core of one layer for T tokens.
inline DeltaNetParams deltanet_params(const ModelConfig& c, const GpuDeltaNet& d, int T) {
  DeltaNetParams p;
  p.T = T;
  p.num_key_heads = c.linear_num_key_heads;
  p.num_value_heads = c.linear_num_value_heads;
  p.head_dim = c.linear_key_head_dim;
  p.conv_kernel = c.linear_conv_kernel_dim;
  p.eps = c.rms_norm_eps;
  p.conv_weight = d.conv1d;
  p.A_log = d.A_log;
  p.dt_bias = d.dt_bias;
  p.norm_weight = d.norm;
  return p;
}

}  // namespace lily::cuda
