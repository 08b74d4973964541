// persistent_decode.cpp: see persistent_decode.h.
#include "backend/cuda/persistent/persistent_decode.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/persistent/decode_kernel.h"
#include "base/error.h"

namespace lily::cuda::persistent {

namespace {

DeviceMatrix device_matrix(const QMatrix& m) {
  DeviceMatrix d;
  d.codes = m.codes;
  d.scales = reinterpret_cast<const uint16_t*>(m.scales);
  d.biases = reinterpret_cast<const uint16_t*>(m.biases);
  d.rows = m.rows, d.cols = m.cols, d.bits = m.bits;
  return d;
}

// "" when m is `bits`-bit group 64 with a multiple of 256 columns (whole pairs of the tile loads)
// up to 4096, else what is wrong.
std::string matrix_refusal(const QMatrix& m, int bits, const char* what) {
  if (m.rows <= 0 || m.bits != bits || m.group_size != 64 || m.cols % 64 != 0 || m.cols > 4096 || !aligned16(m.codes))
    return fmt::format("{} is [{}, {}] q{} group {} (wanted q{} group 64, at most 4096 columns)", what, m.rows, m.cols,
                       m.bits, m.group_size, bits);
  return "";
}

DeviceLayer device_layer(const GpuLayer& l) {
  DeviceLayer d;
  d.attention = l.kind == LayerKind::full_attention;
  d.input_norm = l.input_layernorm;
  d.post_norm = l.post_attention_layernorm;
  if (d.attention) {
    d.in_proj = device_matrix(l.attention.qkv_proj);
    d.out_proj = device_matrix(l.attention.o_proj);
    d.q_norm = l.attention.q_norm;
    d.k_norm = l.attention.k_norm;
  } else {
    d.in_proj = device_matrix(l.deltanet.in_proj_all);
    d.out_proj = device_matrix(l.deltanet.out_proj);
    d.conv1d = l.deltanet.conv1d;
    d.A_log = l.deltanet.A_log;
    d.dt_bias = l.deltanet.dt_bias;
    d.gated_norm = l.deltanet.norm;
  }
  const GpuMoe& m = l.moe;
  d.router = device_matrix(m.router);
  d.shared_expert_gate = device_matrix(m.shared_expert_gate);
  d.gate = device_matrix(m.experts_gate);
  d.up = device_matrix(m.experts_up);
  d.down = device_matrix(m.experts_down);
  d.shared_gate = device_matrix(m.shared_gate);
  d.shared_up = device_matrix(m.shared_up);
  d.shared_down = device_matrix(m.shared_down);
  return d;
}

Dims dims_of(const ModelConfig& c, const DecodeTasks& t, int splits) {
  Dims d;
  d.T = t.rows.count, d.parallel = t.rows.kind == DecodeRows::Kind::parallel;
  d.H = c.hidden_size, d.E = c.num_experts, d.k = c.num_experts_per_tok;
  d.I = std::max(c.moe_intermediate_size, c.shared_expert_intermediate_size), d.V = c.vocab_size;
  d.slots = expert_slots(c, t.rows);
  d.proj_stride = int(t.buffer_bytes[kProj] / 4 / uint64_t(d.T));
  d.mixer_stride = int(t.buffer_bytes[kMixer] / 4 / uint64_t(d.T));
  d.splits = splits;
  d.nq = c.num_attention_heads, d.nkv = c.num_key_value_heads, d.head_dim = c.head_dim;
  d.rotary_dim = c.rotary_dim, d.rope_theta = float(c.rope_theta), d.eps = float(c.rms_norm_eps);
  d.Hk = c.linear_num_key_heads, d.Hv = c.linear_num_value_heads, d.conv_k = c.linear_conv_kernel_dim;
  return d;
}

// The tasks for the kernel, block after block; an expert slot's task knows the counter of its
// layer's top-k (its weights are known once that is done).
std::vector<DeviceTask> flatten(const DecodeTasks& tasks, int slots, std::vector<uint32_t>& begin) {
  std::map<int, const Task*> top_k;  // by layer
  for (const auto& block : tasks.list.blocks)
    for (const Task& t : block)
      if (DecodeOp(t.op) == DecodeOp::top_k) top_k[t.layer] = &t;
  std::vector<DeviceTask> out;
  begin.assign(1, 0);
  for (const auto& block : tasks.list.blocks) {
    LILY_CHECK(block.size() <= size_t(kMaxBlockTasks), "persistent decode: a block of {} tasks (at most {})",
               block.size(), kMaxBlockTasks);
    for (const Task& t : block) {
      LILY_CHECK(t.waits.size() <= 2, "persistent decode: task '{}' has {} waits (at most 2)", t.name, t.waits.size());
      DeviceTask d;
      d.op = t.op, d.layer = t.layer, d.slot = t.slot, d.row = t.row, d.rows = t.rows;
      d.first = t.first, d.count = t.count, d.signal = t.signal;
      for (size_t i = 0; i < t.waits.size(); ++i) d.wait[i] = t.waits[i].counter, d.wait_count[i] = t.waits[i].count;
      const DecodeOp op = DecodeOp(t.op);
      if ((op == DecodeOp::gate_up || op == DecodeOp::down) && t.slot < slots) {
        const Task* chooser = top_k.at(t.layer);
        d.known = uint32_t(chooser->signal), d.known_count = 1;
      }
      out.push_back(d);
    }
    begin.push_back(uint32_t(out.size()));
  }
  return out;
}

template <class T>
DeviceBuffer upload(const std::vector<T>& v) {
  DeviceBuffer b(v.size() * sizeof(T));
  CUDA_CHECK(cudaMemcpy(b.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return b;
}

}  // namespace

std::string persistent_decode_refusal(const GpuWeights& w) {
  const ModelConfig& c = w.config();
  if (c.num_layers > kMaxLayers) return fmt::format("{} layers (at most {})", c.num_layers, kMaxLayers);
  if (c.hidden_size % 256 != 0 || c.hidden_size > 4096) return fmt::format("hidden size {}", c.hidden_size);
  if (c.num_experts > 256 || c.num_experts_per_tok > 8)
    return fmt::format("{} experts, top {}", c.num_experts, c.num_experts_per_tok);
  if (c.moe_intermediate_size != c.shared_expert_intermediate_size || c.moe_intermediate_size % 64 != 0 ||
      c.moe_intermediate_size > 4096)
    return fmt::format("expert widths {} and {}", c.moe_intermediate_size, c.shared_expert_intermediate_size);
  if (w.embed_tokens.bits != 4 || w.embed_tokens.group_size != 64) return "embed_tokens is not 4-bit group 64";
  if (std::string why = matrix_refusal(w.lm_head, 4, "lm_head"); !why.empty()) return why;
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const GpuLayer& l = w.layers[i];
    const bool attention = l.kind == LayerKind::full_attention;
    const QMatrix& in = attention ? l.attention.qkv_proj : l.deltanet.in_proj_all;
    const QMatrix& out = attention ? l.attention.o_proj : l.deltanet.out_proj;
    const GpuMoe& m = l.moe;
    for (std::string why :
         {matrix_refusal(in, 4, "the fused input projection"), matrix_refusal(out, 4, "the output projection"),
          matrix_refusal(m.router, 8, "the router"), matrix_refusal(m.shared_expert_gate, 8, "shared_expert_gate"),
          matrix_refusal(m.experts_gate, 4, "experts' gate"), matrix_refusal(m.experts_up, 4, "experts' up"),
          matrix_refusal(m.experts_down, 4, "experts' down"), matrix_refusal(m.shared_gate, 4, "shared gate"),
          matrix_refusal(m.shared_up, 4, "shared up"), matrix_refusal(m.shared_down, 4, "shared down")})
      if (!why.empty()) return fmt::format("layer {}: {}", i, why);
  }
  if (c.num_layers_of(LayerKind::full_attention) > 0 &&
      (c.head_dim != 256 || c.num_attention_heads % c.num_key_value_heads != 0 ||
       c.num_attention_heads / c.num_key_value_heads > 8))
    return fmt::format("attention of {} query heads over {} KV heads of {}", c.num_attention_heads,
                       c.num_key_value_heads, c.head_dim);
  if (c.num_layers_of(LayerKind::linear_attention) > 0 &&
      (c.linear_key_head_dim != 128 || c.linear_value_head_dim != 128 || c.linear_conv_kernel_dim != 4))
    return fmt::format("DeltaNet heads of {} and {}, conv {}", c.linear_key_head_dim, c.linear_value_head_dim,
                       c.linear_conv_kernel_dim);
  return "";
}

DecodeTiling persistent_decode_tiling(const ModelConfig& c, int blocks) {
  auto round16 = [](int64_t n) { return int((n + 15) / 16 * 16); };
  DecodeTiling t;
  t.blocks = blocks;
  t.in_proj_rows = 96;
  t.out_proj_rows = 16;
  t.router_rows = 16;  // a row a warp: 17 tasks of one memory latency each (32: 9 tasks of two)
  // The MoE's gate/up and down tasks of a layer on distinct blocks: each of the k + 1 slots' rows
  // cut into at most blocks / (k + 1) tasks (with 132 blocks: 11 of 48 rows and 13 of 160, where
  // 32 and 128 made 144 tasks each and 12 blocks ran two, one after the other).
  const int64_t per_slot = std::max(1, blocks / (c.num_experts_per_tok + 1));
  const int64_t I = std::max(c.moe_intermediate_size, c.shared_expert_intermediate_size);
  t.expert_rows = std::max(16, round16((I + per_slot - 1) / per_slot));
  t.down_rows = std::max(16, round16((int64_t(c.hidden_size) + per_slot - 1) / per_slot));
  t.lm_head_rows = std::max(16, round16((int64_t(c.vocab_size) + blocks - 1) / blocks));
  t.deltanet_columns = 32;
  t.attention_splits = 64;
  t.attention_kv_heads = 1;  // a split task a KV head: 128 tasks of half the bytes
  t.combine_heads = 1;
  return t;
}

PersistentDecode::PersistentDecode(const GpuWeights& w, const DecodeTiling& tiling, const int32_t* token, float* logits)
    : w_(w), tasks_(build_decode_tasks(w.config(), tiling, DecodeRows{})) {
  const ModelConfig& c = w.config();
  const std::string why = persistent_decode_refusal(w);
  LILY_CHECK(why.empty(), "persistent decode: {}", why);
  LILY_CHECK(tiling.blocks <= persistent_decode_max_blocks(), "persistent decode: {} blocks, {} fit at once",
             tiling.blocks, persistent_decode_max_blocks());
  LILY_CHECK(tiling.in_proj_rows <= 256 && tiling.expert_rows <= 256,
             "persistent decode: input projection tasks of {} rows, gate/up tasks of {} (at most 256: the ops' "
             "shared-memory rows)",
             tiling.in_proj_rows, tiling.expert_rows);
  check_task_list(tasks_.list);
  blocks_ = tiling.blocks;

  const Dims dims = dims_of(c, tasks_, tiling.attention_splits);
  flat_ = flatten(tasks_, dims.slots, block_begin_host_);
  device_tasks_ = upload(flat_);
  block_begin_ = upload(block_begin_host_);
  std::vector<DeviceLayer> layers;
  for (const GpuLayer& l : w.layers) layers.push_back(device_layer(l));
  layers_ = upload(layers);

  auto scratch = [&](DecodeBuffer b) { return DeviceBuffer(tasks_.buffer_bytes[b]); };
  hidden_ = scratch(kHidden), proj_ = scratch(kProj), mixer_ = scratch(kMixer), moe_input_ = scratch(kMoeInput);
  router_logits_ = scratch(kRouterLogits), top_k_ = scratch(kTopK), act_ = scratch(kAct);
  partials_ = scratch(kPartials), counters_ = DeviceBuffer(uint64_t(tasks_.list.counters) * 4);

  args_.tasks = device_tasks_.as<DeviceTask>();
  args_.block_begin = block_begin_.as<uint32_t>();
  args_.layers = layers_.as<DeviceLayer>();
  args_.embed = device_matrix(w.embed_tokens);
  args_.lm_head = device_matrix(w.lm_head);
  args_.final_norm = w.final_norm;
  args_.dims = dims;
  StepBuffers& b = args_.buf;
  b.token = token, b.hidden = hidden_.as<float>(), b.proj = proj_.as<float>(), b.mixer = mixer_.as<float>();
  b.moe_input = moe_input_.as<float>(), b.router_logits = router_logits_.as<float>();
  b.slot_ids = top_k_.as<int32_t>(), b.slot_weights = top_k_.as<float>() + dims.slots;
  b.act = act_.as<float>(), b.partials = partials_.as<float>(), b.logits = logits;
  b.counters = counters_.as<uint32_t>();
}

void PersistentDecode::record(CudaSequenceState& s, cudaStream_t stream) {
  StepArgs a = args_;
  a.seq.position = s.position();
  a.seq.capacity = int(s.capacity());
  size_t attention = 0, deltanet = 0;
  for (size_t l = 0; l < w_.layers.size(); ++l) {
    if (w_.layers[l].kind == LayerKind::full_attention) {
      a.seq.k_cache[l] = reinterpret_cast<uint16_t*>(s.k_cache(attention));
      a.seq.v_cache[l] = reinterpret_cast<uint16_t*>(s.v_cache(attention++));
    } else {
      a.seq.conv[l] = s.conv(deltanet);
      a.seq.ssm[l] = s.ssm(deltanet++);
    }
  }
  launch_persistent_decode(a, blocks_, int(tasks_.list.counters), stream);
}

}  // namespace lily::cuda::persistent
