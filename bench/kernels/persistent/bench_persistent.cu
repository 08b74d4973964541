// bench_persistent.cu: what a persistent decode step (issue 16) could gain over today's chain of
// kernels under PDL, measured on the idealized step: 254 stages, 1.8 GB of weights (the 4K step's),
// each stage split over the SMs, each stage's work depending on all of the stage before.
//
// The persistent form: one block per SM (cooperative launch: all resident) walks its task list
// (backend/cuda/persistent/task_list.h, checked by check_task_list before the launch); a task
// waits for a counter in global memory (ld.acquire, one thread), streams its slice of the weights
// from a ring of shared-memory stages that are filled by bulk copies issued tasks ahead (so a
// task's weights arrive while it waits), sums them, and adds to its counter (release). Counters
// only grow: a launch waits for epoch * count, so replays need no reset.
// The chain form: 254 kernels in a CUDA graph with programmatic edges; every block bulk-copies its
// slice before griddepcontrol.wait (today's prefetch GEMV, without the math).
//
// Printed per scenario: microseconds per launch, per stage, and the weight bytes' GB/s:
//   chain           one task per stage on one block at a time (a hand-off per stage, no data)
//   layers          every block a task per stage, each waiting for all of the stage before (no data)
//   layers+stream   the same, each task streaming its 1.8 GB / (254 x SMs) slice
//   with backoff    the same, the waiting thread sleeping 64 ns between polls
//   groups+stream   each task waiting only for the 8 tasks of its group of 8 blocks
//   stream          the slices with no waits at all (this loop's streaming ceiling)
//   pdl chain       254 kernels, each block its slice, programmatic edges
// Random bytes (values do not matter); the weights are 30 x the L2, so every stage reads HBM.
#include "backend/cuda/common/cuda_check.h"  // first: it sets up fmt for nvcc

#include <algorithm>
#include <cstdio>
#include <functional>
#include <vector>

#include "../common/median_ms.cuh"
#include "backend/cuda/common/device_info.h"
#include "backend/cuda/common/mma.cuh"
#include "backend/cuda/common/pdl.cuh"
#include "backend/cuda/common/pdl_graph.h"
#include "backend/cuda/persistent/task_list.h"

using namespace lily;
namespace persistent = lily::cuda::persistent;

