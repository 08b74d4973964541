// mtp.cpp: the MTP head's block (spec §6) for T rows at consecutive positions i.
//
//   e  = RMSNorm_zc(E[x_{i+1}]; mtp.pre_fc_norm_embedding)     E: the main model's embed_tokens
//   hh = RMSNorm_zc(h_i; mtp.pre_fc_norm_hidden)                h_i: the main model's row AFTER its final norm
//   u  = concat(e, hh) @ mtp.fc^T                               [2H] -> [H]; embedding first, then hidden
//   u  = decoder_layer(u; mtp.layers.0)                         full attention at position i, its own KV cache
//   m  = RMSNorm_zc(u; mtp.norm)
//   logits_{i+2} = m @ lm_head^T                                (the caller: the main model's lm_head)
// A chained step takes m as its h, the drafted token as its x, and position i + 1.
#include "backend/cpu/ops.h"

namespace lily::cpu {

void mtp_input(const MtpWeights& w, const Matrix& embed_tokens, const ModelConfig& c, const float* hidden,
               const int32_t* tokens, int64_t T, float* u) {
  const int64_t H = c.hidden_size;
  std::vector<float> eh(size_t(T * 2 * H));  // [T, 2H]: row t = [e_t | hh_t]
  for (int64_t t = 0; t < T; ++t) {
    float* e = eh.data() + t * 2 * H;  // [H]
    float* hh = e + H;                 // [H]
    embed_tokens.dequantize_row(tokens[t], e);
    rms_norm(e, w.pre_fc_norm_embedding.data(), 1, H, c.rms_norm_eps, e);
    rms_norm(hidden + t * H, w.pre_fc_norm_hidden.data(), 1, H, c.rms_norm_eps, hh);
  }
  linear(w.fc, eh.data(), T, u);
}

void mtp_block(const MtpWeights& w, const Matrix& embed_tokens, const ModelConfig& c, AttentionCache& cache,
               int64_t first_position, const float* hidden, const int32_t* tokens, int64_t T, float* m) {
  const int64_t H = c.hidden_size;
  std::vector<float> u(size_t(T * H));  // [T, H] the block's residual stream
  mtp_input(w, embed_tokens, c, hidden, tokens, T, u.data());
  decoder_layer(w.layer, c, LayerCache{.attention = &cache, .deltanet = nullptr, .kept = {}}, first_position, u.data(),
                T);
  rms_norm(u.data(), w.norm.data(), T, H, c.rms_norm_eps, m);
}

}  // namespace lily::cpu
