// backend.cpp: the fast CPU backend (cpu_fast.h): whole-model forward.
//
// The same structure as the reference (backend/cpu/forward.cpp, spec §2.3, §4) with the same
// sequence state (cpu::CpuSequenceState, backend/cpu/sequence_state.h): a decode step (one
// token) runs the layers of layers.h and the lm_head on the GEMV kernels; a longer block runs
// the layers of prefill.h (the prefill product of gemm.h, experts grouped by the tokens routed
// to them) in chunks of kChunkTokens, so prefill and decode can alternate on one sequence. A
// batch step (forward_batch: a token of each of several sequences) is one block of those layers
// too, each sequence a run of one row: every weight read once for all the rows, each row's
// attention and delta rule on its own sequence's caches. forward_hidden hands back the rows after
// the final norm; the MTP head (forward_mtp, mtp_fast.h) runs on the same layers, its KV in the
// state's MTP cache. A forward after keep_row_states has its DeltaNet layers keep their states
// after the kept rows, all in its last block (sequence_state.h), for a rewind.
#include <algorithm>
#include <mutex>

#include "backend/cpu/ops.h"
#include "backend/cpu/sequence_state.h"
#include "backend/cpu_fast/cpu_fast.h"
#include "backend/cpu_fast/gemv.h"
#include "backend/cpu_fast/layers.h"
#include "backend/cpu_fast/mtp_fast.h"
#include "backend/cpu_fast/prefill.h"
#include "backend/output_rows.h"
#include "base/error.h"
#include "model/weights.h"

namespace lily {

namespace {

using cpu::CpuSequenceState;

// The fast backend's name in its states' errors.
constexpr const char* kBackend = "fast CPU";
constexpr int64_t kChunkTokens = 256;

class FastCpuBackend final : public Backend {
 public:
  explicit FastCpuBackend(std::shared_ptr<const ModelWeights> weights) : w_(std::move(weights)) {}

  // "cpu": what --backend names it, and what the runtime checks to budget host memory.
  std::string name() const override { return "cpu"; }
  const ModelConfig& config() const override { return w_->config; }

  std::string mtp_unavailable() const override {
    if (w_->mtp) return "";
    return fmt::format(
        "the model has no MTP head: {} has no mtp.* tensors (mlx-community conversions drop them; --mtp DIR "
        "reads them from the Hugging Face checkpoint)",
        w_->model_dir);
  }

  std::unique_ptr<SequenceState> new_sequence(int64_t capacity) override {
    return cpu::new_cpu_sequence(w_->config, capacity, kBackend);
  }

  void forward(SequenceState& state, std::span<const int32_t> tokens, LogitsWanted wanted,
               std::vector<float>& logits) override {
    std::vector<float> no_hidden;
    forward_hidden(state, tokens, wanted, logits, LogitsWanted::none, no_hidden);
  }

  void forward_hidden(SequenceState& state, std::span<const int32_t> tokens, LogitsWanted wanted,
                      std::vector<float>& logits, LogitsWanted hidden_rows, std::vector<float>& hidden) override {
    std::lock_guard lock(mu_);  // the buffers below are the backend's, one set
    CpuSequenceState* s = &cpu::cpu_sequence(state, kBackend, "forward");
    const ModelConfig& c = w_->config;
    const int64_t T = int64_t(tokens.size()), V = c.vocab_size, H = c.hidden_size;
    LILY_CHECK(s->length() + T <= s->capacity(), "sequence of {} tokens plus {} new ones exceeds its capacity of {}",
               s->length(), T, s->capacity());
    check_tokens(tokens, V);
    logits.assign(size_t(rows_of(wanted, T) * V), 0.f);
    hidden.assign(size_t(rows_of(hidden_rows, T) * H), 0.f);
    // Rows kept for a rewind (sequence_state.h): all in the last block. A decode step keeps
    // none beyond the live state.
    const int64_t kept = s->begin_forward(T);
    if (T == 1)
      return decode_step(*s, tokens[0], logits.empty() ? nullptr : logits.data(),
                         hidden.empty() ? nullptr : hidden.data());
    for (int64_t t0 = 0, n = 0; t0 < T; t0 += n) {
      n = cpu::next_block(t0, T, kChunkTokens, kept);
      const SequenceRows chunk{s, 0, n, t0 + n == T ? kept : 0};
      forward_block(std::span(&chunk, 1), tokens.subspan(size_t(t0), size_t(n)),
                    output_rows(wanted, logits, V, t0, n, T), output_rows(hidden_rows, hidden, H, t0, n, T));
    }
  }

