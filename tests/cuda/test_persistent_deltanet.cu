// test_persistent_deltanet.cu: the persistent kernel's DeltaNet task (persistent/ops_deltanet.cuh)
// against the recurrence written out on the host (the task's formulas: l2 norms of u_q and u_k, the
// gates, the delta rule per column; fp64 sums), on random u, gates and state: a test kernel of one
// 512-thread block a task runs deltanet_core_task on a StepArgs holding only what the task reads.
// Rows of proj and mixer are strided (odd padding), the mixer poisoned with NaN before the launch;
// o (every row) and the state after the step within 1e-4 of the largest reference value. Sizes: the
// model's Hk 16 / Hv 32 and lily-tiny's 2 / 4; T = 1, 3 and 8 verify rows; tasks of 16 and 32
// columns, a whole head and two heads.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/cuda/persistent/ops_deltanet.cuh"
#include "backend/cuda/persistent/step_args.h"
#include "cuda_test_util.h"

namespace lily::test {
namespace {

namespace ps = cuda::persistent;

constexpr int kD = 128;
constexpr double kTolerance = 1e-4;

__global__ void __launch_bounds__(ps::kThreads, 1)
    deltanet_task_kernel(const __grid_constant__ ps::StepArgs a, const ps::DeviceTask* tasks) {
  extern __shared__ __align__(16) unsigned char smem[];
  ps::deltanet_core_task(a, tasks[blockIdx.x], smem);
}

struct Case {
  int Hk, Hv, columns, T;  // columns: a task's
};

double sigmoid(double x) { return 1 / (1 + std::exp(-x)); }
double softplus(double x) { return x > 20 ? x : std::log1p(std::exp(x)); }

// The rows in order on `ssm` [Hv, 128, 128]; o into mixer rows.
void reference(const Case& k, const std::vector<float>& proj, int proj_stride, const std::vector<float>& A_log,
               const std::vector<float>& dt_bias, std::vector<float>& ssm, std::vector<float>& mixer,
               int mixer_stride) {
  const int key_dim = k.Hk * kD, C = 2 * key_dim + k.Hv * kD, b0 = C + k.Hv * kD, a0 = b0 + k.Hv;
  for (int t = 0; t < k.T; ++t) {
    const float* p = proj.data() + size_t(t) * proj_stride;
    for (int h = 0; h < k.Hv; ++h) {
      const int kh = h / (k.Hv / k.Hk);
      std::vector<double> q(kD), kk(kD);
      double sq = 0, sk = 0;
      for (int i = 0; i < kD; ++i) {
        q[size_t(i)] = p[kh * kD + i], kk[size_t(i)] = p[key_dim + kh * kD + i];
        sq += q[size_t(i)] * q[size_t(i)], sk += kk[size_t(i)] * kk[size_t(i)];
      }
      for (int i = 0; i < kD; ++i) q[size_t(i)] /= std::sqrt(sq + 1e-6) * std::sqrt(double(kD));
      for (int i = 0; i < kD; ++i) kk[size_t(i)] /= std::sqrt(sk + 1e-6);
      const double beta = sigmoid(p[b0 + h]);
      const double alpha = std::exp(-std::exp(double(A_log[size_t(h)])) * softplus(p[a0 + h] + dt_bias[size_t(h)]));
      float* S = ssm.data() + size_t(h) * kD * kD;
      for (int j = 0; j < kD; ++j) {
        double m = 0;
        for (int i = 0; i < kD; ++i) m += alpha * S[i * kD + j] * kk[size_t(i)];
        const double delta = beta * (p[2 * key_dim + h * kD + j] - m);
        double o = 0;
        for (int i = 0; i < kD; ++i) {
          S[i * kD + j] = float(alpha * S[i * kD + j] + kk[size_t(i)] * delta);
          o += double(S[i * kD + j]) * q[size_t(i)];
        }
        mixer[size_t(t) * mixer_stride + h * kD + j] = float(o);
      }
    }
  }
}

void check(const Case& k, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "Hk " << k.Hk << " Hv " << k.Hv << " columns " << k.columns << " T " << k.T);
  const int Hv = k.Hv, C = 2 * k.Hk * kD + Hv * kD, width = Hv * kD;
  const int proj_stride = C + width + 2 * Hv + 5, mixer_stride = width + 3;  // odd padding
  const std::vector<float> A_log = random_floats(size_t(Hv), seed + 1, 0.5f);
  const std::vector<float> dt_bias = random_floats(size_t(Hv), seed + 2, 0.5f);
  const std::vector<float> ssm0 = random_floats(size_t(Hv) * kD * kD, seed + 5, 0.1f);
  const std::vector<float> proj = random_floats(size_t(k.T) * proj_stride, seed + 6);
  std::vector<float> want_ssm = ssm0, want_mixer(size_t(k.T) * mixer_stride, 0.f);
  reference(k, proj, proj_stride, A_log, dt_bias, want_ssm, want_mixer, mixer_stride);

  DeviceArray<float> d_A_log(A_log), d_dt_bias(dt_bias), ssm(ssm0), d_proj(proj), mixer(want_mixer.size());
  mixer.poison();
  ps::DeviceLayer layer;
  layer.A_log = d_A_log.get(), layer.dt_bias = d_dt_bias.get();
  DeviceArray<ps::DeviceLayer> layers(std::vector<ps::DeviceLayer>{layer});
  ps::StepArgs a;
  a.layers = layers.get();
  a.dims.T = k.T, a.dims.Hk = k.Hk, a.dims.Hv = Hv, a.dims.proj_stride = proj_stride,
  a.dims.mixer_stride = mixer_stride;
  a.buf.proj = d_proj.get(), a.buf.mixer = mixer.get();
  a.seq.ssm[0] = ssm.get();
  std::vector<ps::DeviceTask> tasks;
  for (int c = 0; c < width; c += k.columns) {
    ps::DeviceTask t;
    t.first = uint32_t(c), t.count = uint32_t(std::min(k.columns, width - c)), t.row = 0, t.rows = uint16_t(k.T);
    tasks.push_back(t);
  }
  DeviceArray<ps::DeviceTask> d_tasks(tasks);
  ASSERT_EQ(cudaFuncSetAttribute(deltanet_task_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, ps::kScratchBytes),
            cudaSuccess);
  deltanet_task_kernel<<<unsigned(tasks.size()), ps::kThreads, ps::kScratchBytes>>>(a, d_tasks.get());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> got = mixer.download(), want;
  std::vector<float> got_o;  // the written columns only (the padding stays poisoned)
  for (int t = 0; t < k.T; ++t)
    for (int c = 0; c < width; ++c) {
      got_o.push_back(got[size_t(t) * mixer_stride + c]);
      want.push_back(want_mixer[size_t(t) * mixer_stride + c]);
    }
  EXPECT_LT(relative_error(got_o, want), kTolerance) << "o";
  EXPECT_LT(relative_error(ssm.download(), want_ssm), kTolerance) << "state";
}

TEST(CudaPersistentDeltaNet, ModelHeads) {
  REQUIRE_GPU();
  check({16, 32, 32, 1}, 10);
  check({16, 32, 32, 3}, 11);
  check({16, 32, 128, 1}, 12);
}

TEST(CudaPersistentDeltaNet, TinyHeadsAndOddTasks) {
  REQUIRE_GPU();
  check({2, 4, 32, 8}, 20);
  check({2, 4, 16, 3}, 21);   // half groups: lanes 16..31 idle
  check({2, 4, 256, 2}, 22);  // two heads a task, across key heads
}

}  // namespace
}  // namespace lily::test
