// forward.cpp: the CPU backend: whole-model forward and the sequence state (spec §2.3, §4).
//
//   h = embed[token]
//   for each layer:  h += mixer(RMSNorm_zc(h))        mixer = Gated DeltaNet | gated attention
//                    h += sparse_moe(RMSNorm_zc(h))
//   logits = RMSNorm_zc(h; norm) @ lm_head^T
// Prompts are processed in chunks of kChunkTokens so scratch memory stays bounded; the
// caches carry the context from one chunk to the next.
#include <algorithm>

#include "backend/backend.h"
#include "backend/cpu/ops.h"
#include "base/error.h"
#include "model/weights.h"

namespace lily {

namespace {

using cpu::AttentionCache;
using cpu::DeltaNetCache;

constexpr int64_t kChunkTokens = 256;

struct CpuRecurrentSnapshot final : RecurrentSnapshot {
  int64_t length_ = 0;
  std::vector<DeltaNetCache> deltanet;
  int64_t length() const override { return length_; }
  uint64_t memory_bytes() const override {
    uint64_t n = 0;
    for (auto& d : deltanet) n += (d.conv.size() + d.ssm.size()) * 4;
    return n;
  }
};

class CpuSequenceState final : public SequenceState {
 public:
  CpuSequenceState(const ModelConfig& c, int64_t capacity) : config_(&c), capacity_(capacity) {
    layer_slot_.resize(size_t(c.num_layers));
    for (int i = 0; i < c.num_layers; ++i) {
      if (c.layer_types[size_t(i)] == LayerKind::full_attention) {
        layer_slot_[size_t(i)] = int(attention.size());
        attention.emplace_back();
      } else {
        layer_slot_[size_t(i)] = int(deltanet.size());
        deltanet.emplace_back();
      }
    }
    reset();
  }

  int64_t length() const override { return length_; }
  int64_t capacity() const override { return capacity_; }
  uint64_t memory_bytes() const override {
    uint64_t n = 0;
    for (auto& a : attention) n += (a.k.size() + a.v.size()) * 4;
    for (auto& d : deltanet) n += (d.conv.size() + d.ssm.size()) * 4;
    return n;
  }
  std::unique_ptr<SequenceState> clone() const override { return std::make_unique<CpuSequenceState>(*this); }
  std::unique_ptr<RecurrentSnapshot> snapshot() const override {
    auto s = std::make_unique<CpuRecurrentSnapshot>();
    s->length_ = length_;
    s->deltanet = deltanet;
    return s;
  }
  void restore(const RecurrentSnapshot& snapshot) override {
    auto* s = dynamic_cast<const CpuRecurrentSnapshot*>(&snapshot);
    LILY_CHECK(s, "restore: snapshot is not from the CPU backend");
    LILY_CHECK(s->length_ <= length_, "restore: snapshot at {} tokens is past this sequence's {} tokens", s->length_,
               length_);
    const int64_t row = int64_t(config_->num_key_value_heads) * config_->head_dim;
    for (auto& a : attention) {
      a.k.resize(size_t(s->length_ * row));
      a.v.resize(size_t(s->length_ * row));
    }
    deltanet = s->deltanet;
    length_ = s->length_;
  }
  void reset() override {
    const ModelConfig& c = *config_;
    for (auto& a : attention) {
      a.k.clear();
      a.v.clear();
    }
    for (auto& d : deltanet) {
      d.conv.assign(size_t((c.linear_conv_kernel_dim - 1) * c.linear_conv_dim()), 0.f);
      d.ssm.assign(size_t(c.linear_num_value_heads) * c.linear_key_head_dim * c.linear_value_head_dim, 0.f);
    }
    length_ = 0;
  }

