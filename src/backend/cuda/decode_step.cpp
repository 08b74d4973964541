// decode_step.cpp: the model for one token (spec §2), as backend/cpu/forward.cpp computes it:
//
//   h = embed[token]
//   per layer:  DeltaNet:  [qkv | z | b | a] = RMSNorm(h) @ W_in^T      rms_norm_gemv (one launch)
//                          y = gated_deltanet(qkv, z, b, a)             gated_deltanet_decode
//                          h += y @ out_proj^T                          gemv_accumulate
//               attention: [q,gate | k | v] = RMSNorm(h) @ W_qkv^T      rms_norm_gemv
//                          o = gated_attention(q, k, v; KV cache)       gated_attention_decode (2)
//                          h += o @ o_proj^T                            gemv_accumulate
//               h += experts(RMSNorm(h)) + shared(RMSNorm(h))           moe_route, moe_gate_up, moe_down
//   logits = RMSNorm(h) @ lm_head^T                                     rms_norm_gemv
// Every norm is folded into the launch that reads it, every residual add into the launch that
// writes it. Which kernel each projection runs: the plan (kernel_plan.h). Launches: 254 for the
// 40-layer model with the argmax of the graph (DecodePlan::launches).
#include "backend/cuda/decode_step.h"

#include <algorithm>

#include "backend/cuda/attention/attention_decode.h"
#include "backend/cuda/common/device_info.h"
#include "backend/cuda/common/norm.h"
#include "backend/cuda/deltanet/deltanet_decode.h"
#include "backend/cuda/gemv/gemv.h"
#include "backend/cuda/layer_params.h"
#include "backend/cuda/moe/moe_decode.h"

