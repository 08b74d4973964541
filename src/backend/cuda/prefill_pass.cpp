// prefill_pass.cpp: the model for a pass of T tokens (spec §2), as backend/cpu/forward.cpp
// computes it:
//
//   h = embed[tokens]
//   per layer:  x = RMSNorm(h)                                          rms_norm
//               DeltaNet:  qkv, z, b, a = x @ W^T                       gemm (fused: one) or x4
//                          y = gated_deltanet(qkv, z, b, a)             gated_deltanet_prefill
//                          h += y @ out_proj^T                          gemm_accumulate
//               attention: q,gate, k, v = x @ W^T                       gemm (fused: one) or x3
//                          o = gated_attention(q, k, v; KV cache)       gated_attention_prefill
//                          h += o @ o_proj^T                            gemm_accumulate
//               h += experts(RMSNorm(h)) + shared(RMSNorm(h))           rms_norm, moe_grouped_accumulate
//   logits = RMSNorm(h) @ lm_head^T for the rows asked for              rms_norm_gemv (one row),
//                                                                       rms_norm_gemv_rows (a few) or
//                                                                       rms_norm, gemm_q4 (64 at a time)
// gemm / gemm_accumulate: gemm_q4 (gemm_q4.h), or on sm_90a from the plan's wgmma_from tokens
// gemm_w4_wgmma (x converted to bf16 once per input, read by all its products; an RMSNorm's output
// written as bf16 by the norm itself, rms_norm_bf16_permuted; DeltaNet's y by its gated norm). Both take x in
// bf16 and sum in fp32; the router is fp32-accurate
// (gemm_exact), as in decode. In a pass of a few tokens the dense products split K over more
// blocks (gemm/split_k.h): their grids alone would leave most SMs idle. Passes of up to the
// plan's dense_rows_up_to tokens run the attention / DeltaNet projections as few-row GEMVs
// instead (gemv/gemv_rows.h): the RMSNorm folded into the fused input projection's one
// launch, the residual add into out_proj / o_proj's; and the experts (moe_rows_up_to). Passes of fewer than
// the plan's programmatic_below tokens launch their kernels with programmatic dependent launch
// (common/pdl_launch.cuh).
#include "backend/cuda/prefill_pass.h"

#include <algorithm>

#include "backend/cuda/attention/attention_decode.h"
#include "backend/cuda/attention/attention_prefill.h"
#include "backend/cuda/common/norm.h"
#include "backend/cuda/common/phase_marks.h"
#include "backend/cuda/common/programmatic_launches.h"
#include "backend/cuda/deltanet/deltanet_decode.h"
#include "backend/cuda/deltanet/deltanet_prefill.h"
#include "backend/cuda/gemm/gemm_q4.h"
#include "backend/cuda/gemm/gemm_w4_wgmma.h"
#include "backend/cuda/gemv/gemv.h"
#include "backend/cuda/gemv/gemv_rows.h"
#include "backend/cuda/layer_params.h"
#include "backend/cuda/moe/moe_decode.h"
#include "backend/cuda/moe/moe_grouped.h"

