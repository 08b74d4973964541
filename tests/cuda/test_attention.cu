// test_attention.cu: the gated attention cores (attention/attention_decode.h,
// attention/attention_prefill.h: both prefill kernels by name) against a host reference built from
// backend/cpu (rms_norm, apply_rope) with the cache rounded to bf16 as the GPU stores it: decode at
// lengths on both sides of the split-KV threshold, prefill at several positions, and prefill then
// decode with the cache carried. Outputs are poisoned before each launch; the written cache rows
// are compared too.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <optional>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cuda/attention/attention_decode.h"
#include "backend/cuda/attention/attention_prefill.h"
#include "cuda_test_util.h"

namespace lily::test {
namespace {

constexpr int kD = 256, kRot = 64;
constexpr float kTheta = 1e7f, kEps = 1e-6f;
constexpr double kOutTolerance = 2e-3;  // decode: same bf16 K/V on both sides; fp32 arithmetic
// Prefill (T > 1) on the tensor cores also rounds the prepared queries and the softmax weights
// to bf16 (flash_prefill_kernel): ~1e-3 relative in the scores' exponent and in each weight.
constexpr double kPrefillOutTolerance = 5e-3;
constexpr double kCacheTolerance = 1e-2;  // one bf16 rounding step

struct Attn {
  int nq, nkv, capacity;
  std::vector<float> q_norm, k_norm;
  std::vector<float> kc, vc;  // host cache [capacity, nkv, 256], bf16-rounded values
  Attn(int nq_, int nkv_, int capacity_, uint32_t seed)
      : nq(nq_), nkv(nkv_), capacity(capacity_), kc(size_t(capacity_) * nkv_ * kD), vc(kc.size()) {
    q_norm = random_floats(kD, seed, 0.2f);
    k_norm = random_floats(kD, seed + 1, 0.2f);
    for (auto& g : q_norm) g += 1.f;
    for (auto& g : k_norm) g += 1.f;
  }
  // Fills rows [0, P) with random bf16 keys and values (as if cached earlier).
  void fill(int P, uint32_t seed) {
    auto k = random_floats(size_t(P) * nkv * kD, seed, 2.f), v = random_floats(size_t(P) * nkv * kD, seed + 1);
    for (size_t i = 0; i < k.size(); ++i) kc[i] = round_bf16(k[i]), vc[i] = round_bf16(v[i]);
  }
};

struct Inputs {
  std::vector<float> qg, k, v;
  Inputs(const Attn& a, int T, uint32_t seed)
      : qg(random_floats(size_t(T) * a.nq * 2 * kD, seed)),
        k(random_floats(size_t(T) * a.nkv * kD, seed + 1)),
        v(random_floats(size_t(T) * a.nkv * kD, seed + 2)) {}
};

// Host reference (spec §2.4): appends T rows at P to the host cache; returns out [T, nq, 256].
std::vector<float> reference(Attn& a, int P, int T, const Inputs& in) {
  const int group = a.nq / a.nkv;
  std::vector<float> q(size_t(T) * a.nq * kD), gate(q.size()), k(in.k);
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < a.nq; ++h)
      for (int e = 0; e < kD; ++e) {
        q[(size_t(t) * a.nq + h) * kD + e] = in.qg[(size_t(t) * a.nq + h) * 2 * kD + e];
        gate[(size_t(t) * a.nq + h) * kD + e] = in.qg[(size_t(t) * a.nq + h) * 2 * kD + kD + e];
      }
  cpu::rms_norm(q.data(), a.q_norm.data(), int64_t(T) * a.nq, kD, kEps, q.data());
  cpu::rms_norm(k.data(), a.k_norm.data(), int64_t(T) * a.nkv, kD, kEps, k.data());
  cpu::apply_rope(q.data(), T, a.nq, kD, kRot, kTheta, P);
  cpu::apply_rope(k.data(), T, a.nkv, kD, kRot, kTheta, P);
  for (size_t i = 0; i < k.size(); ++i) {
    a.kc[size_t(P) * a.nkv * kD + i] = round_bf16(k[i]);
    a.vc[size_t(P) * a.nkv * kD + i] = round_bf16(in.v[i]);
  }
  std::vector<float> out(q.size());
  std::vector<double> score;
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < a.nq; ++h) {
      const int g = h / group, L = P + t + 1;
      const float* qh = &q[(size_t(t) * a.nq + h) * kD];
      score.assign(size_t(L), 0.0);
      double m = -INFINITY;
      for (int j = 0; j < L; ++j) {
        const float* kj = &a.kc[(size_t(j) * a.nkv + g) * kD];
        double s = 0;
        for (int e = 0; e < kD; ++e) s += double(qh[e]) * kj[e];
        score[size_t(j)] = s / 16.0;
        m = std::max(m, score[size_t(j)]);
      }
      double sum = 0;
      for (auto& s : score) sum += (s = std::exp(s - m));
      for (int e = 0; e < kD; ++e) {
        double o = 0;
        for (int j = 0; j < L; ++j) o += score[size_t(j)] * a.vc[(size_t(j) * a.nkv + g) * kD + e];
        const size_t i = (size_t(t) * a.nq + h) * kD + e;
        out[i] = float(o / sum) * cpu::sigmoid(gate[i]);
      }
    }
  return out;
}

