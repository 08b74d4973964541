// decoder_layer.cpp: one decoder layer (spec §2.3), the main model's and the MTP head's alike.
//
//   r = h;  h = r + mixer(RMSNorm_zc(h; input_layernorm))            mixer: Gated DeltaNet | gated attention
//   r = h;  h = r + SparseMoE(RMSNorm_zc(h; post_attention_layernorm))
#include "backend/cpu/ops.h"
#include "base/error.h"

namespace lily::cpu {

void decoder_layer(const LayerWeights& layer, const ModelConfig& c, const LayerCache& cache, int64_t first_position,
                   float* h, int64_t T) {
  const int64_t H = c.hidden_size;
  std::vector<float> normed(size_t(T * H)), mixed(size_t(T * H));  // [T, H]
  rms_norm(h, layer.input_layernorm.data(), T, H, c.rms_norm_eps, normed.data());
  if (layer.kind == LayerKind::full_attention) {
    LILY_CHECK(cache.attention, "internal: a full-attention layer without its KV cache");
    gated_attention(layer.attention, c, *cache.attention, first_position, normed.data(), T, mixed.data());
  } else {
    LILY_CHECK(cache.deltanet, "internal: a DeltaNet layer without its conv and SSM state");
    gated_deltanet(layer.deltanet, c, *cache.deltanet, normed.data(), T, mixed.data(), cache.kept);
  }
  for (int64_t j = 0; j < T * H; ++j) h[j] += mixed[size_t(j)];

  rms_norm(h, layer.post_attention_layernorm.data(), T, H, c.rms_norm_eps, normed.data());
  sparse_moe(layer.moe, c, normed.data(), T, mixed.data());
  for (int64_t j = 0; j < T * H; ++j) h[j] += mixed[size_t(j)];
}

}  // namespace lily::cpu
