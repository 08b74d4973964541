// kernel_plan.cpp: see kernel_plan.h.
#include "backend/cuda/kernel_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <map>

#include "backend/cuda/attention/attention_decode.h"
#include "backend/cuda/gemm/gemm_q4.h"
#include "backend/cuda/gemm/gemm_w4_wgmma.h"
#include "backend/cuda/layer_params.h"
#include "backend/cuda/moe/moe_route_rows.h"
#include "base/error.h"

namespace lily::cuda {

namespace {

std::string format_of(const QMatrix& W) { return fmt::format("[{}, {}] q{}", W.rows, W.cols, W.bits); }

// y = RMSNorm(x) @ W^T: the prefetch kernel where it fits, else the tensor cores, else FP32.
PlannedGemv plan_rms_norm_gemv(const QMatrix& W, const DeviceProfile& device, const char* what) {
  for (GemvKernel k : {GemvKernel::prefetch, GemvKernel::mma, GemvKernel::fp32})
    if (gemv_supports(k, W, false, device)) return {W, k};
  fail("{}: no decode kernel takes {} group {} (4 or 8 bits, group 64, at most 4096 columns)", what, format_of(W),
       W.group_size);
}

// y += x @ W^T: the tensor cores, else FP32.
PlannedGemv plan_gemv_accumulate(const QMatrix& W, const DeviceProfile& device, const char* what) {
  for (GemvKernel k : {GemvKernel::mma, GemvKernel::fp32})
    if (gemv_supports(k, W, true, device)) return {W, k};
  fail("{}: no decode kernel takes {} group {} (4 or 8 bits, group 64, at most 4096 columns)", what, format_of(W),
       W.group_size);
}

void check_prefill_projection(const QMatrix& W, const char* what) {
  LILY_CHECK(gemm_q4_supports(W), "{}: the prefill GEMM does not take {} group {}", what, format_of(W), W.group_size);
}

// The input projections: the fused matrix when there is one (rows > 0), else its parts.
std::vector<PlannedGemv> plan_inputs(const QMatrix& fused, std::initializer_list<const QMatrix*> parts,
                                     const DeviceProfile& device, const char* what) {
  std::vector<PlannedGemv> plan;
  if (fused.rows > 0) {
    plan.push_back(plan_rms_norm_gemv(fused, device, what));
  } else {
    for (const QMatrix* part : parts) plan.push_back(plan_rms_norm_gemv(*part, device, what));
  }
  for (const QMatrix* part : parts) check_prefill_projection(*part, what);
  return plan;
}

DecodeLayerPlan plan_layer(const ModelConfig& c, const GpuLayer& layer, const DeviceProfile& device) {
  DecodeLayerPlan plan;
  plan.kind = layer.kind;
  if (layer.kind == LayerKind::full_attention) {
    const GpuAttention& a = layer.attention;
    check_attention_params(attention_params(c, a, 1, 1, nullptr));
    plan.input = plan_inputs(a.qkv_proj, {&a.q_proj, &a.k_proj, &a.v_proj}, device, "attention q/k/v projections");
    plan.output = plan_gemv_accumulate(a.o_proj, device, "o_proj");
    check_prefill_projection(a.o_proj, "o_proj");
  } else {
    const GpuDeltaNet& d = layer.deltanet;
    check_deltanet_params(deltanet_params(c, d, 1));
    plan.input = plan_inputs(d.in_proj_all, {&d.in_proj_qkv, &d.in_proj_z, &d.in_proj_b, &d.in_proj_a}, device,
                             "DeltaNet input projections");
    plan.output = plan_gemv_accumulate(d.out_proj, device, "out_proj");
    check_prefill_projection(d.out_proj, "out_proj");
  }
  const int k = c.num_experts_per_tok;
  // staged: bulk copies completing on an mbarrier (Hopper)
  plan.gate_up = device.hopper() && moe_decode_supports(layer.moe, k, GateUpKernel::staged) ? GateUpKernel::staged
                                                                                            : GateUpKernel::mma;
  const QMatrix& G = layer.moe.experts_gate;
  LILY_CHECK(moe_decode_supports(layer.moe, k, plan.gate_up),
             "the MoE block ([{}, {}, {}] q{} experts, top-{}, router {}) has no decode kernel: the experts must be "
             "4-bit group 64 with H <= 4096 and I multiples of 64, E <= 256, k <= 8",
             G.batch, G.rows, G.cols, G.bits, k, format_of(layer.moe.router));
  check_prefill_projection(layer.moe.router, "router");
  check_prefill_projection(layer.moe.shared_expert_gate, "shared_expert_gate");
  return plan;
}

// The layers a prefill pass runs: the model's, and the MTP head's where there is one.
std::vector<const GpuLayer*> pass_layers(const GpuWeights& w) {
  std::vector<const GpuLayer*> layers;
  for (const GpuLayer& layer : w.layers) layers.push_back(&layer);
  if (w.mtp) layers.push_back(&w.mtp->layer);
  return layers;
}

std::string layer_line(const DecodeLayerPlan& p) {
  std::string inputs;
  for (const PlannedGemv& g : p.input)
    inputs += fmt::format("{}{} {}", inputs.empty() ? "" : " + ", kernel_name(g.kernel), format_of(g.W));
  const bool attention = p.kind == LayerKind::full_attention;
  return fmt::format("    input projections  {}\n    core               {}\n    {:<18} {} {}\n"
                     "    MoE                moe_route_norm, {}, moe_down_mma\n",
                     inputs, attention ? "attention_split + attention_combine" : "deltanet_decode",
                     attention ? "o_proj" : "out_proj", kernel_name(p.output.kernel), format_of(p.output.W),
                     kernel_name(p.gate_up));
}

// Whether every layer's attention / DeltaNet projections are ones gemv_rows takes: the fused
// input matrix (RMSNorm form) and the output projection (accumulating form).
bool dense_rows_take(const GpuWeights& w) {
  if (w.mtp && !(gemv_rows_supports(w.mtp->fc_embedding, false) && gemv_rows_supports(w.mtp->fc_hidden, false)))
    return false;
  for (const GpuLayer* l : pass_layers(w)) {
    const GpuLayer& layer = *l;
    const bool attention = layer.kind == LayerKind::full_attention;
    const QMatrix& input = attention ? layer.attention.qkv_proj : layer.deltanet.in_proj_all;
    const QMatrix& output = attention ? layer.attention.o_proj : layer.deltanet.out_proj;
    if (input.rows == 0 || !gemv_rows_supports(input, true) || !gemv_rows_supports(output, false)) return false;
  }
  return true;
}

// Whether every projection a prefill pass runs on a GEMM (the attention and DeltaNet inputs and
// outputs, the routed and shared experts) is one the wgmma GEMM takes.
bool wgmma_takes(const GpuWeights& w) {
  if (w.mtp && !(gemm_w4_wgmma_supports(w.mtp->fc_embedding) && gemm_w4_wgmma_supports(w.mtp->fc_hidden))) return false;
  for (const GpuLayer* l : pass_layers(w)) {
    const GpuLayer& layer = *l;
    std::vector<const QMatrix*> m;
    if (layer.kind == LayerKind::full_attention) {
      const GpuAttention& a = layer.attention;
      m = {&a.q_proj, &a.k_proj, &a.v_proj, &a.o_proj};
    } else {
      const GpuDeltaNet& d = layer.deltanet;
      m = {&d.in_proj_qkv, &d.in_proj_z, &d.in_proj_b, &d.in_proj_a, &d.out_proj};
    }
    const GpuMoe& e = layer.moe;
    m.insert(m.end(), {&e.experts_gate, &e.experts_up, &e.experts_down, &e.shared_gate, &e.shared_up});
    for (const QMatrix* W : m)
      if (!gemm_w4_wgmma_supports(*W)) return false;
  }
  return true;
}

// A profile without the Hopper kernels (device_profile.h): what needs clusters, bulk copies or PDL
// is off (prefetch, staged gate/up and wgmma were left out above), and the longer forms that do not
// fit its shared memory give way to the shorter ones. Returns the parts with no portable kernel.
std::vector<std::string> plan_portable(KernelPlan& plan, const DeviceProfile& device) {
  PrefillPlan& prefill = plan.prefill;
  plan.decode.pdl = false;
  prefill.programmatic_below = 0;
  prefill.deltanet_rows_up_to = 0;  // deltanet_decode: clusters
  prefill.batch_rows_limit = 0;     //   and its rows form, the batch step's DeltaNet core
  prefill.batch_rows_up_to = 0;
  if (delta_rule_chunked_shared_bytes() > size_t(device.shared_per_block))
    prefill.chunked_delta_rule_from = PrefillPlan::kNever;  // the token loop at every length
  std::vector<std::string> missing;
  const size_t shared = size_t(device.shared_per_block);
  if (attention_decode_shared_bytes(shared) > shared)
    missing.push_back(fmt::format("the decode attention core (attention_split asks for {} bytes of shared memory a "
                                  "block, the profile allows {})",
                                  attention_decode_shared_bytes(shared), shared));
  missing.push_back("the decode DeltaNet core (deltanet_decode needs thread-block clusters, sm_90)");
  return missing;
}

}  // namespace

int DecodePlan::launches() const {
  int n = 1;  // embed
  for (const DecodeLayerPlan& l : layers)
    n += int(l.input.size()) + (l.kind == LayerKind::full_attention ? 2 : 1) + 1 + 3;  // input, core, output, MoE
  return n + 3;  // advance the position, lm_head, argmax
}

KernelPlan plan_kernels(const GpuWeights& w, const DeviceProfile& device, int prefill_chunk_tokens) {
  std::vector<std::string> gaps;
  KernelPlan plan = plan_kernels_with_gaps(w, device, prefill_chunk_tokens, gaps);
  if (!gaps.empty())
    fail("device profile {}: no portable kernel yet for {}; lily runs on the CPU there (--backend cpu), or on the "
         "Hopper path of an H100 / H200 (docs/gpus.md)",
         device.describe(), fmt::join(gaps, " and "));
  return plan;
}

KernelPlan plan_kernels_with_gaps(const GpuWeights& w, const DeviceProfile& device, int prefill_chunk_tokens,
                                  std::vector<std::string>& gaps) {
  const ModelConfig& c = w.config();
  LILY_CHECK(
      prefill_chunk_tokens >= 64 && prefill_chunk_tokens <= kMaxPrefillChunkTokens && prefill_chunk_tokens % 64 == 0,
      "prefill pass of {} tokens: a multiple of 64 in [64, {}]", prefill_chunk_tokens, kMaxPrefillChunkTokens);
  LILY_CHECK(w.layers.size() == c.layer_types.size(), "{} layers of weights for {} in the config", w.layers.size(),
             c.layer_types.size());
  KernelPlan plan;
  plan.device = device;
  for (size_t i = 0; i < w.layers.size(); ++i)
    plan.decode.layers.push_back(
        with_context(fmt::format("layer {}", i), [&] { return plan_layer(c, w.layers[i], device); }));
  plan.decode.lm_head = plan_rms_norm_gemv(w.lm_head, device, "lm_head");
  check_prefill_projection(w.lm_head, "lm_head");
  if (w.mtp) {
    LILY_CHECK(w.mtp->layer.kind == LayerKind::full_attention, "the MTP head's layer must be a full-attention layer");
    plan.decode.mtp_layer = with_context("the MTP head", [&] { return plan_layer(c, w.mtp->layer, device); });
    check_prefill_projection(w.mtp->fc_embedding, "mtp.fc");
    check_prefill_projection(w.mtp->fc_hidden, "mtp.fc");
    plan.decode.mtp_limit = 1;
  }
  const std::vector<const GpuLayer*> layers = pass_layers(w);
  plan.prefill.chunk_tokens = prefill_chunk_tokens;
  plan.prefill.dense_rows_up_to = dense_rows_take(w) ? kGemvRowsMaxT : 0;
  const bool moe_rows = std::all_of(layers.begin(), layers.end(), [](const GpuLayer* layer) {
    return moe_rows_supports(layer->moe) && moe_route_rows_supports(layer->moe);
  });
  plan.prefill.moe_rows_up_to = moe_rows ? kGemvRowsMaxT : 0;
  const bool moe_slots = std::all_of(layers.begin(), layers.end(), [&](const GpuLayer* layer) {
    return moe_route_rows_supports(layer->moe);  // gate/up and down: the decode step's, checked above
  });
  plan.prefill.moe_slots_limit = moe_slots ? kMoeSlotsMaxRows : 0;
  // Measured on the H100 (docs/perf-log/2026-12.md, session 25): passes of 2 and 4 tokens at
  // depth 4K 2.996 / 4.159 ms with both against 3.546 / 4.444 without; at 8 tokens the slots lose
  // (6.77 against 6.55 ms on the graphs alone), so they stop at 4.
  plan.prefill.moe_slots_up_to = std::min(kMoeSlotsDefaultRows, plan.prefill.moe_slots_limit);
  plan.prefill.pass_graphs_up_to = kMaxPassGraphTokens;
  plan.prefill.logit_rows_up_to = gemv_rows_supports(w.lm_head, true) ? kGemvRowsMaxT : 0;
  if (device.hopper() && wgmma_takes(w)) {
    plan.prefill.wgmma_from = 256;  // measured: below, out_proj [2048, 4096] is slower than on gemm_q4's split K
    plan.prefill.wgmma_experts_from = 512;
  }
  AttentionParams attention;
  attention.num_heads = c.num_attention_heads, attention.num_kv_heads = c.num_key_value_heads;
  const bool flash_fits = flash_prefill_shared_bytes() <= size_t(device.shared_per_block);
  plan.prefill.attention = flash_fits && attention_prefill_supports(AttentionPrefillKernel::flash, attention)
                               ? AttentionPrefillKernel::flash
                               : AttentionPrefillKernel::simple;
  gaps.clear();
  if (!device.hopper()) gaps = plan_portable(plan, device);
  return plan;
}

namespace {

// The settings edit_plan may change: each one's setter and the most it may be (what the weights
// allow).
struct PlanField {
  const char* name;
  void (*set)(KernelPlan&, int);
  int (*limit)(const KernelPlan&);
};

constexpr int kAny = PrefillPlan::kNever;

constexpr PlanField kPlanFields[] = {
    {"chain", [](KernelPlan& p, int v) { p.decode.chain = v != 0; }, [](const KernelPlan&) { return 1; }},
    {"mtp", [](KernelPlan& p, int v) { p.decode.mtp = v != 0; },
     [](const KernelPlan& p) { return p.decode.mtp_limit; }},
    {"decode_steps_below", [](KernelPlan& p, int v) { p.prefill.decode_steps_below = v; },
     [](const KernelPlan&) { return kAny; }},
    {"programmatic_below", [](KernelPlan& p, int v) { p.prefill.programmatic_below = v; },
     [](const KernelPlan&) { return kAny; }},
    {"chunked_delta_rule_from", [](KernelPlan& p, int v) { p.prefill.chunked_delta_rule_from = v; },
     [](const KernelPlan&) { return kAny; }},
    {"moe_slots_up_to", [](KernelPlan& p, int v) { p.prefill.moe_slots_up_to = v; },
     [](const KernelPlan& p) { return p.prefill.moe_slots_limit; }},
    {"pass_graphs_up_to", [](KernelPlan& p, int v) { p.prefill.pass_graphs_up_to = v; },
     [](const KernelPlan& p) { return p.prefill.pass_graphs_limit; }},
    {"batch_rows_up_to", [](KernelPlan& p, int v) { p.prefill.batch_rows_up_to = v; },
     [](const KernelPlan& p) { return p.prefill.batch_rows_limit; }},
    {"split_attention_up_to", [](KernelPlan& p, int v) { p.prefill.split_attention_up_to = v; },
     [](const KernelPlan&) { return kAny; }},
};

}  // namespace

void edit_plan(KernelPlan& plan, const std::string& edit) {
  const size_t eq = edit.find('=');
  LILY_CHECK(eq != std::string::npos, "kernel plan edit '{}': NAME=VALUE", edit);
  const std::string name = edit.substr(0, eq), text = edit.substr(eq + 1);
  char* end = nullptr;
  const long value = std::strtol(text.c_str(), &end, 10);
  LILY_CHECK(!text.empty() && *end == '\0' && value >= 0 && value <= PrefillPlan::kNever,
             "kernel plan edit '{}': the value must be a whole number >= 0", edit);
  for (const PlanField& f : kPlanFields) {
    if (name != f.name) continue;
    LILY_CHECK(value <= f.limit(plan), "kernel plan edit '{}': at most {} (what these weights allow)", edit,
               f.limit(plan));
    f.set(plan, int(value));
    return;
  }
  std::string names;
  for (const PlanField& f : kPlanFields) names += fmt::format("{}{}", names.empty() ? "" : ", ", f.name);
  fail("kernel plan edit '{}': no such threshold (the ones that can be set: {})", edit, names);
}

std::string KernelPlan::describe() const {
  // Layers with the same kernels are listed once, with their indices.
  std::vector<std::string> kinds;                        // in order of first appearance
  std::map<std::string, std::vector<size_t>> layers_of;  // kernels -> layers
  for (size_t i = 0; i < decode.layers.size(); ++i) {
    const DecodeLayerPlan& l = decode.layers[i];
    const std::string text = fmt::format("{}\n{}", l.kind == LayerKind::full_attention ? "attention" : "DeltaNet",
                                         layer_line(l));
    if (!layers_of.count(text)) kinds.push_back(text);
    layers_of[text].push_back(i);
  }
  std::string out;
  out = fmt::format("device profile {}\ndecode step ({} launches in one graph{}):\n  embed_tokens\n", device.describe(),
                    decode.launches(), decode.pdl ? "" : ", no PDL");
  for (const std::string& text : kinds) {
    const size_t newline = text.find('\n');
    out += fmt::format("  {} layers {}:\n{}", text.substr(0, newline), fmt::join(layers_of[text], ","),
                       text.substr(newline + 1));
  }
  out += fmt::format("  advance_position, lm_head {} {}, argmax\n", kernel_name(decode.lm_head.kernel),
                     format_of(decode.lm_head.W));
  out += decode.chain ? "  chains: each step's token chosen on the GPU (top_candidates, choose_token)\n"
                      : "  chains: off (each step's candidates to the host)\n";
  if (decode.mtp_limit > 0)
    out += decode.mtp ? "MTP head: prefill passes over its layer (fc halves, then the pass's kernels)\n"
                      : "MTP head: off (not yet run on a GPU; LILY_KERNEL_PLAN=mtp=1)\n";
  out += fmt::format("prefill pass ({} to {} tokens; fewer run as decode steps; PDL below {}; graphs up to {}): "
                     "rms_norm + {} projections "
                     "(gemv_rows up to {} tokens, experts up to {}); attention {} up to {} tokens, "
                     "else {}; DeltaNet {} up to {} "
                     "tokens, {} below {} "
                     "tokens, else {}; MoE "
                     "gemm_exact router, moe_topk, "
                     "moe_plan, "
                     "grouped {} experts, moe_combine (up to {} tokens the decode MoE kernels, rows a grid dimension); "
                     "the last row's logits on the decode lm_head kernel, up to {} rows "
                     "on gemv_rows; batch steps of up to {} sequences as one graph\n",
                     prefill.decode_steps_below, prefill.chunk_tokens, prefill.programmatic_below,
                     prefill.pass_graphs_up_to,
                     prefill.wgmma_from < PrefillPlan::kNever ? "gemm_w4_wgmma" : "gemm_q4 (split K on small grids)",
                     prefill.dense_rows_up_to, prefill.moe_rows_up_to, kernel_name(AttentionPrefillKernel::split),
                     prefill.split_attention_up_to, kernel_name(prefill.attention), kernel_name(DeltaRulePrefill::rows),
                     prefill.deltanet_rows_up_to, kernel_name(DeltaRulePrefill::recurrent),
                     prefill.chunked_delta_rule_from, kernel_name(DeltaRulePrefill::chunked),
                     prefill.wgmma_experts_from < PrefillPlan::kNever
                         ? fmt::format("gemm_w4_wgmma from {} tokens, else gemm_q4", prefill.wgmma_experts_from)
                         : std::string("gemm_q4"),
                     prefill.moe_slots_up_to, prefill.logit_rows_up_to, prefill.batch_rows_up_to);
  return out;
}

}  // namespace lily::cuda
