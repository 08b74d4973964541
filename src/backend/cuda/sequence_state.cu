// sequence_state.cu: see sequence_state.h.
#include "backend/cuda/common/cuda_check.h"  // first: it sets up fmt for nvcc
#include "backend/cuda/sequence_state.h"

#include <algorithm>

#include "backend/cuda/common/pdl.cuh"

namespace lily::cuda {

namespace {

__global__ void advance_position_kernel(int32_t* position, int n) {
  pdl_wait();
  pdl_launch_dependents();
  *position += n;
}

// A device position set to n between steps: no step in flight reads the old one.
void write_position(const DeviceBuffer& position, int64_t n) {
  const int32_t value = int32_t(n);
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaMemcpy(position.get(), &value, sizeof(value), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaDeviceSynchronize());
}

void copy_buffers(const std::vector<DeviceBuffer>& src, std::vector<DeviceBuffer>& dst) {
  for (size_t i = 0; i < src.size(); ++i)
    CUDA_CHECK(cudaMemcpy(dst[i].get(), src[i].get(), src[i].bytes(), cudaMemcpyDeviceToDevice));
}

}  // namespace

void advance_position(int32_t* position, int n, cudaStream_t stream) {
  advance_position_kernel<<<1, 1, 0, stream>>>(position, n);
  CUDA_CHECK_LAUNCH();
}

uint64_t CudaRecurrentSnapshot::memory_bytes() const {
  uint64_t n = 0;
  for (const auto& b : conv_) n += b.bytes();
  for (const auto& b : ssm_) n += b.bytes();
  return n;
}

CudaSequenceState::CudaSequenceState(const ModelConfig& c, int64_t capacity, bool mtp)
    : config_(c), capacity_(capacity) {
  kv_row_bytes_ = uint64_t(c.num_key_value_heads) * c.head_dim * 2;
  conv_bytes_ = uint64_t(c.linear_conv_kernel_dim - 1) * c.linear_conv_dim() * 4;
  ssm_bytes_ = uint64_t(c.linear_num_value_heads) * c.linear_key_head_dim * c.linear_value_head_dim * 4;
  for (LayerKind kind : c.layer_types) {
    if (kind == LayerKind::full_attention) {
      k_cache_.emplace_back(kv_row_bytes_ * uint64_t(capacity));
      v_cache_.emplace_back(kv_row_bytes_ * uint64_t(capacity));
    } else {
      conv_.emplace_back(conv_bytes_);
      ssm_.emplace_back(ssm_bytes_);
    }
  }
  position_ = DeviceBuffer(4);
  if (mtp) {
    mtp_k_ = DeviceBuffer(kv_row_bytes_ * uint64_t(capacity));
    mtp_v_ = DeviceBuffer(kv_row_bytes_ * uint64_t(capacity));
    mtp_position_ = DeviceBuffer(4);
  }
  reset();
}

CudaSequenceState::~CudaSequenceState() {
  if (step_graph) cudaGraphExecDestroy(step_graph);
  for (auto& [key, graph] : pass_graphs)
    if (graph) cudaGraphExecDestroy(graph);
}

uint64_t CudaSequenceState::memory_bytes() const {
  const uint64_t kv_layers = k_cache_.size() + (has_mtp_cache() ? 1 : 0);
  return uint64_t(capacity_) * kv_row_bytes_ * 2 * kv_layers + (conv_bytes_ + ssm_bytes_) * conv_.size();
}

std::unique_ptr<SequenceState> CudaSequenceState::clone() const {
  auto s = std::make_unique<CudaSequenceState>(config_, capacity_, has_mtp_cache());
  const uint64_t kv_bytes = kv_row_bytes_ * uint64_t(length_);
  for (size_t i = 0; i < k_cache_.size(); ++i) {
    CUDA_CHECK(cudaMemcpy(s->k_cache_[i].get(), k_cache_[i].get(), kv_bytes, cudaMemcpyDeviceToDevice));
    CUDA_CHECK(cudaMemcpy(s->v_cache_[i].get(), v_cache_[i].get(), kv_bytes, cudaMemcpyDeviceToDevice));
  }
  if (has_mtp_cache()) {
    const uint64_t mtp_bytes = kv_row_bytes_ * uint64_t(mtp_length_);
    CUDA_CHECK(cudaMemcpy(s->mtp_k_.get(), mtp_k_.get(), mtp_bytes, cudaMemcpyDeviceToDevice));
    CUDA_CHECK(cudaMemcpy(s->mtp_v_.get(), mtp_v_.get(), mtp_bytes, cudaMemcpyDeviceToDevice));
    s->set_mtp_length(mtp_length_);
  }
  s->copy_recurrent_from(conv_, ssm_);
  s->set_length(length_);
  return s;
}

std::unique_ptr<RecurrentSnapshot> CudaSequenceState::snapshot() const {
  auto s = std::make_unique<CudaRecurrentSnapshot>();
  s->length_ = length_;
  s->mtp_length_ = mtp_length_;
  for (size_t i = 0; i < conv_.size(); ++i) {
    s->conv_.emplace_back(conv_bytes_);
    s->ssm_.emplace_back(ssm_bytes_);
  }
  copy_buffers(conv_, s->conv_);
  copy_buffers(ssm_, s->ssm_);
  return s;
}

void CudaSequenceState::restore(const RecurrentSnapshot& snapshot) {
  auto* s = dynamic_cast<const CudaRecurrentSnapshot*>(&snapshot);
  LILY_CHECK(s, "restore: snapshot is not from the CUDA backend");
  LILY_CHECK(s->length_ <= length_, "restore: snapshot at {} tokens is past this sequence's {} tokens", s->length_,
             length_);
  kept_valid_ = false;
  LILY_CHECK(s->mtp_length_ <= mtp_length_,
             "restore: the snapshot's MTP cache at {} positions is past this sequence's {}", s->mtp_length_,
             mtp_length_);
  copy_recurrent_from(s->conv_, s->ssm_);
  set_length(s->length_);
  if (has_mtp_cache()) set_mtp_length(s->mtp_length_);
}

void CudaSequenceState::reset() {
  kept_valid_ = false, asked_rows_ = 0;
  kept_conv_.clear(), kept_ssm_.clear(), kept_slots_ = 0;
  for (auto& b : conv_) b.zero();
  for (auto& b : ssm_) b.zero();
  set_length(0);
  if (has_mtp_cache()) set_mtp_length(0);
}

void CudaSequenceState::set_length(int64_t n) {
  length_ = n;
  write_position(position_, n);
}

bool CudaSequenceState::keep_row_states(int rows) {
  if (rows < 1 || rows > max_kept_rows_) return false;
  if (rows > kept_slots_) {  // buffers for the most rows asked so far
    kept_conv_.clear(), kept_ssm_.clear();
    for (size_t i = 0; i < conv_.size(); ++i) {
      kept_conv_.emplace_back(conv_bytes_ * uint64_t(rows));
      kept_ssm_.emplace_back(ssm_bytes_ * uint64_t(rows));
    }
    kept_slots_ = rows;
  }
  asked_rows_ = rows;
  return true;
}

int CudaSequenceState::begin_forward(int64_t T) {
  kept_valid_ = false;
  const int rows = int(std::min<int64_t>(asked_rows_, T));
  asked_rows_ = 0;
  kept_rows_ = rows;
  return rows;
}

DeltaNetKept CudaSequenceState::kept(size_t i) const {
  if (armed_first_ < 0) return {};
  return {kept_conv_[i].as<float>(), kept_ssm_[i].as<float>(), armed_first_};
}

void CudaSequenceState::kept_done(int64_t end) {
  kept_end_ = kept_last_ = end;
  kept_valid_ = kept_rows_ > 0;
}

bool CudaSequenceState::rewind(int64_t length, int64_t mtp_length) {
  if (!kept_valid_ || length > kept_last_ || length < kept_end_ - kept_rows_ + 1 || mtp_length < 0 ||
      mtp_length > mtp_length_)
    return false;
  if (length != length_) {  // the state after row length - 1: kept slot (length - first kept length)
    const uint64_t slot = uint64_t(length - (kept_end_ - kept_rows_ + 1));
    for (size_t i = 0; i < conv_.size(); ++i) {
      CUDA_CHECK(cudaMemcpy(conv_[i].get(), kept_conv_[i].as<char>() + slot * conv_bytes_, conv_bytes_,
                            cudaMemcpyDeviceToDevice));
      CUDA_CHECK(
          cudaMemcpy(ssm_[i].get(), kept_ssm_[i].as<char>() + slot * ssm_bytes_, ssm_bytes_, cudaMemcpyDeviceToDevice));
    }
    set_length(length);  // the KV rows past it are cut: append-only, overwritten next
  }
  kept_last_ = length;
  if (has_mtp_cache() && mtp_length != mtp_length_) set_mtp_length(mtp_length);
  return true;
}

void CudaSequenceState::set_mtp_length(int64_t n) {
  LILY_CHECK(has_mtp_cache(), "internal: the MTP length of a sequence without the head's cache");
  mtp_length_ = n;
  write_position(mtp_position_, n);
}

void CudaSequenceState::copy_recurrent_from(const std::vector<DeviceBuffer>& conv,
                                            const std::vector<DeviceBuffer>& ssm) {
  copy_buffers(conv, conv_);
  copy_buffers(ssm, ssm_);
}

CudaSequenceState& as_cuda(SequenceState& state) {
  auto* s = dynamic_cast<CudaSequenceState*>(&state);
  LILY_CHECK(s, "sequence state is not from the CUDA backend");
  return *s;
}

}  // namespace lily::cuda
