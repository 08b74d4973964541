// test_moe_grouped.cu: the prefill MoE path (backend/cuda/moe_grouped.cu): top-k and the plan
// (exact, against host rules), the grouped experts against a host reference built from
// cpu::linear, the whole block against cpu::sparse_moe.
//
// Loads: uniform random ids, ids from a few experts only (most experts get zero rows), one
// expert in every token's first slot (it takes T of the T*k rows). T in {1, 15, 16, 17, 64, 65,
// 300} crosses the 16/32/64-row tiles. Tolerance for the expert products: max |gpu - cpu| <=
// 1e-2 * max |cpu| (bf16 inputs to the tensor cores, fp32 sums; see gemm_q4.h).
#include "backend/cuda/common/cuda_check.h"  // first: it sets up fmt for nvcc
#include "backend/cuda/moe/moe_grouped.h"

#include "backend/cuda/moe/moe_route_rows.h"

#include <algorithm>
#include <numeric>

#include "backend/cpu/ops.h"
#include "cuda_test_util.h"
#include "moe_test_weights.h"

namespace lily::test {
namespace {

constexpr double kTolerance = 1e-2;

enum class Load { uniform, few_experts, one_dominant };

// ids [T, k]: distinct experts per token, with the requested skew.
std::vector<int32_t> make_ids(int T, int k, int E, Load load, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(T) * k);
  const int pool = load == Load::few_experts ? std::max(k, std::min(E, k + 2)) : E;
  for (int t = 0; t < T; ++t) {
    std::vector<int32_t> perm(static_cast<size_t>(pool));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    if (load == Load::one_dominant) {
      auto it = std::find(perm.begin(), perm.end(), E / 2);
      std::iter_swap(perm.begin(), it);  // slot 0 is always expert E/2
    }
    for (int s = 0; s < k; ++s)
      ids[static_cast<size_t>(t) * k + s] = perm[static_cast<size_t>(s)] * (load == Load::few_experts ? E / pool : 1);
  }
  return ids;
}

TEST(CudaMoeGrouped, TopkMatchesHostRule) {
  REQUIRE_GPU();
  for (int E : {8, 100, 256})
    for (int k : {1, 4, 8}) {
      if (k > E) continue;
      const int T = 37;
      SCOPED_TRACE(testing::Message() << "E " << E << " k " << k);
      auto logits = random_floats(static_cast<size_t>(T) * E, uint32_t(E * 10 + k), 2.f);
      for (int e = 0; e < E; e += 3) logits[static_cast<size_t>(e)] = logits[0];  // ties in token 0
      DeviceArray<float> dl(logits), dw(static_cast<size_t>(T) * k);
      DeviceArray<int32_t> di(static_cast<size_t>(T) * k);
      dw.poison(), di.poison();
      cuda::moe_topk(dl.get(), T, E, k, di.get(), dw.get(), nullptr);
      CUDA_OK(cudaDeviceSynchronize());
      const auto ids = di.download();
      const auto w = dw.download();
      for (int t = 0; t < T; ++t) {
        const float* l = logits.data() + static_cast<size_t>(t) * E;
        const float m = *std::max_element(l, l + E);
        std::vector<float> p(static_cast<size_t>(E));
        double sum = 0;
        for (int e = 0; e < E; ++e) sum += (p[static_cast<size_t>(e)] = std::exp(l[e] - m));
        for (auto& v : p) v = float(v / sum);
        std::vector<int> order(static_cast<size_t>(E));
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(),
                         [&](int a, int b) { return p[static_cast<size_t>(a)] > p[static_cast<size_t>(b)]; });
        float chosen = 0;
        for (int i = 0; i < k; ++i) chosen += p[static_cast<size_t>(order[static_cast<size_t>(i)])];
        for (int i = 0; i < k; ++i) {
          const size_t j = static_cast<size_t>(t) * k + i;
          const int want = order[static_cast<size_t>(i)];
          if (ids[j] != want) {  // fp32 exp/sum order may differ: only a near-tie may swap
            EXPECT_NEAR(p[static_cast<size_t>(ids[j])], p[static_cast<size_t>(want)], 1e-6f)
                << "token " << t << " slot " << i;
            continue;
          }
          EXPECT_NEAR(w[j], p[static_cast<size_t>(want)] / chosen, 1e-5f) << "token " << t << " slot " << i;
        }
      }
    }
}

