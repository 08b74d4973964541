// bench_gemv.cu: times the decode kernels of gemv.cu and moe.cu at the model's full sizes and
// reports achieved bandwidth against 4.3 TB/s (bytes = codes + scales + biases actually read;
// x, y and act are ignored). Random codes, scales around 0.01; median of 200 launches after 20
// warm-ups, each launch timed with events; weights rotate over enough copies to exceed the L2.
#include "backend/cuda/common/cuda_check.h"  // first: it sets up fmt for nvcc
#include "../common/random_qmatrix.cuh"
#include "backend/cuda/decode/gemv.h"
#include "backend/cuda/decode/moe.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

using namespace lily;
using bench::random_qmatrix;

namespace {

double bytes_of(int rows, int cols, int bits) { return double(rows) * cols * bits / 8 + double(rows) * cols / 64 * 4; }

// Median microseconds of f(copy) over launches, rotating over `copies`.
double time_us(int copies, const std::function<void(int)>& f) {
  cudaEvent_t a, b;
  cudaEventCreate(&a), cudaEventCreate(&b);
  for (int i = 0; i < 20; ++i) f(i % copies);
  std::vector<float> ms;
  for (int i = 0; i < 200; ++i) {
    cudaEventRecord(a);
    f(i % copies);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float t;
    cudaEventElapsedTime(&t, a, b);
    ms.push_back(t);
  }
  CUDA_CHECK(cudaGetLastError());
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2] * 1000.0;
}

void report(const char* name, double bytes, double us) {
  const double gbs = bytes / us / 1e3;
  std::printf("%-44s %8.2f us %8.1f GB/s %5.1f %% of 4.3 TB/s\n", name, us, gbs, gbs / 43.0);
}

}  // namespace

int main() {
  float *x, *y, *act, *w;
  int32_t* ids;
  CUDA_CHECK(cudaMalloc(&x, 64 * 4096 * 4));
  CUDA_CHECK(cudaMalloc(&y, 64 * 248320 * 4));
  float *gain, *normed;
  CUDA_CHECK(cudaMalloc(&act, 64 * 9 * 512 * 4));  // 8 routed slots + the shared expert
  CUDA_CHECK(cudaMalloc(&w, 64 * 9 * 4));
  CUDA_CHECK(cudaMalloc(&ids, 64 * 9 * 4));
  CUDA_CHECK(cudaMalloc(&gain, 4096 * 4));
  CUDA_CHECK(cudaMalloc(&normed, 64 * 4096 * 4));
  CUDA_CHECK(cudaMemset(x, 0, 64 * 4096 * 4));
  CUDA_CHECK(cudaMemset(gain, 0, 4096 * 4));
  CUDA_CHECK(cudaMemset(act, 0, 64 * 9 * 512 * 4));
  CUDA_CHECK(cudaMemset(w, 0, 64 * 9 * 4));
  std::vector<int32_t> h_ids = {3, 17, 60, 99, 128, 200, 201, 255, 0};
  CUDA_CHECK(cudaMemcpy(ids, h_ids.data(), 36, cudaMemcpyHostToDevice));

  struct Shape { const char* name; int rows, cols, bits; };
  for (const Shape& s : {Shape{"gemv [8192, 2048] q4", 8192, 2048, 4}, Shape{"gemv [2048, 4096] q4", 2048, 4096, 4},
                         Shape{"gemv [12288, 2048] q4", 12288, 2048, 4}, Shape{"gemv [248320, 2048] q4 (lm_head)", 248320, 2048, 4},
                         Shape{"gemv [2048, 512] q4 (shared down)", 2048, 512, 4}, Shape{"gemv [256, 2048] q8 (router)", 256, 2048, 8}}) {
    const double bytes = bytes_of(s.rows, s.cols, s.bits);
    const int copies = std::max(1, int(240e6 / bytes));
    std::vector<cuda::QMatrix> m;
    for (int i = 0; i < copies; ++i) m.push_back(random_qmatrix(1, s.rows, s.cols, s.bits));
    report(s.name, bytes, time_us(copies, [&](int i) { cuda::gemv(m[size_t(i)], x, y, 1, nullptr); }));
    if (s.cols <= 4096)
      report((std::string(s.name) + ", rms_norm_gemv").c_str(), bytes,
             time_us(copies, [&](int i) { cuda::rms_norm_gemv(m[size_t(i)], x, gain, 1e-6f, y, nullptr); }));
    if (s.rows == 8192) {
      report("gemv [8192, 2048] q4, T = 8", bytes, time_us(copies, [&](int i) { cuda::gemv(m[size_t(i)], x, y, 8, nullptr); }));
      report("gemv [8192, 2048] q4, T = 64", bytes, time_us(copies, [&](int i) { cuda::gemv(m[size_t(i)], x, y, 64, nullptr); }));
    }
    for (auto& q : m) bench::free_random_qmatrix(q);
  }

  // One layer's experts: 256 x [512, 2048] gate and up, 256 x [2048, 512] down, 8 selected.
  const int layers = 4;  // 4 layers' stacks (~1.1 GB) so the 8 selected experts are not in L2
  std::vector<cuda::QMatrix> gate, up, down;
  for (int l = 0; l < layers; ++l) {
    gate.push_back(random_qmatrix(256, 512, 2048, 4));
    up.push_back(random_qmatrix(256, 512, 2048, 4));
    down.push_back(random_qmatrix(256, 2048, 512, 4));
  }
  cuda::QMatrix sg = random_qmatrix(1, 512, 2048, 4), su = random_qmatrix(1, 512, 2048, 4);
  cuda::QMatrix sd = random_qmatrix(1, 2048, 512, 4), eg = random_qmatrix(1, 1, 2048, 8);
  const double gu_bytes = 9 * 2 * bytes_of(512, 2048, 4), d_bytes = 9 * bytes_of(2048, 512, 4);
  report("moe_gate_up (8 experts + shared, SwiGLU)", gu_bytes, time_us(layers, [&](int l) {
           cuda::moe_gate_up(gate[size_t(l)], up[size_t(l)], sg, su, x, ids, 1, 8, act, nullptr);
         }));
  report("moe_down_accumulate (8 experts + shared)", d_bytes, time_us(layers, [&](int l) {
           cuda::moe_down_accumulate(down[size_t(l)], sd, act, ids, w, 1, 8, y, nullptr);
         }));
  cuda::QMatrix router = random_qmatrix(1, 256, 2048, 8);
  report("moe_route_norm (norm + router q8 + top-8 + shared gate)", bytes_of(256, 2048, 8), time_us(1, [&](int) {
           cuda::moe_route_norm(router, eg, x, gain, 1e-6f, 1, 8, normed, ids, w, nullptr);
         }));
  return 0;
}
