// test_deltanet.cu: cuda::gated_deltanet_core against a host reference built from backend/cpu
// (delta_rule_recurrent, gated_rms_norm; conv and l2norm written out below as in deltanet.cpp),
// for decode (T = 1), prefill of odd and chunk-crossing lengths, and prefill then decode, with
// random initial conv and SSM states. Outputs are poisoned before each launch.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cuda/deltanet.h"
#include "cuda_test_util.h"

namespace lily::test {
namespace {

constexpr int kD = 128, kK = 4;
constexpr double kTolerance = 1e-4;

struct Layer {
  int Hk, Hv;
  int C() const { return 2 * Hk * kD + Hv * kD; }
  std::vector<float> conv_w, A_log, dt_bias, norm_w;
  Layer(int hk, int hv, uint32_t seed) : Hk(hk), Hv(hv) {
    conv_w = random_floats(size_t(C()) * kK, seed, 0.5f);
    A_log = random_floats(size_t(Hv), seed + 1, 0.5f);
    dt_bias = random_floats(size_t(Hv), seed + 2, 0.5f);
    norm_w = random_floats(kD, seed + 3, 0.2f);
    for (auto& w : norm_w) w += 1.f;
  }
};

struct State {
  std::vector<float> conv, ssm;  // [K-1, C], [Hv, 128, 128]
};

struct Inputs {
  std::vector<float> mixed, z, b, a;
  Inputs(const Layer& l, int T, uint32_t seed)
      : mixed(random_floats(size_t(T) * l.C(), seed)),
        z(random_floats(size_t(T) * l.Hv * kD, seed + 1)),
        b(random_floats(size_t(T) * l.Hv, seed + 2)),
        a(random_floats(size_t(T) * l.Hv, seed + 3)) {}
};

// The host reference (spec §2.6): y [T, Hv*128]; advances st.
std::vector<float> reference(const Layer& l, State& st, const Inputs& in, int T) {
  const int C = l.C(), key_dim = l.Hk * kD;
  std::vector<float> u(size_t(T) * C);
  for (int t = 0; t < T; ++t)
    for (int c = 0; c < C; ++c) {
      float s = 0;
      for (int i = 0; i < kK; ++i) {
        const int row = t + i;  // of [conv_state; mixed]
        const float x = row < kK - 1 ? st.conv[size_t(row) * C + c] : in.mixed[size_t(row - (kK - 1)) * C + c];
        s += l.conv_w[size_t(c) * kK + i] * x;
      }
      u[size_t(t) * C + c] = cpu::silu(s);
    }
  std::vector<float> next(size_t(kK - 1) * C);
  for (int r = 0; r < kK - 1; ++r)
    for (int c = 0; c < C; ++c) {
      const int row = T + r;
      next[size_t(r) * C + c] = row < kK - 1 ? st.conv[size_t(row) * C + c] : in.mixed[size_t(row - (kK - 1)) * C + c];
    }
  st.conv = next;
  auto l2 = [](float* x, float scale) {
    double ss = 0;
    for (int i = 0; i < kD; ++i) ss += double(x[i]) * x[i];
    const float inv = 1.f / std::sqrt(float(ss) + 1e-6f) * scale;
    for (int i = 0; i < kD; ++i) x[i] *= inv;
  };
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < l.Hk; ++h) {
      l2(&u[size_t(t) * C + h * kD], 1.f / std::sqrt(float(kD)));
      l2(&u[size_t(t) * C + key_dim + h * kD], 1.f);
    }
  std::vector<float> beta(size_t(T) * l.Hv), g(size_t(T) * l.Hv);
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < l.Hv; ++h) {
      const size_t i = size_t(t) * l.Hv + h;
      beta[i] = cpu::sigmoid(in.b[i]);
      g[i] = -std::exp(l.A_log[size_t(h)]) * cpu::softplus(in.a[i] + l.dt_bias[size_t(h)]);
    }
  std::vector<float> o(size_t(T) * l.Hv * kD), y(o.size());
  const int ratio = l.Hv / l.Hk;
  for (int h = 0; h < l.Hv; ++h) {
    const int kh = h / ratio;
    cpu::DeltaRuleInputs dr{u.data() + kh * kD, u.data() + key_dim + kh * kD, u.data() + 2 * key_dim + h * kD,
                            g.data() + h, beta.data() + h, C, C, C, l.Hv, T, kD, kD};
    cpu::delta_rule_recurrent(dr, st.ssm.data() + size_t(h) * kD * kD, o.data() + h * kD, l.Hv * kD);
  }
  cpu::gated_rms_norm(o.data(), in.z.data(), l.norm_w.data(), int64_t(T) * l.Hv, kD, 1e-6f, y.data());
  return y;
}

