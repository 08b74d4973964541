// test_persistent_attention.cu: the persistent kernel's attention tasks (persistent/ops_attention.cuh)
// against an fp32 reference written here (the oracle's attention_split + attention_combine of
// test_decode_tasks_on_cpu.cpp, with the caches in bf16 as the GPU keeps them). Test kernels run
// the tasks on a StepArgs holding only what they read: a block of 512 threads a split task (split
// s of all KV heads, or of one KV head each), then a launch of combine tasks (heads [first, first +
// count) each). Random bf16 cache rows
// [0, n), random proj rows (odd strides), the cache rows past n, partials and mixer poisoned with
// NaN; an empty split must write l = 0 or the combine reads NaN. Checked: the mixer within 2e-4 of
// the largest reference value, the appended K rows within a bf16 step, V rows exact, every other
// cache row untouched. Sizes: nq/nkv 16/2 (the model) and 2/1, S 64 and 5, n 0, 1, 63, 64, 65,
// 300, 4096, T = 1, and T = 3 and 8 verify rows at a few n.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cuda/persistent/ops_attention.cuh"
#include "backend/cuda/persistent/step_args.h"
#include "cuda_test_util.h"

namespace lily::test {
namespace {

namespace ps = cuda::persistent;

constexpr int kD = 256, kRot = 64, kLayer = 1;
constexpr float kTheta = 1e7f, kEps = 1e-6f;
constexpr double kTolerance = 2e-4;
constexpr uint16_t kPoison = 0xFFFF;  // a bf16 NaN

__global__ void __launch_bounds__(ps::kThreads, 1)
    split_kernel(const __grid_constant__ ps::StepArgs a, const ps::DeviceTask* tasks) {
  extern __shared__ __align__(16) unsigned char smem[];
  if (threadIdx.x == 0) ps::trace_row = nullptr;  // no trace marks (the kernel's per-task row)
  __syncthreads();
  ps::attention_split_task(a, tasks[blockIdx.x], smem);
}

__global__ void __launch_bounds__(ps::kThreads, 1)
    combine_kernel(const __grid_constant__ ps::StepArgs a, const ps::DeviceTask* tasks) {
  extern __shared__ __align__(16) unsigned char smem[];
  ps::attention_combine_task(a, tasks[blockIdx.x], smem);
}

struct Case {
  int nq, nkv, S, n, T;
  int combine_heads = 1;   // heads a combine task
  int split_kv_heads = 0;  // KV heads a split task (0: all)
};

float bf16_float(uint16_t b) { return to_float(bf16{b}); }

void check(const Case& c, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "nq " << c.nq << " nkv " << c.nkv << " S " << c.S << " n " << c.n << " T " << c.T
                                  << " combine heads " << c.combine_heads << " split KV heads " << c.split_kv_heads);
  const int nq = c.nq, nkv = c.nkv, G = nq / nkv, n = c.n, T = c.T, capacity = n + T + 3;
  const int proj_stride = 2 * nq * kD + 2 * nkv * kD + 5, mixer_stride = nq * kD + 3;  // odd padding
  const size_t kv = size_t(nkv) * kD;
  std::vector<float> q_norm = random_floats(kD, seed, 0.2f), k_norm = random_floats(kD, seed + 1, 0.2f);
  for (auto& g : q_norm) g += 1.f;
  for (auto& g : k_norm) g += 1.f;
  const std::vector<float> proj = random_floats(size_t(T) * proj_stride, seed + 2);
  std::vector<uint16_t> kc(size_t(capacity) * kv, kPoison), vc(kc.size(), kPoison);
  {
    const std::vector<float> k = random_floats(size_t(n) * kv, seed + 3, 2.f),
                             v = random_floats(size_t(n) * kv, seed + 4);
    for (size_t i = 0; i < k.size(); ++i) kc[i] = to_bf16(k[i]).bits, vc[i] = to_bf16(v[i]).bits;
  }

