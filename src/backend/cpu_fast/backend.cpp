// backend.cpp: the fast CPU backend (cpu_fast.h): whole-model forward.
//
// The same structure as the reference (backend/cpu/forward.cpp, spec §2.3, §4) with the same
// sequence state (cpu::CpuSequenceState, backend/cpu/sequence_state.h): a decode step (one
// token) runs the layers of layers.h and the lm_head on the GEMV kernels; a longer block runs
// the layers of prefill.h (the prefill product of gemm.h, experts grouped by the tokens routed
// to them) in chunks of kChunkTokens, so prefill and decode can alternate on one sequence. A
// batch step (forward_batch: a token of each of several sequences) is one block of those layers
// too, each sequence a run of one row: every weight read once for all the rows, each row's
// attention and delta rule on its own sequence's caches.
#include <algorithm>
#include <mutex>

#include "backend/cpu/ops.h"
#include "backend/cpu/sequence_state.h"
#include "backend/cpu_fast/cpu_fast.h"
#include "backend/cpu_fast/gemv.h"
#include "backend/cpu_fast/layers.h"
#include "backend/cpu_fast/prefill.h"
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
    return "the fast CPU backend (--backend cpu) does not run the MTP head yet; --backend reference does";
  }

  std::unique_ptr<SequenceState> new_sequence(int64_t capacity) override {
    return cpu::new_cpu_sequence(w_->config, capacity, kBackend);
  }

  void forward(SequenceState& state, std::span<const int32_t> tokens, LogitsWanted wanted,
               std::vector<float>& logits) override {
    std::lock_guard lock(mu_);  // the buffers below are the backend's, one set
    CpuSequenceState* s = &cpu::cpu_sequence(state, kBackend, "forward");
    const ModelConfig& c = w_->config;
    const int64_t T = int64_t(tokens.size()), V = c.vocab_size;
    LILY_CHECK(s->length() + T <= s->capacity(), "sequence of {} tokens plus {} new ones exceeds its capacity of {}",
               s->length(), T, s->capacity());
    for (int32_t id : tokens) LILY_CHECK(id >= 0 && id < V, "token id {} is outside the vocabulary [0, {})", id, V);
    logits.assign(size_t(wanted == LogitsWanted::all ? T * V : wanted == LogitsWanted::last && T > 0 ? V : 0), 0.f);
    // Rows kept for a rewind (sequence_state.h): all in the last block. A decode step keeps
    // none beyond the live state.
    const int64_t kept = s->begin_forward(T);
    if (T == 1) return decode_step(*s, tokens[0], wanted == LogitsWanted::none ? nullptr : logits.data());
    for (int64_t t0 = 0, n = 0; t0 < T; t0 += n) {
      n = cpu::next_block(t0, T, kChunkTokens, kept);
      const bool is_last_chunk = t0 + n == T;
      float* out = nullptr;
      int64_t first_row = 0;
      if (wanted == LogitsWanted::all) out = logits.data() + t0 * V;
      else if (wanted == LogitsWanted::last && is_last_chunk) out = logits.data(), first_row = n - 1;
      const SequenceRows chunk{s, 0, n, is_last_chunk ? kept : 0};
      forward_block(std::span(&chunk, 1), tokens.subspan(size_t(t0), size_t(n)), out, first_row);
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
    if (rows.size() == 1) return decode_step(*rows[0].state, tokens[0], logits.data());
    if (!rows.empty()) forward_block(rows, tokens, logits.data(), 0);
  }

 private:
  // One token through every layer on the GEMV kernels; its logits into `logits` (or none).
  void decode_step(CpuSequenceState& s, int32_t token, float* logits) {
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
                                 scratch_.attention);
      else
        cpu_fast::deltanet_step(layer.deltanet, c, s.deltanet_cache(i), normed.data(), mixed.data(), scratch_.deltanet);
      for (int64_t j = 0; j < H; ++j) h[size_t(j)] += mixed[size_t(j)];
      cpu::rms_norm(h.data(), layer.post_attention_layernorm.data(), 1, H, c.rms_norm_eps, normed.data());
      cpu_fast::moe_step(layer.moe, c, normed.data(), mixed.data(), scratch_.moe);
      for (int64_t j = 0; j < H; ++j) h[size_t(j)] += mixed[size_t(j)];
    }
    s.advance(1);
    if (!logits) return;
    cpu::rms_norm(h.data(), w_->final_norm.data(), 1, H, c.rms_norm_eps, normed.data());
    cpu_fast::linear(w_->lm_head, normed.data(), 1, logits, scratch_.gemv);
  }

  // Rows [row, row + rows) of a block: tokens of one sequence, appended at its length; the
  // DeltaNet states after its last `kept` rows kept for a rewind.
  struct SequenceRows {
    CpuSequenceState* state;
    int64_t row, rows;
    int64_t kept = 0;
  };

  // A block of tokens through the prefill layers (prefill.h): one sequence's (a prompt's chunk)
  // or several sequences' (a batch step), each its run of rows; logits of rows [first_row, T)
  // into `logits` (or none).
  void forward_block(std::span<const SequenceRows> sequences, std::span<const int32_t> tokens, float* logits,
                     int64_t first_row) {
    const ModelConfig& c = w_->config;
    const int64_t T = int64_t(tokens.size()), H = c.hidden_size;
    std::vector<float>&h = scratch_.h, &normed = scratch_.normed, &mixed = scratch_.mixed;  // [T, H] each
    h.resize(size_t(T * H));
    normed.resize(size_t(T * H));
    mixed.resize(size_t(T * H));
    cpu_fast::PrefillScratch& p = scratch_.prefill;
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
    if (!logits) return;
    const int64_t rows = T - first_row;
    cpu::rms_norm(h.data() + first_row * H, w_->final_norm.data(), rows, H, c.rms_norm_eps, normed.data());
    if (rows == 1) cpu_fast::linear(w_->lm_head, normed.data(), 1, logits, scratch_.gemv);
    else cpu_fast::gemm_parallel(w_->lm_head, normed.data(), rows, logits, p.x, p.gemm);
  }

  // The working buffers of a forward (cpu_fast/layers.h, gemv.h), under mu_: one set for the
  // backend, whichever thread calls it.
  struct Scratch {
    std::vector<float> h, normed, mixed;  // [T, H] each: the residual stream, its norm, a layer's output
    cpu_fast::AttentionScratch attention;
    cpu_fast::DeltaNetScratch deltanet;
    cpu_fast::MoeScratch moe;
    cpu_fast::GemvScratch gemv;
    cpu_fast::PrefillScratch prefill;
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