// moe_topk_gate: the top-k bit for bit as moe_topk's, the gate logit as cpu::linear's (fp32).
TEST(CudaMoeGrouped, TopkGateIsTopkAndTheGateLogit) {
  REQUIRE_GPU();
  for (int bits : {8, 4})
    for (int H : {64, 192, 2048})
      for (int T : {1, 3, 37}) {
        SCOPED_TRACE(testing::Message() << "bits " << bits << " H " << H << " T " << T);
        const int E = 256, k = 8;
        const TestQMatrix egate(1, 1, H, bits, uint32_t(H + T + bits));
        const auto logits = random_floats(size_t(T) * E, uint32_t(T + 5), 2.f);
        const auto x = random_floats(size_t(T) * H, uint32_t(T + 6), 3.f);
        std::vector<float> sg(static_cast<size_t>(T));
        cpu::linear(egate.cpu(), x.data(), T, sg.data());
        DeviceArray<float> dl(logits), dx(x), dw(size_t(T) * k), dw2(size_t(T) * k), dsg(sg.size());
        DeviceArray<int32_t> di(size_t(T) * k), di2(size_t(T) * k);
        dw.poison(), dw2.poison(), di.poison(), di2.poison(), dsg.poison();
        cuda::moe_topk(dl.get(), T, E, k, di.get(), dw.get(), nullptr);
        cuda::moe_topk_gate(dl.get(), dx.get(), egate.gpu(), T, E, k, di2.get(), dw2.get(), dsg.get(), nullptr);
        CUDA_OK(cudaDeviceSynchronize());
        EXPECT_EQ(di.download(), di2.download());
        EXPECT_EQ(dw.download(), dw2.download());
        EXPECT_LT(relative_error(dsg.download(), sg), 1e-5);
      }
}

void check_plan(int T, int k, int E, int tile_rows, Load load) {
  SCOPED_TRACE(testing::Message() << "T " << T << " k " << k << " E " << E << " tile rows " << tile_rows << " load "
                                  << int(load));
  const int P = T * k;
  const auto ids = make_ids(T, k, E, load, uint32_t(T * 13 + E + tile_rows));
  cuda::MoePlan plan;
  plan.tile_rows = tile_rows;
  plan.max_tiles = cuda::moe_max_tiles(P, E, tile_rows);
  DeviceArray<int32_t> did(ids), offsets(static_cast<size_t>(E + 1)), sorted(static_cast<size_t>(P)),
      position(static_cast<size_t>(P)), tiles(static_cast<size_t>(plan.max_tiles) * 4), num(1),
      chunk_counts(static_cast<size_t>(cuda::moe_plan_chunks(P)) * E);
  offsets.poison(), sorted.poison(), position.poison(), tiles.poison(), num.poison(), chunk_counts.poison();
  plan.offsets = offsets.get(), plan.sorted = sorted.get(), plan.position = position.get();
  plan.tiles = tiles.get(), plan.num_tiles = num.get(), plan.chunk_counts = chunk_counts.get();
  cuda::moe_plan(did.get(), T, k, E, plan, nullptr);
  CUDA_OK(cudaDeviceSynchronize());

  // Host: stable counting sort and the tile list.
  std::vector<int32_t> want_offsets(static_cast<size_t>(E + 1), 0), want_sorted, want_tiles;
  for (int32_t e : ids) ++want_offsets[static_cast<size_t>(e) + 1];
  for (int e = 0; e < E; ++e) want_offsets[static_cast<size_t>(e) + 1] += want_offsets[static_cast<size_t>(e)];
  for (int e = 0; e < E; ++e) {
    for (int i = 0; i < P; ++i)
      if (ids[static_cast<size_t>(i)] == e) want_sorted.push_back(i);
    const int first = want_offsets[static_cast<size_t>(e)], end = want_offsets[static_cast<size_t>(e) + 1];
    for (int r = first; r < end; r += tile_rows)
      want_tiles.insert(want_tiles.end(), {e, r, std::min(end, r + tile_rows), 0});
  }
  EXPECT_EQ(offsets.download(), want_offsets);
  EXPECT_EQ(sorted.download(), want_sorted);
  const auto pos = position.download();
  for (int p = 0; p < P; ++p) EXPECT_EQ(pos[static_cast<size_t>(want_sorted[static_cast<size_t>(p)])], p);
  const int n = num.download()[0];
  ASSERT_EQ(n, int(want_tiles.size() / 4));
  ASSERT_LE(n, plan.max_tiles);
  auto got_tiles = tiles.download();
  got_tiles.resize(static_cast<size_t>(n) * 4);
  EXPECT_EQ(got_tiles, want_tiles);
}

