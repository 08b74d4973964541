// moe_test_weights.h: the random weights of one MoE block for the CUDA MoE tests (test_moe.cu,
// test_moe_grouped.cu), on host and device, with the host reference of its experts.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cuda/common/gpu_types.h"
#include "cuda_test_util.h"

namespace lily::test {

// Router (8-bit, entries scaled by router_scale), routed experts [E, I, H] / [E, H, I] and the
// shared expert [Is, H] / [H, Is] (4-bit), the shared expert's gate (8-bit); seeds seed .. seed + 7.
struct TestMoe {
  int E, H, I, Is;
  TestQMatrix router, gate, up, down, sgate, sup, sdown, egate;
  TestMoe(int E_, int H_, int I_, int Is_, uint32_t seed, float router_scale = 0.05f)
      : E(E_),
        H(H_),
        I(I_),
        Is(Is_),
        router(1, E, H, 8, seed, router_scale),
        gate(E, I, H, 4, seed + 1),
        up(E, I, H, 4, seed + 2),
        down(E, H, I, 4, seed + 3),
        sgate(1, Is, H, 4, seed + 4),
        sup(1, Is, H, 4, seed + 5),
        sdown(1, H, Is, 4, seed + 6),
        egate(1, 1, H, 8, seed + 7) {}
  cuda::GpuMoe gpu() const {
    cuda::GpuMoe w;
    w.router = router.gpu(), w.experts_gate = gate.gpu(), w.experts_up = up.gpu(), w.experts_down = down.gpu();
    w.shared_gate = sgate.gpu(), w.shared_up = sup.gpu(), w.shared_down = sdown.gpu();
    w.shared_expert_gate = egate.gpu();
    return w;
  }
  MoeWeights cpu() const {
    MoeWeights w;
    w.router = router.cpu();
    for (int e = 0; e < E; ++e) {
      w.experts.gate_proj.push_back(gate.cpu(e));
      w.experts.up_proj.push_back(up.cpu(e));
      w.experts.down_proj.push_back(down.cpu(e));
    }
    w.shared_gate_proj = sgate.cpu(), w.shared_up_proj = sup.cpu(), w.shared_down_proj = sdown.cpu();
    w.shared_expert_gate = egate.cpu();
    return w;
  }
  // out[t] += routed (given ids, weights) + gated shared expert, all in fp32.
  void reference(const std::vector<float>& x, const std::vector<int32_t>& ids, const std::vector<float>& weights, int T,
                 int k, std::vector<float>& out) const {
    std::vector<float> g(static_cast<size_t>(std::max(I, Is))), u(g.size()), y(static_cast<size_t>(H));
    for (int t = 0; t < T; ++t) {
      const float* xt = x.data() + static_cast<size_t>(t) * H;
      float* ot = out.data() + static_cast<size_t>(t) * H;
      for (int s = 0; s < k; ++s) {
        const int e = ids[static_cast<size_t>(t) * k + s];
        cpu::linear(gate.cpu(e), xt, 1, g.data());
        cpu::linear(up.cpu(e), xt, 1, u.data());
        for (int i = 0; i < I; ++i)
          g[static_cast<size_t>(i)] = cpu::silu(g[static_cast<size_t>(i)]) * u[static_cast<size_t>(i)];
        cpu::linear(down.cpu(e), g.data(), 1, y.data());
        for (int h = 0; h < H; ++h) ot[h] += weights[static_cast<size_t>(t) * k + s] * y[static_cast<size_t>(h)];
      }
      cpu::linear(sgate.cpu(), xt, 1, g.data());
      cpu::linear(sup.cpu(), xt, 1, u.data());
      for (int i = 0; i < Is; ++i)
        g[static_cast<size_t>(i)] = cpu::silu(g[static_cast<size_t>(i)]) * u[static_cast<size_t>(i)];
      cpu::linear(sdown.cpu(), g.data(), 1, y.data());
      float logit = 0;
      cpu::linear(egate.cpu(), xt, 1, &logit);
      for (int h = 0; h < H; ++h) ot[h] += cpu::sigmoid(logit) * y[static_cast<size_t>(h)];
    }
  }
};

}  // namespace lily::test
