// test_moe.cu: the decode MoE's three launches (backend/cuda/moe/moe_decode.h) against host
// references built from cpu::rms_norm and cpu::linear, and the whole block against
// cpu::sparse_moe.
//
// Route: the normalized x, the router logits and the shared expert's gate (E 8, 100 and 256, H 64
// to 2048, 4- and 8-bit routers). The choice, made by the expert launches from the logits: the
// experts and weights of the CPU's top-k (softmax, ties to the lower index, renormalised in rank
// order), seen through what gate/up and down compute; logits with ties. Experts: both gate/up
// kernels by name at the model's shape and at edges (rows not a multiple of 16, partial 256-column
// pairs, k = 1 .. 8, E = k), down at edge widths; outputs poisoned (NaN) or pre-filled (down adds).
// Slots: the block of T = 1 .. 16 rows on the same kernels against each row alone.
#include "backend/cuda/common/cuda_check.h"  // first: it sets up fmt for nvcc
#include "backend/cuda/moe/moe_decode.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "backend/cpu/ops.h"
#include "cuda_test_util.h"
#include "moe_test_weights.h"

namespace lily::test {
namespace {

using cuda::GateUpKernel;

// The CPU routing rule (backend/cpu/moe.cpp) on one token's logits: softmax, top-k by p with ties
// to the lower index, renormalised (summed in rank order). p too, to judge near-ties.
struct HostChoice {
  std::vector<int> ids;        // [k]
  std::vector<float> weights;  // [k]
  std::vector<float> p;        // [E]
};

HostChoice host_choice(const std::vector<float>& logits, int k) {
  const int E = int(logits.size());
  HostChoice r;
  r.p.resize(size_t(E));
  const float m = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (int e = 0; e < E; ++e) sum += (r.p[size_t(e)] = std::exp(logits[size_t(e)] - m));
  for (auto& v : r.p) v = float(v / sum);
  std::vector<int> order(static_cast<size_t>(E));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int a, int b) {
    return r.p[size_t(a)] > r.p[size_t(b)] || (r.p[size_t(a)] == r.p[size_t(b)] && a < b);
  });
  float chosen = 0;
  for (int i = 0; i < k; ++i) chosen += r.p[size_t(order[size_t(i)])];
  for (int i = 0; i < k; ++i) {
    r.ids.push_back(order[size_t(i)]);
    r.weights.push_back(r.p[size_t(order[size_t(i)])] / chosen);
  }
  return r;
}

// Logits whose top-k has no near-ties: a random permutation of 0, 0.05, 0.1, ... (p differ by 5%).
std::vector<float> separated_logits(int E, uint32_t seed) {
  std::vector<float> l(static_cast<size_t>(E));
  for (int e = 0; e < E; ++e) l[size_t(e)] = 0.05f * float(e) - 3.f;
  std::shuffle(l.begin(), l.end(), std::mt19937(seed));
  return l;
}

// The input of the block: h and the norm gain (1 + w), and the normalized x of the reference.
struct NormedInput {
  std::vector<float> h, gain, x;
};

NormedInput normed_input(int H, uint32_t seed) {
  NormedInput in;
  in.h = random_floats(size_t(H), seed, 3.f);
  in.gain = random_floats(size_t(H), seed + 1, 0.2f);
  for (auto& g : in.gain) g += 1.f;
  in.x.resize(in.h.size());
  cpu::rms_norm(in.h.data(), in.gain.data(), 1, H, 1e-6f, in.x.data());
  return in;
}

// The device buffers of one token's block, poisoned (NaN) where a launch writes.
struct GpuBlock {
  DeviceArray<float> h, gain, x, logits, shared_weight, act;
  GpuBlock(const TestMoe& m, const std::vector<float>& h0, const std::vector<float>& gain0, int k)
      : h(h0), gain(gain0), x(size_t(m.H)), logits(size_t(m.E)), shared_weight(1), act(size_t(k + 1) * m.I) {
    x.poison(), logits.poison(), shared_weight.poison(), act.poison();
  }
  cuda::MoeDecodeArgs args(const cuda::GpuMoe& w, int k) {
    cuda::MoeDecodeArgs a;
    a.w = &w, a.gain = gain.get(), a.eps = 1e-6f, a.k = k;
    a.buffers = {h.get(), x.get(), logits.get(), shared_weight.get(), act.get()};
    return a;
  }
};

