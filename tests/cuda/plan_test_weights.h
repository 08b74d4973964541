// plan_test_weights.h: the weights of a config as the GPU upload lays them out, described only
// (shapes, bits, aligned addresses that are never read), for the kernel plan's host-only tests
// (test_kernel_plan.cpp, test_device_profile.cpp).
#pragma once

#include <cstdint>
#include <memory>

#include "backend/cuda/gpu_weights.h"
#include "model/config.h"

namespace lily::test {

inline cuda::QMatrix plan_test_matrix(int batch, int rows, int cols, int bits) {
  cuda::QMatrix m;
  m.batch = batch, m.rows = rows, m.cols = cols, m.bits = bits;
  m.codes = reinterpret_cast<const uint32_t*>(uintptr_t(4096));  // 16-byte aligned, never read
  m.scales = m.biases = reinterpret_cast<const bf16*>(uintptr_t(8192));
  return m;
}

// The weights of `c` as the GPU upload lays them out (fused input projections where every part
// has the same format), every matrix at `bits` except those `tweak` changes.
struct PlanTestWeights {
  std::unique_ptr<cuda::GpuWeights> w;
  explicit PlanTestWeights(const ModelConfig& c, int expert_bits = 4, int ab_bits = 4, int lm_head_bits = 4) {
    w = std::make_unique<cuda::GpuWeights>(c);
    const int H = c.hidden_size, E = c.num_experts, I = c.moe_intermediate_size;
    w->embed_tokens = plan_test_matrix(1, c.vocab_size, H, 4);
    w->lm_head = plan_test_matrix(1, c.vocab_size, H, lm_head_bits);
    for (LayerKind kind : c.layer_types) {
      cuda::GpuLayer l;
      l.kind = kind;
      if (kind == LayerKind::full_attention) {
        const int q = 2 * c.attention_q_width(), kv = c.attention_kv_width();
        l.attention.q_proj = plan_test_matrix(1, q, H, 4), l.attention.k_proj = plan_test_matrix(1, kv, H, 4);
        l.attention.v_proj = plan_test_matrix(1, kv, H, 4),
        l.attention.qkv_proj = plan_test_matrix(1, q + 2 * kv, H, 4);
        l.attention.o_proj = plan_test_matrix(1, H, c.attention_q_width(), 4);
      } else {
        const int C = c.linear_conv_dim(), Vd = c.linear_value_dim(), Hv = c.linear_num_value_heads;
        cuda::GpuDeltaNet& d = l.deltanet;
        d.in_proj_qkv = plan_test_matrix(1, C, H, 4), d.in_proj_z = plan_test_matrix(1, Vd, H, 4);
        d.in_proj_b = plan_test_matrix(1, Hv, H, ab_bits), d.in_proj_a = plan_test_matrix(1, Hv, H, ab_bits);
        if (ab_bits == 4) d.in_proj_all = plan_test_matrix(1, C + Vd + 2 * Hv, H, 4);  // else parts only (rows 0)
        d.out_proj = plan_test_matrix(1, H, Vd, 4);
      }
      l.moe.router = plan_test_matrix(1, E, H, 8), l.moe.shared_expert_gate = plan_test_matrix(1, 1, H, 8);
      l.moe.experts_gate = plan_test_matrix(E, I, H, expert_bits),
      l.moe.experts_up = plan_test_matrix(E, I, H, expert_bits);
      l.moe.experts_down = plan_test_matrix(E, H, I, expert_bits);
      l.moe.shared_gate = plan_test_matrix(1, I, H, 4), l.moe.shared_up = plan_test_matrix(1, I, H, 4);
      l.moe.shared_down = plan_test_matrix(1, H, I, 4);
      w->layers.push_back(l);
    }
  }
  // The MTP head as the upload lays it out: mtp.fc's two [H, H] halves and a full-attention layer
  // like the model's first.
  void add_mtp() {
    const int H = w->config().hidden_size;
    cuda::GpuMtp m;
    m.fc_embedding = plan_test_matrix(1, H, H, 4), m.fc_hidden = plan_test_matrix(1, H, H, 4);
    for (const cuda::GpuLayer& l : w->layers)
      if (l.kind == LayerKind::full_attention) {
        m.layer = l;
        break;
      }
    w->mtp = m;
  }
};

}  // namespace lily::test
