// persistent_decode.h: the decode step of one row (T = 1) as persistent work (issue 16): the task
// list of decode_tasks.h, checked by check_task_list when it is built, flattened for the kernel of
// decode_kernel.cu with the weights of every layer and the step's scratch. DecodeStep records it in
// place of its chain of kernels where the kernel plan says so (kernel_plan.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/cuda/common/device_buffer.h"
#include "backend/cuda/gpu_weights.h"
#include "backend/cuda/persistent/decode_tasks.h"
#include "backend/cuda/persistent/step_args.h"
#include "backend/cuda/sequence_state.h"

namespace lily::cuda::persistent {

// Why the persistent kernel does not take these weights ("" when it does): every matrix 4-bit
// group 64 except the router and the shared expert's gate (8-bit group 64), fused input
// projections, H and the mixer widths at most 4096, the cores' shapes (dk = dv = 128, head dim 256).
std::string persistent_decode_refusal(const GpuWeights& w);

// The tiling for a device of `blocks` resident blocks.
DecodeTiling persistent_decode_tiling(const ModelConfig& c, int blocks);

class PersistentDecode {
 public:
  // token: device int32 [1], the step's input; logits: device fp32 [vocab], its output.
  PersistentDecode(const GpuWeights& w, const DecodeTiling& tiling, const int32_t* token, float* logits);

  // One step of s: logits of the token, s's device position advanced by one. Stream-ordered.
  void record(CudaSequenceState& s, cudaStream_t stream);

  const DecodeTasks& tasks() const { return tasks_; }
  // The kernel's list: block b runs flat_tasks()[block_begin()[b] .. block_begin()[b + 1]).
  const std::vector<DeviceTask>& flat_tasks() const { return flat_; }
  const std::vector<uint32_t>& block_begin() const { return block_begin_host_; }
  // Steps recorded from now on write each task's marks (step_args.h, StepArgs::trace) into `trace`
  // (device, [flat_tasks().size(), kTraceMarks] uint64, zeroed); nullptr stops it.
  void trace_into(uint64_t* trace) { args_.trace = trace; }
  // How far ahead blocks bring weights into L2 (StepArgs::lookahead_bytes, prefetch_own).
  void prefetch(uint32_t lookahead_bytes, int own) {
    args_.lookahead_bytes = lookahead_bytes, args_.prefetch_own = own;
  }

 private:
  const GpuWeights& w_;
  DecodeTasks tasks_;
  std::vector<DeviceTask> flat_;
  std::vector<uint32_t> block_begin_host_;
  int blocks_ = 0;
  StepArgs args_;
  DeviceBuffer device_tasks_, block_begin_, layers_;
  DeviceBuffer hidden_, proj_, mixer_, moe_input_, router_logits_, top_k_, act_, partials_, counters_;
};

}  // namespace lily::cuda::persistent
