// test_persistent_deltanet.cu: the persistent kernel's DeltaNet task (persistent/ops_deltanet.cuh)
// against the decode kernel (decode/deltanet_decode.h, itself tested against backend/cpu in
// test_deltanet.cu) on the same random weights, state and inputs: a test kernel of one 512-thread
// block a head group runs deltanet_core_task on a StepArgs holding only what the task reads (dims,
// proj, mixer, layer 0's weights and state). Rows of proj and mixer are strided (odd padding), the
// mixer poisoned with NaN before the launch; y, the conv state and the SSM state must agree within
// 1e-4 of the largest reference value. Sizes: the model's Hk 16 / Hv 32 and lily-tiny's 2 / 4, T = 1,
// 3 and 8 verify rows, tasks of 1 to 4 value heads.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

#include "backend/cuda/decode/deltanet_decode.h"
#include "backend/cuda/persistent/ops_deltanet.cuh"
#include "backend/cuda/persistent/step_args.h"
#include "cuda_test_util.h"

namespace lily::test {
namespace {

namespace ps = cuda::persistent;

constexpr int kD = 128, kK = 4;
constexpr double kTolerance = 1e-4;

__global__ void __launch_bounds__(ps::kThreads, 1)
    deltanet_task_kernel(const __grid_constant__ ps::StepArgs a, const ps::DeviceTask* tasks) {
  extern __shared__ __align__(16) unsigned char smem[];
  ps::deltanet_core_task(a, tasks[blockIdx.x], smem);
}

struct Case {
  int Hk, Hv, count, T;  // count: value heads a task
};

void check(const Case& k, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "Hk " << k.Hk << " Hv " << k.Hv << " count " << k.count << " T " << k.T);
  const int T = k.T, Hv = k.Hv, C = 2 * k.Hk * kD + Hv * kD, width = Hv * kD;
  const int proj_stride = C + width + 2 * Hv + 5, mixer_stride = width + 3;  // odd padding
  // Weights (as test_deltanet.cu's), state, and the proj rows [mixed | z | b | a].
  const std::vector<float> conv_w = random_floats(size_t(C) * kK, seed, 0.5f);
  const std::vector<float> A_log = random_floats(size_t(Hv), seed + 1, 0.5f);
  const std::vector<float> dt_bias = random_floats(size_t(Hv), seed + 2, 0.5f);
  std::vector<float> norm_w = random_floats(kD, seed + 3, 0.2f);
  for (auto& x : norm_w) x += 1.f;
  const std::vector<float> conv0 = random_floats(size_t(kK - 1) * C, seed + 4);
  const std::vector<float> ssm0 = random_floats(size_t(Hv) * kD * kD, seed + 5, 0.1f);
  const std::vector<float> proj = random_floats(size_t(T) * proj_stride, seed + 6);

  // The reference: gated_deltanet_decode on contiguous copies.
  std::vector<float> mixed(size_t(T) * C), z(size_t(T) * width), b(size_t(T) * Hv), a(size_t(T) * Hv);
  for (int t = 0; t < T; ++t) {
    const float* row = proj.data() + size_t(t) * proj_stride;
    std::copy_n(row, C, mixed.data() + size_t(t) * C);
    std::copy_n(row + C, width, z.data() + size_t(t) * width);
    std::copy_n(row + C + width, Hv, b.data() + size_t(t) * Hv);
    std::copy_n(row + C + width + Hv, Hv, a.data() + size_t(t) * Hv);
  }
  DeviceArray<float> d_conv_w(conv_w), d_A_log(A_log), d_dt_bias(dt_bias), d_norm_w(norm_w);
  DeviceArray<float> ref_conv(conv0), ref_ssm(ssm0), d_mixed(mixed), d_z(z), d_b(b), d_a(a), ref_y(size_t(T) * width);
  ref_y.poison();
  cuda::DeltaNetParams p;
  p.T = T, p.num_key_heads = k.Hk, p.num_value_heads = Hv, p.head_dim = kD, p.conv_kernel = kK, p.eps = 1e-6f;
  p.conv_weight = d_conv_w.get(), p.A_log = d_A_log.get(), p.dt_bias = d_dt_bias.get();
  p.norm_weight = d_norm_w.get();
  cuda::gated_deltanet_decode(p, d_mixed.get(), d_z.get(), d_b.get(), d_a.get(), ref_conv.get(), ref_ssm.get(),
                              ref_y.get(), nullptr);
  CUDA_OK(cudaDeviceSynchronize());