float silu(float g) { return g / (1.f + std::exp(-g)); }

// The model's block (E 256, H 2048, I 512): built once, it takes a while.
const TestMoe& model_block() {
  static const TestMoe m(256, 2048, 512, 512, 77);
  return m;
}

// ---- The route ---------------------------------------------------------------------------

void check_route(int E, int H, int router_bits) {
  SCOPED_TRACE(testing::Message() << "route E " << E << " H " << H << " router q" << router_bits);
  const uint32_t seed = uint32_t(E * 31 + H + router_bits);
  const TestQMatrix router(1, E, H, router_bits, seed, 0.05f), egate(1, 1, H, 8, seed + 7);
  const NormedInput in = normed_input(H, seed + 1);
  std::vector<float> want_logits(static_cast<size_t>(E));
  cpu::linear(router.cpu(), in.x.data(), 1, want_logits.data());
  float gate_logit = 0;
  cpu::linear(egate.cpu(), in.x.data(), 1, &gate_logit);

  cuda::GpuMoe w;  // the route reads these two alone
  w.router = router.gpu(), w.shared_expert_gate = egate.gpu();
  DeviceArray<float> h(in.h), gain(in.gain), x(static_cast<size_t>(H)), logits(static_cast<size_t>(E)),
      shared_weight(1);
  x.poison(), logits.poison(), shared_weight.poison();
  cuda::MoeDecodeArgs a;
  a.w = &w, a.gain = gain.get(), a.eps = 1e-6f, a.k = 2;
  a.buffers = {h.get(), x.get(), logits.get(), shared_weight.get(), nullptr};
  cuda::moe_route(a, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_LT(relative_error(x.download(), in.x), 1e-5) << "normed x";
  EXPECT_LT(relative_error(logits.download(), want_logits), 1e-5) << "router logits";
  EXPECT_NEAR(shared_weight.download()[0], cpu::sigmoid(gate_logit), 1e-5f) << "the shared expert's gate";
  EXPECT_EQ(h.download(), in.h) << "the route must not write h";
}

TEST(CudaMoe, Route) {
  REQUIRE_GPU();
  for (int E : {8, 256})
    for (int H : {128, 2048}) check_route(E, H, 8);
  check_route(256, 2048, 4);
  check_route(100, 64, 8);    // E not a multiple of the 32 blocks
  check_route(256, 4096, 8);  // the widest H (the rows no longer fit one round of loads)
}

// ---- Gate/up: the choice and the SwiGLU ----------------------------------------------------

// act[s] of `kernel` against the host's, the experts chosen from `logits` by the CPU's rule.
void check_gate_up(GateUpKernel kernel, const TestMoe& m, int k, const std::vector<float>& logits, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << cuda::kernel_name(kernel) << " E " << m.E << " I " << m.I << " H " << m.H << " k "
                                  << k);
  const cuda::GpuMoe w = m.gpu();
  ASSERT_TRUE(cuda::moe_decode_supports(w, k, kernel));
  const auto x = random_floats(size_t(m.H), seed);
  const HostChoice choice = host_choice(logits, k);
  std::vector<float> expected(size_t(k + 1) * m.I), g(static_cast<size_t>(m.I)), u(static_cast<size_t>(m.I));
  for (int s = 0; s <= k; ++s) {
    cpu::linear(s == k ? m.sgate.cpu() : m.gate.cpu(choice.ids[size_t(s)]), x.data(), 1, g.data());
    cpu::linear(s == k ? m.sup.cpu() : m.up.cpu(choice.ids[size_t(s)]), x.data(), 1, u.data());
    for (int i = 0; i < m.I; ++i) expected[size_t(s) * m.I + i] = silu(g[size_t(i)]) * u[size_t(i)];
  }
  GpuBlock b(m, std::vector<float>(size_t(m.H), 0.f), std::vector<float>(size_t(m.H), 1.f), k);
  b.x.upload(x), b.logits.upload(logits);
  cuda::moe_gate_up(kernel, b.args(w, k), nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  const auto got = b.act.download();
  for (int s = 0; s <= k; ++s) {  // slot by slot: a wrong expert shows as its slot
    const std::vector<float> got_s(got.begin() + s * m.I, got.begin() + (s + 1) * m.I);
    const std::vector<float> want_s(expected.begin() + s * m.I, expected.begin() + (s + 1) * m.I);
    EXPECT_LT(relative_error(got_s, want_s), 1e-4) << "slot " << s << (s < k ? " (expert " : " (shared")
                                                   << (s < k ? std::to_string(choice.ids[size_t(s)]) : "") << ")";
  }
}

TEST(CudaMoe, GateUp) {
  REQUIRE_GPU();
  struct Shape {
    int E, I, H, k;
  };
  for (GateUpKernel kernel : {GateUpKernel::staged, GateUpKernel::mma})
    check_gate_up(kernel, model_block(), 8, separated_logits(256, 1), 7);
  // Both kernels: E = k + 1, I over 512, 6 pairs (not a multiple of the 4 warps), k = 1, the widest H.
  for (const Shape& s : {Shape{8, 512, 2048, 8}, Shape{16, 1024, 1024, 8}, Shape{9, 64, 1536, 8},
                         Shape{256, 64, 512, 1}, Shape{8, 64, 4096, 2}}) {
    const TestMoe m(s.E, s.H, s.I, s.I, uint32_t(s.E + s.I + s.H + s.k));
    for (GateUpKernel kernel : {GateUpKernel::staged, GateUpKernel::mma})
      check_gate_up(kernel, m, s.k, separated_logits(s.E, uint32_t(s.H)), 7);
  }
  // The mma kernel alone: H off the 512-column grid (lily-tiny's 256, a partial 256-column pair), E = k.
  for (const Shape& s : {Shape{16, 128, 256, 4}, Shape{256, 64, 128, 8}, Shape{8, 192, 192, 8}, Shape{8, 64, 64, 3},
                         Shape{4, 128, 320, 4}}) {
    const TestMoe m(s.E, s.H, s.I, s.I, uint32_t(s.E * 3 + s.I + s.H + s.k));
    EXPECT_FALSE(cuda::moe_decode_supports(m.gpu(), s.k, GateUpKernel::staged));
    check_gate_up(GateUpKernel::mma, m, s.k, separated_logits(s.E, uint32_t(s.I)), 8);
  }
}

// Equal logits: every tie goes to the lower expert index (the CPU's rule), in gate/up's choice.
TEST(CudaMoe, ChoiceTiesToLowerIndex) {
  REQUIRE_GPU();
  for (int E : {8, 64, 256})
    for (int distinct : {1, 3}) {
      SCOPED_TRACE(testing::Message() << "E " << E << " distinct logits " << distinct);
      const TestMoe m(E, 512, 64, 64, uint32_t(E + distinct));
      std::vector<float> logits(static_cast<size_t>(E));
      for (int e = 0; e < E; ++e) logits[size_t(e)] = 0.5f * float(e % distinct);
      const HostChoice want = host_choice(logits, 8);
      if (distinct == 1)
        for (int i = 0; i < 8; ++i) ASSERT_EQ(want.ids[size_t(i)], i);
      for (GateUpKernel kernel : {GateUpKernel::staged, GateUpKernel::mma}) check_gate_up(kernel, m, 8, logits, 9);
    }
}

// ---- Down: the choice's weights, the shared expert, the sum into h -------------------------

// The down launch reads D, the shared expert's D, act, the logits and the shared expert's weight
// alone (H need not suit gate/up here).
void check_down(const TestQMatrix& down, const TestQMatrix& sdown, int k, const std::vector<float>& logits,
                uint32_t seed) {
  const int E = down.batch, H = down.rows, I = down.cols;
  SCOPED_TRACE(testing::Message() << "down E " << E << " H " << H << " I " << I << " k " << k);
  cuda::GpuMoe w;
  w.experts_down = down.gpu(), w.shared_down = sdown.gpu();
  const auto act = random_floats(size_t(k + 1) * I, seed);
  const auto h0 = random_floats(size_t(H), seed + 1);
  const float shared_weight = 0.37f;
  const HostChoice choice = host_choice(logits, k);
  std::vector<float> expected = h0, y(static_cast<size_t>(H));
  for (int s = 0; s <= k; ++s) {
    cpu::linear(s == k ? sdown.cpu() : down.cpu(choice.ids[size_t(s)]), act.data() + size_t(s) * I, 1, y.data());
    const float ws = s == k ? shared_weight : choice.weights[size_t(s)];
    for (int r = 0; r < H; ++r) expected[size_t(r)] += ws * y[size_t(r)];
  }
  DeviceArray<float> h(h0), dact(act), dlogits(logits), dshared(std::vector<float>{shared_weight});
  cuda::MoeDecodeArgs a;
  a.w = &w, a.k = k;
  a.buffers = {h.get(), nullptr, dlogits.get(), dshared.get(), dact.get()};
  cuda::moe_down(a, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  const double err = relative_error(h.download(), expected);
  EXPECT_LT(err, 1e-4) << "max |gpu - cpu| / max |cpu| = " << err;
}

TEST(CudaMoe, Down) {
  REQUIRE_GPU();
  struct Shape {
    int E, H, I, k;
  };
  check_down(model_block().down, model_block().sdown, 8, separated_logits(256, 2), 10);
  // H of one row, not a multiple of 16, partial 256-column pairs of I, several load steps, E = k.
  for (const Shape& s : {Shape{8, 2048, 512, 8}, Shape{256, 128, 64, 8}, Shape{256, 65, 64, 2}, Shape{8, 1, 2048, 8},
                         Shape{8, 130, 1088, 5}, Shape{8, 2048, 192, 8}, Shape{8, 40, 1088, 3}, Shape{4, 63, 128, 4}}) {
    const TestQMatrix down(s.E, s.H, s.I, 4, uint32_t(s.E * 3 + s.I + s.H + s.k)), sdown(1, s.H, s.I, 4, 99);
    check_down(down, sdown, s.k, separated_logits(s.E, uint32_t(s.H + 1)), 11);
  }
  // Ties in the weights: equal logits give equal weights 1/k to experts 0..k-1.
  const TestQMatrix down(16, 256, 128, 4, 5), sdown(1, 256, 128, 4, 6);
  check_down(down, sdown, 4, std::vector<float>(16, 0.25f), 12);
}

// ---- The whole block ------------------------------------------------------------------------

// The three launches together against h + cpu::sparse_moe(cpu::rms_norm(h)) at small sizes and the
// model's. The CPU's choice from its own logits is compared with the CPU's rule on the GPU's
// logits first, so a near-tie flip shows as such rather than as a numeric mismatch.
void check_block(const TestMoe& m, int k, uint32_t seed) {
  const int E = m.E, H = m.H, I = m.I;
  SCOPED_TRACE(testing::Message() << "block E " << E << " k " << k << " H " << H << " I " << I);
  const NormedInput in = normed_input(H, seed + 9);
  ModelConfig c;
  c.hidden_size = H, c.num_experts = E, c.num_experts_per_tok = k, c.moe_intermediate_size = I;
  c.shared_expert_intermediate_size = I;
  std::vector<float> expected(static_cast<size_t>(H));
  cpu::sparse_moe(m.cpu(), c, in.x.data(), 1, expected.data());
  for (size_t i = 0; i < expected.size(); ++i) expected[i] += in.h[i];
  std::vector<float> cpu_logits(static_cast<size_t>(E));
  cpu::linear(m.router.cpu(), in.x.data(), 1, cpu_logits.data());

  const cuda::GpuMoe w = m.gpu();
  const GateUpKernel gate_up = cuda::moe_decode_supports(w, k, GateUpKernel::staged) ? GateUpKernel::staged
                                                                                     : GateUpKernel::mma;
  GpuBlock b(m, in.h, in.gain, k);
  const cuda::MoeDecodeArgs args = b.args(w, k);
  cuda::moe_route(args, nullptr);
  cuda::moe_gate_up(gate_up, args, nullptr);
  cuda::moe_down(args, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  ASSERT_EQ(host_choice(b.logits.download(), k).ids, host_choice(cpu_logits, k).ids) << "routing differs (near-tie?)";
  const double err = relative_error(b.h.download(), expected);
  EXPECT_LT(err, 1e-4) << "max |gpu - cpu| / max |cpu| = " << err;
}

TEST(CudaMoe, WholeBlockMatchesCpu) {
  REQUIRE_GPU();
  check_block(TestMoe(16, 128, 64, 64, 1), 4, 1);  // mma gate/up
  check_block(TestMoe(16, 512, 64, 64, 2), 4, 2);  // staged gate/up
  check_block(model_block(), 8, 3);                // the model
}

// The block of T rows on the decode kernels (moe_slots_accumulate: the rows a grid dimension)
// against each row alone: h[t] + cpu::sparse_moe(RMSNorm(h[t])), the rows' routings checked
// first against the CPU's rule on the GPU's logits (a near-tie shows as such). h is pre-filled
// (down adds), x poisoned; the scratch poisoned too, so every slot's act must be written.
void check_slots(const TestMoe& m, int k, int T, uint32_t seed) {
  const int E = m.E, H = m.H;
  SCOPED_TRACE(testing::Message() << "slots E " << E << " k " << k << " H " << H << " I " << m.I << " T " << T);
  const auto h = random_floats(size_t(T) * H, seed, 3.f);
  auto gain = random_floats(size_t(H), seed + 1, 0.2f);
  for (auto& g : gain) g += 1.f;
  std::vector<float> x(h.size()), expected(h), cpu_logits(size_t(T) * E);
  cpu::rms_norm(h.data(), gain.data(), T, H, 1e-6f, x.data());
  cpu::linear(m.router.cpu(), x.data(), T, cpu_logits.data());
  ModelConfig c;
  c.hidden_size = H, c.num_experts = E, c.num_experts_per_tok = k, c.moe_intermediate_size = m.I;
  c.shared_expert_intermediate_size = m.Is;
  std::vector<float> row(static_cast<size_t>(H));
  for (int t = 0; t < T; ++t) {  // each row alone
    cpu::sparse_moe(m.cpu(), c, x.data() + size_t(t) * H, 1, row.data());
    for (int i = 0; i < H; ++i) expected[size_t(t) * H + size_t(i)] += row[size_t(i)];
  }

  const cuda::GpuMoe w = m.gpu();
  const GateUpKernel gate_up = cuda::moe_decode_supports(w, k, GateUpKernel::staged) ? GateUpKernel::staged
                                                                                     : GateUpKernel::mma;
  DeviceArray<float> dh(h), dgain(gain), dx(h.size());
  DeviceArray<uint8_t> scratch(cuda::moe_slots_scratch_bytes(w, T, k));
  dx.poison(), scratch.poison();
  cuda::moe_slots_accumulate(gate_up, w, dh.get(), dgain.get(), 1e-6f, T, k, scratch.get(), dx.get(), nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_LT(relative_error(dx.download(), x), 1e-5) << "normed x";
  // The GPU's logits are the scratch's first T * E floats (moe_slots.cpp's layout).
  const std::vector<uint8_t> bytes = scratch.download();
  std::vector<float> gpu_logits(size_t(T) * E);
  std::memcpy(gpu_logits.data(), bytes.data(), gpu_logits.size() * 4);
  for (int t = 0; t < T; ++t) {
    const auto at = [&](const std::vector<float>& l) {
      return std::vector<float>(l.begin() + ptrdiff_t(t) * E, l.begin() + ptrdiff_t(t + 1) * E);
    };
    ASSERT_EQ(host_choice(at(gpu_logits), k).ids, host_choice(at(cpu_logits), k).ids)
        << "row " << t << ": routing differs (near-tie?)";
  }
  const std::vector<float> got = dh.download();
  for (int t = 0; t < T; ++t) {
    const std::vector<float> g(got.begin() + ptrdiff_t(t) * H, got.begin() + ptrdiff_t(t + 1) * H),
        e(expected.begin() + ptrdiff_t(t) * H, expected.begin() + ptrdiff_t(t + 1) * H);
    EXPECT_LT(relative_error(g, e), 1e-4) << "row " << t;
  }
}

TEST(CudaMoe, SlotsMatchEachRowAlone) {
  REQUIRE_GPU();
  const TestMoe tiny(16, 128, 64, 64, 11, 0.5f), staged(16, 512, 64, 64, 12, 0.5f);
  for (int T : {1, 2, 3, 8, 16}) {
    check_slots(tiny, 4, T, uint32_t(100 + T));    // mma gate/up
    check_slots(staged, 4, T, uint32_t(200 + T));  // staged gate/up
  }
  for (int T : {1, 4, 8}) check_slots(model_block(), 8, T, uint32_t(300 + T));  // the model
  // Rows past what the launches take are refused before anything runs.
  const cuda::GpuMoe w = tiny.gpu();
  EXPECT_THROW(cuda::moe_slots_accumulate(GateUpKernel::mma, w, nullptr, nullptr, 1e-6f, cuda::kMoeSlotsMaxRows + 1, 4,
                                          nullptr, nullptr, nullptr),
               Error);
}

// Which kernels take which block (a host check: no GPU needed): both gate/up kernels the model's,
// mma alone H off the 512-column grid; nothing 8-bit experts, k over 8 or E, H over 4096.
TEST(CudaMoe, KernelsTakeTheirFormats) {
  auto block = [](int E, int H, int I, int expert_bits) {
    auto m = [&](int batch, int rows, int cols, int bits) {
      cuda::QMatrix q;
      q.batch = batch, q.rows = rows, q.cols = cols, q.bits = bits;
      q.codes = reinterpret_cast<const uint32_t*>(uintptr_t(256));  // only the alignment is read
      q.scales = q.biases = reinterpret_cast<const bf16*>(uintptr_t(512));
      return q;
    };
    cuda::GpuMoe w;
    w.router = m(1, E, H, 8), w.shared_expert_gate = m(1, 1, H, 8);
    w.experts_gate = m(E, I, H, expert_bits), w.experts_up = m(E, I, H, expert_bits);
    w.experts_down = m(E, H, I, expert_bits);
    w.shared_gate = m(1, I, H, expert_bits), w.shared_up = m(1, I, H, expert_bits);
    w.shared_down = m(1, H, I, expert_bits);
    return w;
  };
  const cuda::GpuMoe model = block(256, 2048, 512, 4);
  EXPECT_TRUE(cuda::moe_decode_supports(model, 8, GateUpKernel::staged));
  EXPECT_TRUE(cuda::moe_decode_supports(model, 8, GateUpKernel::mma));
  EXPECT_FALSE(cuda::moe_decode_supports(model, 9, GateUpKernel::mma));
  EXPECT_FALSE(cuda::moe_decode_supports(model, 0, GateUpKernel::mma));
  EXPECT_FALSE(cuda::moe_decode_supports(block(4, 2048, 512, 4), 8, GateUpKernel::mma));  // k > E
  const cuda::GpuMoe tiny = block(16, 256, 128, 4);                                       // lily-tiny's
  EXPECT_FALSE(cuda::moe_decode_supports(tiny, 4, GateUpKernel::staged));
  EXPECT_TRUE(cuda::moe_decode_supports(tiny, 4, GateUpKernel::mma));
  EXPECT_FALSE(cuda::moe_decode_supports(block(256, 2048, 512, 8), 8, GateUpKernel::mma));
  EXPECT_FALSE(cuda::moe_decode_supports(block(256, 4160, 512, 4), 8, GateUpKernel::mma));
  EXPECT_FALSE(cuda::moe_decode_supports(block(257, 2048, 512, 4), 8, GateUpKernel::mma));
}

}  // namespace
}  // namespace lily::test
