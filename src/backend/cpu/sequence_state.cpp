// sequence_state.cpp: one sequence's state on the CPU (sequence_state.h).
#include "backend/cpu/sequence_state.h"

#include <cstring>

#include "base/error.h"

namespace lily::cpu {

namespace {

uint64_t deltanet_bytes(const std::vector<DeltaNetCache>& deltanet) {
  uint64_t n = 0;
  for (auto& d : deltanet) n += (d.conv.size() + d.ssm.size()) * 4;
  return n;
}

}  // namespace

uint64_t CpuRecurrentSnapshot::memory_bytes() const { return deltanet_bytes(deltanet); }

CpuSequenceState::CpuSequenceState(const ModelConfig& c, int64_t capacity, const char* backend)
    : config_(&c), capacity_(capacity), backend_(backend), mtp_(c) {
  layer_slot_.resize(size_t(c.num_layers));
  for (int i = 0; i < c.num_layers; ++i) {
    if (c.layer_types[size_t(i)] == LayerKind::full_attention) {
      layer_slot_[size_t(i)] = int(attention_.size());
      attention_.emplace_back();
    } else {
      layer_slot_[size_t(i)] = int(deltanet_.size());
      deltanet_.emplace_back();
    }
  }
  reset();
}

uint64_t CpuSequenceState::memory_bytes() const {
  uint64_t n = 0;
  for (auto& a : attention_) n += (a.k.size() + a.v.size()) * 4;
  return n + deltanet_bytes(deltanet_) + mtp_.memory_bytes();
}

std::unique_ptr<RecurrentSnapshot> CpuSequenceState::snapshot() const {
  auto s = std::make_unique<CpuRecurrentSnapshot>();
  s->backend = backend_;
  s->length_ = length_;
  s->mtp_length = mtp_.length();
  s->deltanet = deltanet_;
  return s;
}

void CpuSequenceState::restore(const RecurrentSnapshot& snapshot) {
  auto* s = dynamic_cast<const CpuRecurrentSnapshot*>(&snapshot);
  LILY_CHECK(s && std::strcmp(s->backend, backend_) == 0, "restore: snapshot is not from the {} backend", backend_);
  LILY_CHECK(s->length_ <= length_, "restore: snapshot at {} tokens is past this sequence's {} tokens", s->length_,
             length_);
  mtp_.cut(s->mtp_length);  // checks that it is not past this sequence's: before anything changes
  const int64_t row = int64_t(config_->num_key_value_heads) * config_->head_dim;
  for (auto& a : attention_) {
    a.k.resize(size_t(s->length_ * row));
    a.v.resize(size_t(s->length_ * row));
  }
  deltanet_ = s->deltanet;
  length_ = s->length_;
}

void CpuSequenceState::reset() {
  const ModelConfig& c = *config_;
  for (auto& a : attention_) {
    a.k.clear();
    a.v.clear();
  }
  for (auto& d : deltanet_) {
    d.conv.assign(size_t((c.linear_conv_kernel_dim - 1) * c.linear_conv_dim()), 0.f);
    d.ssm.assign(size_t(c.linear_num_value_heads) * c.linear_key_head_dim * c.linear_value_head_dim, 0.f);
  }
  mtp_.clear();
  length_ = 0;
}

LayerCache CpuSequenceState::layer_cache(int layer) {
  if (config_->layer_types[size_t(layer)] == LayerKind::full_attention) return {.attention = &attention_cache(layer)};
  return {.deltanet = &deltanet_cache(layer)};
}

std::unique_ptr<SequenceState> new_cpu_sequence(const ModelConfig& c, int64_t capacity, const char* backend) {
  LILY_CHECK(capacity > 0, "sequence capacity must be positive, got {}", capacity);
  return std::make_unique<CpuSequenceState>(c, capacity, backend);
}

CpuSequenceState& cpu_sequence(SequenceState& state, const char* backend, const char* what) {
  auto* s = dynamic_cast<CpuSequenceState*>(&state);
  LILY_CHECK(s && std::strcmp(s->backend(), backend) == 0, "{}: sequence state is not from the {} backend", what,
             backend);
  return *s;
}

}  // namespace lily::cpu
