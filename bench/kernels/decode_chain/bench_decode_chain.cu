// bench_decode_chain.cu: what a decode kernel costs INSIDE the step graph, where programmatic
// dependent launch (pdl.cuh) lets its blocks start while the kernel before it still runs.
//
// For a kernel K (a GEMV of the model's shape, by name: the input projections on the prefetch
// and the mma kernel, out_proj on mma), a graph of 20
// pairs [busy, K] with programmatic edges is replayed; busy is a kernel of 132 x 256 threads that
// spins for a set time without touching memory (it stands for the predecessor). Printed per
// pair: the replay time minus the busy-only graph's, i.e. K's exposed cost; "chain" is 20 K back
// to back. Each K of a graph reads its own copy of the weights (no L2 reuse).
// Boundaries: the exposed cost of an empty kernel (wait, trigger, one store per block), of two
// empty kernels, and of one kernel with a grid barrier (atomic arrival counter, acquire spin) in
// place of the second launch: what fusing two dependent launches through a barrier would save.
#include "backend/cuda/common/cuda_check.h"  // first: it sets up fmt for nvcc
#include "../common/median_ms.cuh"
#include "../common/random_qmatrix.cuh"
#include "backend/cuda/common/device_info.h"
#include "backend/cuda/common/pdl.cuh"
#include "backend/cuda/common/pdl_graph.h"
#include "backend/cuda/gemv/gemv.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

using namespace lily;

namespace {

__global__ void busy_kernel(long long ns) {
  cuda::pdl_wait();
  cuda::pdl_launch_dependents();
  long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  while (now - start < ns);
}

__global__ void empty_kernel(float* y) {
  cuda::pdl_wait();
  cuda::pdl_launch_dependents();
  if (threadIdx.x == 0) y[blockIdx.x] += 1.f;
}

// Every block arrives on a 64-bit counter that only grows (no reset: graph replays keep counting)
// and waits until the grid's arrivals of this barrier are all in.
__device__ void grid_barrier(unsigned long long* counter) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    const unsigned long long old = atomicAdd(counter, 1ull);
    const unsigned long long target = (old / gridDim.x + 1) * gridDim.x;
    unsigned long long now;
    do asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(now) : "l"(counter) : "memory");
    while (now < target);
  }
  __syncthreads();
}

__global__ void barrier_kernel(float* y, unsigned long long* counter) {
  cuda::pdl_wait();
  if (threadIdx.x == 0) y[blockIdx.x] += 1.f;
  grid_barrier(counter);
  cuda::pdl_launch_dependents();
  if (threadIdx.x == 0) y[(blockIdx.x + 1) % gridDim.x] += 1.f;
}

// Microseconds per repetition of `body` (captured `reps` times into one graph, replayed).
double graph_us(cudaStream_t s, int reps, const std::function<void(int)>& body) {
  cudaGraph_t g;
  CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  for (int i = 0; i < reps; ++i) body(i);
  CUDA_CHECK(cudaStreamEndCapture(s, &g));
  cuda::make_edges_programmatic(g);
  cudaGraphExec_t e;
  CUDA_CHECK(cudaGraphInstantiate(&e, g, 0));
  const double ms = bench::median_ms([&] { CUDA_CHECK(cudaGraphLaunch(e, s)); }, 15, 3, s);
  CUDA_CHECK(cudaGraphExecDestroy(e));
  CUDA_CHECK(cudaGraphDestroy(g));
  return ms * 1000.0 / reps;
}

}  // namespace