TEST(CudaMoeGrouped, Plan) {
  REQUIRE_GPU();
  for (Load load : {Load::uniform, Load::few_experts, Load::one_dominant})
    for (int T : {1, 15, 16, 17, 64, 65, 300})
      for (int tile_rows : {16, 32, 64}) check_plan(T, 8, 256, tile_rows, load);
  // several 1024-pair chunks, one block each: 128 tokens of 8 pairs fill one, 8192 tokens 64
  for (int T : {127, 128, 129, 1000, 8192}) check_plan(T, 8, 256, 128, Load::uniform);
  check_plan(1000, 8, 256, 32, Load::one_dominant);
  check_plan(4096, 8, 256, 64, Load::few_experts);
  check_plan(129, 4, 16, 16, Load::one_dominant);
}

void check_experts(const TestMoe& m, int T, int k, Load load,
                   cuda::MoeExpertKernels kernels = cuda::MoeExpertKernels::gemm) {
  SCOPED_TRACE(testing::Message() << "E " << m.E << " H " << m.H << " I " << m.I << " T " << T << " k " << k << " load "
                                  << int(load)
                                  << (kernels == cuda::MoeExpertKernels::rows    ? " rows"
                                      : kernels == cuda::MoeExpertKernels::wgmma ? " wgmma"
                                                                                 : ""));
  const uint32_t seed = uint32_t(T * 7 + k + int(load) * 1000);
  const auto x = random_floats(static_cast<size_t>(T) * m.H, seed);
  const auto ids = make_ids(T, k, m.E, load, seed + 1);
  auto weights = random_floats(static_cast<size_t>(T) * k, seed + 2);
  for (auto& w : weights) w = std::fabs(w);
  auto out = random_floats(static_cast<size_t>(T) * m.H, seed + 3);

  const cuda::GpuMoe w = m.gpu();
  DeviceArray<float> dx(x), dw(weights), dout(out);
  DeviceArray<int32_t> dids(ids);
  DeviceArray<uint8_t> scratch(cuda::moe_grouped_scratch_bytes(w, T, k, 16));  // the most tiles
  scratch.poison();
  cuda::moe_experts_grouped_accumulate(w, dx.get(), dids.get(), dw.get(), T, k, scratch.get(), dout.get(), nullptr, 0,
                                       nullptr, kernels);
  CUDA_OK(cudaDeviceSynchronize());
  m.reference(x, ids, weights, T, k, out);
  const double err = relative_error(dout.download(), out);
  EXPECT_LT(err, kTolerance) << "max |gpu - cpu| / max |cpu| = " << err;
}

TEST(CudaMoeGrouped, ExpertsUnevenLoads) {
  REQUIRE_GPU();
  const TestMoe small(16, 128, 64, 128, 11);
  for (Load load : {Load::uniform, Load::few_experts, Load::one_dominant})
    for (int T : {1, 15, 16, 17, 64, 65, 300}) check_experts(small, T, 4, load);
  const TestMoe wide(256, 128, 192, 64, 12);  // I = 3 x 64: not a multiple of Tile64's 128 weight rows
  for (Load load : {Load::uniform, Load::few_experts, Load::one_dominant})
    for (int T : {1, 17, 300}) check_experts(wide, T, 8, load);
}