namespace {

constexpr int kThreads = 256;
constexpr int kStages = 3;
constexpr uint32_t kStageBytes = 64 * 1024;
constexpr uint32_t kNone = 0xFFFFFFFFu;

struct DeviceTask {
  uint32_t wait_counter = kNone;  // kNone: no wait
  uint32_t wait_count = 0;        // per launch
  int32_t signal = -1;
  uint32_t bytes = 0;   // weights to stream (a multiple of 16, at most kStageBytes)
  uint64_t offset = 0;  // into the weights
};

__device__ __forceinline__ uint32_t load_acquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

template <bool BACKOFF>
__global__ void __launch_bounds__(kThreads, 1)
    interpreter(const DeviceTask* tasks, const uint32_t* begin, uint32_t* counters, uint32_t epoch,
                const uint8_t* weights, uint32_t* out) {
  extern __shared__ __align__(128) uint8_t ring[];  // kStages x kStageBytes
  __shared__ __align__(8) uint64_t full[kStages];
  const uint32_t first = begin[blockIdx.x], n = begin[blockIdx.x + 1] - first;
  if (threadIdx.x == 0)
    for (int s = 0; s < kStages; ++s) cuda::ptx::mbarrier_init(&full[s], 1);
  __syncthreads();
  auto issue = [&](uint32_t i) {  // one thread: task i's weights into stage i % kStages
    const DeviceTask& t = tasks[first + i];
    if (t.bytes == 0) return;
    const int s = int(i % kStages);
    cuda::ptx::mbarrier_arrive_expect_tx(&full[s], t.bytes);
    cuda::ptx::bulk_copy_to_shared(ring + size_t(s) * kStageBytes, weights + t.offset, t.bytes, &full[s]);
  };
  if (threadIdx.x == 0)
    for (uint32_t i = 0; i < n && i < kStages; ++i) issue(i);
  uint32_t parity = 0, acc = 0;  // parity bit s: the phase stage s completes next
  for (uint32_t i = 0; i < n; ++i) {
    const DeviceTask t = tasks[first + i];
    if (threadIdx.x == 0 && t.wait_counter != kNone) {
      const uint32_t target = epoch * t.wait_count;
      while (load_acquire(counters + t.wait_counter) < target)
        if (BACKOFF) __nanosleep(64);
    }
    __syncthreads();  // the wait, for every thread
    if (t.bytes) {
      const int s = int(i % kStages);
      cuda::ptx::mbarrier_wait(&full[s], (parity >> s) & 1u);
      parity ^= 1u << s;
      const uint4* p = reinterpret_cast<const uint4*>(ring + size_t(s) * kStageBytes);
      for (uint32_t j = threadIdx.x; j < t.bytes / 16; j += kThreads) {
        const uint4 v = p[j];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
      }
    }
    __syncthreads();  // the task is done, its stage read
    if (threadIdx.x == 0) {
      if (t.signal >= 0) {
        __threadfence();
        atomicAdd(counters + t.signal, 1u);
      }
      if (i + kStages < n) {
        cuda::ptx::fence_proxy_async_shared();
        issue(i + kStages);
      }
    }
  }
  out[blockIdx.x * kThreads + threadIdx.x] = acc;  // keeps the reads
}

// The chain form: one stage, every block its slice, prefetched before the wait.
__global__ void __launch_bounds__(kThreads, 1)
    pdl_stage(const uint8_t* weights, uint64_t stage_offset, uint32_t bytes, uint32_t* out) {
  extern __shared__ __align__(128) uint8_t slice[];
  __shared__ __align__(8) uint64_t full;
  if (threadIdx.x == 0) {
    cuda::ptx::mbarrier_init(&full, 1);
    cuda::ptx::mbarrier_arrive_expect_tx(&full, bytes);
    cuda::ptx::bulk_copy_to_shared(slice, weights + stage_offset + uint64_t(blockIdx.x) * bytes, bytes, &full);
  }
  cuda::pdl_wait();
  cuda::pdl_launch_dependents();
  __syncthreads();
  cuda::ptx::mbarrier_wait(&full, 0);
  uint32_t acc = 0;
  const uint4* p = reinterpret_cast<const uint4*>(slice);
  for (uint32_t j = threadIdx.x; j < bytes / 16; j += kThreads) {
    const uint4 v = p[j];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  out[blockIdx.x * kThreads + threadIdx.x] ^= acc;
}

__global__ void fill(uint32_t* p, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = uint32_t(i) * 2654435761u;
}

// The scenarios as checked task lists. stages x blocks; data: each task streams its slice.
// layers: each task waits for every task of the stage before; groups: for the 8 tasks of its own
// group of 8 blocks (a dependency that spans a few SMs, not all).
enum class Shape { chain, layers, groups };
persistent::TaskList build(Shape shape, int stages, int blocks, uint32_t slice, bool waits) {
  persistent::TaskList l;
  l.blocks.resize(size_t(blocks));
  const int groups = (blocks + 7) / 8;
  l.counters = uint32_t(stages * groups);
  for (int st = 0; st < stages; ++st) {
    const int on = shape == Shape::chain ? st % blocks : -1;
    for (int b = 0; b < blocks; ++b) {
      if (on >= 0 && b != on) continue;
      persistent::Task t;
      t.op = 1, t.layer = uint16_t(st), t.first = uint32_t(b), t.count = slice;
      // The counter of (stage, group): one group of all blocks except in Shape::groups.
      const int g = shape == Shape::groups ? b / 8 : 0;
      const uint32_t producers = shape == Shape::chain    ? 1
                                 : shape == Shape::layers ? uint32_t(blocks)
                                                          : uint32_t(std::min(8, blocks - 8 * g));
      if (waits && st > 0) t.waits.push_back({uint32_t((st - 1) * groups + g), producers});
      if (waits && st + 1 < stages) t.signal = st * groups + g;
      if (slice)
        t.accesses.push_back({persistent::Access::Kind::read, 0, (uint64_t(st) * blocks + b) * slice,
                              (uint64_t(st) * blocks + b + 1) * slice});
      l.blocks[size_t(b)].push_back(t);
    }
  }
  return l;
}

struct DeviceList {
  DeviceTask* tasks = nullptr;
  uint32_t* begin = nullptr;
};

DeviceList upload(const persistent::TaskList& l) {
  std::vector<DeviceTask> tasks;
  std::vector<uint32_t> begin;
  for (const auto& block : l.blocks) {
    begin.push_back(uint32_t(tasks.size()));
    for (const persistent::Task& t : block) {
      DeviceTask d;
      if (!t.waits.empty()) d.wait_counter = t.waits[0].counter, d.wait_count = t.waits[0].count;
      d.signal = t.signal;
      d.bytes = t.count;
      d.offset = t.accesses.empty() ? 0 : t.accesses[0].begin;
      tasks.push_back(d);
    }
  }
  begin.push_back(uint32_t(tasks.size()));
  DeviceList d;
  CUDA_CHECK(cudaMalloc(&d.tasks, std::max<size_t>(1, tasks.size()) * sizeof(DeviceTask)));
  CUDA_CHECK(cudaMalloc(&d.begin, begin.size() * sizeof(uint32_t)));
  CUDA_CHECK(cudaMemcpy(d.tasks, tasks.data(), tasks.size() * sizeof(DeviceTask), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(d.begin, begin.data(), begin.size() * sizeof(uint32_t), cudaMemcpyHostToDevice));
  return d;
}

// Median microseconds of `launch` over 21 runs after 3 warm-ups.
double median_us(const std::function<void()>& launch) { return bench::median_ms(launch, 21, 3) * 1000.0; }

}  // namespace

int main() {
  const int blocks = cuda::multiprocessor_count(), stages = 254;
  const uint64_t total = 1800ull << 20;  // the 4K step's weights
  const uint32_t slice = uint32_t(total / (uint64_t(stages) * blocks)) / 16 * 16;
  const uint64_t bytes = uint64_t(slice) * stages * blocks;
  uint8_t* weights = nullptr;
  uint32_t *counters = nullptr, *out = nullptr;
  CUDA_CHECK(cudaMalloc(&weights, bytes));
  fill<<<1024, 256>>>(reinterpret_cast<uint32_t*>(weights), bytes / 4);
  const size_t counter_bytes = size_t(stages) * ((blocks + 7) / 8) * sizeof(uint32_t);
  CUDA_CHECK(cudaMalloc(&counters, counter_bytes));
  CUDA_CHECK(cudaMalloc(&out, size_t(blocks) * kThreads * sizeof(uint32_t)));
  const size_t ring = size_t(kStages) * kStageBytes;
  CUDA_CHECK(cudaFuncSetAttribute(interpreter<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(ring)));
  CUDA_CHECK(cudaFuncSetAttribute(interpreter<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(ring)));
  CUDA_CHECK(cudaFuncSetAttribute(pdl_stage, cudaFuncAttributeMaxDynamicSharedMemorySize, int(slice)));
  std::printf("%d SMs, %d stages, %u bytes per task, %.2f GB of weights\n", blocks, stages, slice, double(bytes) / 1e9);
  std::printf("%-16s %10s %10s %10s\n", "scenario", "us/launch", "us/stage", "GB/s");

  struct Scenario {
    const char* name;
    Shape shape;
    bool data, waits, backoff;
  };
  for (const Scenario& sc :
       {Scenario{"chain", Shape::chain, false, true, false}, Scenario{"layers", Shape::layers, false, true, false},
        Scenario{"layers+stream", Shape::layers, true, true, false},
        Scenario{"  with backoff", Shape::layers, true, true, true},
        Scenario{"groups+stream", Shape::groups, true, true, false},
        Scenario{"stream", Shape::layers, true, false, false}}) {
    const persistent::TaskList list = build(sc.shape, stages, blocks, sc.data ? slice : 0, sc.waits);
    persistent::check_task_list(list);  // safe by construction: the same check the step will use
    const DeviceList d = upload(list);
    CUDA_CHECK(cudaMemset(counters, 0, counter_bytes));
    uint32_t epoch = 0;
    auto launch = [&] {
      ++epoch;
      cudaLaunchConfig_t config = {};
      config.gridDim = dim3(unsigned(blocks));
      config.blockDim = dim3(kThreads);
      config.dynamicSmemBytes = ring;
      cudaLaunchAttribute attribute[1];
      attribute[0].id = cudaLaunchAttributeCooperative;  // every block resident, or no launch
      attribute[0].val.cooperative = 1;
      config.attrs = attribute, config.numAttrs = 1;
      CUDA_CHECK(cudaLaunchKernelEx(&config, sc.backoff ? interpreter<true> : interpreter<false>,
                                    static_cast<const DeviceTask*>(d.tasks), static_cast<const uint32_t*>(d.begin),
                                    counters, epoch, static_cast<const uint8_t*>(weights), out));
    };
    const double us = median_us(launch);
    std::printf("%-16s %10.1f %10.3f %10.0f\n", sc.name, us, us / stages, sc.data ? double(bytes) / us / 1e3 : 0.0);
    CUDA_CHECK(cudaFree(d.tasks));
    CUDA_CHECK(cudaFree(d.begin));
  }

  // The chain form in a graph with programmatic edges.
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t graph;
  CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  for (int st = 0; st < stages; ++st)
    pdl_stage<<<unsigned(blocks), kThreads, slice, s>>>(weights, uint64_t(st) * blocks * slice, slice, out);
  CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  cuda::make_edges_programmatic(graph);
  cudaGraphExec_t exec;
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  const double us = median_us([&] { CUDA_CHECK(cudaGraphLaunch(exec, nullptr)); });
  std::printf("%-16s %10.1f %10.3f %10.0f\n", "pdl chain", us, us / stages, double(bytes) / us / 1e3);
  return 0;
}