std::vector<bf16> to_bf16_vector(const std::vector<float>& x) {
  std::vector<bf16> r(x.size());
  for (size_t i = 0; i < x.size(); ++i) r[i] = to_bf16(x[i]);
  return r;
}
std::vector<float> to_float_vector(const std::vector<bf16>& x, size_t begin, size_t end) {
  std::vector<float> r;
  for (size_t i = begin; i < end; ++i) r.push_back(to_float(x[i]));
  return r;
}

struct GpuAttn {
  Attn& a;
  DeviceArray<float> q_norm, k_norm;
  DeviceArray<bf16> kc, vc;
  DeviceArray<int32_t> position{1};
  explicit GpuAttn(Attn& attn)
      : a(attn), q_norm(attn.q_norm), k_norm(attn.k_norm), kc(to_bf16_vector(attn.kc)), vc(to_bf16_vector(attn.vc)) {}

  cuda::AttentionParams params(int T) const {
    cuda::AttentionParams p;
    p.T = T, p.num_heads = a.nq, p.num_kv_heads = a.nkv, p.head_dim = kD, p.rotary_dim = kRot;
    p.rope_theta = kTheta, p.eps = kEps, p.q_norm = q_norm.get(), p.k_norm = k_norm.get();
    p.position = position.get(), p.capacity = a.capacity;
    return p;
  }

  // T = 1: the decode path (with its own scratch, zeroed once, unless one is given); T > 1: the
  // prefill kernel given, else the one the kernel plan would pick (flash where the group divides 64).
  std::vector<float> run(int P, int T, const Inputs& in, void* scratch = nullptr,
                         std::optional<cuda::AttentionPrefillKernel> kernel = std::nullopt) {
    position.upload({P});
    DeviceArray<float> qg(in.qg), k(in.k), v(in.v), out(size_t(T) * a.nq * kD);
    out.poison();
    const cuda::AttentionParams p = params(T);
    if (T == 1) {
      if (!scratch) {
        if (!own_scratch) {
          own_scratch = std::make_unique<DeviceArray<char>>(cuda::attention_decode_scratch_bytes(p));
          EXPECT_EQ(cudaMemset(own_scratch->get(), 0, own_scratch->size()), cudaSuccess);
        }
        scratch = own_scratch->get();
      }
      cuda::gated_attention_decode(p, qg.get(), k.get(), v.get(), kc.get(), vc.get(), out.get(), scratch, nullptr);
    } else {
      const auto pick = kernel ? *kernel
                        : cuda::attention_prefill_supports(cuda::AttentionPrefillKernel::flash, p)
                            ? cuda::AttentionPrefillKernel::flash
                            : cuda::AttentionPrefillKernel::simple;
      DeviceArray<char> prefill_scratch(std::max<size_t>(1, cuda::attention_prefill_scratch_bytes(pick, p)));
      prefill_scratch.poison();
      cuda::gated_attention_prefill(pick, p, qg.get(), k.get(), v.get(), kc.get(), vc.get(), out.get(), nullptr,
                                    prefill_scratch.get());
    }
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return out.download();
  }
  std::unique_ptr<DeviceArray<char>> own_scratch;
};

