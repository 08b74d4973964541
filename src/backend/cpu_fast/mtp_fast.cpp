// mtp_fast.cpp: the MTP head's block (spec §6) on the fast layers (mtp_fast.h).
//
//   e  = RMSNorm_zc(E[x_{i+1}]; mtp.pre_fc_norm_embedding)     hh = RMSNorm_zc(h_i; mtp.pre_fc_norm_hidden)
//   u  = concat(e, hh) @ mtp.fc^T                              GEMV (one row) | GEMM (more)
//   u += attention(RMSNorm_zc(u; input_layernorm))             attention_step | attention_prefill
//   u += moe(RMSNorm_zc(u; post_attention_layernorm))          moe_step | moe_prefill
//   m  = RMSNorm_zc(u; mtp.norm)
// Tested against cpu::mtp_block through the backends (tests/cpu_fast/test_mtp_fast.cpp).
#include "backend/cpu_fast/mtp_fast.h"

#include "backend/cpu_fast/gemm.h"

namespace lily::cpu_fast {

namespace {

void add_rows(float* h, const std::vector<float>& x, int64_t n) {
  for (int64_t j = 0; j < n; ++j) h[j] += x[size_t(j)];
}

}  // namespace

void mtp_block(const MtpWeights& w, const Matrix& embed_tokens, const ModelConfig& c, cpu::AttentionCache& cache,
               int64_t first_position, const float* hidden, const int32_t* tokens, int64_t T, float* m, MtpScratch& s,
               LayerScratch& layers) {
  const int64_t H = c.hidden_size;
  s.eh.resize(size_t(T * 2 * H));
  s.u.resize(size_t(T * H));
  s.normed.resize(size_t(T * H));
  s.mixed.resize(size_t(T * H));
  for (int64_t t = 0; t < T; ++t) {
    float* e = s.eh.data() + t * 2 * H;  // [H], then hh [H]
    embed_tokens.dequantize_row(tokens[t], e);
    cpu::rms_norm(e, w.pre_fc_norm_embedding.data(), 1, H, c.rms_norm_eps, e);
    cpu::rms_norm(hidden + t * H, w.pre_fc_norm_hidden.data(), 1, H, c.rms_norm_eps, e + H);
  }
  PrefillScratch& p = layers.prefill;
  if (T == 1) linear(w.fc, s.eh.data(), 1, s.u.data(), layers.gemv);
  else gemm_parallel(w.fc, s.eh.data(), T, s.u.data(), p.x, p.gemm);

  const LayerWeights& l = w.layer;
  cpu::rms_norm(s.u.data(), l.input_layernorm.data(), T, H, c.rms_norm_eps, s.normed.data());
  if (T == 1) attention_step(l.attention, c, cache, first_position, s.normed.data(), s.mixed.data(), layers.attention);
  else attention_prefill(l.attention, c, cache, first_position, s.normed.data(), T, s.mixed.data(), p);
  add_rows(s.u.data(), s.mixed, T * H);
  cpu::rms_norm(s.u.data(), l.post_attention_layernorm.data(), T, H, c.rms_norm_eps, s.normed.data());
  if (T == 1) moe_step(l.moe, c, s.normed.data(), s.mixed.data(), layers.moe);
  else moe_prefill(l.moe, c, s.normed.data(), T, s.mixed.data(), p);
  add_rows(s.u.data(), s.mixed, T * H);
  cpu::rms_norm(s.u.data(), w.norm.data(), T, H, c.rms_norm_eps, m);
}

}  // namespace lily::cpu_fast