  AttentionCache& attention_cache(int layer) { return attention[size_t(layer_slot_[size_t(layer)])]; }
  DeltaNetCache& deltanet_cache(int layer) { return deltanet[size_t(layer_slot_[size_t(layer)])]; }
  cpu::LayerCache layer_cache(int layer) {
    if (config_->layer_types[size_t(layer)] == LayerKind::full_attention) return {.attention = &attention_cache(layer)};
    return {.deltanet = &deltanet_cache(layer)};
  }
  void advance(int64_t n) { length_ += n; }

 private:
  const ModelConfig* config_;
  int64_t capacity_;
  int64_t length_ = 0;
  std::vector<int> layer_slot_;  // layer -> index into attention or deltanet
  std::vector<AttentionCache> attention;
  std::vector<DeltaNetCache> deltanet;
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(std::shared_ptr<const ModelWeights> weights) : w_(std::move(weights)) {}

  std::string name() const override { return "cpu"; }
  const ModelConfig& config() const override { return w_->config; }

  std::unique_ptr<SequenceState> new_sequence(int64_t capacity) override {
    LILY_CHECK(capacity > 0, "sequence capacity must be positive, got {}", capacity);
    return std::make_unique<CpuSequenceState>(w_->config, capacity);
  }

  void forward(SequenceState& state, std::span<const int32_t> tokens, LogitsWanted wanted,
               std::vector<float>& logits) override {
    auto* s = dynamic_cast<CpuSequenceState*>(&state);
    LILY_CHECK(s, "forward: sequence state is not from the CPU backend");
    const ModelConfig& c = w_->config;
    const int64_t T = int64_t(tokens.size()), V = c.vocab_size;
    LILY_CHECK(s->length() + T <= s->capacity(), "sequence of {} tokens plus {} new ones exceeds its capacity of {}",
               s->length(), T, s->capacity());
    for (int32_t id : tokens) LILY_CHECK(id >= 0 && id < V, "token id {} is outside the vocabulary [0, {})", id, V);
    logits.assign(size_t(wanted == LogitsWanted::all ? T * V : wanted == LogitsWanted::last && T > 0 ? V : 0), 0.f);
    for (int64_t t0 = 0; t0 < T; t0 += kChunkTokens) {
      const int64_t n = std::min(kChunkTokens, T - t0);
      const bool is_last_chunk = t0 + n == T;
      float* out = nullptr;
      int64_t first_row = 0;
      if (wanted == LogitsWanted::all) out = logits.data() + t0 * V;
      else if (wanted == LogitsWanted::last && is_last_chunk) out = logits.data(), first_row = n - 1;
      forward_chunk(*s, tokens.subspan(size_t(t0), size_t(n)), out, first_row);
    }
  }

 private:
  // One block of tokens through every layer; logits of rows [first_row, n) into `logits`.
  void forward_chunk(CpuSequenceState& s, std::span<const int32_t> tokens, float* logits, int64_t first_row) {
    const ModelConfig& c = w_->config;
    const int64_t T = int64_t(tokens.size()), H = c.hidden_size;
    std::vector<float> h(size_t(T * H));  // [T, H] the residual stream
    for (int64_t t = 0; t < T; ++t) w_->embed_tokens.dequantize_row(tokens[size_t(t)], h.data() + t * H);

    for (int i = 0; i < c.num_layers; ++i)
      cpu::decoder_layer(w_->layers[size_t(i)], c, s.layer_cache(i), s.length(), h.data(), T);
    s.advance(T);
    if (!logits) return;
    const int64_t rows = T - first_row;
    std::vector<float> normed(size_t(rows * H));  // [rows, H]
    cpu::rms_norm(h.data() + first_row * H, w_->final_norm.data(), rows, H, c.rms_norm_eps, normed.data());
    cpu::linear(w_->lm_head, normed.data(), rows, logits);
  }

  std::shared_ptr<const ModelWeights> w_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(std::shared_ptr<const ModelWeights> weights) {
  return std::make_unique<CpuBackend>(std::move(weights));
}

}  // namespace lily