// The layer's weights and state on the GPU.
struct GpuLayer {
  DeviceArray<float> conv_w, A_log, dt_bias, norm_w, conv, ssm;
  const Layer& l;
  GpuLayer(const Layer& layer, const State& st)
      : conv_w(layer.conv_w), A_log(layer.A_log), dt_bias(layer.dt_bias), norm_w(layer.norm_w), conv(st.conv),
        ssm(st.ssm), l(layer) {}
  std::vector<float> run(const Inputs& in, int T) {
    DeviceArray<float> mixed(in.mixed), z(in.z), b(in.b), a(in.a), y(size_t(T) * l.Hv * kD);
    y.poison();
    cuda::DeltaNetParams p;
    p.T = T, p.num_key_heads = l.Hk, p.num_value_heads = l.Hv, p.head_dim = kD, p.conv_kernel = kK, p.eps = 1e-6f;
    p.conv_weight = conv_w.get(), p.A_log = A_log.get(), p.dt_bias = dt_bias.get(), p.norm_weight = norm_w.get();
    cuda::gated_deltanet_core(p, mixed.get(), z.get(), b.get(), a.get(), conv.get(), ssm.get(), y.get(), nullptr);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return y.download();
  }
};

State random_state(const Layer& l, uint32_t seed) {
  return {random_floats(size_t(kK - 1) * l.C(), seed), random_floats(size_t(l.Hv) * kD * kD, seed + 1, 0.1f)};
}

// Runs blocks of the given lengths one after another, state carried, comparing each block's y
// and the states after it.
void check_blocks(int Hk, int Hv, const std::vector<int>& lengths, uint32_t seed) {
  Layer layer(Hk, Hv, seed);
  State host = random_state(layer, seed + 10);
  GpuLayer gpu(layer, host);
  for (size_t i = 0; i < lengths.size(); ++i) {
    const int T = lengths[i];
    Inputs in(layer, T, seed + 100 + uint32_t(i) * 7);
    const auto want = reference(layer, host, in, T);
    const auto got = gpu.run(in, T);
    SCOPED_TRACE(testing::Message() << "Hk " << Hk << " Hv " << Hv << " block " << i << " T " << T);
    EXPECT_LT(relative_error(got, want), kTolerance) << "y";
    EXPECT_LT(relative_error(gpu.conv.download(), host.conv), kTolerance) << "conv state";
    EXPECT_LT(relative_error(gpu.ssm.download(), host.ssm), kTolerance) << "ssm state";
  }
}

TEST(CudaDeltaNet, DecodeSmall) {
  REQUIRE_GPU();
  check_blocks(2, 4, {1}, 1);
}

TEST(CudaDeltaNet, DecodeFull) {
  REQUIRE_GPU();
  check_blocks(16, 32, {1}, 2);
}

TEST(CudaDeltaNet, PrefillSmall) {
  REQUIRE_GPU();
  for (int T : {2, 3, 63, 64, 65, 200}) check_blocks(2, 4, {T}, 3 + uint32_t(T));
}

TEST(CudaDeltaNet, PrefillFull) {
  REQUIRE_GPU();
  for (int T : {2, 63, 64, 65, 200}) check_blocks(16, 32, {T}, 5 + uint32_t(T));
}

// Longer than one 512-token prefill chunk: the conv state and SSM state carry across chunks.
TEST(CudaDeltaNet, PrefillAcrossChunks) {
  REQUIRE_GPU();
  check_blocks(2, 4, {1100}, 7);
}

TEST(CudaDeltaNet, PrefillThenDecode) {
  REQUIRE_GPU();
  check_blocks(2, 4, {65, 1, 1, 1, 2, 1}, 11);
  check_blocks(16, 32, {63, 1, 1, 1}, 13);
}

TEST(CudaDeltaNet, ScratchOverload) {
  REQUIRE_GPU();
  Layer layer(2, 4, 17);
  State host = random_state(layer, 18);
  GpuLayer gpu(layer, host);
  const int T = 70;
  Inputs in(layer, T, 19);
  const auto want = reference(layer, host, in, T);
  cuda::DeltaNetParams p;
  p.T = T, p.num_key_heads = 2, p.num_value_heads = 4;
  p.conv_weight = gpu.conv_w.get(), p.A_log = gpu.A_log.get(), p.dt_bias = gpu.dt_bias.get();
  p.norm_weight = gpu.norm_w.get();
  DeviceArray<char> scratch(cuda::gated_deltanet_scratch_bytes(p));
  DeviceArray<float> mixed(in.mixed), z(in.z), b(in.b), a(in.a), y(size_t(T) * 4 * kD);
  y.poison();
  cuda::gated_deltanet_core(p, mixed.get(), z.get(), b.get(), a.get(), gpu.conv.get(), gpu.ssm.get(), y.get(),
                            scratch.get(), nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_LT(relative_error(y.download(), want), kTolerance);
  EXPECT_LT(relative_error(gpu.ssm.download(), host.ssm), kTolerance);
}

}  // namespace
}  // namespace lily::test
