// forward.cpp: the CPU backend: whole-model forward (spec §2.3; its sequence state: sequence_state.h).
//
//   h = embed[token]
//   for each layer:  h += mixer(RMSNorm_zc(h))        mixer = Gated DeltaNet | gated attention
//                    h += sparse_moe(RMSNorm_zc(h))
//   logits = RMSNorm_zc(h; norm) @ lm_head^T
// Prompts are processed in chunks of kChunkTokens so scratch memory stays bounded; the
// caches carry the context from one chunk to the next. The MTP head (mtp.cpp) runs on the
// rows RMSNorm_zc(h; norm) that forward_hidden hands back, with its own cache (mtp_cache.h).
// A forward after keep_row_states (sequence_state.h) puts the kept rows in its last chunk and
// has the DeltaNet layers keep their states after them, for a rewind.
#include <algorithm>

#include "backend/backend.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/sequence_state.h"
#include "backend/output_rows.h"
#include "base/error.h"
#include "model/weights.h"

namespace lily {

namespace {

using cpu::CpuSequenceState;

// The reference backend's name in its states' errors.
constexpr const char* kBackend = "CPU";
constexpr int64_t kChunkTokens = 256;

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(std::shared_ptr<const ModelWeights> weights) : w_(std::move(weights)) {}

  std::string name() const override { return "cpu"; }
  const ModelConfig& config() const override { return w_->config; }

  std::unique_ptr<SequenceState> new_sequence(int64_t capacity) override {
    return cpu::new_cpu_sequence(w_->config, capacity, kBackend);
  }

  std::string mtp_unavailable() const override {
    if (w_->mtp) return "";
    return fmt::format(
        "the model has no MTP head: {} has no mtp.* tensors (mlx-community conversions drop them; --mtp DIR "
        "reads them from the Hugging Face checkpoint)",
        w_->model_dir);
  }

  void forward(SequenceState& state, std::span<const int32_t> tokens, LogitsWanted wanted,
               std::vector<float>& logits) override {
    std::vector<float> no_hidden;
    forward_hidden(state, tokens, wanted, logits, LogitsWanted::none, no_hidden);
  }

  void forward_hidden(SequenceState& state, std::span<const int32_t> tokens, LogitsWanted wanted,
                      std::vector<float>& logits, LogitsWanted hidden_rows, std::vector<float>& hidden) override {
    CpuSequenceState& s = cpu::cpu_sequence(state, kBackend, "forward");
    const ModelConfig& c = w_->config;
    const int64_t T = int64_t(tokens.size()), V = c.vocab_size, H = c.hidden_size;
    LILY_CHECK(s.length() + T <= s.capacity(), "sequence of {} tokens plus {} new ones exceeds its capacity of {}",
               s.length(), T, s.capacity());
    check_tokens(tokens, V);
    logits.assign(size_t(rows_of(wanted, T) * V), 0.f);
    hidden.assign(size_t(rows_of(hidden_rows, T) * H), 0.f);
    const int64_t kept = s.begin_forward(T);  // rows kept for a rewind: all in the last chunk
    for (int64_t t0 = 0, n = 0; t0 < T; t0 += n) {
      n = cpu::next_block(t0, T, kChunkTokens, kept);
      forward_chunk(s, tokens.subspan(size_t(t0), size_t(n)), output_rows(wanted, logits, V, t0, n, T),
                    output_rows(hidden_rows, hidden, H, t0, n, T), t0 + n == T ? kept : 0);
    }
  }

  void forward_mtp(SequenceState& state, std::span<const float> hidden, std::span<const int32_t> tokens,
                   LogitsWanted wanted, std::vector<float>& logits, std::vector<float>& mtp_hidden) override {
    LILY_CHECK(w_->mtp, "{}", mtp_unavailable());
    CpuSequenceState& s = cpu::cpu_sequence(state, kBackend, "forward_mtp");
    const ModelConfig& c = w_->config;
    const int64_t T = int64_t(tokens.size()), V = c.vocab_size, H = c.hidden_size;
    check_mtp_rows(s, hidden, tokens);
    logits.assign(size_t(rows_of(wanted, T) * V), 0.f);
    mtp_hidden.assign(size_t(rows_of(wanted, T) * H), 0.f);
    for (int64_t t0 = 0; t0 < T; t0 += kChunkTokens) {
      const int64_t n = std::min(kChunkTokens, T - t0);
      std::vector<float> m(size_t(n * H));  // [n, H] the head's post-norm rows
      cpu::mtp_block(*w_->mtp, w_->embed_tokens, c, s.mtp().attention(), s.mtp_length(), hidden.data() + t0 * H,
                     tokens.data() + t0, n, m.data());
      const OutputRows m_rows = output_rows(wanted, mtp_hidden, H, t0, n, T);
      if (m_rows.out) std::copy(m.begin() + m_rows.first_row * H, m.end(), m_rows.out);
      const OutputRows logit_rows = output_rows(wanted, logits, V, t0, n, T);
      if (logit_rows.out)
        cpu::linear(w_->lm_head, m.data() + logit_rows.first_row * H, n - logit_rows.first_row, logit_rows.out);
    }
  }

 private:
  // One block of tokens through every layer; the logits and post-norm hidden rows each asks for.
  // The DeltaNet layers keep their states after the block's last `kept` rows (sequence_state.h).
  void forward_chunk(CpuSequenceState& s, std::span<const int32_t> tokens, OutputRows logits, OutputRows hidden,
                     int64_t kept) {
    const ModelConfig& c = w_->config;
    const int64_t T = int64_t(tokens.size()), H = c.hidden_size;
    std::vector<float> h(size_t(T * H));  // [T, H] the residual stream
    for (int64_t t = 0; t < T; ++t) w_->embed_tokens.dequantize_row(tokens[size_t(t)], h.data() + t * H);

    for (int i = 0; i < c.num_layers; ++i) {
      cpu::LayerCache cache = s.layer_cache(i);
      if (cache.deltanet && kept > 0) cache.kept = s.deltanet_kept(i, T - kept);
      cpu::decoder_layer(w_->layers[size_t(i)], c, cache, s.length(), h.data(), T);
    }
    s.advance(T);
    if (!logits.out && !hidden.out) return;
    // RMSNorm_zc(h; norm) from the first row either output wants.
    const int64_t first = std::min(logits.out ? logits.first_row : T, hidden.out ? hidden.first_row : T);
    std::vector<float> normed(size_t(T * H));  // [T, H] rows [first, T) set
    cpu::rms_norm(h.data() + first * H, w_->final_norm.data(), T - first, H, c.rms_norm_eps, normed.data() + first * H);
    if (hidden.out) std::copy(normed.begin() + hidden.first_row * H, normed.end(), hidden.out);
    if (logits.out) cpu::linear(w_->lm_head, normed.data() + logits.first_row * H, T - logits.first_row, logits.out);
  }

  std::shared_ptr<const ModelWeights> w_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(std::shared_ptr<const ModelWeights> weights) {
  return std::make_unique<CpuBackend>(std::move(weights));
}

}  // namespace lily
