// cuda_backend.cpp: the CUDA backend: the Backend contract (backend.h) over its pieces:
//
//   kernel_plan.h     which kernel runs each part, decided here, once, from the device and weights
//   decode_step.h     the model for one token             decode_graph.h  captured and replayed
//   prefill_pass.h    the model for up to 8192 tokens     sequence_state.h  caches, state, position
//   pass_graph.h      short passes captured and replayed
//
// forward() with one token replays the decode graph, and with a few (below the plan's
// prefill.decode_steps_below) replays it token by token; up to the plan's pass_graphs_up_to,
// replays the pass's graph; with more, runs prefill passes (the last row's logits, or all
// rows', copied to the host as they are computed). With the MTP head on in the plan,
// forward_hidden runs prefill passes (one token: the decode graph, its residual normed after)
// and forward_mtp the head's passes (mtp_pass.cpp); sequences then hold the head's cache.
#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/common/device_info.h"
#include "backend/cuda/common/norm.h"
#include "backend/cuda/decode_graph.h"
#include "backend/cuda/decode_step.h"
#include "backend/cuda/deltanet/deltanet_decode.h"
#include "backend/cuda/gpu_weights.h"
#include "backend/cuda/kernel_plan.h"
#include "backend/cuda/memory_plan.h"
#include "backend/cuda/pass_graph.h"
#include "backend/cuda/prefill_pass.h"
#include "backend/cuda/sequence_state.h"
#include "backend/output_rows.h"
#include "base/log.h"
#include "model/weights.h"

namespace lily {

using namespace lily::cuda;

namespace {

class CudaBackendImpl final : public CudaBackend {
 public:
  CudaBackendImpl(std::unique_ptr<GpuWeights> weights, const CudaBackendOptions& options)
      : w_(std::move(weights)),
        c_(w_->config()),
        plan_(planned(*w_, options)),
        stream_(make_stream()),
        step_(*w_, plan_.decode),
        graph_(step_, c_.vocab_size, options.pdl && plan_.decode.pdl, stream_),
        memory_(memory_needs(*w_, w_->bytes(), plan_)),
        gpu_memory_(checked_cap(memory_, options.gpu_memory_bytes)),
        prefill_(*w_, plan_),
        pass_graph_(prefill_, c_, kMaxPassGraphTokens, stream_),
        hidden_row_(uint64_t(c_.hidden_size) * 4) {}
  ~CudaBackendImpl() override { cudaStreamDestroy(stream_); }

  std::string name() const override { return "cuda"; }
  const ModelConfig& config() const override { return c_; }
  uint64_t weight_bytes() const override { return w_->bytes(); }
  std::string describe_kernels() const override { return plan_.describe(); }
  void observe_decode_step(DecodeStepObserver* observer) override { step_.set_observer(observer); }
  void synchronize() override { CUDA_CHECK(cudaStreamSynchronize(stream_)); }

  std::unique_ptr<SequenceState> new_sequence(int64_t capacity) override {
    LILY_CHECK(capacity > 0, "sequence capacity must be positive, got {}", capacity);
    if (gpu_memory_ > 0) {  // one sequence of this capacity beside the weights and workspaces (throws)
      MemoryRequest request;
      request.context = capacity, request.budget = gpu_memory_;
      plan_memory(memory_, request, capacity);
    }
    auto s = std::make_unique<CudaSequenceState>(c_, capacity, mtp_on());
    // A verify's rewind (keep_row_states) with the head: the rows kept by the DeltaNet decode kernel.
    if (mtp_on() && plan_.prefill.deltanet_rows_up_to >= 2)
      s->allow_row_states(std::min(plan_.prefill.deltanet_rows_up_to, kDeltaNetDecodeMaxT));
    return s;
  }

  std::string mtp_unavailable() const override {
    if (!w_->mtp)
      return "the model has no MTP head: it has no mtp.* tensors (mlx-community conversions drop them; --mtp DIR "
             "reads them from the Hugging Face checkpoint)";
    if (!plan_.decode.mtp)
      return "the CUDA backend's MTP head has not yet run on a GPU and is off in the kernel plan "
             "(LILY_KERNEL_PLAN=mtp=1 turns it on for testing); --backend cpu runs it";
    return "";
  }

