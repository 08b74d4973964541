// cmd_info.cpp: `lily info` describes a model directory or GGUF: layout, quantization (a
// GGUF's quant mix: bytes by type), sizes.
#include <cstdio>
#include <map>

#include "cli/command.h"
#include "cli/model_options.h"
#include "model/checkpoint/load.h"
#include "model/gguf_file.h"
#ifdef LILY_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace lily::cli {
namespace {

void count_matrix(const Matrix& m, std::map<std::string, std::pair<uint64_t, uint64_t>>& by_format) {
  std::string key = m.describe();
  key = m.format == MatrixFormat::gguf ? to_string(m.gguf_type) : key.substr(0, key.find(' '));
  by_format[key].first += uint64_t(m.rows * m.cols);
  by_format[key].second += m.bytes();
}

// A GGUF's quant mix: the bytes of its tensors by storage type, as the file holds them.
void print_gguf_mix(const std::string& path) {
  const GgufModel file(path);
  const double total = double(file.tensor_bytes());
  std::printf("gguf         %zu file(s), %zu tensors, %.3f GB by type:\n", file.paths().size(), file.tensors().size(),
              total / 1e9);
  for (const auto& [type, bytes] : file.bytes_by_type())
    std::printf("  %-8s   %.3f GB (%.1f%%)\n", to_string(type), double(bytes) / 1e9, 100.0 * double(bytes) / total);
}

int run_info(const ModelOptions& options) {
  auto w = load_model(options.resolved_model_dir(), options.load_options());
  const ModelConfig& c = w->config;
  std::printf("model        %s\n", w->model_dir.c_str());
  std::printf("layout       %s\n", to_string(w->layout).c_str());
  std::printf("architecture %s: %d layers (%d Gated DeltaNet, %d gated attention), hidden %d, vocab %d\n",
              c.model_type.c_str(), c.num_layers, c.num_layers_of(LayerKind::linear_attention),
              c.num_layers_of(LayerKind::full_attention), c.hidden_size, c.vocab_size);
  std::printf("attention    %d query heads, %d KV heads, head_dim %d, rotary %d dims, theta %g\n",
              c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.rotary_dim, c.rope_theta);
  std::printf("deltanet     %d key heads, %d value heads of 128, conv kernel %d\n", c.linear_num_key_heads,
              c.linear_num_value_heads, c.linear_conv_kernel_dim);
  std::printf("moe          %d experts, top %d, expert width %d, shared expert width %d\n", c.num_experts,
              c.num_experts_per_tok, c.moe_intermediate_size, c.shared_expert_intermediate_size);
  std::map<std::string, std::pair<uint64_t, uint64_t>> by_format;
  count_matrix(w->embed_tokens, by_format);
  if (w->lm_head.data != w->embed_tokens.data) count_matrix(w->lm_head, by_format);
  for (const auto& l : w->layers) {
    for (const Matrix* m :
         {&l.attention.q_proj, &l.attention.k_proj, &l.attention.v_proj, &l.attention.o_proj, &l.deltanet.in_proj_qkv,
          &l.deltanet.in_proj_z, &l.deltanet.in_proj_a, &l.deltanet.in_proj_b, &l.deltanet.out_proj, &l.moe.router,
          &l.moe.shared_gate_proj, &l.moe.shared_up_proj, &l.moe.shared_down_proj, &l.moe.shared_expert_gate})
      if (!m->empty()) count_matrix(*m, by_format);
    for (const auto* list : {&l.moe.experts.gate_proj, &l.moe.experts.up_proj, &l.moe.experts.down_proj})
      for (const Matrix& m : *list) count_matrix(m, by_format);
  }
  std::printf("parameters   %.3f B (text decoder)\n", double(w->parameter_count()) / 1e9);
  for (auto& [format, v] : by_format)
    std::printf("  %-8s   %.3f B parameters, %.3f GB\n", format.c_str(), double(v.first) / 1e9, double(v.second) / 1e9);
  std::printf("memory       %.3f GB of weights\n", double(w->weight_bytes()) / 1e9);
  if (w->layout == CheckpointLayout::gguf) print_gguf_mix(w->model_dir);
  if (w->mtp)
    std::printf("mtp          MTP head from %s: %.3f GB (fc %s, experts %s), %d bytes of KV cache per token (bf16)\n",
                w->mtp_dir.c_str(), double(w->mtp_weight_bytes()) / 1e9, w->mtp->fc.describe().c_str(),
                w->mtp->layer.moe.experts.gate_proj[0].describe().c_str(), 2 * c.num_key_value_heads * c.head_dim * 2);
  else std::printf("mtp          none (no mtp.* tensors; --mtp DIR reads them from another checkpoint)\n");
  const double kv_per_token = 2.0 * c.num_key_value_heads * c.head_dim * 2 * c.num_layers_of(LayerKind::full_attention);
  const double recurrent = double(c.num_layers_of(LayerKind::linear_attention)) *
                           (double(c.linear_num_value_heads) * 128 * 128 * 4 +
                            (c.linear_conv_kernel_dim - 1.0) * c.linear_conv_dim() * 2);
  std::printf("state        %.0f bytes of KV cache per token (bf16), %.1f MB recurrent state per sequence\n",
              kv_per_token, recurrent / 1e6);
#ifdef LILY_HAVE_CUDA
  std::printf("gpu          %s\n", describe_device_profile(options.device_profile).c_str());
#endif
  return 0;
}

CommandRegistration info_command{{"info", "Describe a model: layout, quantization, parameter count, memory",
                                  [](CLI::App& sub) {
                                    auto o = std::make_shared<ModelOptions>();
                                    o->add_to(sub);
                                    return [o] { return run_info(*o); };
                                  },
                                  52}};

}  // namespace
}  // namespace lily::cli