namespace lily::cuda {

namespace {

// Rows of the largest input projection (fused or its parts laid end to end).
uint64_t input_rows(const DecodePlan& plan) {
  uint64_t rows = 0;
  for (const DecodeLayerPlan& l : plan.layers) {
    uint64_t n = 0;
    for (const PlannedGemv& g : l.input) n += uint64_t(g.W.rows);
    rows = std::max(rows, n);
  }
  return rows;
}

// Enough for any sequence: the split count stops growing at a few thousand rows of capacity.
uint64_t attention_scratch_bytes(const ModelConfig& c) {
  AttentionParams p;
  p.num_heads = c.num_attention_heads, p.num_kv_heads = c.num_key_value_heads, p.capacity = 1 << 22;
  return attention_decode_scratch_bytes(p);
}

}  // namespace

uint64_t decode_step_workspace_bytes(const ModelConfig& c, const DecodePlan& plan) {
  const uint64_t H = uint64_t(c.hidden_size), V = uint64_t(c.vocab_size), slots = uint64_t(c.num_experts_per_tok) + 1;
  const uint64_t step = 4 + H * 4 + input_rows(plan) * 4 +
                        std::max<uint64_t>(c.linear_value_dim(), c.attention_q_width()) * 4 + H * 4 +
                        uint64_t(c.num_experts) * 4 + 4 + slots * uint64_t(c.moe_intermediate_size) * 4 + V * 4 +
                        attention_scratch_bytes(c);
  return step + 4 * V * 4 + (uint64_t(1) << 20);  // the graph's rows of V and its small buffers
}

const char* part_name(DecodePart part) {
  switch (part) {
    case DecodePart::embed: return "embed";
    case DecodePart::in_proj: return "in_proj";
    case DecodePart::mixer: return "mixer";
    case DecodePart::out_proj: return "out_proj";
    case DecodePart::route: return "route";
    case DecodePart::gate_up: return "gate_up";
    case DecodePart::down: return "down";
    case DecodePart::advance: return "advance";
    case DecodePart::lm_head: return "lm_head";
  }
  return "?";
}

DecodeStep::DecodeStep(const GpuWeights& w, const DecodePlan& plan) : w_(w), c_(w.config()), plan_(plan) {
  const uint64_t H = uint64_t(c_.hidden_size), slots = uint64_t(c_.num_experts_per_tok) + 1;
  token_ = DeviceBuffer(4);
  h_ = DeviceBuffer(H * 4);
  proj_ = DeviceBuffer(input_rows(plan) * 4);
  mixer_out_ = DeviceBuffer(std::max<uint64_t>(c_.linear_value_dim(), c_.attention_q_width()) * 4);
  x_ = DeviceBuffer(H * 4);
  router_logits_ = DeviceBuffer(uint64_t(c_.num_experts) * 4);
  shared_weight_ = DeviceBuffer(4);
  act_ = DeviceBuffer(slots * uint64_t(c_.moe_intermediate_size) * 4);
  logits_ = DeviceBuffer(uint64_t(c_.vocab_size) * 4);
  attention_scratch_ = DeviceBuffer(attention_scratch_bytes(c_));
  attention_scratch_.zero();
  CUDA_CHECK(cudaDeviceSynchronize());
}

DecodeStep::~DecodeStep() = default;

void DecodeStep::record(CudaSequenceState& s, cudaStream_t stream) {
  stream_ = stream;
  mark(DecodePart::embed);
  // h = embed[token]
  embed_tokens(w_.embed_tokens, token(), 1, h_.as<float>(), stream);
  size_t attention_index = 0, deltanet_index = 0;
  for (size_t i = 0; i < w_.layers.size(); ++i) {
    const GpuLayer& layer = w_.layers[i];
    if (layer.kind == LayerKind::full_attention) gated_attention(layer, plan_.layers[i], s, attention_index++);
    else gated_deltanet(layer, plan_.layers[i], s, deltanet_index++);
    sparse_moe(layer, plan_.layers[i]);
  }
  mark(DecodePart::advance);
  advance_position(s.position(), 1, stream);
  mark(DecodePart::lm_head);
  // logits = RMSNorm(h) @ lm_head^T
  rms_norm_gemv(plan_.lm_head.kernel, plan_.lm_head.W, h_.as<float>(), w_.final_norm, c_.rms_norm_eps, logits(),
                stream);
  mark_end();
}

// out = RMSNorm(h) @ [W_0; W_1; ...]^T: one launch over the fused matrix, or one per part.
void DecodeStep::input_projections(const DecodeLayerPlan& plan, const float* input_norm) {
  float* out = proj_.as<float>();
  for (const PlannedGemv& g : plan.input) {
    rms_norm_gemv(g.kernel, g.W, h_.as<float>(), input_norm, c_.rms_norm_eps, out, stream_);
    out += g.W.rows;
  }
}

// h += gated_attention(RMSNorm(h)): the q/k/v projections, the core, o_proj (cpu::gated_attention)
void DecodeStep::gated_attention(const GpuLayer& layer, const DecodeLayerPlan& plan, CudaSequenceState& s,
                                 size_t index) {
  const GpuAttention& a = layer.attention;
  mark(DecodePart::in_proj);
  // [q, gate | k | v] = RMSNorm(h) @ [Wq; Wk; Wv]^T
  input_projections(plan, layer.input_layernorm);
  const float* qg = proj_.as<float>();
  const float* k = qg + a.q_proj.rows;
  const float* v = k + a.k_proj.rows;
  mark(DecodePart::mixer);
  // o = softmax(q K^T / 16) V * sigmoid(gate), this token's k and v appended to the cache
  const AttentionParams p = attention_params(c_, a, 1, int(s.capacity()), s.position());
  gated_attention_decode(p, qg, k, v, s.k_cache(index), s.v_cache(index), mixer_out_.as<float>(),
                         attention_scratch_.get(), stream_);
  mark(DecodePart::out_proj);
  // h += o @ o_proj^T
  gemv_accumulate(plan.output.kernel, plan.output.W, mixer_out_.as<float>(), h_.as<float>(), stream_);
}

// h += gated_deltanet(RMSNorm(h)): the input projections, the core, out_proj (cpu::gated_deltanet)
void DecodeStep::gated_deltanet(const GpuLayer& layer, const DecodeLayerPlan& plan, CudaSequenceState& s,
                                size_t index) {
  const GpuDeltaNet& d = layer.deltanet;
  mark(DecodePart::in_proj);
  // [qkv | z | b | a] = RMSNorm(h) @ [W_qkv; W_z; W_b; W_a]^T
  input_projections(plan, layer.input_layernorm);
  const float* qkv = proj_.as<float>();
  const float* z = qkv + d.in_proj_qkv.rows;
  const float* b = z + d.in_proj_z.rows;
  const float* a = b + d.in_proj_b.rows;
  mark(DecodePart::mixer);
  // y = gated_rms_norm(delta_rule(conv(qkv), b, a), z); the conv and recurrent state updated
  gated_deltanet_decode(deltanet_params(c_, d, 1), qkv, z, b, a, s.conv(index), s.ssm(index), mixer_out_.as<float>(),
                        stream_);
  mark(DecodePart::out_proj);
  // h += y @ out_proj^T
  gemv_accumulate(plan.output.kernel, plan.output.W, mixer_out_.as<float>(), h_.as<float>(), stream_);
}

// h += sum_s w_s * expert_s(x) + sigmoid(x . w_sg) * shared(x),  x = RMSNorm(h)
// (moe_decode.h: which launch reads what, and when)
void DecodeStep::sparse_moe(const GpuLayer& layer, const DecodeLayerPlan& plan) {
  MoeDecodeArgs args;
  args.w = &layer.moe;
  args.gain = layer.post_attention_layernorm;
  args.eps = c_.rms_norm_eps;
  args.k = c_.num_experts_per_tok;
  args.buffers = {h_.as<float>(), x_.as<float>(), router_logits_.as<float>(), shared_weight_.as<float>(),
                  act_.as<float>()};
  mark(DecodePart::route);
  // x = RMSNorm(h); router logits; the shared expert's gate
  moe_route(args, stream_);
  mark(DecodePart::gate_up);
  // act_s = silu(G_s x) * (U_s x) for the top-k experts and the shared one
  moe_gate_up(plan.gate_up, args, stream_);
  mark(DecodePart::down);
  // h += sum_s w_s * D_s act_s
  moe_down(args, stream_);
}

}  // namespace lily::cuda