  // The head's rows in blocks of kChunkTokens (mtp_fast.h), checked before anything changes.
  void forward_mtp(SequenceState& state, std::span<const float> hidden, std::span<const int32_t> tokens,
                   LogitsWanted wanted, std::vector<float>& logits, std::vector<float>& mtp_hidden) override {
    LILY_CHECK(w_->mtp, "{}", mtp_unavailable());
    std::lock_guard lock(mu_);
    CpuSequenceState& s = cpu::cpu_sequence(state, kBackend, "forward_mtp");
    const ModelConfig& c = w_->config;
    const int64_t T = int64_t(tokens.size()), V = c.vocab_size, H = c.hidden_size;
    check_mtp_rows(s, hidden, tokens);
    logits.assign(size_t(rows_of(wanted, T) * V), 0.f);
    mtp_hidden.assign(size_t(rows_of(wanted, T) * H), 0.f);
    std::vector<float>& m = scratch_.mtp_rows;
    for (int64_t t0 = 0; t0 < T; t0 += kChunkTokens) {
      const int64_t n = std::min(kChunkTokens, T - t0);
      m.resize(size_t(n * H));  // [n, H] the head's post-norm rows
      cpu_fast::mtp_block(*w_->mtp, w_->embed_tokens, c, s.mtp().attention(), s.mtp_length(), hidden.data() + t0 * H,
                          tokens.data() + t0, n, m.data(), scratch_.mtp, scratch_.layers);
      const OutputRows m_rows = output_rows(wanted, mtp_hidden, H, t0, n, T);
      if (m_rows.out) std::copy(m.begin() + m_rows.first_row * H, m.end(), m_rows.out);
      const OutputRows logit_rows = output_rows(wanted, logits, V, t0, n, T);
      if (logit_rows.out) lm_head(m.data() + logit_rows.first_row * H, n - logit_rows.first_row, logit_rows.out);
    }
  }

  // A token of each sequence as one block of the prefill layers (forward_block): every weight
  // read once for all the rows, each row's attention and DeltaNet on its own sequence's caches.
  // A batch of one is forward()'s decode step.
  void forward_batch(std::span<SequenceState* const> states, std::span<const int32_t> tokens,
                     std::vector<float>& logits) override {
    check_batch(states, tokens);
    std::lock_guard lock(mu_);
    std::vector<SequenceRows>& rows = scratch_.rows;
    rows.clear();
    for (size_t i = 0; i < states.size(); ++i)
      rows.push_back({&cpu::cpu_sequence(*states[i], kBackend, "forward_batch"), int64_t(i), 1});
    for (const SequenceRows& r : rows) r.state->begin_forward(1);  // one row: no states beyond the live ones
    logits.resize(states.size() * size_t(w_->config.vocab_size));
    if (rows.size() == 1) return decode_step(*rows[0].state, tokens[0], logits.data(), nullptr);
    if (!rows.empty()) forward_block(rows, tokens, {logits.data(), 0}, {});
  }

 private:
  // y[rows, V] = x[rows, H] @ lm_head^T: one row on the GEMV kernels, more on the GEMM.
  void lm_head(const float* x, int64_t rows, float* y) {
    if (rows == 1) cpu_fast::linear(w_->lm_head, x, 1, y, scratch_.layers.gemv);
    else cpu_fast::gemm_parallel(w_->lm_head, x, rows, y, scratch_.layers.prefill.x, scratch_.layers.prefill.gemm);
  }

  // One token through every layer on the GEMV kernels; its logits into `logits`, its post-norm
  // row into `hidden` (either null: not wanted).
  void decode_step(CpuSequenceState& s, int32_t token, float* logits, float* hidden) {
    const ModelConfig& c = w_->config;
    const int64_t H = c.hidden_size;
    std::vector<float>&h = scratch_.h, &normed = scratch_.normed, &mixed = scratch_.mixed;
    h.resize(size_t(H));
    normed.resize(size_t(H));
    mixed.resize(size_t(H));
    w_->embed_tokens.dequantize_row(token, h.data());
    for (int i = 0; i < c.num_layers; ++i) {
      const LayerWeights& layer = w_->layers[size_t(i)];
      cpu::rms_norm(h.data(), layer.input_layernorm.data(), 1, H, c.rms_norm_eps, normed.data());
      if (layer.kind == LayerKind::full_attention)
        cpu_fast::attention_step(layer.attention, c, s.attention_cache(i), s.length(), normed.data(), mixed.data(),
                                 scratch_.layers.attention);
      else
        cpu_fast::deltanet_step(layer.deltanet, c, s.deltanet_cache(i), normed.data(), mixed.data(),
                                scratch_.layers.deltanet);
      for (int64_t j = 0; j < H; ++j) h[size_t(j)] += mixed[size_t(j)];
      cpu::rms_norm(h.data(), layer.post_attention_layernorm.data(), 1, H, c.rms_norm_eps, normed.data());
      cpu_fast::moe_step(layer.moe, c, normed.data(), mixed.data(), scratch_.layers.moe);
      for (int64_t j = 0; j < H; ++j) h[size_t(j)] += mixed[size_t(j)];
    }
    s.advance(1);
    if (!logits && !hidden) return;
    cpu::rms_norm(h.data(), w_->final_norm.data(), 1, H, c.rms_norm_eps, normed.data());
    if (hidden) std::copy_n(normed.data(), H, hidden);
    if (logits) lm_head(normed.data(), 1, logits);
  }

