// deltanet_prefill.h: the core of a Gated DeltaNet layer for a block of T tokens (prefill), in
// chunks of <= kDeltaNetPrefillChunk tokens (deltanet_prefill.cu), with the delta rule in one of
// two forms.
#pragma once

#include <cstddef>

#include "backend/cuda/deltanet/deltanet.h"
#include "base/bf16.h"

namespace lily::cuda {

// Tokens of one chunk of gated_deltanet_prefill: each chunk launches its six kernels once (their
// fixed costs fell from 8 to 1 times a layer at 4096 tokens: docs/perf-log/2026-12.md, session
// 19), and its scratch holds one chunk.
constexpr int kDeltaNetPrefillChunk = 4096;

// How the delta rule runs over a chunk: the whole core of a few tokens in the decode kernel
// (rows: deltanet/deltanet_decode.h, T <= 16), the token loop (spec §3.1) or the chunked form
// (spec §3.2, deltanet_chunked.cu). The kernel plan picks by length (kernel_plan.h).
enum class DeltaRulePrefill { rows, recurrent, chunked };

const char* kernel_name(DeltaRulePrefill form);

// Device scratch of gated_deltanet_prefill for p.T tokens, in bytes: none for the rows form, else
// min(T, chunk) * conv_dim floats (the conv outputs of one chunk), plus for the chunked form
// delta_rule_chunked_scratch_bytes(min(T, chunk), Hv) (36,928 floats per v-head and 64 tokens).
size_t deltanet_prefill_scratch_bytes(DeltaRulePrefill form, const DeltaNetParams& p);

// mixed: [T, conv_dim] pre-conv q|k|v (in_proj_qkv output), z: [T, Hv*128], b, a: [T, Hv]
// conv_state: [K-1, conv_dim] fp32 (oldest first), updated;  ssm_state: [Hv, 128, 128] fp32
// (dk-major, as the CPU backend), updated;  y: [T, Hv*128] = gated_rms_norm(o, z), ready for
// out_proj. Every buffer 16-byte aligned; scratch: deltanet_prefill_scratch_bytes(form, p) bytes.
// y_bf16 (optional, not the rows form): y also as bf16 in x_to_bf16_permuted's K order [T, Hv*128].
void gated_deltanet_prefill(DeltaRulePrefill form, const DeltaNetParams& p, const float* mixed, const float* z,
                            const float* b, const float* a, float* conv_state, float* ssm_state, float* y,
                            void* scratch, cudaStream_t stream, bf16* y_bf16 = nullptr);

// The chunked delta rule alone (deltanet_chunked.cu), as gated_deltanet_prefill calls it for each
// chunk; o and the final state equal the token loop's up to rounding.
struct DeltaRuleChunkedArgs {
  int n = 0;                       // tokens
  int num_key_heads = 16;          // Hk
  int num_value_heads = 32;        // Hv
  int conv_dim = 0;                // row length of u
  const float* u = nullptr;        // [n, conv_dim] q (l2-normalised, scaled by 1/sqrt(128)) | k (l2-normalised) | v
  const float* b = nullptr;        // [n, Hv] beta logits
  const float* a = nullptr;        // [n, Hv] decay inputs
  const float* A_log = nullptr;    // [Hv]
  const float* dt_bias = nullptr;  // [Hv]
  float* ssm_state = nullptr;      // [Hv, 128, 128] fp32 dk-major, updated
  float* o = nullptr;              // [n, Hv*128] raw delta-rule outputs
  void* scratch = nullptr;         // delta_rule_chunked_scratch_bytes(n, Hv) bytes
};
size_t delta_rule_chunked_scratch_bytes(int n, int num_value_heads);
// The most dynamic shared memory a block of the chunked rule asks for (its state kernel: 188,928 bytes).
size_t delta_rule_chunked_shared_bytes();
void delta_rule_chunked(const DeltaRuleChunkedArgs& args, cudaStream_t stream);

}  // namespace lily::cuda