// Passes of at most 16 tokens on the few-row kernels (gemv/gemv_rows.h): the same checks,
// T across their 8-token tiles, H from 128 (8 tiles a task) to the model's 2048. The model's
// expert widths (full: gate/up 2048 -> 512, down 512 -> 2048) and mid's gate/up (1024 -> 256)
// take the shared-memory ring kernel (gemv_rows_ring.cu), the rest the register form.
TEST(CudaMoeGrouped, ExpertsOnFewRowKernels) {
  REQUIRE_GPU();
  const TestMoe small(16, 128, 64, 128, 11), wide(256, 128, 192, 64, 12), full(32, 2048, 512, 512, 13);
  const TestMoe mid(16, 1024, 256, 256, 14);  // the shared expert of the experts' shape: folded in
  ASSERT_TRUE(cuda::moe_rows_supports(small.gpu()) && cuda::moe_rows_supports(full.gpu()) &&
              cuda::moe_rows_supports(mid.gpu()));
  for (Load load : {Load::uniform, Load::few_experts, Load::one_dominant})
    for (int T : {1, 2, 7, 8, 9, 15, 16}) {
      check_experts(small, T, 4, load, cuda::MoeExpertKernels::rows);
      check_experts(wide, T, 8, load, cuda::MoeExpertKernels::rows);
    }
  for (Load load : {Load::uniform, Load::few_experts, Load::one_dominant})
    for (int T : {1, 5, 8, 9, 16}) {
      check_experts(full, T, 8, load, cuda::MoeExpertKernels::rows);
      check_experts(mid, T, 8, load, cuda::MoeExpertKernels::rows);
    }
}

TEST(CudaMoeGrouped, ModelWidths) {
  REQUIRE_GPU();
  const TestMoe full(32, 2048, 512, 512, 13);
  check_experts(full, 65, 8, Load::uniform);
  check_experts(full, 300, 8, Load::one_dominant);
}

// The experts on the wgmma GEMMs (64-position tiles): the checks of ExpertsUnevenLoads and
// ModelWidths, I from one K group (64) up.
TEST(CudaMoeGrouped, ExpertsOnWgmma) {
  REQUIRE_GPU();
  const auto wgmma = cuda::MoeExpertKernels::wgmma;
  const TestMoe small(16, 128, 64, 128, 11), wide(256, 128, 192, 64, 12), full(32, 2048, 512, 512, 13);
  for (Load load : {Load::uniform, Load::few_experts, Load::one_dominant})
    for (int T : {1, 17, 64, 65, 300}) check_experts(small, T, 4, load, wgmma);
  for (Load load : {Load::uniform, Load::one_dominant})
    for (int T : {1, 17, 300}) check_experts(wide, T, 8, load, wgmma);
  check_experts(full, 65, 8, Load::uniform, wgmma);
  check_experts(full, 300, 8, Load::one_dominant, wgmma);
  check_experts(full, 400, 8, Load::uniform, wgmma);  // 100 rows an expert: 128-position tiles
}

// Routing included (the fp32-accurate router, gemm_exact), against cpu::sparse_moe. The router's
// scale spreads the logits; tokens whose experts still differ are reported and skipped (a
// near-tie, not an error), and must be rare.
TEST(CudaMoeGrouped, WholeBlockMatchesCpu) {
  REQUIRE_GPU();
  const int E = 16, k = 4, H = 128, I = 64, Is = 128;
  const TestMoe m(E, H, I, Is, 21, 0.5f);
  MoeWeights cw = m.cpu();
  ModelConfig c;
  c.hidden_size = H, c.num_experts = E, c.num_experts_per_tok = k, c.moe_intermediate_size = I;
  c.shared_expert_intermediate_size = Is;
  for (int T : {1, 17, 65, 300})
    for (auto kernels : {cuda::MoeExpertKernels::gemm, cuda::MoeExpertKernels::wgmma}) {
      SCOPED_TRACE(testing::Message() << "T " << T << (kernels == cuda::MoeExpertKernels::wgmma ? " wgmma" : ""));
      const auto x = random_floats(static_cast<size_t>(T) * H, uint32_t(T + 5));
      std::vector<float> expected(static_cast<size_t>(T) * H);
      cpu::sparse_moe(cw, c, x.data(), T, expected.data());

      const cuda::GpuMoe w = m.gpu();
      DeviceArray<float> dx(x), dout(static_cast<size_t>(T) * H);
      CUDA_OK(cudaMemset(dout.get(), 0, dout.size() * sizeof(float)));
      DeviceArray<uint8_t> scratch(cuda::moe_grouped_scratch_bytes(w, T, k));
      scratch.poison();
      cuda::moe_grouped_accumulate(w, dx.get(), T, k, scratch.get(), dout.get(), nullptr, 0, nullptr, kernels);
      CUDA_OK(cudaDeviceSynchronize());
      const auto got = dout.download();

      // Per token: a token whose output is far off had an expert flip (near-tie); count those.
      int skipped = 0;
      double diff = 0, ref = 0;
      for (int t = 0; t < T; ++t) {
        double d = 0, r = 0;
        for (int h = 0; h < H; ++h) {
          d = std::max(
              d, double(std::fabs(got[static_cast<size_t>(t) * H + h] - expected[static_cast<size_t>(t) * H + h])));
          r = std::max(r, double(std::fabs(expected[static_cast<size_t>(t) * H + h])));
        }
        if (std::isnan(d) || d > 5 * kTolerance * r) {
          ++skipped;
          continue;
        }
        diff = std::max(diff, d), ref = std::max(ref, r);
      }
      EXPECT_LE(skipped, std::max(1, T / 50)) << "tokens far from the CPU result (expert flips?)";
      // Two bf16 roundings of the inputs (x into gate/up, act into down) against fp32 throughout.
      EXPECT_LT(diff, 2 * kTolerance * ref) << "max |gpu - cpu| / max |cpu| = " << diff / ref;
    }
}

