// test_moe.cu: the MoE kernels (backend/cuda/moe.cu) against host references built from
// cpu::rms_norm and cpu::linear, and the whole block against cpu::sparse_moe.
//
// Routing (with the fused input norm and the shared expert's gate): E 8, 100 and 256, k 2 and
// 8, ties (identical router rows) to the lower expert index, the normalized x it writes.
// Experts: random expert ids (repeats included; slot k, the shared expert, holds a garbage id
// the kernels must ignore), T 1 and 3, I/H small and full size, 4 and 8 bits; outputs poisoned
// (NaN) or pre-filled (the accumulating kernels) before each launch.
#include "backend/cuda/common/cuda_check.h"  // first: it sets up fmt for nvcc
#include "backend/cuda/decode/moe.h"
#include "backend/cuda/decode/moe_fused.h"

#include <algorithm>
#include <numeric>

#include "backend/cpu/ops.h"
#include "cuda_test_util.h"
#include "moe_test_weights.h"

#include <cstdlib>

namespace lily::test {
namespace {

// A quantized matrix from given float values (TestQMatrix makes random ones).
struct FixedQMatrix {
  QuantizedMatrix host;
  int rows, cols, bits;
  std::unique_ptr<DeviceArray<uint32_t>> codes;
  std::unique_ptr<DeviceArray<bf16>> scales, biases;
  FixedQMatrix(const std::vector<float>& w, int rows_, int cols_, int bits_) : rows(rows_), cols(cols_), bits(bits_) {
    host = quantize_affine(w, rows, cols, bits, 64);
    codes = std::make_unique<DeviceArray<uint32_t>>(host.codes);
    scales = std::make_unique<DeviceArray<bf16>>(host.scales);
    biases = std::make_unique<DeviceArray<bf16>>(host.biases);
  }
  cuda::QMatrix gpu() const {
    cuda::QMatrix m;
    m.rows = rows, m.cols = cols, m.bits = bits, m.group_size = 64;
    m.codes = codes->get(), m.scales = scales->get(), m.biases = biases->get();
    return m;
  }
  Matrix cpu() const {
    Matrix m;
    m.rows = rows, m.cols = cols, m.format = MatrixFormat::affine, m.bits = bits, m.group_size = 64;
    m.data = host.codes.data(), m.scales = host.scales.data(), m.biases = host.biases.data();
    return m;
  }
};

// The CPU routing rule (backend/cpu/moe.cpp): softmax, top-k by p with ties to the lower
// index, renormalised. Returns p too, to judge near-ties.
struct HostRouting {
  std::vector<int> ids;        // [T, k]
  std::vector<float> weights;  // [T, k]
  std::vector<float> p;        // [T, E]
};

HostRouting host_route(const Matrix& router, const std::vector<float>& x, int T, int k) {
  const int E = int(router.rows);
  std::vector<float> logits(size_t(T) * E);
  cpu::linear(router, x.data(), T, logits.data());
  HostRouting r;
  r.ids.resize(size_t(T) * k), r.weights.resize(size_t(T) * k), r.p.resize(size_t(T) * E);
  for (int t = 0; t < T; ++t) {
    const float* l = logits.data() + size_t(t) * E;
    float* p = r.p.data() + size_t(t) * E;
    const float m = *std::max_element(l, l + E);
    double sum = 0;
    for (int e = 0; e < E; ++e) sum += (p[e] = std::exp(l[e] - m));
    for (int e = 0; e < E; ++e) p[e] = float(p[e] / sum);
    std::vector<int> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int a, int b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    float chosen = 0;
    for (int i = 0; i < k; ++i) chosen += p[order[size_t(i)]];
    for (int i = 0; i < k; ++i) {
      r.ids[size_t(t) * k + i] = order[size_t(i)];
      r.weights[size_t(t) * k + i] = p[order[size_t(i)]] / chosen;
    }
  }
  return r;
}

// The input of the block: h and the norm gain (1 + w), and the normalized x of the reference.
struct NormedInput {
  std::vector<float> h, gain, x;
};

NormedInput normed_input(int T, int H, uint32_t seed) {
  NormedInput in;
  in.h = random_floats(size_t(T) * H, seed, 3.f);
  in.gain = random_floats(size_t(H), seed + 1, 0.2f);
  for (auto& g : in.gain) g += 1.f;
  in.x.resize(in.h.size());
  cpu::rms_norm(in.h.data(), in.gain.data(), T, H, 1e-6f, in.x.data());
  return in;
}

struct GpuRouting {
  std::vector<int32_t> ids;    // [T, k + 1]
  std::vector<float> weights;  // [T, k + 1]
  std::vector<float> normed;   // [T, H]
};

GpuRouting gpu_route(const cuda::QMatrix& router, const cuda::QMatrix& expert_gate, const NormedInput& in, int T,
                     int k) {
  const int H = router.cols;
  DeviceArray<float> dh(in.h), dgain(in.gain), dnormed(size_t(T) * H), dw(size_t(T) * (k + 1));
  DeviceArray<int32_t> di(size_t(T) * (k + 1));
  dw.poison(), di.poison(), dnormed.poison();
  cuda::moe_route_norm(router, expert_gate, dh.get(), dgain.get(), 1e-6f, T, k, dnormed.get(), di.get(), dw.get(),
                       nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return {di.download(), dw.download(), dnormed.download()};
}

void check_route(int E, int k, int H, int T, int bits) {
  SCOPED_TRACE(testing::Message() << "E " << E << " k " << k << " H " << H << " T " << T << " bits " << bits);
  const uint32_t seed = uint32_t(E * 31 + k * 7 + H + T);
  TestQMatrix router(1, E, H, bits, seed, 0.05f), expert_gate(1, 1, H, 8, seed + 7, 0.05f);
  const NormedInput in = normed_input(T, H, seed + 1);
  const HostRouting want = host_route(router.cpu(), in.x, T, k);
  const GpuRouting got = gpu_route(router.gpu(), expert_gate.gpu(), in, T, k);
  const double err = relative_error(got.normed, in.x);
  EXPECT_LT(err, 1e-5) << "normed x: max |gpu - cpu| / max |cpu| = " << err;
  for (int t = 0; t < T; ++t) {
    const float* p = want.p.data() + size_t(t) * E;
    for (int i = 0; i < k; ++i) {
      const size_t j = size_t(t) * (k + 1) + i, jw = size_t(t) * k + i;
      const int g = got.ids[j], w = want.ids[jw];
      ASSERT_TRUE(g >= 0 && g < E) << "token " << t << " slot " << i << ": expert " << g;
      // Summation order differs, so only a near-tie may swap experts.
      if (g != w) {
        EXPECT_NEAR(p[g], p[w], 1e-6f) << "token " << t << " slot " << i << ": gpu expert " << g << " cpu " << w;
        continue;
      }
      EXPECT_NEAR(got.weights[j], want.weights[jw], 1e-5f) << "token " << t << " slot " << i;
    }
    float logit = 0;
    cpu::linear(expert_gate.cpu(), in.x.data() + size_t(t) * H, 1, &logit);
    const size_t js = size_t(t) * (k + 1) + k;
    EXPECT_EQ(got.ids[js], 0) << "token " << t << ": the shared slot's id";
    EXPECT_NEAR(got.weights[js], cpu::sigmoid(logit), 1e-5f) << "token " << t << ": the shared expert's gate";
  }
}

TEST(CudaMoe, Route) {
  REQUIRE_GPU();
  for (int E : {8, 256})
    for (int k : {2, 8})
      for (int H : {128, 2048})
        for (int T : {1, 3}) check_route(E, k, H, T, 8);
  check_route(256, 8, 2048, 2, 4);
  check_route(100, 8, 64, 2, 8);  // E not a multiple of the 8 blocks per token
}

// Identical router rows give identical logits: every tie must go to the lower expert index.
TEST(CudaMoe, RouteTiesToLowerIndex) {
  REQUIRE_GPU();
  for (int E : {8, 64, 256}) {
    for (int distinct : {1, 3}) {
      SCOPED_TRACE(testing::Message() << "E " << E << " distinct rows " << distinct);
      const int H = 128, k = 8, T = 2;
      const auto base = random_floats(size_t(distinct) * H, uint32_t(E + distinct), 0.05f);
      std::vector<float> w(size_t(E) * H);
      for (int e = 0; e < E; ++e) std::copy_n(base.begin() + (e % distinct) * H, H, w.begin() + size_t(e) * H);
      FixedQMatrix router(w, E, H, 8);
      TestQMatrix expert_gate(1, 1, H, 8, 98);
      const NormedInput in = normed_input(T, H, 99);
      const HostRouting want = host_route(router.cpu(), in.x, T, k);
      const GpuRouting got = gpu_route(router.gpu(), expert_gate.gpu(), in, T, k);
      for (int t = 0; t < T; ++t)
        for (int i = 0; i < k; ++i) {
          const size_t j = size_t(t) * (k + 1) + i, jw = size_t(t) * k + i;
          EXPECT_EQ(got.ids[j], want.ids[jw]) << "token " << t << " slot " << i;
          EXPECT_NEAR(got.weights[j], want.weights[jw], 1e-6f) << "token " << t << " slot " << i;
        }
      if (distinct == 1)  // all equal: experts 0..k-1, weight 1/k each
        for (int i = 0; i < k; ++i) EXPECT_EQ(got.ids[size_t(i)], i);
    }
  }
}

// Random expert ids with repeats (as when several tokens pick the same expert).
std::vector<int32_t> random_ids(int n, int E, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& e : ids) e = int32_t(rng() % uint32_t(E));
  if (n > 1) ids[1] = ids[0];
  if (n > 0) ids[size_t(n - 1)] = E - 1;
  return ids;
}

// [T, k + 1] slots: k random routed ids per token, then the shared slot with an id the kernels
// must ignore.
std::vector<int32_t> slot_ids(int T, int k, int E, uint32_t seed) {
  const auto routed = random_ids(T * k, E, seed);
  std::vector<int32_t> ids(size_t(T) * (k + 1), 123456);
  for (int t = 0; t < T; ++t)
    for (int s = 0; s < k; ++s) ids[size_t(t) * (k + 1) + s] = routed[size_t(t) * k + s];
  return ids;
}

float silu(float g) { return g / (1.f + std::exp(-g)); }

void check_gate_up(int E, int I, int H, int T, int k, int bits) {
  SCOPED_TRACE(testing::Message() << "E " << E << " I " << I << " H " << H << " T " << T << " k " << k << " bits "
                                  << bits);
  const uint32_t seed = uint32_t(E + I + H * 3 + T * 5 + k * 7 + bits);
  TestQMatrix gate(E, I, H, bits, seed), up(E, I, H, bits, seed + 1);
  TestQMatrix shared_gate(1, I, H, bits, seed + 4), shared_up(1, I, H, bits, seed + 5);
  const auto x = random_floats(size_t(T) * H, seed + 2);
  const auto ids = slot_ids(T, k, E, seed + 3);

  const int slots = k + 1;
  std::vector<float> expected(size_t(T) * slots * I), g(static_cast<size_t>(I)), u(static_cast<size_t>(I));
  for (int t = 0; t < T; ++t)
    for (int s = 0; s < slots; ++s) {
      const int e = ids[size_t(t) * slots + s];
      cpu::linear(s == k ? shared_gate.cpu() : gate.cpu(e), x.data() + size_t(t) * H, 1, g.data());
      cpu::linear(s == k ? shared_up.cpu() : up.cpu(e), x.data() + size_t(t) * H, 1, u.data());
      for (int i = 0; i < I; ++i) expected[(size_t(t) * slots + s) * I + i] = silu(g[size_t(i)]) * u[size_t(i)];
    }

  DeviceArray<float> dx(x), dact(expected.size());
  DeviceArray<int32_t> dids(ids);
  dact.poison();
  cuda::moe_gate_up(gate.gpu(), up.gpu(), shared_gate.gpu(), shared_up.gpu(), dx.get(), dids.get(), T, k, dact.get(),
                    nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  const double err = relative_error(dact.download(), expected);
  EXPECT_LT(err, 1e-4) << "max |gpu - cpu| / max |cpu| = " << err;
}

TEST(CudaMoe, GateUp) {
  REQUIRE_GPU();
  check_gate_up(8, 512, 2048, 1, 8, 4);  // full size, decode
  check_gate_up(8, 512, 2048, 3, 8, 4);
  check_gate_up(256, 64, 128, 1, 8, 4);
  check_gate_up(256, 64, 128, 3, 2, 4);
  check_gate_up(8, 128, 64, 2, 2, 8);
  check_gate_up(8, 192, 192, 1, 8, 8);
  check_gate_up(8, 80, 192, 2, 3, 4);   // rows not a multiple of 16, a partial 256-column pair
  check_gate_up(4, 48, 4096, 1, 2, 4);  // the widest H the tensor-core kernel takes
  // One token at H a multiple of 512 and I of 16: moe_gate_up_staged.cu's kernel.
  check_gate_up(256, 16, 512, 1, 1, 4);  // one block of rows per slot, k = 1
  check_gate_up(256, 1024, 1024, 1, 8, 4);
  check_gate_up(9, 32, 1536, 1, 8, 4);   // k + 1 = E + 1 slots, 6 pairs (not a multiple of 4 warps)
}

// The same one-token shapes on moe_gate_up_mma_kernel (LILY_GATEUP_STAGED=0, the A/B switch).
TEST(CudaMoe, GateUpWithoutStaging) {
  REQUIRE_GPU();
  ScopedEnv off("LILY_GATEUP_STAGED", "0");
  check_gate_up(8, 512, 2048, 1, 8, 4);
  check_gate_up(4, 48, 4096, 1, 2, 4);
  check_gate_up(256, 16, 512, 1, 1, 4);
}

void check_down(int E, int H, int I, int T, int k, int bits, bool ids_before_launch = false) {
  SCOPED_TRACE(testing::Message() << "E " << E << " H " << H << " I " << I << " T " << T << " k " << k << " bits "
                                  << bits << (ids_before_launch ? " ids before launch" : ""));
  const uint32_t seed = uint32_t(E * 3 + I + H + T * 5 + k * 7 + bits);
  TestQMatrix down(E, H, I, bits, seed), shared_down(1, H, I, bits, seed + 5);
  const int slots = k + 1;
  const auto act = random_floats(size_t(T) * slots * I, seed + 1);
  const auto ids = slot_ids(T, k, E, seed + 2);
  auto weights = random_floats(size_t(T) * slots, seed + 3);
  for (auto& w : weights) w = std::fabs(w);
  const auto out0 = random_floats(size_t(T) * H, seed + 4);

  std::vector<float> expected = out0, y(static_cast<size_t>(H));
  for (int t = 0; t < T; ++t)
    for (int s = 0; s < slots; ++s) {
      const size_t ts = size_t(t) * slots + s;
      cpu::linear(s == k ? shared_down.cpu() : down.cpu(ids[ts]), act.data() + ts * I, 1, y.data());
      for (int h = 0; h < H; ++h) expected[size_t(t) * H + h] += weights[ts] * y[size_t(h)];
    }

  DeviceArray<float> dact(act), dw(weights), dout(out0);
  DeviceArray<int32_t> dids(ids);
  cuda::moe_down_accumulate(down.gpu(), shared_down.gpu(), dact.get(), dids.get(), dw.get(), T, k, dout.get(),
                            nullptr, ids_before_launch);
  CUDA_OK(cudaDeviceSynchronize());
  const double err = relative_error(dout.download(), expected);
  EXPECT_LT(err, 1e-4) << "max |gpu - cpu| / max |cpu| = " << err;
}

TEST(CudaMoe, DownAccumulate) {
  REQUIRE_GPU();
  check_down(8, 2048, 512, 1, 8, 4);  // full size, decode
  check_down(8, 2048, 512, 3, 8, 4);
  check_down(256, 128, 64, 1, 8, 4);
  check_down(256, 65, 64, 3, 2, 4);
  check_down(8, 63, 128, 2, 2, 8);
  check_down(8, 1, 2048, 1, 8, 8);
  check_down(8, 130, 3072, 1, 5, 4);
  check_down(8, 2048, 192, 1, 8, 4);  // a partial 256-column pair
  check_down(8, 40, 1088, 2, 3, 4);   // several load steps, then a partial pair
  // The routed weights loaded before the PDL wait (the decode graph's order); here in stream order.
  check_down(8, 2048, 512, 1, 8, 4, true);
  check_down(256, 65, 64, 3, 2, 4, true);
  check_down(8, 40, 1088, 2, 3, 4, true);
}

// 4-bit experts go to the tensor-core kernels by default; LILY_MMA_GEMV=0 sends them to the
// FP32 kernels: both must match the CPU.
TEST(CudaMoe, Fp32ExpertKernels) {
  REQUIRE_GPU();
  ScopedEnv fp32("LILY_MMA_GEMV", "0");
  check_gate_up(8, 512, 2048, 1, 8, 4);
  check_gate_up(256, 64, 128, 3, 2, 4);
  check_down(8, 2048, 512, 1, 8, 4);
  check_down(256, 65, 64, 3, 2, 4);
  check_down(8, 130, 3072, 1, 5, 4);
}

// The three launches together against h + cpu::sparse_moe(cpu::rms_norm(h)) (small sizes; ids
// compared first, so a near-tie flip would show as such rather than as a numeric mismatch).
TEST(CudaMoe, WholeBlockMatchesCpu) {
  REQUIRE_GPU();
  for (int T : {1, 5}) {
    SCOPED_TRACE(testing::Message() << "T " << T);
    const int E = 16, k = 4, H = 128, I = 64;
    const TestMoe m(E, H, I, I, 1);
    const NormedInput in = normed_input(T, H, 9);

    const MoeWeights w = m.cpu();
    ModelConfig c;
    c.hidden_size = H, c.num_experts = E, c.num_experts_per_tok = k, c.moe_intermediate_size = I;
    c.shared_expert_intermediate_size = I;
    std::vector<float> expected(size_t(T) * H);
    cpu::sparse_moe(w, c, in.x.data(), T, expected.data());
    for (size_t i = 0; i < expected.size(); ++i) expected[i] += in.h[i];

    const int slots = k + 1;
    DeviceArray<float> h(in.h), gain(in.gain), x(size_t(T) * H), dw(size_t(T) * slots), act(size_t(T) * slots * I);
    DeviceArray<int32_t> ids(size_t(T) * slots);
    x.poison(), act.poison(), dw.poison(), ids.poison();
    cuda::moe_route_norm(m.router.gpu(), m.egate.gpu(), h.get(), gain.get(), 1e-6f, T, k, x.get(), ids.get(), dw.get(),
                         nullptr);
    cuda::moe_gate_up(m.gate.gpu(), m.up.gpu(), m.sgate.gpu(), m.sup.gpu(), x.get(), ids.get(), T, k, act.get(),
                      nullptr);
    cuda::moe_down_accumulate(m.down.gpu(), m.sdown.gpu(), act.get(), ids.get(), dw.get(), T, k, h.get(), nullptr);
    CUDA_OK(cudaDeviceSynchronize());

    const HostRouting want = host_route(m.router.cpu(), in.x, T, k);
    const auto got_ids = ids.download();
    for (int t = 0; t < T; ++t)
      for (int i = 0; i < k; ++i)
        ASSERT_EQ(got_ids[size_t(t) * slots + i], want.ids[size_t(t) * k + i])
            << "token " << t << " slot " << i << ": routing differs (near-tie?)";
    const double err = relative_error(h.download(), expected);
    EXPECT_LT(err, 1e-4) << "max |gpu - cpu| / max |cpu| = " << err;
  }
}

// The single-launch decode block (moe_fused.cu) against the three launches on the same input:
// the same arithmetic in the same order, so ids, weights and h agree (to 1e-6 of max |h|); at
// the model's full size and at small sizes (E and I below one block of work, k = 2 and 8).
void check_fused(int E, int k, int H, int I, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "E " << E << " k " << k << " H " << H << " I " << I);
  const TestMoe m(E, H, I, I, seed);
  const NormedInput in = normed_input(1, H, seed + 8);
  const int slots = k + 1;
  const cuda::MoeFusedWeights fw{m.router.gpu(), m.egate.gpu(), m.gate.gpu(), m.up.gpu(), m.down.gpu(),
                                 m.sgate.gpu(),  m.sup.gpu(),   m.sdown.gpu()};
  ASSERT_TRUE(cuda::moe_fused_supports(fw, k));

  DeviceArray<float> h3(in.h), gain(in.gain), x(static_cast<size_t>(H)), w3(static_cast<size_t>(slots)),
      act(static_cast<size_t>(slots) * I);
  DeviceArray<int32_t> ids3(static_cast<size_t>(slots));
  cuda::moe_route_norm(m.router.gpu(), m.egate.gpu(), h3.get(), gain.get(), 1e-6f, 1, k, x.get(), ids3.get(), w3.get(),
                       nullptr);
  cuda::moe_gate_up(m.gate.gpu(), m.up.gpu(), m.sgate.gpu(), m.sup.gpu(), x.get(), ids3.get(), 1, k, act.get(),
                    nullptr);
  cuda::moe_down_accumulate(m.down.gpu(), m.sdown.gpu(), act.get(), ids3.get(), w3.get(), 1, k, h3.get(), nullptr);

  DeviceArray<float> hf(in.h), wf(static_cast<size_t>(slots));
  DeviceArray<int32_t> idsf(static_cast<size_t>(slots));
  DeviceArray<uint8_t> scratch(static_cast<size_t>(cuda::moe_fused_scratch_bytes(E, I, k)));
  CUDA_OK(cudaMemset(scratch.get(), 0, cuda::moe_fused_scratch_bytes(E, I, k)));
  wf.poison(), idsf.poison();
  for (int rep = 0; rep < 3; ++rep) {  // the barrier words must come back to zero between launches
    CUDA_OK(cudaMemcpy(hf.get(), in.h.data(), size_t(H) * 4, cudaMemcpyHostToDevice));
    cuda::moe_fused_decode(fw, hf.get(), gain.get(), 1e-6f, k, idsf.get(), wf.get(), scratch.get(), nullptr);
  }
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(idsf.download(), ids3.download());
  EXPECT_LT(relative_error(wf.download(), w3.download()), 1e-6);
  EXPECT_LT(relative_error(hf.download(), h3.download()), 1e-6);
}

// Decode with the choice in the expert launches (moe_route_norm choose = false; gate/up and down
// choose from the logits) against the choice in moe_route_norm: the same h, bit for bit.
void check_experts_choose(int E, int k, int H, int I, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "experts choose: E " << E << " k " << k << " H " << H << " I " << I);
  const TestMoe m(E, H, I, I, seed);
  const NormedInput in = normed_input(1, H, seed + 8);
  const int slots = k + 1;
  ASSERT_TRUE(cuda::moe_experts_can_choose(m.gate.gpu(), m.down.gpu(), E, k));
  const size_t scratch_bytes = cuda::moe_route_scratch_bytes(E, 1);
  std::vector<std::vector<float>> h_out, w_out;
  std::vector<std::vector<int32_t>> ids_out;
  for (bool experts_choose : {false, true}) {
    DeviceArray<float> h(in.h), gain(in.gain), x(static_cast<size_t>(H)), w(static_cast<size_t>(slots)),
        act(static_cast<size_t>(slots) * I);
    DeviceArray<int32_t> ids(static_cast<size_t>(slots));
    DeviceArray<uint8_t> scratch(scratch_bytes);
    CUDA_OK(cudaMemset(scratch.get(), 0, scratch_bytes));
    w.poison(), ids.poison(), act.poison();
    const float* logits = experts_choose ? cuda::moe_route_logits(scratch.get(), 1) : nullptr;
    cuda::moe_route_norm(m.router.gpu(), m.egate.gpu(), h.get(), gain.get(), 1e-6f, 1, k, x.get(), ids.get(), w.get(),
                         scratch.get(), 1, nullptr, !experts_choose);
    cuda::moe_gate_up(m.gate.gpu(), m.up.gpu(), m.sgate.gpu(), m.sup.gpu(), x.get(), ids.get(), 1, k, act.get(),
                      nullptr, logits);
    cuda::moe_down_accumulate(m.down.gpu(), m.sdown.gpu(), act.get(), ids.get(), w.get(), 1, k, h.get(), nullptr, true,
                              logits);
    CUDA_OK(cudaDeviceSynchronize());
    h_out.push_back(h.download()), w_out.push_back(w.download()), ids_out.push_back(ids.download());
  }
  // The routed slots are not written when the experts choose; the shared expert's slot is.
  EXPECT_EQ(ids_out[1][size_t(k)], 0);
  EXPECT_EQ(w_out[1][size_t(k)], w_out[0][size_t(k)]);
  // The same kernels' arithmetic on the same experts: bit-equal (another expert would not be).
  EXPECT_EQ(h_out[1], h_out[0]);
}

TEST(CudaMoe, ExpertsChooseLikeTheRouter) {
  REQUIRE_GPU();
  check_experts_choose(256, 8, 2048, 512, 21);  // the model
  check_experts_choose(16, 4, 128, 64, 22);
  check_experts_choose(100, 8, 64, 64, 23);
  check_experts_choose(8, 2, 192, 128, 24);
}

TEST(CudaMoe, FusedDecodeMatchesThreeLaunches) {
  REQUIRE_GPU();
  check_fused(256, 8, 2048, 512, 11);  // the model
  check_fused(16, 4, 128, 64, 12);
  check_fused(8, 2, 192, 128, 13);     // H with a partial 256-column pair
  check_fused(8, 2, 512, 64, 15);      // 2 pairs over 4 warps: one warp takes both
  check_fused(100, 8, 64, 64, 14);     // E not a multiple of the 4-row router quads
}

}  // namespace
}  // namespace lily::test
