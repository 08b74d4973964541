// cmd_bench.cpp: `lily bench` sweeps prefill over prompt lengths and decode over context
// depths, and states each speed against the hardware limit, measured where it runs. On the
// GPU: decode bytes a step must move / time vs the device's copy bandwidth, prefill TFLOP/s vs
// the bf16 matrix peak. On the CPU: decode vs the read bandwidth of the threads in use, prefill
// vs their fp32 FMA rate (backend/cpu_fast/machine_probe.h), over sizes a CPU gets through.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <optional>
#include <random>
#include <span>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "cli/bench_plot.h"
#include "cli/bench_speculative.h"
#include "cli/command.h"
#include "cli/model_options.h"
#include "runtime/batch_generate.h"
#include "runtime/cost_model.h"
#include "runtime/generate.h"
#ifdef LILY_HAVE_CUDA
#include "backend/cuda/bench/cuda_bench.h"
#include "backend/cuda/common/kernel_trace.h"
#include "backend/cuda/common/phase_marks.h"
#include "backend/cuda/cuda_backend.h"
#endif
#include "backend/cpu_fast/machine_probe.h"
#include "base/thread_pool.h"

namespace lily::cli {
namespace {

constexpr double kBf16PeakTflops = 790.0;  // measured dense bf16 rate of the H200 here (docs/perf.md)

// The sweeps' defaults: the GPU's, and the CPU's (a 128-token prompt, as llama-bench -p 128;
// decode after 128 tokens; a full-size step takes tens of milliseconds there).
constexpr const char* kGpuLengths = "256,512,1024,2048,4096,8192,16384,32768,65536,131072";
constexpr const char* kCpuLengths = "128";
constexpr int kGpuDecodeTokens = 128, kCpuDecodeTokens = 32;
constexpr int kChatDecodeTokens = 256;  // --speculate with a chat prompt: the reply, up to its stop token
constexpr int kMaxDecodeRows = 8;       // issue 16: steps of 1 .. 8 rows

struct BenchArgs {
  ModelOptions model;
  bool synthetic = false;
  std::string prefill_lengths;  // empty: kGpuLengths or kCpuLengths
  std::string decode_depths;    // empty: likewise
  int decode_tokens = 0;        // 0: kGpuDecodeTokens or kCpuDecodeTokens (steps, with --decode-rows)
  int decode_rows = 1;          // tokens a step: > 1 measures steps of one sequence's consecutive tokens
  bool decode_batch = false;    // with decode_rows: one token of each of that many sequences instead
  int repeats = 3;
  bool json = false;
  std::string plot;                      // PNG path, empty: no plot
  std::string decode_loop = "graph";     // graph | generate | stepwise (see the option's help)
  std::string decode_skip;               // parts left out of the decode step (measurement only)
  std::string decode_trace;              // CSV of the traced kernels' blocks (LILY_KERNEL_TRACE builds)
  int speculate = 0;                     // > 0: plain vs speculative decode (bench_speculative.h)
  std::string assume_acceptance;         // with speculate: forced rates per draft position
  bool chat = false;                     // with speculate: decode after a chat prompt, not random context
  std::string prompt, prompt_file;       // with speculate: the chat prompt's user message (implies chat)
  std::vector<std::string> kernel_plan;  // --kernel-plan NAME=VALUE edits (CUDA)
  bool prefill_split = false;            // where each prefill length's pass spends its time (CUDA)
};

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::vector<int32_t> random_tokens(int64_t n, int32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, vocab - 1);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = d(rng);
  return t;
}

struct Row {
  std::string kind;
  int64_t length;
  double seconds;  // per prompt (prefill) or per token (decode)
  double tokens_per_second;
  double rate;     // GB/s (decode) or TFLOP/s (prefill)
  double percent;  // of the ceiling
  int rows = 1;    // decode: tokens a step (--decode-rows: one sequence's consecutive tokens)
};

// Marks the first measurement of each point for a profiler (CUDA only; see cuda_bench.h).
struct ProfiledRegion {
  bool on;
  explicit ProfiledRegion(bool enabled) : on(enabled) {
#ifdef LILY_HAVE_CUDA
    if (on) cuda::bench::profiler_start();
#endif
  }
  ~ProfiledRegion() {
#ifdef LILY_HAVE_CUDA
    if (on) cuda::bench::profiler_stop();
#endif
  }
};

// One prefill of `tokens` into `state` from empty, in seconds; a profiler sees only the forward.
double time_prefill_pass(Backend& backend, SequenceState& state, const std::vector<int32_t>& tokens,
                         std::vector<float>& logits, bool profiled) {
  state.reset();
  ProfiledRegion region(profiled);
  const double t0 = now_seconds();
  backend.forward(state, tokens, LogitsWanted::last, logits);
  return now_seconds() - t0;
}

std::vector<Row> bench_prefill(Backend& backend, const std::vector<int32_t>& lengths, int repeats, bool on_cuda,
                               double peak_flops) {
  const ModelConfig& c = backend.config();
  std::vector<Row> rows;
  if (lengths.empty()) return rows;
  std::vector<float> logits;
  {  // warm-up: module load, graph and scratch set-up (the page cache, on the CPU)
    auto s = backend.new_sequence(512);
    auto t = random_tokens(on_cuda ? 256 : 16, c.vocab_size, 1);
    backend.forward(*s, t, LogitsWanted::last, logits);
  }
  for (int32_t L : lengths) {
    auto tokens = random_tokens(L, c.vocab_size, uint32_t(L));
    auto state = backend.new_sequence(L + 1);
    // One untimed pass first: a length can be the first to launch some kernels (the few-token
    // forms, other tiles), and CUDA loads each on its first launch (lazy module loading). Timed,
    // that pass was the reported time of --repeats 2, whose median is the slower of the two
    // (docs/perf-log/2026-12.md, session 14, call 4: the first length's row).
    time_prefill_pass(backend, *state, tokens, logits, false);
    std::vector<double> times;
    for (int r = 0; r < repeats; ++r)
      times.push_back(time_prefill_pass(backend, *state, tokens, logits, on_cuda && r == 0));
    double t = median(times);
    double tflops = prefill_flops(c, L) / t / 1e12;
    rows.push_back({"prefill", L, t, L / t, tflops, 100.0 * tflops * 1e12 / peak_flops});
    std::fprintf(stderr, "prefill %7d tokens: %.3f s\n", L, t);
  }
  return rows;
}

#ifdef LILY_HAVE_CUDA
// One more pass of each length with the phase marks armed (common/phase_marks.h): the device
// time of each phase, and its host time beside it (equal: the phase was bound by launching).
void print_prefill_split(Backend& backend, const std::vector<int32_t>& lengths) {
  const ModelConfig& c = backend.config();
  std::vector<float> logits;
  for (int32_t L : lengths) {
    auto tokens = random_tokens(L, c.vocab_size, uint32_t(L));
    auto state = backend.new_sequence(L + 1);
    cuda::phases::PhaseRecorder recorder;
    const double t0 = now_seconds();
    backend.forward(*state, tokens, LogitsWanted::last, logits);
    const double wall_ms = (now_seconds() - t0) * 1e3;
    cuda::phases::Split split = recorder.collect();
    std::sort(split.phases.begin(), split.phases.end(),
              [](const auto& a, const auto& b) { return a.device_ms > b.device_ms; });
    std::fprintf(stderr,
                 "prefill split, %d tokens: %.3f ms wall; marks first to last %.3f ms on the device, %.3f ms "
                 "on the host\n",
                 L, wall_ms, split.device_ms, split.host_ms);
    for (const auto& p : split.phases)
      std::fprintf(stderr, "  %-22s %9.3f ms %5.1f%%  host %9.3f ms  (%d intervals)\n", p.phase.c_str(), p.device_ms,
                   100.0 * p.device_ms / std::max(split.device_ms, 1e-9), p.host_ms, p.count);
  }
}

constexpr int kTracedSteps = 3;

// `steps` more greedy steps with the kernel trace armed; every block's record to `path`.
void trace_decode_steps(CudaBackend& backend, SequenceState& state, int steps, const std::string& path,
                        const std::string& comment) {
  cuda::trace::Session session(1u << 19);
  backend.decode_greedy(state, 1, steps);
  uint64_t dropped = 0;
  const auto records = session.collect(&dropped);
  LILY_CHECK(dropped == 0, "--decode-trace: {} records did not fit the log", dropped);
  cuda::trace::write_csv(path, records, comment);
  std::fprintf(stderr, "wrote %zu block records of %d steps to %s\n", records.size(), steps, path.c_str());
}

// FILE for one depth; FILE with -DEPTH before its extension for several.
std::string trace_path(const std::string& path, int32_t depth, size_t depths) {
  if (depths == 1) return path;
  const std::filesystem::path p(path);
  return (p.parent_path() / (p.stem().string() + "-" + std::to_string(depth) + p.extension().string())).string();
}

std::vector<Row> bench_decode_cuda(CudaBackend& backend, const std::vector<int32_t>& depths, int n, int repeats,
                                   double peak_bytes_per_second, const std::string& trace) {
  const ModelConfig& c = backend.config();
  std::vector<Row> rows;
  for (int32_t D : depths) {
    auto state = backend.new_sequence(int64_t(D) + 16 + int64_t(repeats) * n + kTracedSteps + 1);
    cuda::bench::fake_fill(*state, D);
    backend.decode_greedy(*state, 1, 16);  // warm-up, captures the step graph
    std::vector<double> times;
    for (int r = 0; r < repeats; ++r) {
      ProfiledRegion region(r == 0);
      double t0 = now_seconds();
      backend.decode_greedy(*state, 1, n);
      times.push_back((now_seconds() - t0) / n);
    }
    double t = median(times);
    double gbps = decode_bytes_per_token(c, D) / t / 1e9;
    rows.push_back({"decode", D, t, 1 / t, gbps, 100.0 * gbps * 1e9 / peak_bytes_per_second});
    std::fprintf(stderr, "decode at depth %7d: %.3f ms/token\n", D, t * 1e3);
    if (!trace.empty())
      trace_decode_steps(backend, *state, kTracedSteps, trace_path(trace, D, depths.size()),
                         fmt::format("lily bench --decode-trace: {} steps at depth {}, untraced {:.3f} ms/step",
                                     kTracedSteps, D, t * 1e3));
  }
  return rows;
}
#endif

// D tokens of random context, computed (the decode benchmarks' state where no fake fill exists).
void prefill_random(Backend& backend, SequenceState& state, int32_t D) {
  std::vector<float> unused;
  backend.forward(state, random_tokens(D, backend.config().vocab_size, 7), LogitsWanted::none, unused);
}

std::vector<Row> bench_decode_generic(Backend& backend, const std::vector<int32_t>& depths, int n, int repeats,
                                      double peak_bytes_per_second) {
  const ModelConfig& c = backend.config();
  std::vector<Row> rows;
  std::vector<float> logits;
  for (int32_t D : depths) {
    auto state = backend.new_sequence(int64_t(D) + int64_t(repeats + 1) * n + 1);
    prefill_random(backend, *state, D);
    std::vector<double> times;
    for (int r = 0; r <= repeats; ++r) {
      double t0 = now_seconds();
      int32_t token = 1;
      for (int i = 0; i < n; ++i)
        backend.forward(*state, std::span<const int32_t>(&token, 1), LogitsWanted::last, logits);
      if (r > 0) times.push_back((now_seconds() - t0) / n);  // the first round is a warm-up
    }
    double t = median(times);
    double gbps = decode_bytes_per_token(c, D) / t / 1e9;
    rows.push_back(
        {"decode", D, t, 1 / t, gbps, peak_bytes_per_second > 0 ? 100.0 * gbps * 1e9 / peak_bytes_per_second : 0});
    std::fprintf(stderr, "decode at depth %7d: %.3f ms/token\n", D, t * 1e3);
  }
  return rows;
}

// The median seconds a step over `repeats` rounds of n steps (one more round first, as a warm-up;
// the first timed round under a profiler's marks): step(tokens) runs one step on its `width`
// random tokens.
double median_step_seconds(int n, int repeats, int width, int32_t vocab, bool on_cuda,
                           const std::function<void(std::span<const int32_t>)>& step) {
  std::vector<double> times;
  for (int r = 0; r <= repeats; ++r) {
    const auto tokens = random_tokens(int64_t(n) * width, vocab, uint32_t(r + 1));
    ProfiledRegion region(on_cuda && r == 1);
    const double t0 = now_seconds();
    for (int i = 0; i < n; ++i) step(std::span<const int32_t>(tokens.data() + size_t(i) * width, size_t(width)));
    if (r > 0) times.push_back((now_seconds() - t0) / n);
  }
  return median(times);
}

// A row of the table for steps of `rows` tokens (`what`: rows or sequences) taking t seconds and
// moving `bytes`.
Row step_row(const char* kind, const char* what, int32_t depth, double t, int rows, double bytes,
             double peak_bytes_per_second) {
  const double gbps = bytes / t / 1e9;
  std::fprintf(stderr, "steps of %d %s at depth %7d: %.3f ms/step\n", rows, what, depth, t * 1e3);
  return {kind, depth, t, rows / t, gbps, peak_bytes_per_second > 0 ? 100.0 * gbps * 1e9 / peak_bytes_per_second : 0,
          rows};
}

// Steps of `rows` consecutive tokens of one sequence, as the verification of a speculative draft
// would run them: one forward of the rows with every row's logits to the host, at each depth
// (`fill` puts the context in). Per step: its time and the GB/s of decode_step_bytes (the
// weights once, the union of the rows' experts).
std::vector<Row> bench_decode_rows(Backend& backend, const std::vector<int32_t>& depths, int rows, int n, int repeats,
                                   double peak_bytes_per_second,
                                   const std::function<void(SequenceState&, int32_t)>& fill, bool on_cuda) {
  const ModelConfig& c = backend.config();
  std::vector<Row> out;
  std::vector<float> logits;
  for (int32_t D : depths) {
    auto state = backend.new_sequence(int64_t(D) + int64_t(repeats + 1) * n * rows + 1);
    fill(*state, D);
    const double t = median_step_seconds(n, repeats, rows, c.vocab_size, on_cuda, [&](std::span<const int32_t> tokens) {
      backend.forward(*state, tokens, LogitsWanted::all, logits);
    });
    out.push_back(step_row("verify", "rows", D, t, rows, decode_step_bytes(c, D, rows), peak_bytes_per_second));
  }
  return out;
}

// Steps of one token of each of `sequences` sequences (parallel requests: Backend::forward_batch),
// every sequence `fill`ed to the depth first. Per step: its time and the GB/s of
// batch_step_bytes (the weights once, the experts' union, every sequence's state and cache).
std::vector<Row> bench_decode_batch(Backend& backend, const std::vector<int32_t>& depths, int sequences, int n,
                                    int repeats, double peak_bytes_per_second,
                                    const std::function<void(SequenceState&, int32_t)>& fill, bool on_cuda) {
  const ModelConfig& c = backend.config();
  std::vector<Row> out;
  std::vector<float> logits;
  for (int32_t D : depths) {
    std::vector<std::unique_ptr<SequenceState>> states;
    std::vector<SequenceState*> batch;
    for (int i = 0; i < sequences; ++i) {
      states.push_back(backend.new_sequence(int64_t(D) + int64_t(repeats + 1) * n + 1));
      fill(*states.back(), D);
      batch.push_back(states.back().get());
    }
    const double t = median_step_seconds(
        n, repeats, sequences, c.vocab_size, on_cuda,
        [&](std::span<const int32_t> tokens) { backend.forward_batch(batch, tokens, logits); });
    out.push_back(
        step_row("batch", "sequences", D, t, sequences, batch_step_bytes(c, D, sequences), peak_bytes_per_second));
  }
  return out;
}

// Parallel requests as `lily serve --parallel` runs them: `streams` requests through the runtime's
// BatchGenerator (the scheduler thread's loop), each a D-token random prompt (prefilled in the
// generator's rounds) and n tokens with Qwen's thinking-mode sampling, against one such request
// through the same generator, in turns (one, then all, each repeat; the first repeat a warm-up).
// Aggregate decode tokens/s: the tokens after each request's first, over the time from the first
// first token to the last last token (as tests/server/node/bench_parallel.mjs over HTTP). Rows
// streams1 and streamsN; ms a step = streams / aggregate.
double aggregate_decode_rate(Backend& backend, int32_t D, int streams, int n, uint32_t seed) {
  const ModelConfig& c = backend.config();
  BatchGenerator batch(backend, {streams, 512});
  std::vector<GenerateRequest> requests{size_t(streams)};
  std::vector<std::unique_ptr<SequenceState>> states;
  std::vector<double> first(size_t(streams), 0), last(size_t(streams), 0);
  for (int i = 0; i < streams; ++i) {
    GenerateRequest& r = requests[size_t(i)];
    r.prompt = random_tokens(D, c.vocab_size, seed + uint32_t(i));
    r.max_new_tokens = n;
    r.sampling.temperature = 0.6f, r.sampling.top_k = 20, r.sampling.top_p = 0.95f;
    r.sampling.seed = seed + uint32_t(i);
    states.push_back(backend.new_sequence(int64_t(D) + n + 1));
    batch.add(r, *states.back(), [&, i](const GeneratedToken&) {
      (first[size_t(i)] == 0 ? first[size_t(i)] : last[size_t(i)]) = now_seconds();
      return true;
    });
  }
  while (batch.step()) {
  }
  const double t0 = *std::min_element(first.begin(), first.end()), t1 = *std::max_element(last.begin(), last.end());
  return double(streams) * (n - 1) / (t1 - t0);
}

std::vector<Row> bench_decode_streams(Backend& backend, const std::vector<int32_t>& depths, int streams, int n,
                                      int repeats, double peak_bytes_per_second) {
  const ModelConfig& c = backend.config();
  LILY_CHECK(n >= 2, "--decode-batch --decode-loop generate needs --decode-tokens of at least 2");
  std::vector<Row> out;
  for (int32_t D : depths) {
    std::vector<double> one, all;
    for (int r = 0; r <= repeats; ++r) {
      const double rate_one = aggregate_decode_rate(backend, D, 1, n, uint32_t(100 * r));
      const double rate_all = aggregate_decode_rate(backend, D, streams, n, uint32_t(100 * r + 1));
      if (r > 0) one.push_back(rate_one), all.push_back(rate_all);
      std::fprintf(stderr, "streams at depth %d, round %d: one %.1f tokens/s, %d %.1f tokens/s (%.2fx)\n", D, r,
                   rate_one, streams, rate_all, rate_all / rate_one);
    }
    const double mid = D + n / 2.0;  // the depth of a step, on average
    out.push_back(step_row("streams", "streams", D, 1 / median(one), 1, batch_step_bytes(c, int64_t(mid), 1),
                           peak_bytes_per_second));
    out.push_back(step_row("streams", "streams", D, streams / median(all), streams,
                           batch_step_bytes(c, int64_t(mid), streams), peak_bytes_per_second));
  }
  return out;
}

// A backend with its chains hidden (Backend::chain_tokens not offered): generate() then waits for
// each step's candidates and draws on the host, as before chains (--decode-loop stepwise).
class StepwiseOnly final : public Backend {
 public:
  explicit StepwiseOnly(Backend& inner) : inner_(inner) {}
  std::string name() const override { return inner_.name(); }
  const ModelConfig& config() const override { return inner_.config(); }
  std::unique_ptr<SequenceState> new_sequence(int64_t capacity) override { return inner_.new_sequence(capacity); }
  void forward(SequenceState& state, std::span<const int32_t> tokens, LogitsWanted wanted,
               std::vector<float>& logits) override {
    inner_.forward(state, tokens, wanted, logits);
  }
  bool forward_candidates(SequenceState& state, int32_t token, int count, int32_t vocab_limit,
                          const AllowedTokens* allowed, std::vector<TokenLogit>& out) override {
    return inner_.forward_candidates(state, token, count, vocab_limit, allowed, out);
  }