  DeviceArray<float> d_q_norm(q_norm), d_k_norm(k_norm), d_proj(proj);
  DeviceArray<uint16_t> d_kc(kc), d_vc(vc);
  DeviceArray<int32_t> d_position(std::vector<int32_t>{n});
  DeviceArray<float> d_partials(size_t(T) * c.S * nq * (kD + 2)), d_mixer(size_t(T) * mixer_stride);
  d_partials.poison();
  d_mixer.poison();
  std::vector<ps::DeviceLayer> layers(kLayer + 1);
  layers[kLayer].attention = 1, layers[kLayer].q_norm = d_q_norm.get(), layers[kLayer].k_norm = d_k_norm.get();
  DeviceArray<ps::DeviceLayer> d_layers(layers);

  ps::StepArgs a;
  a.layers = d_layers.get();
  a.dims.T = T, a.dims.nq = nq, a.dims.nkv = nkv, a.dims.splits = c.S, a.dims.head_dim = kD, a.dims.rotary_dim = kRot;
  a.dims.rope_theta = kTheta, a.dims.eps = kEps, a.dims.proj_stride = proj_stride, a.dims.mixer_stride = mixer_stride;
  a.buf.proj = d_proj.get(), a.buf.mixer = d_mixer.get(), a.buf.partials = d_partials.get();
  a.seq.position = d_position.get(), a.seq.capacity = capacity;
  a.seq.k_cache[kLayer] = d_kc.get(), a.seq.v_cache[kLayer] = d_vc.get();

  std::vector<ps::DeviceTask> splits, combines;
  const int per_split = c.split_kv_heads > 0 ? c.split_kv_heads : nkv;
  for (int s = 0; s < c.S; ++s)
    for (int g = 0; g < nkv; g += per_split) {
      ps::DeviceTask t;
      t.layer = kLayer, t.row = 0, t.rows = uint16_t(T), t.first = uint32_t(s), t.slot = uint16_t(g);
      t.count = uint32_t(std::min(per_split, nkv - g));
      splits.push_back(t);
    }
  for (int h = 0; h < nq; h += c.combine_heads) {
    ps::DeviceTask t;
    t.layer = kLayer, t.row = 0, t.rows = uint16_t(T), t.first = uint32_t(h);
    t.count = uint32_t(std::min(c.combine_heads, nq - h));
    combines.push_back(t);
  }
  DeviceArray<ps::DeviceTask> d_splits(splits), d_combines(combines);
  CUDA_OK(cudaFuncSetAttribute(split_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, ps::kScratchBytes));
  CUDA_OK(cudaFuncSetAttribute(combine_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, ps::kScratchBytes));
  split_kernel<<<unsigned(splits.size()), ps::kThreads, ps::kScratchBytes>>>(a, d_splits.get());
  CUDA_OK(cudaGetLastError());
  combine_kernel<<<unsigned(combines.size()), ps::kThreads, ps::kScratchBytes>>>(a, d_combines.get());
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaDeviceSynchronize());
  const std::vector<uint16_t> got_k = d_kc.download(), got_v = d_vc.download();
  const std::vector<float> got_mixer = d_mixer.download();

  // The appended rows: k normed and rotated at n + r, both rounded to bf16.
  std::vector<float> k_new(size_t(T) * kv), v_new(k_new.size());
  for (int r = 0; r < T; ++r) {
    const float* row = proj.data() + size_t(r) * proj_stride + 2 * nq * kD;
    cpu::rms_norm(row, k_norm.data(), nkv, kD, kEps, k_new.data() + r * kv);
    cpu::apply_rope(k_new.data() + r * kv, 1, nkv, kD, kRot, kTheta, n + r);
    for (size_t i = 0; i < kv; ++i) v_new[r * kv + i] = round_bf16(row[kv + i]);
  }
  std::vector<float> got_k_new(k_new.size()), got_v_new(k_new.size());
  for (size_t i = 0; i < k_new.size(); ++i) {
    got_k_new[i] = bf16_float(got_k[size_t(n) * kv + i]);
    got_v_new[i] = bf16_float(got_v[size_t(n) * kv + i]);
  }
  EXPECT_LE(relative_error(got_k_new, k_new), 1e-2) << "appended K rows";
  EXPECT_EQ(got_v_new, v_new) << "appended V rows";
  size_t changed = 0;  // every other row as it was (the cached rows and the poisoned ones past the step)
  for (size_t i = 0; i < kc.size(); ++i)
    if (i / kv < size_t(n) || i / kv >= size_t(n + T)) changed += got_k[i] != kc[i] || got_v[i] != vc[i];
  EXPECT_EQ(changed, 0u) << "cache values changed outside the appended rows";

