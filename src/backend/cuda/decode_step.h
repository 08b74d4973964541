// decode_step.h: the model for one token on the GPU (T = 1), launch by launch, with the kernels
// the plan picked (kernel_plan.h). It reads like backend/cpu/forward.cpp; the decode graph
// (decode_graph.h) captures it once per sequence and replays it.
#pragma once

#include <cstdint>
#include <memory>

#include "backend/cuda/common/device_buffer.h"
#include "backend/cuda/gpu_weights.h"
#include "backend/cuda/kernel_plan.h"
#include "backend/cuda/sequence_state.h"

namespace lily::cuda {

// The parts of a step in launch order: embed, then per layer in_proj .. down, then advance (the
// position) and lm_head.
enum class DecodePart { embed, in_proj, mixer, out_proj, route, gate_up, down, advance, lm_head };
const char* part_name(DecodePart part);

// Watches a step while it is captured (measurement only: bench/cuda_bench.h's decode_skip leaves
// parts out): begin() comes before the launches of each part and end() after the step's last,
// during the capture; captured() gets the graph (the step, then the graph's argmax and token
// copy) before it is instantiated.
class DecodeStepObserver {
 public:
  virtual ~DecodeStepObserver() = default;
  virtual void begin(DecodePart part, cudaStream_t stream) = 0;
  virtual void end(cudaStream_t stream) = 0;
  virtual void captured(cudaGraph_t graph) = 0;
};

// The device buffers of a DecodeStep and its DecodeGraph (the chain's token counts, the candidates'
// scratch: ~4 rows of V floats), in bytes, before anything is allocated (memory_plan.h).
uint64_t decode_step_workspace_bytes(const ModelConfig& c, const DecodePlan& plan);

class DecodeStep {
 public:
  DecodeStep(const GpuWeights& w, const DecodePlan& plan);
  ~DecodeStep();

  // The launches of one step of sequence s: the token in token(), the next token's logits into
  // logits(), s's device position advanced by one.
  void record(CudaSequenceState& s, cudaStream_t stream);

  int32_t* token() const { return token_.as<int32_t>(); }  // device int32 [1]
  float* logits() const { return logits_.as<float>(); }    // device fp32 [vocab]
  // device fp32 [H]: the residual stream after the last layer of the step last run (the input of
  // the final norm; Backend::forward_hidden's row), until the next step
  const float* residual() const { return h_.as<float>(); }

  void set_observer(DecodeStepObserver* observer) { observer_ = observer; }
  DecodeStepObserver* observer() const { return observer_; }

 private:
  void gated_attention(const GpuLayer& layer, const DecodeLayerPlan& plan, CudaSequenceState& s, size_t index);
  void gated_deltanet(const GpuLayer& layer, const DecodeLayerPlan& plan, CudaSequenceState& s, size_t index);
  void sparse_moe(const GpuLayer& layer, const DecodeLayerPlan& plan);
  void input_projections(const DecodeLayerPlan& plan, const float* input_norm);
  void mark(DecodePart part) {
    if (observer_) observer_->begin(part, stream_);
  }
  void mark_end() {
    if (observer_) observer_->end(stream_);
  }

  const GpuWeights& w_;
  const ModelConfig& c_;
  const DecodePlan& plan_;
  cudaStream_t stream_ = nullptr;  // of the step being recorded
  DecodeStepObserver* observer_ = nullptr;
  // Activations of one token (device).
  DeviceBuffer token_;              // int32 [1]: the step's input
  DeviceBuffer h_;                  // [H] the residual stream
  DeviceBuffer proj_;               // [fused rows]: the input projections' outputs, consecutive
  DeviceBuffer mixer_out_;          // [max(Hv*128, nq*hd)]: input of out_proj / o_proj
  DeviceBuffer x_;                  // [H] RMSNorm(h) of the MoE block
  DeviceBuffer router_logits_;      // [E]
  DeviceBuffer shared_weight_;      // [1]
  DeviceBuffer act_;                // [k + 1, I]
  DeviceBuffer logits_;             // [V]
  DeviceBuffer attention_scratch_;  // split-KV partials (zeroed once; the kernels reset them)
};

}  // namespace lily::cuda