namespace lily::cuda {

PrefillWorkspace prefill_workspace(const GpuWeights& w, const KernelPlan& plan) {
  const ModelConfig& c = w.config();
  const uint64_t T = uint64_t(plan.prefill.chunk_tokens), H = uint64_t(c.hidden_size);
  const uint64_t value_dim = uint64_t(c.linear_value_dim());
  const uint64_t wide = std::max<uint64_t>(c.linear_conv_dim(), 2ull * c.attention_q_width());
  PrefillWorkspace s;
  s.tokens = T * 4;
  s.h = s.normed = T * H * 4;
  s.wide = T * wide * 4;
  s.z = T * std::max(value_dim, H) * 4;  // also the MTP head's normed hidden rows [T, H]
  s.b = s.a = T * uint64_t(c.linear_num_value_heads) * 4;
  s.k = s.v = T * uint64_t(c.attention_kv_width()) * 4;
  s.mixer_out = T * std::max<uint64_t>({value_dim, uint64_t(c.attention_q_width()), H}) * 4;  // and its hidden rows in
  if (plan.prefill.wgmma_from <= plan.prefill.chunk_tokens)
    s.xp = T * std::max({H, value_dim, uint64_t(c.attention_q_width())}) * 2;
  s.moe = std::max(moe_grouped_scratch_bytes(w.layers.at(0).moe, int(T), c.num_experts_per_tok),
                   moe_slots_scratch_bytes(w.layers.at(0).moe, kMoeSlotsMaxRows, c.num_experts_per_tok));
  for (const GpuLayer& layer : w.layers)  // the chunked form's is the larger
    if (layer.kind == LayerKind::linear_attention) {
      s.deltanet = deltanet_prefill_scratch_bytes(DeltaRulePrefill::chunked,
                                                  deltanet_params(c, layer.deltanet, int(T)));
      break;
    }
  size_t attention_bytes = 0;  // the split attention's partials, the most any short pass needs
  for (const GpuLayer& layer : w.layers)
    if (layer.kind == LayerKind::full_attention) {
      for (int n = 1; n <= std::min(plan.prefill.split_attention_up_to, plan.prefill.chunk_tokens); ++n)
        attention_bytes = std::max(
            attention_bytes, attention_prefill_scratch_bytes(AttentionPrefillKernel::split,
                                                             attention_params(c, layer.attention, n, 1, nullptr)));
      break;
    }
  for (const GpuLayer& layer : w.layers)  // a batch step's rows' partials
    if (layer.kind == LayerKind::full_attention) {
      attention_bytes = std::max(
          attention_bytes,
          attention_decode_rows_scratch_bytes(attention_params(c, layer.attention, 1, 1, nullptr), kMaxBatchRows));
      break;
    }
  s.attention = attention_bytes;
  s.logits = uint64_t(PrefillPass::kLogitRows) * uint64_t(c.vocab_size) * 4;
  return s;
}

uint64_t PrefillWorkspace::total() const {
  return tokens + h + normed + wide + z + b + a + k + v + mixer_out + xp + moe + deltanet + attention + logits;
}

PrefillPass::PrefillPass(const GpuWeights& w, const KernelPlan& plan) : w_(w), c_(w.config()), plan_(plan) {
  const PrefillWorkspace s = prefill_workspace(w, plan);
  tokens_ = DeviceBuffer(s.tokens);
  h_ = DeviceBuffer(s.h);
  normed_ = DeviceBuffer(s.normed);
  wide_ = DeviceBuffer(s.wide);
  z_ = DeviceBuffer(s.z);
  b_ = DeviceBuffer(s.b);
  a_ = DeviceBuffer(s.a);
  k_ = DeviceBuffer(s.k);
  v_ = DeviceBuffer(s.v);
  mixer_out_ = DeviceBuffer(s.mixer_out);
  if (s.xp > 0) xp_ = DeviceBuffer(s.xp);
  moe_scratch_ = DeviceBuffer(s.moe);
  if (s.deltanet > 0) deltanet_scratch_ = DeviceBuffer(s.deltanet);
  if (s.attention > 0) attention_scratch_ = DeviceBuffer(s.attention);
  logits_ = DeviceBuffer(s.logits);
}

void PrefillPass::run(CudaSequenceState& s, const int32_t* tokens, int T, int first_row, float* host_logits,
                      cudaStream_t stream, HiddenRows hidden) {
  LILY_CHECK(T >= 1 && T <= plan_.prefill.chunk_tokens && first_row >= 0 && first_row <= T && hidden.first_row >= 0 &&
                 hidden.first_row <= T,
             "prefill pass of {} tokens (at most {}), logits from row {}, hidden rows from {}", T,
             plan_.prefill.chunk_tokens, first_row, hidden.first_row);
  phases::mark("embed", stream);
  CUDA_CHECK(cudaMemcpyAsync(tokens_.get(), tokens, size_t(T) * 4, cudaMemcpyHostToDevice, stream));
  pass(s, T, first_row, host_logits, stream, hidden);
}

void PrefillPass::record(CudaSequenceState& s, int T, int first_row, cudaStream_t stream) {
  LILY_CHECK(
      T >= 1 && T <= plan_.prefill.chunk_tokens && first_row >= 0 && first_row <= T && T - first_row <= kLogitRows,
      "a recorded pass of {} tokens (at most {}), logits from row {} (at most {} rows)", T, plan_.prefill.chunk_tokens,
      first_row, kLogitRows);
  pass(s, T, first_row, nullptr, stream, HiddenRows{T, nullptr});
}

void PrefillPass::pass(CudaSequenceState& s, int T, int first_row, float* host_logits, cudaStream_t stream,
                       HiddenRows hidden) {
  stream_ = stream;
  const ProgrammaticLaunches programmatic(T < plan_.prefill.programmatic_below);
  // h = embed[tokens]
  embed_tokens(w_.embed_tokens, tokens_.as<int32_t>(), T, h_.as<float>(), stream);
  layers(&s, T);
  advance_position(s.position(), T, stream);
  if (hidden.first_row < T && hidden.host) normed_rows(hidden.first_row, T, w_.final_norm, hidden.host);
  if (first_row < T) logits(first_row, T, host_logits, w_.final_norm);
  phases::mark("end", stream);
}

void PrefillPass::record_batch(const BatchRows& rows, int N, cudaStream_t stream) {
  LILY_CHECK(N >= 1 && N <= kMaxBatchRows && N <= kLogitRows, "a batch step of {} rows (1 to {})", N, kMaxBatchRows);
  stream_ = stream;
  batch_ = &rows;
  const ProgrammaticLaunches programmatic(N < plan_.prefill.programmatic_below);
  // h[r] = embed[token r]
  embed_tokens(w_.embed_tokens, tokens_.as<int32_t>(), N, h_.as<float>(), stream);
  layers(nullptr, N);
  advance_positions(rows.positions(), N, stream);
  logits(0, N, nullptr, w_.final_norm);
  batch_ = nullptr;
}

void PrefillPass::layers(CudaSequenceState* s, int T) {
  size_t attention_index = 0, deltanet_index = 0;
  for (size_t i = 0; i < w_.layers.size(); ++i) {
    const GpuLayer& layer = w_.layers[i];
    if (layer.kind == LayerKind::full_attention) {
      const KvCache cache = s ? s->attention_cache(attention_index) : KvCache{};
      gated_attention(layer, s ? &cache : nullptr, attention_index++, T);
    } else {
      gated_deltanet(layer, s, deltanet_index++, T);
    }
    sparse_moe(layer, plan_.decode.layers[i], T);
  }
}

// h += gated_attention(RMSNorm(h)): the q/k/v projections, the core, o_proj (cpu::gated_attention)
void PrefillPass::gated_attention(const GpuLayer& layer, const KvCache* cache, size_t index, int T) {
  const GpuAttention& a = layer.attention;
  if (plan_.prefill.dense_rows(T)) {
    // [q, gate], k, v = RMSNorm(h) @ [Wq; Wk; Wv]^T, one launch
    phases::mark("attention.qkv_proj", stream_);
    rms_norm_gemv_rows(a.qkv_proj, h_.as<float>(), T, layer.input_layernorm, c_.rms_norm_eps, qkv_parts(a), stream_);
  } else {
    // x = RMSNorm(h)
    const GemmInput in = normed_input(layer.input_layernorm, T);
    // [q, gate], k, v = x @ Wq^T, x @ Wk^T, x @ Wv^T
    phases::mark("attention.qkv_proj", stream_);
    if (fused_gemm(a.qkv_proj, in)) {  // one launch for the three
      gemm_w4_wgmma(a.qkv_proj, in.xp, qkv_parts(a), T, stream_);
    } else {
      gemm(a.q_proj, in, wide_.as<float>(), T);
      gemm(a.k_proj, in, k_.as<float>(), T);
      gemm(a.v_proj, in, v_.as<float>(), T);
    }
  }
  phases::mark("attention.core", stream_);
  if (batch_) {
    // o[r] = softmax(q[r] K_r^T / 16) V_r * sigmoid(gate[r]) over row r's own cache, k[r] and v[r] appended
    gated_attention_decode_rows(attention_params(c_, a, 1, 1, nullptr), batch_->attention(index), T, wide_.as<float>(),
                                k_.as<float>(), v_.as<float>(), mixer_out_.as<float>(), attention_scratch_.get(),
                                stream_);
  } else {
    // o = softmax_causal(q K^T / 16) V * sigmoid(gate), the T new k and v appended to the cache
    const AttentionParams p = attention_params(c_, a, T, int(cache->capacity), cache->position);
    gated_attention_prefill(plan_.prefill.attention_kernel(T), p, wide_.as<float>(), k_.as<float>(), v_.as<float>(),
                            cache->k, cache->v, mixer_out_.as<float>(), stream_, attention_scratch_.get());
  }
  // h += o @ o_proj^T
  phases::mark("attention.o_proj", stream_);
  output_projection(a.o_proj, T);
}

// h += gated_deltanet(RMSNorm(h)): the input projections, the core, out_proj (cpu::gated_deltanet)
void PrefillPass::gated_deltanet(const GpuLayer& layer, CudaSequenceState* s, size_t index, int T) {
  const GpuDeltaNet& d = layer.deltanet;
  if (plan_.prefill.dense_rows(T)) {
    // qkv, z, b, a = RMSNorm(h) @ [W_qkv; W_z; W_b; W_a]^T, one launch
    phases::mark("deltanet.in_proj", stream_);
    rms_norm_gemv_rows(d.in_proj_all, h_.as<float>(), T, layer.input_layernorm, c_.rms_norm_eps, in_proj_parts(d),
                       stream_);
  } else {
    // x = RMSNorm(h)
    const GemmInput in = normed_input(layer.input_layernorm, T);
    // qkv, z, b, a = x @ W^T
    phases::mark("deltanet.in_proj", stream_);
    if (fused_gemm(d.in_proj_all, in)) {  // one launch for the four
      gemm_w4_wgmma(d.in_proj_all, in.xp, in_proj_parts(d), T, stream_);
    } else {
      gemm(d.in_proj_qkv, in, wide_.as<float>(), T);
      gemm(d.in_proj_z, in, z_.as<float>(), T);
      gemm(d.in_proj_b, in, b_.as<float>(), T);
      gemm(d.in_proj_a, in, a_.as<float>(), T);
    }
  }
  phases::mark("deltanet.core", stream_);
  if (batch_) {
    // y[r] = gated_rms_norm(delta_rule(conv(qkv[r]), b[r], a[r]), z[r]) on row r's own state
    gated_deltanet_decode_rows(deltanet_params(c_, d, 1), batch_->deltanet(index), T, wide_.as<float>(), z_.as<float>(),
                               b_.as<float>(), a_.as<float>(), mixer_out_.as<float>(), stream_);
    phases::mark("deltanet.out_proj", stream_);
    output_projection(d.out_proj, T);
    return;
  }
  // y = gated_rms_norm(delta_rule(conv(qkv), b, a), z); the conv and recurrent state updated
  const DeltaRulePrefill form = plan_.prefill.delta_rule(T);
  // y also in bf16 for a wgmma out_proj: written by the gated norm, no conversion after it
  bf16* y_bf16 = plan_.prefill.wgmma(T) && form != DeltaRulePrefill::rows ? xp_.as<bf16>() : nullptr;
  DeltaNetParams p = deltanet_params(c_, d, T);
  p.kept = s->kept(index);  // a verify's rows' states (the rows form alone keeps them)
  gated_deltanet_prefill(form, p, wide_.as<float>(), z_.as<float>(), b_.as<float>(), a_.as<float>(), s->conv(index),
                         s->ssm(index), mixer_out_.as<float>(), deltanet_scratch_.get(), stream_, y_bf16);
  // h += y @ out_proj^T
  phases::mark("deltanet.out_proj", stream_);
  output_projection(d.out_proj, T, y_bf16);
}

// h += mixer_out @ W^T (out_proj, o_proj); xp: mixer_out in the wgmma GEMM's bf16 already
void PrefillPass::output_projection(const QMatrix& W, int T, const bf16* xp) {
  if (plan_.prefill.dense_rows(T)) gemv_rows_accumulate(W, mixer_out_.as<float>(), T, h_.as<float>(), stream_);
  else if (xp) gemm_accumulate(W, {mixer_out_.as<float>(), xp}, h_.as<float>(), T);
  else gemm_accumulate(W, gemm_input(mixer_out_.as<float>(), T, W.cols), h_.as<float>(), T);
}

// RMSNorm(h; gain) as the input of the products: in fp32 (normed_) for gemm_q4, or straight to
// bf16 in the wgmma GEMM's K order (xp_) with no fp32 copy.
PrefillPass::GemmInput PrefillPass::normed_input(const float* gain, int T) {
  phases::mark("norm", stream_);
  if (plan_.prefill.wgmma(T)) {
    rms_norm_bf16_permuted(h_.as<float>(), gain, c_.rms_norm_eps, T, c_.hidden_size, nullptr, xp_.as<bf16>(), stream_);
    return {nullptr, xp_.as<bf16>()};
  }
  float* x = normed_.as<float>();
  rms_norm(h_.as<float>(), gain, T, c_.hidden_size, c_.rms_norm_eps, x, stream_);
  return {x, nullptr};
}

PrefillPass::GemmInput PrefillPass::gemm_input(const float* x, int T, int K) {
  if (!plan_.prefill.wgmma(T)) return {x, nullptr};
  x_to_bf16_permuted(x, xp_.as<bf16>(), T, K, stream_);
  return {x, xp_.as<bf16>()};
}

// Where the rows of the fused [q; k; v] go: q and gate to wide_, k to k_, v to v_.
RowsOutput PrefillPass::qkv_parts(const GpuAttention& a) {
  RowsOutput y;
  y.then(wide_.as<float>(), 0, a.q_proj.rows)
      .then(k_.as<float>(), a.q_proj.rows, a.k_proj.rows)
      .then(v_.as<float>(), a.q_proj.rows + a.k_proj.rows, a.v_proj.rows);
  return y;
}

// Where the rows of the fused [qkv; z; b; a] go: qkv to wide_, z, b, a to their buffers.
RowsOutput PrefillPass::in_proj_parts(const GpuDeltaNet& d) {
  const int z0 = d.in_proj_qkv.rows, b0 = z0 + d.in_proj_z.rows, a0 = b0 + d.in_proj_b.rows;
  RowsOutput y;
  y.then(wide_.as<float>(), 0, d.in_proj_qkv.rows)
      .then(z_.as<float>(), z0, d.in_proj_z.rows)
      .then(b_.as<float>(), b0, d.in_proj_b.rows)
      .then(a_.as<float>(), a0, d.in_proj_a.rows);
  return y;
}

// Whether the fused matrix's product runs as one wgmma launch (its parts share one quantization:
// GpuWeights fused them, and the wgmma GEMM takes it).
bool PrefillPass::fused_gemm(const QMatrix& fused, const GemmInput& in) const {
  return in.xp && fused.rows > 0 && gemm_w4_wgmma_supports(fused);
}

void PrefillPass::gemm(const QMatrix& W, const GemmInput& in, float* y, int T) {
  if (in.xp) gemm_w4_wgmma(W, in.xp, y, T, stream_);
  else gemm_q4(W, in.x, y, T, stream_, split_.get());
}

void PrefillPass::gemm_accumulate(const QMatrix& W, const GemmInput& in, float* y, int T) {
  if (in.xp) gemm_w4_wgmma_accumulate(W, in.xp, y, T, stream_);
  else gemm_q4_accumulate(W, in.x, y, T, stream_, split_.get());
}

// h += routed experts + gated shared expert of x = RMSNorm(h): routing on the GPU, grouped GEMMs
void PrefillPass::sparse_moe(const GpuLayer& layer, const DecodeLayerPlan& plan, int T) {
  float* x = normed_.as<float>();
  const int k = c_.num_experts_per_tok;
  if (plan_.prefill.moe_slots(T)) {
    // x = RMSNorm(h); the same sum on the decode MoE kernels, the T rows a grid dimension
    phases::mark("moe.slots", stream_);
    moe_slots_accumulate(plan.gate_up, layer.moe, h_.as<float>(), layer.post_attention_layernorm, c_.rms_norm_eps, T, k,
                         moe_scratch_.get(), x, stream_);
    return;
  }
  if (plan_.prefill.moe_experts(T) == MoeExpertKernels::rows) {
    // x = RMSNorm(h); h += sum_s w_s * expert_s(x) + sigmoid(x . w_sg) * shared(x), the norm in the route
    moe_rows_accumulate(layer.moe, h_.as<float>(), layer.post_attention_layernorm, c_.rms_norm_eps, T, k,
                        moe_scratch_.get(), x, stream_);
    return;
  }
  // x = RMSNorm(h) (the router reads it in fp32), and in bf16 for the wgmma experts
  phases::mark("norm", stream_);
  const MoeExpertKernels kernels = plan_.prefill.moe_experts(T);
  const bf16* xp = nullptr;
  if (kernels == MoeExpertKernels::wgmma && xp_.get()) {
    rms_norm_bf16_permuted(h_.as<float>(), layer.post_attention_layernorm, c_.rms_norm_eps, T, c_.hidden_size, x,
                           xp_.as<bf16>(), stream_);
    xp = xp_.as<bf16>();
  } else {
    rms_norm(h_.as<float>(), layer.post_attention_layernorm, T, c_.hidden_size, c_.rms_norm_eps, x, stream_);
  }
  // h += sum_s w_s * expert_s(x) + sigmoid(x . w_sg) * shared(x)
  moe_grouped_accumulate(layer.moe, x, T, k, moe_scratch_.get(), h_.as<float>(), stream_, 0, split_.get(), kernels, xp);
}

// RMSNorm(h; gain) of rows [first_row, T) to the host ([T - first_row, H]; forward_hidden's rows),
// through normed_.
void PrefillPass::normed_rows(int first_row, int T, const float* gain, float* host) {
  const int H = c_.hidden_size, rows = T - first_row;
  float* x = normed_.as<float>();
  rms_norm(h_.as<float>() + size_t(first_row) * H, gain, rows, H, c_.rms_norm_eps, x, stream_);
  CUDA_CHECK(cudaMemcpyAsync(host, x, size_t(rows) * H * 4, cudaMemcpyDeviceToHost, stream_));
}

// logits = RMSNorm(h; gain) @ lm_head^T for rows [first_row, T), to the host (host_logits null:
// left in logits_, at most kLogitRows rows); gain: the final norm's, or the MTP head's.
void PrefillPass::logits(int first_row, int T, float* host_logits, const float* gain) {
  const int H = c_.hidden_size, rows = T - first_row;
  const size_t V = size_t(c_.vocab_size);
  phases::mark("logits", stream_);
  const float* h = h_.as<float>() + size_t(first_row) * H;
  float* logits = logits_.as<float>();
  if (rows == 1) {  // the decode step's lm_head kernel
    const PlannedGemv& lm_head = plan_.decode.lm_head;
    rms_norm_gemv(lm_head.kernel, lm_head.W, h, gain, c_.rms_norm_eps, logits, stream_);
    if (host_logits) CUDA_CHECK(cudaMemcpyAsync(host_logits, logits, V * 4, cudaMemcpyDeviceToHost, stream_));
    return;
  }
  if (rows <= plan_.prefill.logit_rows_up_to) {  // the weights read once for the rows
    rms_norm_gemv_rows(w_.lm_head, h, rows, gain, c_.rms_norm_eps, RowsOutput::whole(logits, int(V)), stream_);
    if (host_logits)
      CUDA_CHECK(cudaMemcpyAsync(host_logits, logits, size_t(rows) * V * 4, cudaMemcpyDeviceToHost, stream_));
    return;
  }
  float* x = normed_.as<float>();
  rms_norm(h, gain, rows, H, c_.rms_norm_eps, x, stream_);
  for (int r0 = 0; r0 < rows; r0 += kLogitRows) {
    const int n = std::min(kLogitRows, rows - r0);
    gemm_q4(w_.lm_head, x + size_t(r0) * H, logits, n, stream_, split_.get());
    if (host_logits)
      CUDA_CHECK(
          cudaMemcpyAsync(host_logits + size_t(r0) * V, logits, size_t(n) * V * 4, cudaMemcpyDeviceToHost, stream_));
  }
}

}  // namespace lily::cuda