// The route of a short pass in one launch (moe/moe_route_rows.h): x, logits and the shared
// gate's logit against cpu::rms_norm and cpu::linear (fp32 both sides), T across 1..16.
TEST(CudaMoeGrouped, RouteRows) {
  REQUIRE_GPU();
  for (const auto& [E, H] : {std::pair{16, 128}, std::pair{256, 2048}, std::pair{7, 64}})
    for (int T : {1, 2, 9, 16}) {
      SCOPED_TRACE(testing::Message() << "E " << E << " H " << H << " T " << T);
      const TestMoe m(E, H, 64, 64, uint32_t(E + H + T), 0.5f);
      const cuda::GpuMoe w = m.gpu();
      ASSERT_TRUE(cuda::moe_route_rows_supports(w));
      const auto h = random_floats(size_t(T) * H, uint32_t(T * 3 + 1), 2.f);
      auto gain = random_floats(size_t(H), uint32_t(T * 3 + 2), 0.2f);
      for (auto& g : gain) g += 1.f;
      std::vector<float> x(h.size()), logits(size_t(T) * E), sg(static_cast<size_t>(T));
      cpu::rms_norm(h.data(), gain.data(), T, H, 1e-6f, x.data());
      cpu::linear(m.router.cpu(), x.data(), T, logits.data());
      cpu::linear(m.egate.cpu(), x.data(), T, sg.data());

      DeviceArray<float> dh(h), dgain(gain), dx(h.size()), dlogits(logits.size()), dsg(sg.size());
      dx.poison(), dlogits.poison(), dsg.poison();
      cuda::moe_route_rows(w, dh.get(), T, dgain.get(), 1e-6f, dx.get(), dlogits.get(), dsg.get(), nullptr);
      CUDA_OK(cudaDeviceSynchronize());
      EXPECT_LT(relative_error(dx.download(), x), 1e-5);
      EXPECT_LT(relative_error(dlogits.download(), logits), 1e-4);
      EXPECT_LT(relative_error(dsg.download(), sg), 1e-4);
    }
}