  // forward() with the post-norm hidden rows too (Backend::forward_hidden): prefill passes that
  // hand the rows back; one token replays the decode graph and norms its residual after.
  void forward_hidden(SequenceState& state, std::span<const int32_t> tokens, LogitsWanted wanted,
                      std::vector<float>& logits, LogitsWanted hidden_rows, std::vector<float>& hidden) override {
    LILY_CHECK(mtp_on(), "{}", mtp_unavailable());
    auto& s = as_cuda(state);
    const int64_t T = int64_t(tokens.size());
    check_room(s, T);
    for (int32_t id : tokens) check_token(id);
    forward_passes(s, tokens, wanted, logits, hidden_rows, hidden, s.begin_forward(T));
  }

  // T rows of the MTP head (Backend::forward_mtp), in passes of the plan's chunk.
  void forward_mtp(SequenceState& state, std::span<const float> hidden, std::span<const int32_t> tokens,
                   LogitsWanted wanted, std::vector<float>& logits, std::vector<float>& mtp_hidden) override {
    LILY_CHECK(mtp_on(), "{}", mtp_unavailable());
    auto& s = as_cuda(state);
    const int64_t T = int64_t(tokens.size()), V = c_.vocab_size, H = c_.hidden_size;
    check_mtp_rows(s, hidden, tokens);
    logits.resize(size_t(rows_of(wanted, T) * V));
    mtp_hidden.resize(size_t(rows_of(wanted, T) * H));
    const int chunk = plan_.prefill.chunk_tokens;
    for (int64_t t0 = 0; t0 < T; t0 += chunk) {
      const int n = int(std::min<int64_t>(chunk, T - t0));
      const OutputRows l = output_rows(wanted, logits, V, t0, n, T), m = output_rows(wanted, mtp_hidden, H, t0, n, T);
      prefill_.run_mtp(s, hidden.data() + t0 * H, tokens.data() + t0, n, first_row(l, n), l.out, m.out, stream_);
      CUDA_CHECK(cudaStreamSynchronize(stream_));
      s.advance_mtp_host(n);
    }
  }

  void forward(SequenceState& state, std::span<const int32_t> tokens, LogitsWanted wanted,
               std::vector<float>& logits) override {
    auto& s = as_cuda(state);
    const int64_t T = int64_t(tokens.size()), V = c_.vocab_size;
    check_room(s, T);
    for (int32_t id : tokens) check_token(id);
    if (const int keep = s.begin_forward(T); keep > 0) {  // rows kept for a rewind: uncaptured passes
      std::vector<float> no_hidden;
      forward_passes(s, tokens, wanted, logits, LogitsWanted::none, no_hidden, keep);
      return;
    }
    // Sized, not cleared: every row asked for is overwritten below (a 1 MB memset per decode step
    // saved: 20-26 us of host time, bench_constrained_step).
    logits.resize(size_t(wanted == LogitsWanted::all ? T * V : wanted == LogitsWanted::last && T > 0 ? V : 0));
    if (T < plan_.prefill.decode_steps_below) {  // decode: replay the captured step, token by token
      for (int64_t t = 0; t < T; ++t) {
        float* row = wanted == LogitsWanted::all                  ? logits.data() + t * V
                     : wanted == LogitsWanted::last && t == T - 1 ? logits.data()
                                                                  : nullptr;
        graph_.step(s, tokens[size_t(t)], row);
      }
      return;
    }
    if (T <= plan_.prefill.pass_graphs_up_to) {  // a short pass: its captured graph
      const int n = int(T);
      const int first_row = wanted == LogitsWanted::all ? 0 : wanted == LogitsWanted::last ? n - 1 : n;
      pass_graph_.run(s, tokens.data(), n, first_row, logits.data());
      return;
    }
    const int chunk = plan_.prefill.chunk_tokens;
    for (int64_t t0 = 0; t0 < T; t0 += chunk) {
      const int n = int(std::min<int64_t>(chunk, T - t0));
      const bool last_pass = t0 + n == T;
      int first_row = n;  // no logits
      if (wanted == LogitsWanted::all) first_row = 0;
      else if (wanted == LogitsWanted::last && last_pass) first_row = n - 1;
      float* dst = first_row >= n ? nullptr : wanted == LogitsWanted::all ? logits.data() + t0 * V : logits.data();
      prefill_.run(s, tokens.data() + t0, n, first_row, dst, stream_);
      // The pass reads the host tokens and writes the host logits asynchronously: finish before
      // the next pass reuses the staging (tokens come from pageable memory).
      CUDA_CHECK(cudaStreamSynchronize(stream_));
      s.advance_host(n);
    }
  }