 private:
  Backend& inner_;
};

// Decode as a request of `lily serve` runs it: runtime generate() with Qwen's recommended
// thinking-mode sampling (temperature 0.6, top-k 20, top-p 0.95): on a backend's chain (the
// GPU draws each token, the host a step behind), or, `stepwise`, each step's candidates (or
// logits) to the host and the draw there. `fill` puts D tokens of context into a fresh state.
// Time per token: the decode loop's time over its n - 1 steps.
std::vector<Row> bench_decode_generate(Backend& chained, const std::vector<int32_t>& depths, int n, int repeats,
                                       double peak_bytes_per_second,
                                       const std::function<void(SequenceState&, int32_t)>& fill, bool stepwise) {
  StepwiseOnly hidden(chained);
  Backend& backend = stepwise ? static_cast<Backend&>(hidden) : chained;
  const ModelConfig& c = backend.config();
  LILY_CHECK(n >= 2, "--decode-loop generate needs --decode-tokens of at least 2");
  std::vector<Row> rows;
  for (int32_t D : depths) {
    auto state = backend.new_sequence(int64_t(D) + int64_t(repeats + 1) * (n + 1) + 1);
    fill(*state, D);
    std::vector<double> times;
    for (int r = 0; r <= repeats; ++r) {
      GenerateRequest request;
      request.prompt = random_tokens(state->length() + 1, c.vocab_size, uint32_t(r));  // the state holds its head
      request.max_new_tokens = n;
      request.sampling.temperature = 0.6f, request.sampling.top_k = 20, request.sampling.top_p = 0.95f;
      request.sampling.seed = 7;
      const GenerateResult result = generate(backend, *state, request, [](const GeneratedToken&) { return true; });
      // The last token is not fed back (the generation runs to max_new_tokens): the state holds
      // the prompt and n - 1 tokens.
      if (r > 0) times.push_back(result.decode_seconds / double(n - 1));  // the first round is a warm-up
    }
    double t = median(times);
    double gbps = decode_bytes_per_token(c, D) / t / 1e9;
    rows.push_back(
        {"decode", D, t, 1 / t, gbps, peak_bytes_per_second > 0 ? 100.0 * gbps * 1e9 / peak_bytes_per_second : 0});
    std::fprintf(stderr, "decode (generate loop%s) at depth %7d: %.3f ms/token\n", stepwise ? ", stepwise" : "", D,
                 t * 1e3);
  }
  return rows;
}

void print_table(const std::vector<Row>& rows, const std::string& title, double peak_gbps, double peak_tflops) {
  std::printf("%s\n", title.c_str());
  std::printf("| kind    |  length | tokens/s   | ms/token  | achieved              |\n");
  std::printf("|---------|--------:|-----------:|----------:|-----------------------|\n");
  for (const Row& r : rows) {
    double ms_per_token = r.kind == "prefill" ? r.seconds * 1e3 / double(r.length) : r.seconds * 1e3;
    if (r.kind == "verify" || r.kind == "batch" ||
        r.kind == "streams")  // a step of r.rows tokens: ms a step, the step's tokens a second
      std::printf(peak_gbps >= 100 ? "| %s%d | %7lld | %10.1f | %9.3f | %7.0f GB/s (%4.1f%% of %.0f) |\n"
                                   : "| %s%d | %7lld | %10.1f | %9.3f | %7.1f GB/s (%4.1f%% of %.1f) |\n",
                  r.kind.c_str(), r.rows, (long long)r.length, r.tokens_per_second, ms_per_token, r.rate, r.percent,
                  peak_gbps);
    else if (r.kind == "decode")  // a CPU's tens of GB/s with a decimal
      std::printf(peak_gbps >= 100 ? "| decode  | %7lld | %10.1f | %9.3f | %7.0f GB/s (%4.1f%% of %.0f) |\n"
                                   : "| decode  | %7lld | %10.1f | %9.3f | %7.1f GB/s (%4.1f%% of %.1f) |\n",
                  (long long)r.length, r.tokens_per_second, ms_per_token, r.rate, r.percent, peak_gbps);
    else if (peak_tflops >= 10)
      std::printf("| prefill | %7lld | %10.1f | %9.4f | %6.1f TFLOP/s (%4.1f%% of %.0f) |\n", (long long)r.length,
                  r.tokens_per_second, ms_per_token, r.rate, r.percent, peak_tflops);
    else  // a CPU: GFLOP/s
      std::printf("| prefill | %7lld | %10.1f | %9.4f | %6.1f GFLOP/s (%4.1f%% of %.0f) |\n", (long long)r.length,
                  r.tokens_per_second, ms_per_token, r.rate * 1e3, r.percent, peak_tflops * 1e3);
  }
}

// --speculate's measurement (bench_speculative.h): its rates checked before the model loads.
SpeculativeBench speculative_options(const BenchArgs& a, const std::string& title) {
  SpeculativeBench o;
  o.drafts = a.speculate;
  if (!a.assume_acceptance.empty()) o.assumed = parse_acceptance(a.assume_acceptance, a.speculate);
  o.tokens = a.decode_tokens;
  o.repeats = a.repeats;
  o.title = title;
  return o;
}

// --chat, --prompt, --prompt-file: the decode follows a real chat prompt.
bool chat_context_wanted(const BenchArgs& a) { return a.chat || !a.prompt.empty() || !a.prompt_file.empty(); }

// The chat prompt of --speculate through the engine's tokenizer and generation config.
ChatContext bench_chat_context(const Engine& engine, const std::string& text, const std::string& model) {
  const Tokenizer* tokenizer = engine.tokenizer();
  LILY_CHECK(tokenizer, "--chat / --prompt: {} has no tokenizer (no tokenizer.json, no tokenizer.ggml.* in a GGUF)",
             model);
  return chat_context(*tokenizer, engine.generation_config().eos_token_ids, text);
}

#ifdef LILY_HAVE_CUDA
std::function<void(SequenceState&, int32_t)> fake_fill_of(Backend&) {
  return [](SequenceState& s, int32_t D) { cuda::bench::fake_fill(s, D); };
}
#endif

int run_bench(BenchArgs a) {
#ifdef LILY_HAVE_CUDA
  const bool cuda_runs = a.model.device_profile.empty() ? cuda_backend_available()
                                                        : cuda_backend_runs(a.model.device_profile);
  const bool on_gpu = a.synthetic || a.model.backend == "cuda" || (a.model.backend == "auto" && cuda_runs);
#else
  const bool on_gpu = false;
#endif
  const bool chat = chat_context_wanted(a);
  LILY_CHECK(!chat || a.speculate > 0, "--chat, --prompt and --prompt-file go with --speculate K");
  LILY_CHECK(a.prompt.empty() || a.prompt_file.empty(), "--prompt and --prompt-file: give one of them");
  LILY_CHECK(!chat || a.decode_depths.empty(), "--decode-depths with a chat prompt: the prompt is the context");
  LILY_CHECK(!chat || !a.synthetic, "--chat / --prompt: --synthetic has no tokenizer (random context only)");
  const std::string chat_text = chat ? chat_prompt_text(a.prompt, a.prompt_file) : "";  // its errors before the load
  if (a.prefill_lengths.empty()) a.prefill_lengths = on_gpu ? kGpuLengths : kCpuLengths;
  if (a.decode_depths.empty()) a.decode_depths = on_gpu ? kGpuLengths : kCpuLengths;
  if (a.decode_tokens == 0) a.decode_tokens = chat ? kChatDecodeTokens : on_gpu ? kGpuDecodeTokens : kCpuDecodeTokens;
  std::vector<int32_t> prefill_lengths, decode_depths;
  if (a.prefill_lengths != "none")  // none: decode only (under a profiler, say)
    for (int32_t x : parse_id_list(a.prefill_lengths)) prefill_lengths.push_back(x);
  if (a.decode_depths != "none")  // none: prefill only
    for (int32_t x : parse_id_list(a.decode_depths)) decode_depths.push_back(x);
  LILY_CHECK(a.decode_tokens >= 1 && a.repeats >= 1, "--decode-tokens and --repeats must be at least 1");
  LILY_CHECK(a.decode_rows >= 1 && a.decode_rows <= kMaxDecodeRows, "--decode-rows {}: 1 to {}", a.decode_rows,
             kMaxDecodeRows);
  LILY_CHECK(a.decode_rows == 1 || ((a.decode_loop == "graph" || (a.decode_batch && a.decode_loop == "generate")) &&
                                    a.decode_skip.empty() && a.decode_trace.empty()),
             "--decode-rows takes none of --decode-loop generate (but with --decode-batch) or stepwise, "
             "--decode-skip, --decode-trace");
  LILY_CHECK(!a.decode_batch || a.decode_rows > 1, "--decode-batch needs --decode-rows of 2 or more");
  LILY_CHECK(a.kernel_plan.empty() || on_gpu,
             "--kernel-plan edits the CUDA backend's plan; this bench runs on the CPU");
  LILY_CHECK(a.speculate >= 0 && a.speculate <= kMaxSpeculate, "--speculate {}: 0 (off) to {}", a.speculate,
             kMaxSpeculate);
  LILY_CHECK(a.assume_acceptance.empty() || a.speculate > 0, "--assume-acceptance needs --speculate K");
  if (a.speculate > 0) (void)speculative_options(a, "");  // the rates' errors before a long load
  LILY_CHECK(a.speculate == 0 || (a.decode_rows == 1 && !a.decode_batch && a.decode_skip.empty()),
             "--speculate takes none of --decode-rows, --decode-batch, --decode-skip");
  const bool generate_loop = a.decode_loop == "generate" || a.decode_loop == "stepwise";
  const bool stepwise = a.decode_loop == "stepwise";
  LILY_CHECK(!generate_loop || a.decode_trace.empty(),
             "--decode-trace traces the graph loop, not --decode-loop generate");
  if (!a.plot.empty()) {  // fail before the sweep, not after it
    const auto plot_dir = std::filesystem::absolute(a.plot).parent_path();
    LILY_CHECK(std::filesystem::is_directory(plot_dir), "--plot {}: no directory {}", a.plot, plot_dir.string());
  }

  std::vector<Row> rows;
  std::string title;
  double peak = 0, peak_flops = kBf16PeakTflops * 1e12;
#ifdef LILY_HAVE_CUDA
  if (on_gpu) {
    LILY_CHECK(cuda_runs, "lily bench on the GPU needs a CUDA GPU it runs on: {}",
               describe_device_profile(a.model.device_profile));
    peak = cuda::bench::measure_device_copy_bandwidth();
    std::unique_ptr<CudaBackend> backend;
    std::optional<ChatContext> chat_request;  // --chat: the prompt, through the engine's tokenizer
    CudaBackendOptions options = CudaBackendOptions::from_environment();
    options.plan_edits = a.kernel_plan;
    if (!a.model.device_profile.empty()) options.device_profile = a.model.device_profile;
    if (a.model.gpu_memory_gb > 0) options.gpu_memory_bytes = uint64_t(a.model.gpu_memory_gb * 1e9);
    // Under a cap, room for the longest sequence the bench makes (its depth, then its steps).
    for (int32_t n : prefill_lengths) options.planned_context = std::max<int64_t>(options.planned_context, n + 2048);
    for (int32_t n : decode_depths) options.planned_context = std::max<int64_t>(options.planned_context, n + 2048);
    if (a.synthetic) {
      std::fprintf(stderr, "building the Qwen3.6-35B-A3B geometry with random 4-bit weights on the GPU ...\n");
      backend = make_cuda_backend(cuda::bench::synthetic_weights(qwen36_35b_a3b_config(), 42, a.speculate > 0),
                                  options);
      title = "Qwen3.6-35B-A3B geometry, random 4-bit weights (--synthetic)";
    } else {
      auto engine = a.model.load_engine();
      backend = make_cuda_backend(std::shared_ptr<const ModelWeights>(&engine->weights(), [](const ModelWeights*) {}),
                                  options);
      title = a.model.resolved_model_dir();
      if (chat) chat_request = bench_chat_context(*engine, chat_text, title);
    }
    title += fmt::format(" on {} (cuda), {:.2f} GB of weights; copy bandwidth measured {:.0f} GB/s",
                         cuda::bench::device_name(), double(backend->weight_bytes()) / 1e9, peak / 1e9);
    std::fprintf(stderr, "%s", backend->describe_kernels().c_str());
    std::unique_ptr<cuda::DecodeStepObserver> skip;
    if (!a.decode_skip.empty()) {
      skip = cuda::bench::decode_skip(a.decode_skip);
      backend->observe_decode_step(skip.get());
      title += " (--decode-skip " + a.decode_skip + ": WRONG outputs, measurement only)";
    }
    if (a.speculate > 0 && chat_request) {
      run_speculative_bench(*backend, *chat_request, speculative_options(a, title), a.json);
      return 0;
    }
    if (a.speculate > 0) {
      run_speculative_bench(*backend, decode_depths, speculative_options(a, title), fake_fill_of(*backend), a.json);
      return 0;
    }
    auto p = bench_prefill(*backend, prefill_lengths, a.repeats, true, peak_flops);
    if (a.prefill_split) print_prefill_split(*backend, prefill_lengths);
    auto fake_fill = [&](SequenceState& s, int32_t D) { cuda::bench::fake_fill(s, D); };
    auto d = a.decode_batch && generate_loop
                 ? bench_decode_streams(*backend, decode_depths, a.decode_rows, a.decode_tokens, a.repeats, peak)
             : a.decode_batch ? bench_decode_batch(*backend, decode_depths, a.decode_rows, a.decode_tokens, a.repeats,
                                                   peak, fake_fill, true)
             : a.decode_rows > 1 ? bench_decode_rows(*backend, decode_depths, a.decode_rows, a.decode_tokens, a.repeats,
                                                     peak, fake_fill, true)
             : generate_loop
                 ? bench_decode_generate(*backend, decode_depths, a.decode_tokens, a.repeats, peak, fake_fill, stepwise)
                 : bench_decode_cuda(*backend, decode_depths, a.decode_tokens, a.repeats, peak, a.decode_trace);
    rows.insert(rows.end(), p.begin(), p.end());
    rows.insert(rows.end(), d.begin(), d.end());
  } else
#endif
  {
    LILY_CHECK(!a.synthetic, "--synthetic needs the CUDA backend (this build or machine has none)");
    LILY_CHECK(a.decode_skip.empty(), "--decode-skip needs the CUDA backend");
    LILY_CHECK(a.decode_trace.empty(), "--decode-trace needs the CUDA backend");
    LILY_CHECK(!a.prefill_split, "--prefill-split needs the CUDA backend");
    auto engine = a.model.load_engine();
    Backend& b = engine->backend();
    const bool on_cuda = b.name() == "cuda";
    title = a.model.resolved_model_dir() + " on " +
            (on_cuda                          ? "cuda"
             : a.model.backend == "reference" ? "reference"
                                              : "cpu");
    if (!on_cuda) {  // the ceilings of the threads the CPU backends use, measured now
      std::fprintf(stderr, "measuring the read bandwidth and FMA rate of %d threads ...\n", cpu_thread_count());
      peak = cpu_fast::measure_read_bandwidth();
      peak_flops = cpu_fast::measure_fp32_flops();
      title += fmt::format(
          " ({} threads), {:.2f} GB of weights; read bandwidth measured {:.1f} GB/s, fp32 FMA {:.0f} GFLOP/s",
          cpu_thread_count(), double(engine->weights().weight_bytes()) / 1e9, peak / 1e9, peak_flops / 1e9);
    }
    auto prefill_fill = [&](SequenceState& s, int32_t D) { prefill_random(b, s, D); };
    if (a.speculate > 0 && chat) {
      run_speculative_bench(b, bench_chat_context(*engine, chat_text, a.model.resolved_model_dir()),
                            speculative_options(a, title), a.json);
      return 0;
    }
    if (a.speculate > 0) {
      run_speculative_bench(b, decode_depths, speculative_options(a, title), prefill_fill, a.json);
      return 0;
    }
    auto p = bench_prefill(b, prefill_lengths, a.repeats, on_cuda, peak_flops);
    auto d = a.decode_batch && generate_loop
                 ? bench_decode_streams(b, decode_depths, a.decode_rows, a.decode_tokens, a.repeats, peak)
             : a.decode_batch    ? bench_decode_batch(b, decode_depths, a.decode_rows, a.decode_tokens, a.repeats, peak,
                                                      prefill_fill, on_cuda)
             : a.decode_rows > 1 ? bench_decode_rows(b, decode_depths, a.decode_rows, a.decode_tokens, a.repeats, peak,
                                                     prefill_fill, on_cuda)
             : generate_loop
                 ? bench_decode_generate(b, decode_depths, a.decode_tokens, a.repeats, peak, prefill_fill, stepwise)
                 : bench_decode_generic(b, decode_depths, a.decode_tokens, a.repeats, peak);
    rows.insert(rows.end(), p.begin(), p.end());
    rows.insert(rows.end(), d.begin(), d.end());
  }

  if (a.decode_batch && generate_loop)
    title += fmt::format(
        "; streams: 1 and {} requests of --decode-tokens through the runtime's batch generator (top-k 20 sampling), "
        "their aggregate decode tokens/s (ms a step: streams / aggregate)",
        a.decode_rows);
  else if (generate_loop)
    title += stepwise
                 ? "; decode through the request loop, stepwise (generate, top-k 20 sampling, the draw on the host)"
                 : "; decode through the request loop (generate, top-k 20 sampling)";
  else if (a.decode_batch)
    title += fmt::format("; batch{0}: steps of one token of each of {0} sequences with their logits (ms a step, its "
                         "tokens a second)",
                         a.decode_rows);
  else if (a.decode_rows > 1)
    title += fmt::format(
        "; verify{0}: steps of {0} consecutive tokens with their logits (ms a step, its tokens a second)",
        a.decode_rows);
  if (!a.plot.empty()) {
    std::vector<BenchPoint> points;
    for (const Row& r : rows) points.push_back({r.kind, r.length, r.tokens_per_second, r.percent});
    write_bench_plot(a.plot, points, title);
    std::fprintf(stderr, "wrote the plot to %s\n", a.plot.c_str());
  }
  if (a.json) {
    nlohmann::json out = {{"title", title},
                          {"copy_bandwidth_gbps", peak / 1e9},  // the read bandwidth on the CPU
                          {"peak_tflops", peak_flops / 1e12},
                          {"rows", nlohmann::json::array()}};
    for (const Row& r : rows)
      out["rows"].push_back({{"kind", r.kind},
                             {"rows", r.rows},
                             {"length", r.length},
                             {"tokens_per_second", r.tokens_per_second},
                             {"seconds", r.seconds},
                             {"rate", r.rate},
                             {"percent_of_peak", r.percent}});
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    print_table(rows, title, peak / 1e9, peak_flops / 1e12);
  }
  return 0;
}

CommandRegistration bench_command{
    {"bench", "Benchmark prefill and decode speed against the hardware limit",
     [](CLI::App& sub) {
       auto a = std::make_shared<BenchArgs>();
       a->model.add_to(sub);
       sub.add_flag("--synthetic", a->synthetic,
                    "Full-size Qwen3.6-35B-A3B geometry with random 4-bit weights on the GPU");
       sub.add_option("--prefill-lengths", a->prefill_lengths,
                      fmt::format("Prompt lengths, comma separated, or none (default: {} on a GPU, {} on the CPU)",
                                  kGpuLengths, kCpuLengths));
       sub.add_option("--decode-depths", a->decode_depths,
                      "Context depths for decode, comma separated, or none (default: as --prefill-lengths)");
       sub.add_option("--decode-tokens", a->decode_tokens,
                      fmt::format("Tokens decoded per measurement (default: {} on a GPU, {} on the CPU; with "
                                  "--chat at most {}, the reply's stop token may end it first)",
                                  kGpuDecodeTokens, kCpuDecodeTokens, kChatDecodeTokens));
       sub.add_option("--decode-rows", a->decode_rows,
                      "Tokens a decode step: 2 .. 8 time steps of that many consecutive tokens of one sequence with "
                      "every row's logits (a speculative draft's verification; the table's verifyN rows: ms a step, "
                      "GB/s of the weights once and the union of the rows' experts)")
           ->capture_default_str();
       sub.add_flag("--decode-batch", a->decode_batch,
                    "With --decode-rows N: steps of one token of each of N sequences at the depth (parallel requests; "
                    "the table's batchN rows, GB/s of the weights once and every sequence's state and cache); with "
                    "--decode-loop generate: N requests of --decode-tokens through the runtime's batch generator, as "
                    "lily serve --parallel runs them, and one alone, in turns (streams1, streamsN: aggregate decode "
                    "tokens/s)");
       sub.add_option("--repeats", a->repeats,
                      "Measurements per point (median reported), after one untimed warm-up pass of each prefill "
                      "length and a warm-up of each decode depth")
           ->capture_default_str();
       sub.add_option("--decode-loop", a->decode_loop,
                      "graph: greedy steps chained on the device (the kernels' speed); generate: the request loop "
                      "of lily serve (sampling with Qwen's top-k 20 / top-p 0.95 / temperature 0.6; on the GPU the "
                      "steps chained, each token drawn there, as the plan has them: --kernel-plan chain=0 to "
                      "step); stepwise: that loop with each step's candidates drawn on the host (no chain)")
           ->check(CLI::IsMember({"graph", "generate", "stepwise"}))
           ->capture_default_str();
       sub.add_option("--decode-skip", a->decode_skip,
                      "Measurement only, WRONG outputs: leave these parts out of every CUDA decode step (comma "
                      "separated: embed, in_proj, mixer, out_proj, moe or route, gate_up, down, advance, lm_head); the "
                      "difference in time is their cost inside the graph");
       sub.add_option("--decode-trace", a->decode_trace,
                      "Measurement only, in a build configured with -DLILY_KERNEL_TRACE=ON: after each depth's "
                      "timing, trace 3 more decode steps block by block into this CSV (-DEPTH added for several "
                      "depths); tools/decode_trace.py summarizes it");
       sub.add_flag("--prefill-split", a->prefill_split,
                    "CUDA: after the prefill timings, one more pass of each length with phase marks: the device "
                    "and host time of each phase (projections, cores, experts, ...) (stderr)");
       sub.add_option("--kernel-plan", a->kernel_plan,
                      "CUDA, measurement: set a threshold of the kernel plan, NAME=VALUE (e.g. moe_slots_up_to=8; "
                      "repeatable); the plan printed at the start shows the result");
       sub.add_option("--speculate", a->speculate,
                      "Decode greedy through generate() plain and with K drafts a step from the MTP head, in the "
                      "same run: effective tokens/s of each, tokens a step, acceptance per draft position (decode "
                      "only: no prefill rows). From random context at each --decode-depths (the acceptance is not "
                      "the model's), or, with --chat / --prompt / --prompt-file, from a real chat prompt; the run "
                      "fails if the speculative tokens differ from plain decoding's")
           ->capture_default_str();
       sub.add_flag("--chat", a->chat,
                    fmt::format("With --speculate: decode the model's greedy reply to a chat prompt (one user "
                                "message through the chat template, thinking on, and the tokenizer) instead of "
                                "random context: the acceptance is the model's own. The message is --prompt or "
                                "--prompt-file, else \"{}\"; the reply runs to its stop token or --decode-tokens "
                                "(default {} with --chat)",
                                kDefaultBenchPrompt, kChatDecodeTokens));
       sub.add_option("--prompt", a->prompt, "With --speculate: --chat with this user message");
       sub.add_option("--prompt-file", a->prompt_file,
                      "With --speculate: --chat with the user message read from this file")
           ->type_name("FILE");
       sub.add_option("--assume-acceptance", a->assume_acceptance,
                      "With --speculate: keep draft k at the given rate, e.g. 0.85,0.67,0.51 (random weights accept "
                      "nothing): the pipeline's cost; the output says the rates were assumed, the tokens are not "
                      "the model's");
       sub.add_flag("--json", a->json, "Print JSON instead of a table");
       sub.add_option("--plot", a->plot, "Also draw the sweep (tokens/s vs length, two panels) to this PNG file");
       return [a] { return run_bench(*a); };
     },
     60}};

}  // namespace
}  // namespace lily::cli
