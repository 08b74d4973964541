// sequence_state.h: the state of one sequence on the GPU (spec §4): the KV cache of the
// attention layers, the conv and recurrent state of the DeltaNet layers, and the position, which
// lives in device memory and is advanced by a kernel of the step, so the captured decode step
// (decode_graph.h) replays without re-capture. With the MTP head (Backend::forward_mtp) it also
// holds the head's KV cache and position, rolled with the rest as backend.h says.
//
// keep_row_states / rewind (backend.h, a speculative verify), where the backend allows them
// (allow_row_states): the forward after keep_row_states(R) runs its last R rows through the
// DeltaNet decode kernel with each row's states written to buffers of the state (DeltaNetKept;
// allocated for the most rows asked, reused); rewind copies one back and cuts the KV rows, and
// may be followed by another to a shorter length until the next forward.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/common/device_buffer.h"
#include "backend/cuda/common/gpu_types.h"
#include "backend/cuda/deltanet/deltanet.h"
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
  int64_t mtp_length_ = 0;
  std::vector<DeviceBuffer> conv_, ssm_;
};

// One attention layer's KV cache as the attention kernels read it: [capacity, nkv, head_dim] bf16
// each, and the device position the next rows go to.
struct KvCache {
  bf16* k = nullptr;
  bf16* v = nullptr;
  int64_t capacity = 0;
  int32_t* position = nullptr;
};

class CudaSequenceState final : public SequenceState {
 public:
  // mtp: with the MTP head's cache (a KV cache of `capacity` rows and its position).
  CudaSequenceState(const ModelConfig& c, int64_t capacity, bool mtp = false);
  ~CudaSequenceState() override;

  int64_t length() const override { return length_; }
  int64_t capacity() const override { return capacity_; }
  // The KV cache is allocated for the whole capacity up front, so that is what the state occupies.
  uint64_t memory_bytes() const override;
  std::unique_ptr<SequenceState> clone() const override;
  std::unique_ptr<RecurrentSnapshot> snapshot() const override;
  void restore(const RecurrentSnapshot& snapshot) override;
  void reset() override;
  int64_t mtp_length() const override { return mtp_length_; }
  bool keep_row_states(int rows) override;
  bool rewind(int64_t length, int64_t mtp_length) override;

  // The backend's side of keep_row_states. allow_row_states(n): up to n rows may be kept (0: none,
  // the default). begin_forward(T), first in every forward of T tokens: how many of its last rows
  // to keep (min(asked, T); 0: none asked); the asking is used up. During the pass that holds them,
  // arm_kept(first): DeltaNet layer i's rows from the pass's row `first` go where kept(i) says
  // ({}: unarmed); kept_done(end) once the forward is in, the sequence then end tokens long.
  // A forward of one token keeps its one row as the live state (rewind to its end: nothing to copy).
  void allow_row_states(int rows) { max_kept_rows_ = rows; }
  int begin_forward(int64_t T);
  void arm_kept(int first) { armed_first_ = first; }
  void disarm_kept() { armed_first_ = -1; }
  DeltaNetKept kept(size_t i) const;
  void kept_done(int64_t end);

  // Sets the length on the host and on the device (synchronizes the device).
  void set_length(int64_t n);
  // The host's count after a step or pass advanced the device position by n.
  void advance_host(int64_t n) { length_ += n; }
  // The MTP head's: its length on the host and device (synchronizes), its host count after a
  // pass advanced its device position by n.
  void set_mtp_length(int64_t n);
  void advance_mtp_host(int64_t n) { mtp_length_ += n; }
  bool has_mtp_cache() const { return mtp_k_.get() != nullptr; }

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
  KvCache attention_cache(size_t i) const { return {k_cache(i), v_cache(i), capacity_, position()}; }
  // The MTP head's cache (has_mtp_cache()), its position mtp_length() on the device.
  KvCache mtp_cache() const { return {mtp_k_.as<bf16>(), mtp_v_.as<bf16>(), capacity_, mtp_position_.as<int32_t>()}; }

  // The decode step captured for this sequence's buffers (decode_graph.h), and its short passes
  // by (tokens, first row of logits) (pass_graph.h); destroyed with it.
  cudaGraphExec_t step_graph = nullptr;
  std::map<std::pair<int, int>, cudaGraphExec_t> pass_graphs;

 private:
  void copy_recurrent_from(const std::vector<DeviceBuffer>& conv, const std::vector<DeviceBuffer>& ssm);

  const ModelConfig config_;
  int64_t capacity_;
  int64_t length_ = 0, mtp_length_ = 0;
  uint64_t kv_row_bytes_, conv_bytes_, ssm_bytes_;
  std::vector<DeviceBuffer> k_cache_, v_cache_, conv_, ssm_;  // per attention / DeltaNet layer
  DeviceBuffer position_;
  DeviceBuffer mtp_k_, mtp_v_, mtp_position_;  // the MTP head's (empty without it)
  // keep_row_states' buffers and bookkeeping: kept_conv_ / kept_ssm_[DeltaNet layer] hold
  // kept_slots_ rows' states; the forward kept its last kept_rows_ rows (lengths end - rows + 1 ..
  // end), a rewind may ask lengths up to kept_last_ while kept_valid_.
  int max_kept_rows_ = 0, asked_rows_ = 0, kept_slots_ = 0, armed_first_ = -1;
  int64_t kept_rows_ = 0, kept_end_ = 0, kept_last_ = 0;
  bool kept_valid_ = false;
  std::vector<DeviceBuffer> kept_conv_, kept_ssm_;
};

// The CUDA state behind a SequenceState (throws if it is another backend's).
CudaSequenceState& as_cuda(SequenceState& state);

// *position += n on the device, in stream order (a kernel of the captured step: PDL-aware).
void advance_position(int32_t* position, int n, cudaStream_t stream);

}  // namespace lily::cuda