int main() {
  constexpr int kReps = 20;
  if (const char* v = std::getenv("BUSY_CARVEOUT"))  // the predecessor's shared-memory carveout (percent)
    CUDA_CHECK(cudaFuncSetAttribute(busy_kernel, cudaFuncAttributePreferredSharedMemoryCarveout, std::atoi(v)));
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  float *x, *y, *gain;
  CUDA_CHECK(cudaMalloc(&x, 4096 * 4));
  CUDA_CHECK(cudaMalloc(&gain, 4096 * 4));
  CUDA_CHECK(cudaMalloc(&y, 16384 * 4));
  CUDA_CHECK(cudaMemset(x, 0, 4096 * 4));
  CUDA_CHECK(cudaMemset(gain, 0, 4096 * 4));
  CUDA_CHECK(cudaMemset(y, 0, 16384 * 4));

  struct Shape {
    const char* name;
    int rows, cols;
    bool norm;
  };
  std::printf("%-34s %-9s %9s %9s %9s %9s\n", "kernel", "path", "alone", "chain", "after 5us", "after 10us");
  for (const Shape& sh :
       {Shape{"in_proj [12352, 2048] + norm", 12352, 2048, true}, Shape{"qkv [9216, 2048] + norm", 9216, 2048, true},
        Shape{"out_proj [2048, 4096] += ", 2048, 4096, false}}) {
    std::vector<cuda::QMatrix> m;
    for (int i = 0; i < kReps; ++i) m.push_back(bench::random_qmatrix(1, sh.rows, sh.cols, 4, 1000 + i));
    for (cuda::GemvKernel kernel : {cuda::GemvKernel::prefetch, cuda::GemvKernel::mma}) {
      if (!sh.norm && kernel == cuda::GemvKernel::prefetch) continue;  // y += x @ W^T: mma only
      auto op = [&](int i) {
        if (sh.norm) cuda::rms_norm_gemv(kernel, m[size_t(i)], x, gain, 1e-6f, y, s);
        else cuda::gemv_accumulate(kernel, m[size_t(i)], x, y, s);
      };
      const double alone = graph_us(s, 1, op);
      const double chain = graph_us(s, kReps, op);
      double after[2];
      for (int j = 0; j < 2; ++j) {
        const long long ns = j == 0 ? 5000 : 10000;
        const double busy = graph_us(s, kReps, [&](int) { busy_kernel<<<132, 256, 0, s>>>(ns); });
        const double pair = graph_us(s, kReps, [&](int i) {
          busy_kernel<<<132, 256, 0, s>>>(ns);
          op(i);
        });
        after[j] = pair - busy;
      }
      std::printf("%-34s %-9s %9.2f %9.2f %9.2f %9.2f\n", sh.name,
                  kernel == cuda::GemvKernel::prefetch ? "prefetch" : "mma_gemv", alone, chain, after[0], after[1]);
    }
    for (auto& q : m) bench::free_random_qmatrix(q);
  }
  unsigned long long* counter;
  CUDA_CHECK(cudaMalloc(&counter, sizeof(unsigned long long)));
  CUDA_CHECK(cudaMemset(counter, 0, sizeof(unsigned long long)));
  const int blocks = cuda::multiprocessor_count();
  std::printf("\n%-34s %9s %9s %9s\n", "boundary (grid = SMs x 256)", "chain", "after 5us", "after 10us");
  auto boundary = [&](const char* name, const std::function<void()>& op) {
    const double chain = graph_us(s, kReps, [&](int) { op(); });
    double after[2];
    for (int j = 0; j < 2; ++j) {
      const long long ns = j == 0 ? 5000 : 10000;
      const double busy = graph_us(s, kReps, [&](int) { busy_kernel<<<132, 256, 0, s>>>(ns); });
      const double pair = graph_us(s, kReps, [&](int) {
        busy_kernel<<<132, 256, 0, s>>>(ns);
        op();
      });
      after[j] = pair - busy;
    }
    std::printf("%-34s %9.2f %9.2f %9.2f\n", name, chain, after[0], after[1]);
  };
  boundary("empty kernel", [&] { empty_kernel<<<blocks, 256, 0, s>>>(y); });
  boundary("two empty kernels", [&] {
    empty_kernel<<<blocks, 256, 0, s>>>(y);
    empty_kernel<<<blocks, 256, 0, s>>>(y);
  });
  boundary("one kernel with a grid barrier", [&] { barrier_kernel<<<blocks, 256, 0, s>>>(y, counter); });
  CUDA_CHECK(cudaGetLastError());
  return 0;
}
