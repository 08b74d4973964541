// sequence_state.cpp: one sequence's state on the CPU (sequence_state.h).
#include "backend/cpu/sequence_state.h"

#include <algorithm>
#include <cstring>

#include "base/error.h"

namespace lily::cpu {

namespace {

uint64_t deltanet_bytes(const std::vector<DeltaNetCache>& deltanet) {
  uint64_t n = 0;
  for (auto& d : deltanet) n += (d.conv.size() + d.ssm.size()) * 4;
  return n;
}

uint64_t bytes_of(const std::vector<std::vector<float>>& buffers) {
  uint64_t n = 0;
  for (auto& b : buffers) n += b.size() * 4;
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
  return n + deltanet_bytes(deltanet_) + mtp_.memory_bytes() + bytes_of(kept_.conv) + bytes_of(kept_.ssm);
}

// Everything but the kept rows' buffers (a clone keeps no rows).
std::unique_ptr<SequenceState> CpuSequenceState::clone() const {
  auto s = std::make_unique<CpuSequenceState>(*config_, capacity_, backend_);
  s->length_ = length_;
  s->attention_ = attention_;
  s->deltanet_ = deltanet_;
  s->mtp_ = mtp_;
  return s;
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
  cut_attention(s->length_);
  deltanet_ = s->deltanet;
  length_ = s->length_;
  forget_kept_rows();
}

void CpuSequenceState::cut_attention(int64_t length) {
  const int64_t row = int64_t(config_->num_key_value_heads) * config_->head_dim;
  for (auto& a : attention_) {
    a.k.resize(size_t(length * row));
    a.v.resize(size_t(length * row));
  }
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
  forget_kept_rows();
  kept_.slots = 0;
  kept_.conv.clear();
  kept_.ssm.clear();
}

void CpuSequenceState::forget_kept_rows() {
  kept_.asked = 0;
  kept_.recording = kept_.valid = false;
}

bool CpuSequenceState::keep_row_states(int rows) {
  if (rows < 1 || rows > kMaxKeptRows) return false;
  const ModelConfig& c = *config_;
  const int64_t slots = rows - 1;  // the last kept row's states are the live ones
  if (slots > kept_.slots) {
    const int64_t C = c.linear_conv_dim(), K = c.linear_conv_kernel_dim;
    const int64_t S = int64_t(c.linear_num_value_heads) * c.linear_key_head_dim * c.linear_value_head_dim;
    kept_.conv.resize(deltanet_.size());
    kept_.ssm.resize(deltanet_.size());
    for (size_t i = 0; i < deltanet_.size(); ++i) {
      kept_.conv[i].resize(size_t(std::max<int64_t>(slots + K - 2, 0) * C));
      kept_.ssm[i].resize(size_t(slots * S));
    }
    kept_.slots = slots;
  }
  kept_.asked = rows;
  return true;
}

// Slot j holds the states after the forward's row T - R + j, i.e. at length end - R + 1 + j; the
// last row's (length end) are the live states until a rewind to a shorter length.
bool CpuSequenceState::rewind(int64_t length, int64_t mtp_length) {
  const int64_t first = kept_.end - kept_.rows + 1;
  if (!kept_.valid || length < first || length > kept_.last) return false;
  if (mtp_length < 0 || mtp_length > mtp_.length()) return false;
  if (length < length_) {
    const ModelConfig& c = *config_;
    const int64_t C = c.linear_conv_dim(), K = c.linear_conv_kernel_dim, j = length - first;
    for (size_t i = 0; i < deltanet_.size(); ++i) {
      const float* conv = kept_.conv[i].data() + j * C;  // rows j .. j + K - 2
      std::copy(conv, conv + (K - 1) * C, deltanet_[i].conv.begin());
      const float* ssm = kept_.ssm[i].data() + j * int64_t(deltanet_[i].ssm.size());
      std::copy(ssm, ssm + deltanet_[i].ssm.size(), deltanet_[i].ssm.begin());
    }
    cut_attention(length);
  }
  mtp_.cut(mtp_length);
  length_ = length;
  kept_.last = length;
  return true;
}

int64_t CpuSequenceState::begin_forward(int64_t T) {
  kept_.rows = std::min<int64_t>(kept_.asked, T);
  kept_.asked = 0;
  kept_.end = length_ + T;
  kept_.last = kept_.end;
  kept_.recording = kept_.rows > 0;
  kept_.valid = false;
  return kept_.rows;
}

DeltaNetKept CpuSequenceState::deltanet_kept(int layer, int64_t first_row) {
  if (!kept_.recording || kept_.rows <= 1) return {};
  const size_t slot = size_t(layer_slot_[size_t(layer)]);
  return {kept_.conv[slot].data(), kept_.ssm[slot].data(), first_row, kept_.rows - 1};
}

void CpuSequenceState::advance(int64_t n) {
  length_ += n;
  kept_.asked = 0;
  kept_.valid = kept_.recording && length_ == kept_.end;
  if (length_ >= kept_.end) kept_.recording = false;
}

LayerCache CpuSequenceState::layer_cache(int layer) {
  if (config_->layer_types[size_t(layer)] == LayerKind::full_attention)
    return {.attention = &attention_cache(layer), .deltanet = nullptr, .kept = {}};
  return {.attention = nullptr, .deltanet = &deltanet_cache(layer), .kept = {}};
}

int64_t next_block(int64_t t0, int64_t T, int64_t chunk, int64_t kept) {
  const int64_t n = std::min(chunk, T - t0), rest = T - t0 - n;
  return rest > 0 && rest < kept ? T - t0 - kept : n;
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
