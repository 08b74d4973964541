// decode_kernel.cu: the decode step as persistent work (issue 16): one block of kThreads threads
// per SM, all resident at once (a cooperative launch), each walking its own list of tasks
// (decode_tasks.h builds them, check_task_list proves they cannot deadlock or race). A task:
//
//   thread 0:  prefetch the task's weights into L2 (bulk prefetches) unless done already, once
//              they are known (an expert slot's: once its layer's top-k is done; a task that is
//              ready before that loads them itself); then, until counter[w] >= count for each of
//              its waits (relaxed polls, then one acquire load of each, GPU scope), prefetch the
//              next tasks' weights, up to StepArgs::lookahead_bytes ahead and up to an expert slot
//              not chosen yet
//   all:       run the op (ops_dense.cuh, ops_deltanet.cuh, ops_attention.cuh)
//   thread 0:  after the block's barrier, counter[signal] += 1 (release, GPU scope)
//
// No grid barrier: a task waits only for the tasks whose outputs it reads, and the weights of
// every task whose matrix is known stream into L2 while the block waits, so the memory system is
// not idle at an operator boundary. A wait of more than 2 s (a bug) stops the launch with an error
// that names the task. The counters are zeroed before every step (a memset node of
// the step's graph). Data written in the launch is read through L2 (__ldcg), never through the
// non-coherent read-only path.
// Tested: tests/cuda/test_persistent_decode.cpp (the whole step against the decode step of kernels
// and the CPU backend), test_persistent_deltanet.cu, test_persistent_attention.cu (the cores).
#include "backend/cuda/common/cuda_check.h"  // first: it configures fmt for nvcc
#include "backend/cuda/common/device_info.h"
#include "backend/cuda/persistent/decode_kernel.h"
#include "backend/cuda/persistent/decode_tasks.h"
#include "backend/cuda/persistent/ops_attention.cuh"
#include "backend/cuda/persistent/ops_deltanet.cuh"
#include "backend/cuda/persistent/ops_dense.cuh"
#include "backend/cuda/persistent/trace.cuh"

