// bench_gemv.cu: times the decode GEMVs (gemv/gemv.h, every kernel by name where it takes the
// shape) and the decode MoE's three launches (moe/moe_decode.h) at the model's full sizes, each
// launch alone, and reports achieved bandwidth against 4.3 TB/s (bytes = codes + scales + biases
// actually read; x, y and act are ignored). Random codes, scales around 0.01; median of 200
// launches after 20 warm-ups, each launch timed with events; weights rotate over enough copies to
// exceed the L2.
#include "backend/cuda/common/cuda_check.h"  // first: it sets up fmt for nvcc
#include "../common/median_ms.cuh"
#include "../common/random_qmatrix.cuh"
#include "backend/cuda/gemv/gemv.h"
#include "backend/cuda/moe/moe_decode.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

using namespace lily;
using bench::random_qmatrix;

namespace {

double bytes_of(int rows, int cols, int bits) { return double(rows) * cols * bits / 8 + double(rows) * cols / 64 * 4; }

// Median microseconds of f(copy) over 200 launches after 20, rotating over `copies`.
double time_us(int copies, const std::function<void(int)>& f) {
  return bench::median_ms([&](int i) { f(i % copies); }, 200, 20) * 1000.0;
}

void report(const char* name, double bytes, double us) {
  const double gbs = bytes / us / 1e3;
  std::printf("%-44s %8.2f us %8.1f GB/s %5.1f %% of 4.3 TB/s\n", name, us, gbs, gbs / 43.0);
}

}  // namespace

int main() {
  float *x, *y, *act, *logits, *shared_weight, *gain, *normed;
  CUDA_CHECK(cudaMalloc(&x, 4096 * 4));
  CUDA_CHECK(cudaMalloc(&y, 248320 * 4));
  CUDA_CHECK(cudaMalloc(&act, 9 * 512 * 4));  // 8 routed slots + the shared expert
  CUDA_CHECK(cudaMalloc(&logits, 256 * 4));
  CUDA_CHECK(cudaMalloc(&shared_weight, 16));
  CUDA_CHECK(cudaMalloc(&gain, 4096 * 4));
  CUDA_CHECK(cudaMalloc(&normed, 4096 * 4));
  CUDA_CHECK(cudaMemset(x, 0, 4096 * 4));
  CUDA_CHECK(cudaMemset(gain, 0, 4096 * 4));
  CUDA_CHECK(cudaMemset(act, 0, 9 * 512 * 4));
  CUDA_CHECK(cudaMemset(shared_weight, 0, 16));
  std::vector<float> h_logits(256);
  for (int e = 0; e < 256; ++e) h_logits[size_t(e)] = float((e * 37) % 256) / 64.f;  // a spread of experts
  CUDA_CHECK(cudaMemcpy(logits, h_logits.data(), 256 * 4, cudaMemcpyHostToDevice));

  struct Shape {
    const char* name;
    int rows, cols, bits;
  };
  const cuda::DeviceLimits device = cuda::current_device_limits();
  for (const Shape& s : {Shape{"[8192, 2048] q4", 8192, 2048, 4}, Shape{"[2048, 4096] q4", 2048, 4096, 4},
                         Shape{"[12352, 2048] q4 (DeltaNet in_proj)", 12352, 2048, 4},
                         Shape{"[248320, 2048] q4 (lm_head)", 248320, 2048, 4},
                         Shape{"[2048, 512] q4 (shared down)", 2048, 512, 4}, Shape{"[256, 2048] q8", 256, 2048, 8}}) {
    const double bytes = bytes_of(s.rows, s.cols, s.bits);
    const int copies = std::max(1, int(240e6 / bytes));
    std::vector<cuda::QMatrix> m;
    for (int i = 0; i < copies; ++i) m.push_back(random_qmatrix(1, s.rows, s.cols, s.bits));
    for (cuda::GemvKernel k : {cuda::GemvKernel::prefetch, cuda::GemvKernel::mma, cuda::GemvKernel::fp32}) {
      const std::string name = std::string(cuda::kernel_name(k)) + " " + s.name;
      if (cuda::gemv_supports(k, m[0], false, device))
        report((name + ", RMSNorm").c_str(), bytes,
               time_us(copies, [&](int i) { cuda::rms_norm_gemv(k, m[size_t(i)], x, gain, 1e-6f, y, nullptr); }));
      if (cuda::gemv_supports(k, m[0], true, device))
        report((name + ", +=").c_str(), bytes,
               time_us(copies, [&](int i) { cuda::gemv_accumulate(k, m[size_t(i)], x, y, nullptr); }));
    }
    for (auto& q : m) bench::free_random_qmatrix(q);
  }

  // One layer's experts: 256 x [512, 2048] gate and up, 256 x [2048, 512] down, 8 selected.
  const int layers = 4;  // 4 layers' stacks (~1.1 GB) so the 8 selected experts are not in L2
  std::vector<cuda::GpuMoe> moe(layers);
  for (cuda::GpuMoe& w : moe) {
    w.router = random_qmatrix(1, 256, 2048, 8);
    w.experts_gate = random_qmatrix(256, 512, 2048, 4);
    w.experts_up = random_qmatrix(256, 512, 2048, 4);
    w.experts_down = random_qmatrix(256, 2048, 512, 4);
    w.shared_gate = random_qmatrix(1, 512, 2048, 4), w.shared_up = random_qmatrix(1, 512, 2048, 4);
    w.shared_down = random_qmatrix(1, 2048, 512, 4), w.shared_expert_gate = random_qmatrix(1, 1, 2048, 8);
  }
  auto args = [&](int l) {
    cuda::MoeDecodeArgs a;
    a.w = &moe[size_t(l)], a.gain = gain, a.k = 8;
    a.buffers = {y, normed, logits, shared_weight, act};
    return a;
  };
  const double gu_bytes = 9 * 2 * bytes_of(512, 2048, 4), d_bytes = 9 * bytes_of(2048, 512, 4);
  for (cuda::GateUpKernel k : {cuda::GateUpKernel::staged, cuda::GateUpKernel::mma})
    report((std::string(cuda::kernel_name(k)) + " (8 experts + shared)").c_str(), gu_bytes,
           time_us(layers, [&](int l) { cuda::moe_gate_up(k, args(l), nullptr); }));
  report("moe_down (8 experts + shared)", d_bytes, time_us(layers, [&](int l) { cuda::moe_down(args(l), nullptr); }));
  // The route writes the logits the others read: last.
  report("moe_route (norm + router q8 + shared gate)", bytes_of(256, 2048, 8),
         time_us(layers, [&](int l) { cuda::moe_route(args(l), nullptr); }));
  return 0;
}
