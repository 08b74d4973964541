// sequence_state.cu: see sequence_state.h.
#include "backend/cuda/common/cuda_check.h"  // first: it sets up fmt for nvcc
#include "backend/cuda/sequence_state.h"

#include "backend/cuda/common/pdl.cuh"

namespace lily::cuda {

namespace {

__global__ void advance_position_kernel(int32_t* position, int n) {
  pdl_wait();
  pdl_launch_dependents();
  *position += n;
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

CudaSequenceState::CudaSequenceState(const ModelConfig& c, int64_t capacity) : config_(c), capacity_(capacity) {
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
  reset();
}

CudaSequenceState::~CudaSequenceState() {
  if (step_graph) cudaGraphExecDestroy(step_graph);
  for (auto& [key, graph] : pass_graphs)
    if (graph) cudaGraphExecDestroy(graph);
}

uint64_t CudaSequenceState::memory_bytes() const {
  return uint64_t(capacity_) * kv_row_bytes_ * 2 * k_cache_.size() + (conv_bytes_ + ssm_bytes_) * conv_.size();
}

std::unique_ptr<SequenceState> CudaSequenceState::clone() const {
  auto s = std::make_unique<CudaSequenceState>(config_, capacity_);
  const uint64_t kv_bytes = kv_row_bytes_ * uint64_t(length_);
  for (size_t i = 0; i < k_cache_.size(); ++i) {
    CUDA_CHECK(cudaMemcpy(s->k_cache_[i].get(), k_cache_[i].get(), kv_bytes, cudaMemcpyDeviceToDevice));
    CUDA_CHECK(cudaMemcpy(s->v_cache_[i].get(), v_cache_[i].get(), kv_bytes, cudaMemcpyDeviceToDevice));
  }
  s->copy_recurrent_from(conv_, ssm_);
  s->set_length(length_);
  return s;
}

std::unique_ptr<RecurrentSnapshot> CudaSequenceState::snapshot() const {
  auto s = std::make_unique<CudaRecurrentSnapshot>();
  s->length_ = length_;
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
  copy_recurrent_from(s->conv_, s->ssm_);
  set_length(s->length_);
}

void CudaSequenceState::reset() {
  for (auto& b : conv_) b.zero();
  for (auto& b : ssm_) b.zero();
  set_length(0);
}

void CudaSequenceState::set_length(int64_t n) {
  length_ = n;
  const int32_t position = int32_t(n);
  CUDA_CHECK(cudaDeviceSynchronize());  // no step in flight reads the old position
  CUDA_CHECK(cudaMemcpy(position_.get(), &position, sizeof(position), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaDeviceSynchronize());
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