namespace lily::cuda::persistent {

namespace {

__device__ __forceinline__ uint32_t load_acquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// The polls themselves are relaxed: an acquire load compiles to an invalidation of the whole L1
// (CCTL.IVALL) besides the load, and a block polls hundreds of times a step; once a wait is met, one
// acquire load of each counter it waited on orders the task's reads after its producers' writes.
__device__ __forceinline__ uint32_t load_relaxed(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void add_release(uint32_t* p, uint32_t v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// A wait that outlasts any step by far (a list or kernel bug: a counter that never fills) stops the
// launch with an error naming the task, instead of hanging the device.
constexpr uint64_t kStuckNs = 2'000'000'000;

__device__ __noinline__ void stuck(const DeviceTask& t, uint32_t index, const uint32_t* counters) {
  printf("persistent decode: block %d task %u (op %d, layer %d, first %u) waited 2 s: counters %u: %u of %u, "
         "%u: %u of %u, %u: %u of %u\n",
         int(blockIdx.x), index, int(t.op), int(t.layer), t.first, t.wait[0],
         t.wait[0] == kNoCounter ? 0 : counters[t.wait[0]], t.wait_count[0], t.wait[1],
         t.wait[1] == kNoCounter ? 0 : counters[t.wait[1]], t.wait_count[1], t.known,
         t.known == kNoCounter ? 0 : counters[t.known], t.known_count);
  __trap();
}

// The weights (and recurrent state) task t will read, into L2; returns the bytes. Expert slots:
// only when their top-k is done (the caller checks).
__device__ uint32_t prefetch_task(const StepArgs& a, const DeviceTask& t) {
  const DeviceLayer& L = a.layers[t.layer];
  switch (DecodeOp(t.op)) {
    case DecodeOp::in_proj: return prefetch_rows(L.in_proj, 0, t.first, t.count);
    case DecodeOp::out_proj: return prefetch_rows(L.out_proj, 0, t.first, t.count);
    case DecodeOp::lm_head: return prefetch_rows(a.lm_head, 0, t.first, t.count);
    case DecodeOp::router: {
      const int64_t E = a.dims.E, end = min(int64_t(t.first + t.count), E);
      return end > t.first ? prefetch_rows(L.router, 0, t.first, end - t.first) : 0;
    }
    case DecodeOp::deltanet_core: {  // the whole heads its columns are in ([Hv, dk, dv]: a column is strided)
      const uint64_t h0 = t.first / 128, h1 = (t.first + t.count + 127) / 128, head = 128 * 128 * 4;
      prefetch_l2(a.seq.ssm[t.layer] + h0 * 128 * 128, (h1 - h0) * head);
      return uint32_t(t.count * 128 * 4);
    }
    case DecodeOp::gate_up:
    case DecodeOp::down: {
      const bool shared = t.slot == a.dims.slots, up = DecodeOp(t.op) == DecodeOp::gate_up;
      const int e = shared ? 0 : __ldcg(a.buf.slot_ids + t.slot);
      if (e < 0) return 0;
      if (!up) return prefetch_rows(shared ? L.shared_down : L.down, e, t.first, t.count);
      return prefetch_rows(shared ? L.shared_gate : L.gate, e, t.first, t.count) +
             prefetch_rows(shared ? L.shared_up : L.up, e, t.first, t.count);
    }
    default: return 0;
  }
}

__device__ __forceinline__ bool known(const StepArgs& a, const DeviceTask& t) {
  return t.known == kNoCounter || load_relaxed(a.buf.counters + t.known) >= t.known_count;
}

// The cores and lm_head are functions of their own (not inlined): their registers are allocated
// for them alone, so the ones that need many (the DeltaNet state, the attention's fragments) do
// not make the others spill. The products with the model's matrices are inlined into the loop: a
// call's entry and exit pass its saved registers through local memory at every task (measured in
// docs/perf.md, session 18: inlining the cores too made long contexts slower).
#define LILY_OP(name, body) \
  __device__ __noinline__ void name(const StepArgs& a, const DeviceTask& t, unsigned char* smem) { body; }
#define LILY_INLINE_OP(name, body) \
  __device__ __forceinline__ void name(const StepArgs& a, const DeviceTask& t, unsigned char* smem) { body; }
LILY_INLINE_OP(run_embed, embed_task(a, t))
LILY_INLINE_OP(run_in_proj, in_proj_task(a, t, *reinterpret_cast<ProductScratch*>(smem)))
LILY_OP(run_deltanet, deltanet_core_task(a, t, smem))
LILY_OP(run_attention_split, attention_split_task(a, t, smem))
LILY_OP(run_attention_combine, attention_combine_task(a, t, smem))
LILY_INLINE_OP(run_out_proj, out_proj_task(a, t, *reinterpret_cast<ProductScratch*>(smem)))
LILY_INLINE_OP(run_router, router_task(a, t, *reinterpret_cast<ProductScratch*>(smem)))
LILY_INLINE_OP(run_top_k, top_k_task(a, *reinterpret_cast<ProductScratch*>(smem)))
LILY_INLINE_OP(run_gate_up, gate_up_task(a, t, *reinterpret_cast<ProductScratch*>(smem)))
LILY_INLINE_OP(run_down, down_task(a, t, *reinterpret_cast<ProductScratch*>(smem)))
LILY_OP(run_lm_head, lm_head_task(a, t, *reinterpret_cast<ProductScratch*>(smem)))
#undef LILY_OP
#undef LILY_INLINE_OP

__device__ __forceinline__ void run(const StepArgs& a, const DeviceTask& t, unsigned char* smem) {
  switch (DecodeOp(t.op)) {
    case DecodeOp::embed: return run_embed(a, t, smem);
    case DecodeOp::in_proj: return run_in_proj(a, t, smem);
    case DecodeOp::deltanet_core: return run_deltanet(a, t, smem);
    case DecodeOp::attention_split: return run_attention_split(a, t, smem);
    case DecodeOp::attention_combine: return run_attention_combine(a, t, smem);
    case DecodeOp::out_proj: return run_out_proj(a, t, smem);
    case DecodeOp::router: return run_router(a, t, smem);
    case DecodeOp::top_k: return run_top_k(a, t, smem);
    case DecodeOp::gate_up: return run_gate_up(a, t, smem);
    case DecodeOp::down: return run_down(a, t, smem);
    case DecodeOp::lm_head: return run_lm_head(a, t, smem);
    case DecodeOp::advance:
      if (threadIdx.x == 0) *a.seq.position += a.dims.parallel ? 1 : a.dims.T;
      return;
  }
}

// Whether the task's waits are met (thread 0; relaxed loads: acquire() follows).
__device__ __forceinline__ bool ready(const uint32_t* counters, const DeviceTask& t) {
  for (int j = 0; j < 2; ++j)
    if (t.wait[j] != kNoCounter && load_relaxed(counters + t.wait[j]) < t.wait_count[j]) return false;
  return true;
}

// After ready(): the acquire loads that order the task's reads after its producers' writes (the
// counters only grow, so these see the counts ready() saw).
__device__ __forceinline__ void acquire(const uint32_t* counters, const DeviceTask& t) {
  for (int j = 0; j < 2; ++j)
    if (t.wait[j] != kNoCounter) (void)load_acquire(counters + t.wait[j]);
}

__global__ void __launch_bounds__(kThreads, 1) persistent_decode_kernel(const __grid_constant__ StepArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ DeviceTask list[kMaxBlockTasks];   // this block's tasks
  __shared__ uint32_t fetched[kMaxBlockTasks];  // bytes prefetched for each (thread 0)
  const uint32_t first = a.block_begin[blockIdx.x], n = a.block_begin[blockIdx.x + 1] - first;
  for (uint32_t i = threadIdx.x; i < n; i += kThreads) list[i] = a.tasks[first + i];
  __syncthreads();
  uint32_t ahead = 0, in_flight = 0;  // thread 0: tasks [0, ahead) prefetched; bytes of those after the current
  uint64_t* trace = a.trace ? a.trace + kTraceMarks * uint64_t(first) : nullptr;
  for (uint32_t i = 0; i < n; ++i) {
    if (threadIdx.x == 0) {
      const DeviceTask& t = list[i];
      trace_row = trace ? trace + kTraceMarks * i : nullptr;
      trace_mark(0);
      if (ahead != i) in_flight -= fetched[i];
      else if (known(a, t)) fetched[ahead++] = a.prefetch_own ? prefetch_task(a, t) : 0;  // its own weights
      // While the inputs are not ready: the task's own weights once they are known, then the next
      // tasks', while the budget lasts and up to an expert slot whose experts are not chosen yet.
      const uint64_t start = global_ns();
      while (!ready(a.buf.counters, t)) {
        if (ahead == i && known(a, t)) {
          fetched[ahead++] = a.prefetch_own ? prefetch_task(a, t) : 0;
        } else if (ahead != i && ahead < n && in_flight < a.lookahead_bytes && known(a, list[ahead])) {
          fetched[ahead] = prefetch_task(a, list[ahead]);
          in_flight += fetched[ahead++];
        } else if (global_ns() - start > kStuckNs) {
          stuck(t, i, a.buf.counters);
        }
      }
      acquire(a.buf.counters, t);
      if (ahead == i) fetched[ahead++] = 0;  // ready before its weights were known: it loads them itself
      trace_mark(1);
    }
    __syncthreads();
    const DeviceTask t = list[i];
    run(a, t, smem);
    __syncthreads();
    if (threadIdx.x == 0 && t.signal >= 0) add_release(a.buf.counters + t.signal, 1);
    trace_mark(4);
  }
}

}  // namespace

namespace {

// The kernel's opt-in shared memory, set once (before the first launch or occupancy query).
void configure_kernel() {
  static const bool configured = [] {
    CUDA_CHECK(
        cudaFuncSetAttribute(persistent_decode_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kScratchBytes));
    return true;
  }();
  (void)configured;
}

}  // namespace

void launch_persistent_decode(const StepArgs& args, int blocks, int counters, cudaStream_t stream) {
  configure_kernel();
  CUDA_CHECK(cudaMemsetAsync(args.buf.counters, 0, size_t(counters) * 4, stream));
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(unsigned(blocks));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = kScratchBytes;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeCooperative;  // every block resident at once, or an error
  attribute[0].val.cooperative = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  CUDA_CHECK(cudaLaunchKernelEx(&config, persistent_decode_kernel, args));
}

int persistent_decode_max_blocks() {
  configure_kernel();
  int per_sm = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, persistent_decode_kernel, kThreads, kScratchBytes));
  return per_sm * multiprocessor_count();
}

}  // namespace lily::cuda::persistent