// Blocks of lengths Ts at positions P0, P0 + T0, ...: compares each output and the new cache rows.
void check_blocks(int nq, int nkv, int capacity, int P0, const std::vector<int>& Ts, uint32_t seed,
                  std::optional<cuda::AttentionPrefillKernel> kernel = std::nullopt) {
  Attn attn(nq, nkv, capacity, seed);
  attn.fill(P0, seed + 1);
  GpuAttn gpu(attn);
  int P = P0;
  for (size_t i = 0; i < Ts.size(); ++i) {
    const int T = Ts[i];
    Inputs in(attn, T, seed + 10 + uint32_t(i) * 3);
    const auto want = reference(attn, P, T, in);
    const auto got = gpu.run(P, T, in, nullptr, kernel);
    SCOPED_TRACE(testing::Message() << "nq " << nq << " nkv " << nkv << " position " << P << " T " << T);
    EXPECT_LT(relative_error(got, want), T == 1 ? kOutTolerance : kPrefillOutTolerance) << "out";
    const size_t begin = size_t(P) * nkv * kD, end = size_t(P + T) * nkv * kD;
    const std::vector<float> want_k(attn.kc.begin() + long(begin), attn.kc.begin() + long(end));
    const std::vector<float> want_v(attn.vc.begin() + long(begin), attn.vc.begin() + long(end));
    EXPECT_LT(relative_error(to_float_vector(gpu.kc.download(), begin, end), want_k), kCacheTolerance) << "k cache";
    EXPECT_LT(relative_error(to_float_vector(gpu.vc.download(), begin, end), want_v), kCacheTolerance) << "v cache";
    P += T;
  }
}

// Decode at lengths 1, 100, 1000 and beyond the split threshold (128 keys per split, 64 splits).
TEST(CudaAttention, DecodeSmall) {
  REQUIRE_GPU();
  for (int P : {0, 99, 999, 5000}) check_blocks(2, 1, P + 40, P, {1}, 1 + uint32_t(P));
}

TEST(CudaAttention, DecodeFull) {
  REQUIRE_GPU();
  for (int P : {0, 99, 127, 128, 999, 5000}) check_blocks(16, 2, P + 40, P, {1}, 2 + uint32_t(P));
}

// Many splits of 128 keys (94 of the 157 the capacity gives), repeated steps; and more keys
// than 512 splits x 128, where the splits grow (here 192 keys each).
TEST(CudaAttention, DecodeLongManySteps) {
  REQUIRE_GPU();
  check_blocks(16, 2, 20000, 12000, {1, 1, 1}, 3);
  check_blocks(16, 2, 70000, 69000, {1, 1}, 30);
}

// A small capacity means one split whatever the length.
TEST(CudaAttention, DecodeSmallCapacity) {
  REQUIRE_GPU();
  check_blocks(16, 2, 100, 98, {1, 1}, 4);
}

TEST(CudaAttention, PrefillSmall) {
  REQUIRE_GPU();
  for (int T : {2, 63, 64, 65, 200}) check_blocks(2, 1, 1024, 0, {T}, 5 + uint32_t(T));
}

TEST(CudaAttention, PrefillFull) {
  REQUIRE_GPU();
  for (int T : {2, 63, 65, 200}) check_blocks(16, 2, 1024, 0, {T}, 6 + uint32_t(T));
  check_blocks(16, 2, 2048, 900, {100}, 7);  // keys up to 1000
  check_blocks(16, 2, 2048, 37, {65}, 8);
}