  // The reference attention over the bf16 cache; the new rows' K as the GPU stored it (checked
  // above to a bf16 step), so that a rounding step there does not count as an attention error.
  std::vector<float> K(size_t(n + T) * kv), V(K.size());
  for (size_t i = 0; i < K.size(); ++i) K[i] = bf16_float(got_k[i]), V[i] = bf16_float(got_v[i]);
  std::vector<float> want(size_t(T) * nq * kD), got(want.size()), q(kD);
  std::vector<double> score, o(kD);
  for (int r = 0; r < T; ++r)
    for (int h = 0; h < nq; ++h) {
      const float* row = proj.data() + size_t(r) * proj_stride + size_t(h) * 2 * kD;
      cpu::rms_norm(row, q_norm.data(), 1, kD, kEps, q.data());
      cpu::apply_rope(q.data(), 1, 1, kD, kRot, kTheta, n + r);
      const int g = h / G, keys = n + r + 1;
      score.assign(size_t(keys), 0.0);
      double m = -INFINITY, l = 0;
      for (int j = 0; j < keys; ++j) {
        for (int e = 0; e < kD; ++e) score[size_t(j)] += double(q[size_t(e)]) * K[size_t(j) * kv + g * kD + e];
        score[size_t(j)] /= 16.0;
        m = std::max(m, score[size_t(j)]);
      }
      std::fill(o.begin(), o.end(), 0.0);
      for (int j = 0; j < keys; ++j) {
        const double p = std::exp(score[size_t(j)] - m);
        l += p;
        for (int e = 0; e < kD; ++e) o[size_t(e)] += p * V[size_t(j) * kv + g * kD + e];
      }
      for (int e = 0; e < kD; ++e) {
        const size_t at = (size_t(r) * nq + h) * kD + e;
        want[at] = float(o[size_t(e)] / l) * cpu::sigmoid(row[kD + e]);
        got[at] = got_mixer[size_t(r) * mixer_stride + size_t(h) * kD + e];
      }
    }
  const double err = relative_error(got, want);
  EXPECT_LE(err, kTolerance) << "mixer: max error " << err << " of the largest |reference|";
}

TEST(PersistentAttention, ModelHeadsT1) {
  REQUIRE_GPU();
  uint32_t seed = 100;
  for (int S : {64, 5})
    for (int n : {0, 1, 63, 64, 65, 300, 4096}) check({16, 2, S, n, 1}, seed += 10);
}

TEST(PersistentAttention, SmallHeadsT1) {
  REQUIRE_GPU();
  uint32_t seed = 200;
  for (int S : {64, 5})
    for (int n : {0, 1, 63, 64, 65, 300, 4096}) check({2, 1, S, n, 1}, seed += 10);
}

TEST(PersistentAttention, VerifyRows) {
  REQUIRE_GPU();
  uint32_t seed = 300;
  for (int S : {64, 5})
    for (int n : {0, 65, 300}) {
      check({16, 2, S, n, 3}, seed += 10);
      check({2, 1, S, n, 3}, seed += 10);
    }
  check({16, 2, 64, 300, 8}, seed += 10);  // 16 units: two passes
  check({2, 1, 5, 63, 8}, seed += 10);
}

// Split tasks of one KV head each (the persistent kernel's tiling): each appends and attends for
// its own KV head and query heads only.
TEST(PersistentAttention, SplitTasksOfOneKvHead) {
  REQUIRE_GPU();
  uint32_t seed = 500;
  for (int n : {0, 65, 4096}) check({16, 2, 64, n, 1, 1, 1}, seed += 10);
  check({16, 2, 5, 300, 3, 1, 1}, seed += 10);
  check({16, 2, 64, 300, 8, 2, 1}, seed += 10);
}

TEST(PersistentAttention, CombineTasksOfSeveralHeads) {
  REQUIRE_GPU();
  check({16, 2, 64, 300, 1, 3}, 400);  // rounds of 3 (row, head) pairs and a last of 1
  check({16, 2, 5, 65, 3, 16}, 410);   // 48 pairs: 12 rounds of 4
  check({2, 1, 64, 4096, 3, 2}, 420);
}

}  // namespace
}  // namespace lily::test