// moe_topk_plan is moe_topk then moe_plan, bit for bit.
TEST(CudaMoeGrouped, TopkPlanIsTopkThenPlan) {
  REQUIRE_GPU();
  for (int T : {1, 5, 16, 32}) {
    SCOPED_TRACE(testing::Message() << "T " << T);
    const int E = 256, k = 8, P = T * k;
    const auto logits = random_floats(size_t(T) * E, uint32_t(T + 77), 3.f);
    DeviceArray<float> dlogits(logits);
    struct Out {
      DeviceArray<int32_t> ids, offsets, sorted, position, tiles, num, chunk_counts;
      DeviceArray<float> weights;
      cuda::MoePlan plan;
      Out(int P, int E)
          : ids(size_t(P)),
            offsets(size_t(E + 1)),
            sorted(size_t(P)),
            position(size_t(P)),
            tiles(size_t(cuda::moe_max_tiles(P, E, 16)) * 4),
            num(1),
            chunk_counts(size_t(cuda::moe_plan_chunks(P)) * E),
            weights(size_t(P)) {
        for (auto* a : {&ids, &offsets, &sorted, &position, &tiles, &num, &chunk_counts}) a->poison();
        weights.poison();
        plan.offsets = offsets.get(), plan.sorted = sorted.get(), plan.position = position.get();
        plan.tiles = tiles.get(), plan.num_tiles = num.get(), plan.tile_rows = 16;
        plan.chunk_counts = chunk_counts.get();
        plan.max_tiles = cuda::moe_max_tiles(P, E, 16);
      }
    } a(P, E), b(P, E);
    cuda::moe_topk(dlogits.get(), T, E, k, a.ids.get(), a.weights.get(), nullptr);
    cuda::moe_plan(a.ids.get(), T, k, E, a.plan, nullptr);
    cuda::moe_topk_plan(dlogits.get(), T, k, E, b.ids.get(), b.weights.get(), b.plan, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    EXPECT_EQ(a.ids.download(), b.ids.download());
    EXPECT_EQ(a.weights.download(), b.weights.download());
    EXPECT_EQ(a.offsets.download(), b.offsets.download());
    EXPECT_EQ(a.sorted.download(), b.sorted.download());
    EXPECT_EQ(a.position.download(), b.position.download());
    const auto num = a.num.download();
    ASSERT_EQ(num, b.num.download());
    auto ta = a.tiles.download(), tb = b.tiles.download();
    ta.resize(size_t(num[0]) * 4), tb.resize(size_t(num[0]) * 4);
    EXPECT_EQ(ta, tb);
  }
}

// The whole block of a short pass (moe_rows_accumulate: the norm and route in one launch, top-k
// with the plan, the experts on gemv_rows) against cpu::rms_norm + cpu::sparse_moe, T 1..16.
TEST(CudaMoeGrouped, ShortPassBlockMatchesCpu) {
  REQUIRE_GPU();
  const int E = 16, k = 4, H = 128, I = 64, Is = 128;
  const TestMoe m(E, H, I, Is, 21, 0.5f);
  MoeWeights cw = m.cpu();
  ModelConfig c;
  c.hidden_size = H, c.num_experts = E, c.num_experts_per_tok = k, c.moe_intermediate_size = I;
  c.shared_expert_intermediate_size = Is;
  const cuda::GpuMoe w = m.gpu();
  ASSERT_TRUE(cuda::moe_rows_supports(w) && cuda::moe_route_rows_supports(w));
  for (int T : {1, 2, 7, 9, 16}) {
    SCOPED_TRACE(testing::Message() << "T " << T);
    const auto h = random_floats(size_t(T) * H, uint32_t(T + 5), 2.f);
    auto gain = random_floats(size_t(H), uint32_t(T + 6), 0.2f);
    for (auto& g : gain) g += 1.f;
    std::vector<float> x(h.size()), moe(h.size()), expected(h);
    cpu::rms_norm(h.data(), gain.data(), T, H, 1e-6f, x.data());
    cpu::sparse_moe(cw, c, x.data(), T, moe.data());
    for (size_t i = 0; i < expected.size(); ++i) expected[i] += moe[i];

    DeviceArray<float> dh(h), dgain(gain), dx(h.size());
    DeviceArray<uint8_t> scratch(cuda::moe_grouped_scratch_bytes(w, T, k, 16));
    scratch.poison(), dx.poison();
    cuda::moe_rows_accumulate(w, dh.get(), dgain.get(), 1e-6f, T, k, scratch.get(), dx.get(), nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    EXPECT_LT(relative_error(dx.download(), x), 1e-5);
    const auto got = dh.download();
    double diff = 0, ref = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      diff = std::max(diff, std::isfinite(got[i]) ? double(std::fabs(got[i] - expected[i])) : INFINITY);
      ref = std::max(ref, double(std::fabs(moe[i])));
    }
    // The MoE's part of h: two bf16 roundings of the inputs against fp32 throughout.
    EXPECT_LT(diff, 2 * kTolerance * ref) << "max |gpu - cpu| / max |cpu moe| = " << diff / ref;
  }
}

}  // namespace
}  // namespace lily::test