  // One decode step (the captured graph), then the `count` best logits selected on the GPU,
  // among the allowed ids under a grammar (its 31 KB mask filled while the step runs, then
  // uploaded): count (value, id) pairs come back instead of the 1 MB row
  // (Backend::forward_candidates).
  bool forward_candidates(SequenceState& state, int32_t token, int count, int32_t vocab_limit,
                          const AllowedTokens* allowed, std::vector<TokenLogit>& out) override {
    if (count < 1 || count > kMaxTopCandidates) return false;
    auto& s = as_cuda(state);
    check_room(s, 1);
    check_token(token);
    s.begin_forward(1);  // no rows kept: a rewind after it is refused
    graph_.step_candidates(s, token, count, vocab_limit, allowed, out);
    return true;
  }

  // Decode steps chained on the GPU, each token chosen there (top_candidates, choose_token), the
  // host a step behind (Backend::chain_tokens).
  std::unique_ptr<TokenChain> chain_tokens(SequenceState& state, int32_t token, int64_t steps,
                                           const ChainChoice& choice) override {
    if (!plan_.decode.chain || choice.count < 1 || choice.count > kMaxTopCandidates) return nullptr;
    auto& s = as_cuda(state);
    check_room(s, steps);
    check_token(token);
    s.begin_forward(steps);
    return graph_.chain(s, token, steps, choice);
  }

  // One token of each of several sequences in one step (Backend::forward_batch): up to the plan's
  // batch_rows_up_to sequences as one batch step's graph (the weights read once for the rows),
  // else one after another.
  void forward_batch(std::span<SequenceState* const> states, std::span<const int32_t> tokens,
                     std::vector<float>& logits) override {
    check_batch(states, tokens);
    const size_t N = states.size();
    if (N < 2 || N > size_t(plan_.prefill.batch_rows_up_to)) {
      Backend::forward_batch(states, tokens, logits);
      return;
    }
    std::vector<CudaSequenceState*> rows;
    for (SequenceState* s : states) rows.push_back(&as_cuda(*s));
    for (CudaSequenceState* s : rows) s->begin_forward(1);
    logits.resize(N * size_t(c_.vocab_size));
    pass_graph_.run_batch(rows, tokens.data(), logits.data());
  }

  std::vector<int32_t> decode_greedy(SequenceState& state, int32_t first_token, int count) override {
    auto& s = as_cuda(state);
    LILY_CHECK(count >= 0, "decode of {} tokens", count);
    check_room(s, count);
    check_token(first_token);
    s.begin_forward(count);
    return graph_.greedy(s, first_token, count);
  }

