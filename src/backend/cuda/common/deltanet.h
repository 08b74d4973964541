// deltanet.h: the core of a Gated DeltaNet layer on the GPU (spec §2.6, §3): everything
// between the input projections and out_proj.
#pragma once

#include <cstddef>

#include "backend/cuda/common/gpu_types.h"

namespace lily::cuda {

// How a prefill (T > 1) runs the delta rule: the token loop (spec §3.1, deltanet_scan_kernel) or
// the chunked form (spec §3.2, deltanet_chunked.cu). Decode (T = 1) always uses the fused kernel.
enum class DeltaRulePrefill { recurrent, chunked };

struct DeltaNetParams {
  int T = 1;                    // tokens in this block
  int num_key_heads = 16;       // Hk
  int num_value_heads = 32;     // Hv (v-head n reads q/k head n / (Hv/Hk))
  int head_dim = 128;           // dk = dv = 128
  int conv_kernel = 4;          // K
  float eps = 1e-6f;            // the gated RMSNorm's epsilon
  const float* conv_weight = nullptr;  // [conv_dim, K] fp32, w[c, K-1] multiplies the current token
  const float* A_log = nullptr;        // [Hv]
  const float* dt_bias = nullptr;      // [Hv]
  const float* norm_weight = nullptr;  // [128] gated RMSNorm weight
  DeltaRulePrefill prefill = DeltaRulePrefill::chunked;
  int conv_dim() const { return 2 * num_key_heads * head_dim + num_value_heads * head_dim; }
};

// mixed: [T, conv_dim] pre-conv q|k|v (in_proj_qkv output), z: [T, Hv*128], b, a: [T, Hv]
// conv_state: [K-1, conv_dim] fp32 (oldest first), updated;  ssm_state: [Hv, 128, 128] fp32
// (dk-major, as the CPU backend), updated;  y: [T, Hv*128] = gated_rms_norm(o, z), ready for out_proj.
//   u = silu(conv(mixed)); q = l2norm(q)/sqrt(128); k = l2norm(k); beta = sigmoid(b);
//   g = -exp(A_log) * softplus(a + dt_bias); o = delta rule; y = rmsnorm(o) * w * silu(z)
void gated_deltanet_core(const DeltaNetParams& p, const float* mixed, const float* z, const float* b, const float* a,
                         float* conv_state, float* ssm_state, float* y, cudaStream_t stream);

// Device scratch that gated_deltanet_core needs for p.T tokens, in bytes: 0 for decode (T = 1);
// for prefill min(T, 512) * conv_dim floats (the conv outputs of one 512-token chunk), plus for
// the chunked rule delta_rule_chunked_scratch_bytes(min(T, 512), Hv) (36,928 floats per v-head
// and 64 tokens: 36 MB at T >= 512 and Hv = 32).
size_t gated_deltanet_scratch_bytes(const DeltaNetParams& p);

// The same with caller-owned scratch of at least gated_deltanet_scratch_bytes(p) bytes. The
// overload above uses a grow-only buffer of its own (cudaMallocAsync on `stream`), so one
// stream at a time; decode (T = 1) allocates nothing and can be captured in a CUDA graph.
void gated_deltanet_core(const DeltaNetParams& p, const float* mixed, const float* z, const float* b, const float* a,
                         float* conv_state, float* ssm_state, float* y, void* scratch, cudaStream_t stream);

// The chunked delta rule alone (deltanet_chunked.cu), as gated_deltanet_core's prefill calls it
// for each block of <= 512 tokens; o and the final state equal the token loop's up to rounding.
struct DeltaRuleChunkedArgs {
  int n = 0;                      // tokens
  int num_key_heads = 16;         // Hk
  int num_value_heads = 32;       // Hv
  int conv_dim = 0;               // row length of u
  const float* u = nullptr;       // [n, conv_dim] q (l2-normalised, scaled by 1/sqrt(128)) | k (l2-normalised) | v
  const float* b = nullptr;       // [n, Hv] beta logits
  const float* a = nullptr;       // [n, Hv] decay inputs
  const float* A_log = nullptr;   // [Hv]
  const float* dt_bias = nullptr; // [Hv]
  float* ssm_state = nullptr;     // [Hv, 128, 128] fp32 dk-major, updated
  float* o = nullptr;             // [n, Hv*128] raw delta-rule outputs
  void* scratch = nullptr;        // delta_rule_chunked_scratch_bytes(n, Hv) bytes
};
size_t delta_rule_chunked_scratch_bytes(int n, int num_value_heads);
void delta_rule_chunked(const DeltaRuleChunkedArgs& args, cudaStream_t stream);

}  // namespace lily::cuda
