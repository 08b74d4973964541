// mtp_pass.cpp: the MTP head for T rows on the GPU (spec §6), as backend/cpu/mtp.cpp computes it:
//
//   e  = RMSNorm(embed[tokens]; pre_fc_norm_embedding)          embed_tokens, rms_norm
//   hh = RMSNorm(hidden; pre_fc_norm_hidden)                    rms_norm
//   u  = e @ fc_embedding^T + hh @ fc_hidden^T                  mtp.fc's two column halves: the
//                                                               [T, 2H] concatenation never built
//   u  = decoder_layer(u)                                       the pass's gated_attention (the
//                                                               head's own KV cache and position)
//                                                               and sparse_moe, as a model layer
//   m  = RMSNorm(u; mtp.norm), logits = m @ lm_head^T           for the rows asked for
//
// hidden: [T, H] fp32, the main model's post-norm rows (forward_hidden) or the head's own m of
// the step before (a chained draft). Every kernel is the prefill pass's at T rows, so the head is
// exact to the pass's arithmetic; tests/cuda/test_cuda_mtp.cpp compares it with the CPU backend's.
#include "backend/cuda/common/norm.h"
#include "backend/cuda/gemv/gemv_rows.h"
#include "backend/cuda/prefill_pass.h"

namespace lily::cuda {

void PrefillPass::run_mtp(CudaSequenceState& s, const float* hidden, const int32_t* tokens, int T, int first_row,
                          float* host_logits, float* host_m, cudaStream_t stream) {
  LILY_CHECK(w_.mtp, "internal: an MTP pass over weights without the head");
  LILY_CHECK(s.has_mtp_cache(), "internal: an MTP pass on a sequence without the head's cache");
  LILY_CHECK(T >= 1 && T <= plan_.prefill.chunk_tokens && first_row >= 0 && first_row <= T,
             "MTP pass of {} rows (at most {}), outputs from row {}", T, plan_.prefill.chunk_tokens, first_row);
  const GpuMtp& mtp = *w_.mtp;
  const int H = c_.hidden_size;
  stream_ = stream;
  float* h = h_.as<float>();
  float* e = normed_.as<float>();
  float* hh = z_.as<float>();                 // [T, H]
  float* hidden_in = mixer_out_.as<float>();  // [T, H]
  CUDA_CHECK(cudaMemcpyAsync(tokens_.get(), tokens, size_t(T) * 4, cudaMemcpyHostToDevice, stream));
  CUDA_CHECK(cudaMemcpyAsync(hidden_in, hidden, size_t(T) * H * 4, cudaMemcpyHostToDevice, stream));
  // e = RMSNorm(embed[x_{i+1}]), hh = RMSNorm(h_i)
  embed_tokens(w_.embed_tokens, tokens_.as<int32_t>(), T, h, stream);
  rms_norm(h, mtp.pre_fc_norm_embedding, T, H, c_.rms_norm_eps, e, stream);
  rms_norm(hidden_in, mtp.pre_fc_norm_hidden, T, H, c_.rms_norm_eps, hh, stream);
  // u = concat(e, hh) @ fc^T
  project(mtp.fc_embedding, e, h, T, false);
  project(mtp.fc_hidden, hh, h, T, true);
  // u += attention(RMSNorm(u)) over the head's cache; u += MoE(RMSNorm(u))
  const KvCache cache = s.mtp_cache();
  gated_attention(mtp.layer, &cache, 0, T);
  sparse_moe(mtp.layer, plan_.decode.mtp_layer, T);
  advance_position(cache.position, T, stream);
  if (first_row == T) return;
  // m = RMSNorm(u; mtp.norm); logits = m @ lm_head^T
  if (host_m) normed_rows(first_row, T, mtp.norm, host_m);
  logits(first_row, T, host_logits, mtp.norm);
}

void PrefillPass::project(const QMatrix& W, const float* x, float* y, int T, bool accumulate) {
  if (plan_.prefill.dense_rows(T)) {
    if (accumulate) gemv_rows_accumulate(W, x, T, y, stream_);
    else gemv_rows(W, x, T, nullptr, y, stream_);
    return;
  }
  const GemmInput in = gemm_input(x, T, W.cols);
  if (accumulate) gemm_accumulate(W, in, y, T);
  else gemm(W, in, y, T);
}

}  // namespace lily::cuda