  // Rows [row, row + rows) of a block: tokens of one sequence, appended at its length; the
  // DeltaNet states after its last `kept` rows kept for a rewind.
  struct SequenceRows {
    CpuSequenceState* state;
    int64_t row, rows;
    int64_t kept = 0;
  };

  // A block of tokens through the prefill layers (prefill.h): one sequence's (a prompt's chunk)
  // or several sequences' (a batch step), each its run of rows; the logits and post-norm rows
  // each output asks for.
  void forward_block(std::span<const SequenceRows> sequences, std::span<const int32_t> tokens, OutputRows logits,
                     OutputRows hidden) {
    const ModelConfig& c = w_->config;
    const int64_t T = int64_t(tokens.size()), H = c.hidden_size;
    std::vector<float>&h = scratch_.h, &normed = scratch_.normed, &mixed = scratch_.mixed;  // [T, H] each
    h.resize(size_t(T * H));
    normed.resize(size_t(T * H));
    mixed.resize(size_t(T * H));
    cpu_fast::PrefillScratch& p = scratch_.layers.prefill;
    std::vector<cpu_fast::AttentionRun>& attention = scratch_.attention_runs;
    std::vector<cpu_fast::DeltaNetRun>& deltanet = scratch_.deltanet_runs;
    for (int64_t t = 0; t < T; ++t) w_->embed_tokens.dequantize_row(tokens[size_t(t)], h.data() + t * H);
    for (int i = 0; i < c.num_layers; ++i) {
      const LayerWeights& layer = w_->layers[size_t(i)];
      cpu::rms_norm(h.data(), layer.input_layernorm.data(), T, H, c.rms_norm_eps, normed.data());
      attention.clear();
      deltanet.clear();
      for (const SequenceRows& q : sequences) {
        if (layer.kind == LayerKind::full_attention)
          attention.push_back({&q.state->attention_cache(i), q.state->length(), q.row, q.rows});
        else
          deltanet.push_back({&q.state->deltanet_cache(i), q.row, q.rows,
                              q.kept > 0 ? q.state->deltanet_kept(i, q.rows - q.kept) : cpu::DeltaNetKept{}});
      }
      if (layer.kind == LayerKind::full_attention)
        cpu_fast::attention_runs(layer.attention, c, attention, normed.data(), T, mixed.data(), p);
      else cpu_fast::deltanet_runs(layer.deltanet, c, deltanet, normed.data(), T, mixed.data(), p);
      for (int64_t j = 0; j < T * H; ++j) h[size_t(j)] += mixed[size_t(j)];
      cpu::rms_norm(h.data(), layer.post_attention_layernorm.data(), T, H, c.rms_norm_eps, normed.data());
      cpu_fast::moe_prefill(layer.moe, c, normed.data(), T, mixed.data(), p);
      for (int64_t j = 0; j < T * H; ++j) h[size_t(j)] += mixed[size_t(j)];
    }
    for (const SequenceRows& q : sequences) q.state->advance(q.rows);
    if (!logits.out && !hidden.out) return;
    // RMSNorm_zc(h; norm) from the first row either output wants, into normed's rows from 0.
    const int64_t first = std::min(logits.out ? logits.first_row : T, hidden.out ? hidden.first_row : T);
    cpu::rms_norm(h.data() + first * H, w_->final_norm.data(), T - first, H, c.rms_norm_eps, normed.data());
    if (hidden.out)
      std::copy(normed.begin() + (hidden.first_row - first) * H, normed.begin() + (T - first) * H, hidden.out);
    if (logits.out) lm_head(normed.data() + (logits.first_row - first) * H, T - logits.first_row, logits.out);
  }

  // The working buffers of a forward (cpu_fast/layers.h, gemv.h), under mu_: one set for the
  // backend, whichever thread calls it.
  struct Scratch {
    std::vector<float> h, normed, mixed;  // [T, H] each: the residual stream, its norm, a layer's output
    cpu_fast::LayerScratch layers;        // the layers' own
    cpu_fast::MtpScratch mtp;
    std::vector<float> mtp_rows;     // [n, H] a block's m rows
    std::vector<SequenceRows> rows;  // a batch step's sequences
    std::vector<cpu_fast::AttentionRun> attention_runs;
    std::vector<cpu_fast::DeltaNetRun> deltanet_runs;
  };

  std::shared_ptr<const ModelWeights> w_;
  std::mutex mu_;
  Scratch scratch_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_fast_backend(std::shared_ptr<const ModelWeights> weights) {
  return std::make_unique<FastCpuBackend>(std::move(weights));
}

}  // namespace lily