  // The task: one block a group of `count` value heads, all T rows.
  DeviceArray<float> conv(conv0), ssm(ssm0), d_proj(proj), mixer(size_t(T) * mixer_stride);
  mixer.poison();
  ps::DeviceLayer layer;
  layer.conv1d = d_conv_w.get(), layer.A_log = d_A_log.get(), layer.dt_bias = d_dt_bias.get();
  layer.gated_norm = d_norm_w.get();
  DeviceArray<ps::DeviceLayer> layers(std::vector<ps::DeviceLayer>{layer});
  std::vector<ps::DeviceTask> tasks(size_t(Hv / k.count));
  for (size_t i = 0; i < tasks.size(); ++i) {
    tasks[i].layer = 0, tasks[i].row = 0, tasks[i].rows = uint16_t(T);
    tasks[i].first = uint32_t(i) * uint32_t(k.count), tasks[i].count = uint32_t(k.count);
  }
  DeviceArray<ps::DeviceTask> d_tasks(tasks);
  ps::StepArgs args;
  args.layers = layers.get();
  args.dims.T = T, args.dims.Hk = k.Hk, args.dims.Hv = Hv, args.dims.conv_k = kK, args.dims.eps = 1e-6f;
  args.dims.proj_stride = proj_stride, args.dims.mixer_stride = mixer_stride;
  args.buf.proj = d_proj.get(), args.buf.mixer = mixer.get();
  args.seq.conv[0] = conv.get(), args.seq.ssm[0] = ssm.get();
  CUDA_OK(cudaFuncSetAttribute(deltanet_task_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, ps::kScratchBytes));
  deltanet_task_kernel<<<unsigned(tasks.size()), ps::kThreads, ps::kScratchBytes>>>(args, d_tasks.get());
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaDeviceSynchronize());

  const std::vector<float> got_mixer = mixer.download();
  std::vector<float> y(size_t(T) * width);
  for (int t = 0; t < T; ++t)
    std::copy_n(got_mixer.data() + size_t(t) * mixer_stride, width, y.data() + size_t(t) * width);
  EXPECT_LT(relative_error(y, ref_y.download()), kTolerance) << "y";
  EXPECT_LT(relative_error(conv.download(), ref_conv.download()), kTolerance) << "conv state";
  EXPECT_LT(relative_error(ssm.download(), ref_ssm.download()), kTolerance) << "ssm state";
}

TEST(CudaPersistentDeltaNet, TinyModel) {
  REQUIRE_GPU();
  for (int T : {1, 3, 8}) check({2, 4, 2, T}, 10 + uint32_t(T));
}

TEST(CudaPersistentDeltaNet, FullModel) {
  REQUIRE_GPU();
  for (int T : {1, 3}) check({16, 32, 2, T}, 20 + uint32_t(T));
}

// Tasks of two key heads (two passes of two value heads), of one value head (half the block idle in
// the recurrence) and of three (a pass of two, then one).
TEST(CudaPersistentDeltaNet, OtherHeadCounts) {
  REQUIRE_GPU();
  for (int T : {1, 3}) {
    check({2, 4, 4, T}, 30 + uint32_t(T));
    check({2, 2, 1, T}, 40 + uint32_t(T));
    check({3, 3, 3, T}, 50 + uint32_t(T));
  }
}

}  // namespace
}  // namespace lily::test
