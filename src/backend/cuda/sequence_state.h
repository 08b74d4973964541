// sequence_state.h: the state of one sequence on the GPU (spec §4): the KV cache of the
// attention layers, the conv and recurrent state of the DeltaNet layers, and the position, which
// lives in device memory and is advanced by a kernel of the step, so the captured decode step
// (decode_graph.h) replays without re-capture.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/common/device_buffer.h"
#include "backend/cuda/common/gpu_types.h"
#include "model/config.h"

namespace lily::cuda {

// The DeltaNet layers' conv and recurrent state at some length (session reuse rolls back to it).
class CudaRecurrentSnapshot final : public RecurrentSnapshot {
 public:
  int64_t length() const override { return length_; }
  uint64_t memory_bytes() const override;

 private:
  friend class CudaSequenceState;
  int64_t length_ = 0;
  std::vector<DeviceBuffer> conv_, ssm_;
};

class CudaSequenceState final : public SequenceState {
 public:
  CudaSequenceState(const ModelConfig& c, int64_t capacity);
  ~CudaSequenceState() override;

  int64_t length() const override { return length_; }
  int64_t capacity() const override { return capacity_; }
  // The KV cache is allocated for the whole capacity up front, so that is what the state occupies.
  uint64_t memory_bytes() const override;
  std::unique_ptr<SequenceState> clone() const override;
  std::unique_ptr<RecurrentSnapshot> snapshot() const override;
  void restore(const RecurrentSnapshot& snapshot) override;
  void reset() override;

  // Sets the length on the host and on the device (synchronizes the device).
  void set_length(int64_t n);
  // The host's count after a step or pass advanced the device position by n.
  void advance_host(int64_t n) { length_ += n; }

  // Attention layer i's caches [capacity, nkv, head_dim] bf16 (i counts attention layers).
  bf16* k_cache(size_t i) const { return k_cache_[i].as<bf16>(); }
  bf16* v_cache(size_t i) const { return v_cache_[i].as<bf16>(); }
  size_t attention_layers() const { return k_cache_.size(); }
  // DeltaNet layer i's conv state [K-1, conv_dim] and recurrent state [Hv, 128, 128] fp32.
  float* conv(size_t i) const { return conv_[i].as<float>(); }
  float* ssm(size_t i) const { return ssm_[i].as<float>(); }
  // Device int32: tokens processed so far (the next token's position).
  int32_t* position() const { return position_.as<int32_t>(); }
  uint64_t kv_cache_bytes(size_t i) const { return k_cache_[i].bytes(); }

  // The decode step captured for this sequence's buffers (decode_graph.h), and its short passes
  // by (tokens, first row of logits) (pass_graph.h); destroyed with it.
  cudaGraphExec_t step_graph = nullptr;
  std::map<std::pair<int, int>, cudaGraphExec_t> pass_graphs;

 private:
  void copy_recurrent_from(const std::vector<DeviceBuffer>& conv, const std::vector<DeviceBuffer>& ssm);

  const ModelConfig config_;
  int64_t capacity_;
  int64_t length_ = 0;
  uint64_t kv_row_bytes_, conv_bytes_, ssm_bytes_;
  std::vector<DeviceBuffer> k_cache_, v_cache_, conv_, ssm_;  // per attention / DeltaNet layer
  DeviceBuffer position_;
};

// The CUDA state behind a SequenceState (throws if it is another backend's).
CudaSequenceState& as_cuda(SequenceState& state);

// *position += n on the device, in stream order (a kernel of the captured step: PDL-aware).
void advance_position(int32_t* position, int n, cudaStream_t stream);

}  // namespace lily::cuda