 private:
  static KernelPlan planned(const GpuWeights& w, const CudaBackendOptions& options) {
    const DeviceProfile profile = resolve_device_profile(query_device_profile(), options.device_profile);
    LILY_CHECK(runs_by_default(profile),
               "the CUDA backend on {}: this build's Hopper kernels need an H100 / H200 (compute 9.0, built with "
               "sm_90a); the portable kernels for other cards have never run on a GPU: --device-profile device (or "
               "LILY_DEVICE_PROFILE=device) to try them, --backend cpu to run on the CPU",
               profile.describe());
    set_current_device_profile(profile);  // the launchers' shared-memory limit
    auto plan_with_chunk = [&](int chunk) {
      KernelPlan plan = plan_kernels(w, profile, chunk);
      for (const std::string& edit : options.plan_edits) edit_plan(plan, edit);
      return plan;
    };
    if (options.prefill_chunk_tokens > 0) return plan_with_chunk(options.prefill_chunk_tokens);
    const int chunk = prefill_chunk_for([&](int c) { return memory_needs(w, w.bytes(), plan_with_chunk(c)); },
                                        options.planned_context, options.gpu_memory_bytes);
    if (chunk != kPrefillChunkChoices.front())
      LILY_LOG_INFO("prefill chunk {} tokens: the largest whose workspace leaves room for {} tokens of context in "
                    "{:.1f} GB (--gpu-memory)",
                    chunk, std::max<int64_t>(options.planned_context, 256), double(options.gpu_memory_bytes) / 1e9);
    return plan_with_chunk(chunk);
  }
  // The cap, checked before the workspaces are allocated: the weights, workspaces and reserve, and
  // one slot of 256 tokens, must fit it.
  static uint64_t checked_cap(const MemoryNeeds& needs, uint64_t cap) {
    if (cap == 0) return 0;
    MemoryRequest request;
    request.budget = cap;
    plan_memory(needs, request, 256);  // throws, saying what the bytes are, when nothing fits
    return cap;
  }
  static cudaStream_t make_stream() {
    cudaStream_t stream = nullptr;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    return stream;
  }
  void check_room(const CudaSequenceState& s, int64_t n) const {
    LILY_CHECK(s.length() + n <= s.capacity(), "sequence of {} tokens plus {} new ones exceeds its capacity of {}",
               s.length(), n, s.capacity());
  }
  bool mtp_on() const { return w_->mtp && plan_.decode.mtp; }

  // The forward of forward_hidden, and of forward() when rows are kept (keep > 0: its last `keep`
  // rows' DeltaNet states written for a rewind): one token replays the decode graph (its residual
  // normed after for the hidden row); more run uncaptured prefill passes, the kept rows in the
  // last, which the DeltaNet decode kernel runs (the whole forward where it is short enough, else
  // a tail of at least 2 tokens on its own).
  void forward_passes(CudaSequenceState& s, std::span<const int32_t> tokens, LogitsWanted wanted,
                      std::vector<float>& logits, LogitsWanted hidden_rows, std::vector<float>& hidden, int keep) {
    const int64_t T = int64_t(tokens.size()), V = c_.vocab_size, H = c_.hidden_size;
    logits.resize(size_t(rows_of(wanted, T) * V));
    hidden.resize(size_t(rows_of(hidden_rows, T) * H));
    if (T == 0) return;
    if (T == 1) {
      graph_.step(s, tokens[0], wanted == LogitsWanted::none ? nullptr : logits.data());
      if (hidden_rows != LogitsWanted::none) {
        rms_norm(step_.residual(), w_->final_norm, 1, int(H), c_.rms_norm_eps, hidden_row_.as<float>(), stream_);
        CUDA_CHECK(cudaMemcpyAsync(hidden.data(), hidden_row_.get(), size_t(H) * 4, cudaMemcpyDeviceToHost, stream_));
        CUDA_CHECK(cudaStreamSynchronize(stream_));
      }
      if (keep > 0) s.kept_done(s.length());
      return;
    }
    const int chunk = plan_.prefill.chunk_tokens;
    auto run_pass = [&](int64_t t0, int n, int kept_first) {
      const OutputRows l = output_rows(wanted, logits, V, t0, n, T), h = output_rows(hidden_rows, hidden, H, t0, n, T);
      if (kept_first >= 0) s.arm_kept(kept_first);
      try {
        prefill_.run(s, tokens.data() + t0, n, first_row(l, n), l.out, stream_, HiddenRows{first_row(h, n), h.out});
        CUDA_CHECK(cudaStreamSynchronize(stream_));
      } catch (...) {
        s.disarm_kept();
        throw;
      }
      s.disarm_kept();
      s.advance_host(n);
    };
    int64_t tail = 0;  // the last pass's tokens, which keep the rows
    if (keep > 0) tail = T <= std::min(chunk, plan_.prefill.deltanet_rows_up_to) ? T : std::max(keep, 2);
    for (int64_t t0 = 0; t0 < T - tail; t0 += chunk) run_pass(t0, int(std::min<int64_t>(chunk, T - tail - t0)), -1);
    if (tail > 0) {
      run_pass(T - tail, int(tail), int(tail) - keep);
      s.kept_done(s.length());
    }
  }
  // A pass of n tokens' first row of an output (output_rows.h), n where it wants none: the
  // pass's convention.
  static int first_row(const OutputRows& o, int n) { return o.out ? int(o.first_row) : n; }
  void check_token(int32_t id) const {
    LILY_CHECK(id >= 0 && id < c_.vocab_size, "token id {} is outside the vocabulary [0, {})", id, c_.vocab_size);
  }