// The flash prefill: many key tiles behind the block, a partial last block, every group size
// that divides its 64 rows (1, 2, 4, 8), and a group that does not (3: the simple kernel).
TEST(CudaAttention, PrefillLongAndGroups) {
  REQUIRE_GPU();
  check_blocks(16, 2, 4096, 3000, {300}, 20);     // 52 key tiles, 300 tokens (a partial last block)
  check_blocks(2, 2, 1024, 100, {130}, 21);       // group 1: 64 tokens per block
  check_blocks(8, 2, 1024, 0, {77}, 22);          // group 4
  check_blocks(6, 2, 1024, 10, {50}, 23);         // group 3: not a divisor of 64, simple kernel
  check_blocks(16, 2, 1100, 1000, {64, 36}, 24);  // up to the capacity, two passes
}

// The simple kernel where the flash one would run: group 8 (the model's) and 1.
TEST(CudaAttention, PrefillSimpleKernel) {
  REQUIRE_GPU();
  check_blocks(16, 2, 2048, 37, {65, 200}, 25, cuda::AttentionPrefillKernel::simple);
  check_blocks(2, 2, 1024, 100, {130}, 26, cuda::AttentionPrefillKernel::simple);
}

// The split kernel (short passes at depth): a few tokens over many keys in many splits, the
// last token's keys cut mid-split, splits past a token's keys empty, every group size, and a
// pass from an empty cache (one split with keys).
TEST(CudaAttention, PrefillSplitKernel) {
  REQUIRE_GPU();
  const auto split = cuda::AttentionPrefillKernel::split;
  for (int T : {2, 3, 8, 32}) check_blocks(16, 2, 8192, 4000, {T}, 40 + uint32_t(T), split);
  check_blocks(16, 2, 4096, 0, {2, 5, 32}, 45, split);     // from an empty cache, three passes
  check_blocks(16, 2, 2048, 2000, {33, 15}, 46, split);    // up to the capacity
  check_blocks(2, 2, 1024, 700, {4}, 47, split);           // group 1
  check_blocks(6, 2, 20000, 15000, {7, 1, 2}, 48, split);  // group 3, then decode, then again
  check_blocks(8, 1, 70000, 69000, {3}, 49, split);        // 69K keys, one KV head
}

TEST(CudaAttention, PrefillThenDecode) {
  REQUIRE_GPU();
  check_blocks(2, 1, 512, 0, {63, 1, 1, 1}, 9);
  check_blocks(16, 2, 4096, 0, {200, 1, 1, 7, 1}, 10);
  check_blocks(16, 2, 4096, 0, {1, 1, 2, 1}, 11);  // decode from an empty cache
}

// One scratch for the decode steps of several caches (the backend's, sized for any capacity): its
// counters come back to zero after every step.
TEST(CudaAttention, DecodeScratchSharedAcrossCaches) {
  REQUIRE_GPU();
  Attn attn(16, 2, 3000, 12);
  attn.fill(2500, 13);
  GpuAttn gpu(attn);
  cuda::AttentionParams p;
  p.num_heads = 16, p.num_kv_heads = 2, p.capacity = 1 << 22;
  DeviceArray<char> scratch(cuda::attention_decode_scratch_bytes(p));
  CUDA_OK(cudaMemset(scratch.get(), 0, scratch.size()));
  for (int step = 0; step < 2; ++step) {
    Inputs in(attn, 1, 14 + uint32_t(step));
    const auto want = reference(attn, 2500 + step, 1, in);
    EXPECT_LT(relative_error(gpu.run(2500 + step, 1, in, scratch.get()), want), kOutTolerance);
  }
}

// A batch step (gated_attention_decode_rows): one new token of each of N sequences, each over its
// own cache, length and capacity (lengths 0, 1, 63, 64, 65, 700 and one at capacity - 1), against
// the host reference row by row; outputs poisoned, every row's appended cache row compared. N = 1
// and the full set, then the full set again one step later (the tables unchanged, each position
// advanced by the test as the batch step's advance_positions would).
TEST(CudaAttention, RowsOfSeveralSequences) {
  REQUIRE_GPU();
  const int nq = 16, nkv = 2;
  const std::vector<std::pair<int, int>> shapes = {{0, 64},   {1, 130},    {63, 512},   {64, 512},
                                                   {65, 100}, {700, 4096}, {4099, 4100}};  // (length, capacity)
  for (size_t N : {size_t(1), shapes.size()}) {
    SCOPED_TRACE(testing::Message() << N << " rows");
    std::vector<std::unique_ptr<Attn>> attn;
    std::vector<std::unique_ptr<GpuAttn>> gpu;
    std::vector<int> P;
    for (size_t r = 0; r < N; ++r) {
      attn.push_back(std::make_unique<Attn>(nq, nkv, shapes[r].second, 40));  // one layer: the same norms
      attn[r]->fill(shapes[r].first, 50 + uint32_t(r));
      gpu.push_back(std::make_unique<GpuAttn>(*attn[r]));
      P.push_back(shapes[r].first);
    }
    // The tables, as batch_rows.h lays them out for one layer.
    std::vector<int32_t*> positions;
    std::vector<int32_t> capacities;
    std::vector<bf16*> k_caches, v_caches;
    for (size_t r = 0; r < N; ++r) {
      positions.push_back(gpu[r]->position.get()), capacities.push_back(shapes[r].second);
      k_caches.push_back(gpu[r]->kc.get()), v_caches.push_back(gpu[r]->vc.get());
    }
    DeviceArray<int32_t*> d_positions(positions);
    DeviceArray<int32_t> d_capacities(capacities);
    DeviceArray<bf16*> d_k(k_caches), d_v(v_caches);
    const cuda::AttentionRows rows{d_positions.get(), d_capacities.get(), d_k.get(), d_v.get()};
    cuda::AttentionParams p = gpu[0]->params(1);
    p.position = nullptr, p.capacity = 1;  // not read: the rows' own come from the tables
    DeviceArray<char> scratch(cuda::attention_decode_rows_scratch_bytes(p, int(N)));
    scratch.poison();
    for (int step = 0; step < 2; ++step) {
      std::vector<Inputs> in;
      std::vector<float> qg, k, v, want;
      for (size_t r = 0; r < N; ++r) {
        in.emplace_back(*attn[r], 1, 60 + uint32_t(r) * 3 + uint32_t(step) * 100);
        gpu[r]->position.upload({P[r]});
        qg.insert(qg.end(), in[r].qg.begin(), in[r].qg.end());
        k.insert(k.end(), in[r].k.begin(), in[r].k.end());
        v.insert(v.end(), in[r].v.begin(), in[r].v.end());
        const auto w = reference(*attn[r], P[r], 1, in[r]);
        want.insert(want.end(), w.begin(), w.end());
      }
      DeviceArray<float> d_qg(qg), d_kin(k), d_vin(v), out(want.size());
      out.poison();
      cuda::gated_attention_decode_rows(p, rows, int(N), d_qg.get(), d_kin.get(), d_vin.get(), out.get(), scratch.get(),
                                        nullptr);
      CUDA_OK(cudaDeviceSynchronize());
      const std::vector<float> got = out.download();
      const size_t row = size_t(nq) * kD;
      for (size_t r = 0; r < N; ++r) {
        SCOPED_TRACE(testing::Message() << "row " << r << " length " << P[r] << " capacity " << shapes[r].second
                                        << " step " << step);
        const std::vector<float> g(got.begin() + long(r * row), got.begin() + long((r + 1) * row)),
            w(want.begin() + long(r * row), want.begin() + long((r + 1) * row));
        EXPECT_LT(relative_error(g, w), kOutTolerance) << "out";
        const size_t begin = size_t(P[r]) * nkv * kD, end = begin + size_t(nkv) * kD;
        const std::vector<float> want_k(attn[r]->kc.begin() + long(begin), attn[r]->kc.begin() + long(end));
        EXPECT_LT(relative_error(to_float_vector(gpu[r]->kc.download(), begin, end), want_k), kCacheTolerance)
            << "k cache";
        EXPECT_EQ(gpu[r]->position.download()[0], P[r]) << "the kernel must not move the position";
      }
      for (size_t r = 0; r < N; ++r) P[r] = std::min(P[r] + 1, shapes[r].second - 1);
      // A row that reached its capacity - 1 (the last) stays at its last position: its step
      // writes that row again, as the reference does.
    }
  }
}

}  // namespace
}  // namespace lily::test