  std::unique_ptr<GpuWeights> w_;
  const ModelConfig c_;
  const KernelPlan plan_;
  cudaStream_t stream_;
  DecodeStep step_;
  DecodeGraph graph_;
  const MemoryNeeds memory_;   // memory_plan.h
  const uint64_t gpu_memory_;  // the cap (0: none)
  PrefillPass prefill_;
  PassGraph pass_graph_;
  DeviceBuffer hidden_row_;  // [H]: forward_hidden's one-token row
};

}  // namespace

// The environment's say in the backend, read here, once per backend: nothing below reads it.
CudaBackendOptions CudaBackendOptions::from_environment() {
  CudaBackendOptions o;
  if (const char* v = std::getenv("LILY_PDL")) o.pdl = std::string(v) != "0";
  if (const char* v = std::getenv("LILY_PREFILL_CHUNK")) {
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    LILY_CHECK(end != v && *end == '\0' && n >= 64 && n <= kMaxPrefillChunkTokens && n % 64 == 0,
               "LILY_PREFILL_CHUNK={}: a multiple of 64 in [64, {}]", v, kMaxPrefillChunkTokens);
    o.prefill_chunk_tokens = int(n);
  }
  if (const char* v = std::getenv("LILY_DEVICE_PROFILE")) o.device_profile = v;
  if (const char* v = std::getenv("LILY_GPU_MEMORY_GB")) {
    char* end = nullptr;
    const double gb = std::strtod(v, &end);
    LILY_CHECK(end != v && *end == '\0' && gb > 0 && gb < 4096, "LILY_GPU_MEMORY_GB={}: a number of GB", v);
    o.gpu_memory_bytes = uint64_t(gb * 1e9);
  }
  // LILY_KERNEL_PLAN=NAME=VALUE,NAME=VALUE: plan edits for measurement and tests (the runtime's
  // tests and lily serve on the device run a plan's unrun parts this way, without a rebuild).
  if (const char* v = std::getenv("LILY_KERNEL_PLAN")) {
    const std::string list = v;
    for (size_t begin = 0; begin <= list.size();) {
      const size_t end = std::min(list.find(',', begin), list.size());
      if (end > begin) o.plan_edits.push_back(list.substr(begin, end - begin));
      begin = end + 1;
    }
  }
  return o;
}

std::unique_ptr<CudaBackend> make_cuda_backend(std::shared_ptr<const ModelWeights> weights,
                                               const CudaBackendOptions& options) {
  return make_cuda_backend(GpuWeights::upload(*weights), options);
}

std::unique_ptr<CudaBackend> make_cuda_backend(std::unique_ptr<GpuWeights> weights, const CudaBackendOptions& options) {
  return std::make_unique<CudaBackendImpl>(std::move(weights), options);
}

bool cuda_backend_runs(const std::string& device_profile) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) return false;
  return runs_by_default(resolve_device_profile(query_device_profile(), device_profile));
}

bool cuda_backend_available() {
  const char* v = std::getenv("LILY_DEVICE_PROFILE");
  return cuda_backend_runs(v ? v : "");
}

std::string describe_device_profile(const std::string& device_profile) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) return "no CUDA device";
  return resolve_device_profile(query_device_profile(), device_profile).describe();
}

}  // namespace lily
