// cmd_serve.cpp: `lily serve`, the OpenAI-compatible HTTP server (src/server/, docs/server.md).
//
// The port is bound before the model loads: a port in use is refused at once, and /health
// answers 503 with the loading phase (and stderr says how long it has taken) until it is loaded.
#include <malloc.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <thread>

#include "base/log.h"
#include "cli/command.h"
#include "cli/model_options.h"
#include "runtime/chat_service.h"
#include "server/server.h"

namespace lily::cli {
namespace {

struct ServeArgs {
  ModelOptions model;
  server::ServerOptions server;
  int64_t ctx_size = 0;
  uint64_t cache_mib = 4096;
  size_t max_body_mib = 8;
  int64_t prefill_chunk = 512;
  int speculate = 0;
  bool parallel_given = false;  // --parallel on the command line: refused, not lowered, where memory is short
  bool verbose = false;
};

// The context size when --ctx-size is not given: the model's, at most 32768 tokens.
constexpr int64_t kDefaultContext = 32768;

// While the model loads: a line on stderr every 10 s, so a long load is seen to go on.
class LoadTicker {
 public:
  explicit LoadTicker(server::Server& server) : server_(server) {
    thread_ = std::thread([this] {
      const auto start = std::chrono::steady_clock::now();
      std::unique_lock lock(mutex_);
      while (!done_cv_.wait_for(lock, std::chrono::seconds(10), [&] { return done_; })) {
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::fprintf(stderr, "lily serve: %s, %.0f s so far (GET /health answers 503 until it is done)\n",
                     phase_.c_str(), s);
      }
    });
  }
  ~LoadTicker() {
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    done_cv_.notify_all();
    thread_.join();
  }
  void phase(std::string text) {
    server_.set_phase(text);
    std::lock_guard lock(mutex_);
    phase_ = std::move(text);
  }

 private:
  server::Server& server_;
  std::mutex mutex_;
  std::condition_variable done_cv_;
  std::string phase_ = "starting";
  bool done_ = false;
  std::thread thread_;
};

// glibc's malloc thresholds fixed at their start values, before any thread starts: a block of
// 128 KiB or more (sequence states, KV caches, snapshots, the backend's scratch) is mmapped and
// unmapped when freed, and an arena gives back its free top beyond 128 KiB. Left dynamic, the
// first such block freed raises the mmap threshold to its size (up to 32 MiB) and the trim
// threshold to twice that: the states then come from the arenas of the worker threads that ran
// the requests, and each arena keeps up to the trim threshold of freed pages at its top, which
// malloc_trim(0) after /cache/clear does not release (it trims the main heap's top, not a
// thread arena's). What the server kept after /cache/clear then depended on where the last
// states fell (tests/server/node/soak.mjs checks it).
void fix_malloc_thresholds() {
#ifndef __SANITIZE_ADDRESS__  // AddressSanitizer's allocator has no such thresholds; its mallopt refuses all
  constexpr int kThreshold = 128 << 10;
  if (!mallopt(M_MMAP_THRESHOLD, kThreshold) || !mallopt(M_TRIM_THRESHOLD, kThreshold)) {
    LILY_LOG_WARN("mallopt refused the mmap and trim thresholds of {} bytes", kThreshold);
  }
#endif
}

int run_serve(ServeArgs& a) {
  if (a.verbose) set_log_level(LogLevel::debug);
  fix_malloc_thresholds();
  const std::string dir = a.model.resolved_model_dir();
  if (a.server.model_name.empty()) {
    a.server.model_name = std::filesystem::path(dir).lexically_normal().filename().string();
    if (a.server.model_name.empty()) a.server.model_name = std::filesystem::path(dir).parent_path().filename().string();
  }
  a.server.max_body_bytes = a.max_body_mib << 20;
  server::Server server(a.server);  // binds now: "cannot listen on ..." before a long load
  std::fprintf(stderr, "lily serve: bound to %s; loading the model (GET /health answers 503 until it is loaded)\n",
               server.url().c_str());
  std::unique_ptr<Engine> engine;
  std::optional<ChatService> service;
  {
    LoadTicker ticker(server);
    ticker.phase("loading the model weights");
    engine = a.model.load_engine(a.ctx_size > 0 ? a.ctx_size : kDefaultContext);
    // The engine's tokenizer: tokenizer.json, or a GGUF's own vocabulary (engine.h find_tokenizer).
    const Tokenizer* tokenizer = engine->tokenizer();
    if (!tokenizer)
      fail("{} has no tokenizer: no tokenizer.json, and no tokenizer.ggml.* metadata in a GGUF",
           a.model.resolved_model_dir());
    ChatServiceOptions options;
    const int64_t model_max = engine->config().max_position_embeddings;
    options.context_size = a.ctx_size > 0 ? a.ctx_size : std::min<int64_t>(model_max, kDefaultContext);
    if (options.context_size > model_max) {
      LILY_LOG_WARN("--ctx-size {} is beyond the model's max_position_embeddings {}", options.context_size, model_max);
    }
    options.cache_bytes = a.cache_mib << 20;
    options.parallel = a.server.parallel;
    options.fewer_slots_if_short = !a.parallel_given;
    options.prefill_chunk = a.prefill_chunk;
    options.speculate = a.speculate;
    ticker.phase("starting the chat service");
    service.emplace(*engine, *tokenizer, options);
  }
  return server.serve(*service);
}

CommandRegistration serve_command{
    {"serve", "Serve the model over an OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions, ...)",
     [](CLI::App& sub) {
       auto a = std::make_shared<ServeArgs>();
       a->server.model_name.clear();
       a->model.add_to(sub);
       sub.add_option("--host", a->server.host,
                      "Address to listen on (loopback by default; beyond loopback, use an API key)")
           ->capture_default_str();
       sub.add_option("--port", a->server.port, "Port (0: any free port)")
           ->capture_default_str()
           ->check(CLI::Range(0, 65535));
       sub.add_option("-c,--ctx-size", a->ctx_size, "Context size in tokens (default: the model's, at most 32768)");
       sub.add_option("--api-key", a->server.api_key,
                      "Require 'Authorization: Bearer KEY' on every route but /health (prefer $LILY_API_KEY: "
                      "a command line is visible to every user of the machine)")
           ->envname("LILY_API_KEY");
       sub.add_option("--alias", a->server.model_name, "Model name in the API (default: the model directory's name)");
       sub.add_option("--cache-mib", a->cache_mib, "Memory budget of the session cache, MiB")->capture_default_str();
       CLI::Option* parallel =
           sub.add_option("--parallel", a->server.parallel,
                          "Completions that run at once, decoding in the same batch steps (1: one at a time, on the "
                          "single-stream path). Each slot's state is budgeted at the whole --ctx-size when the server "
                          "starts: a --parallel the memory cannot hold is refused (the default is lowered, with a "
                          "warning)")
               ->capture_default_str()
               ->check(CLI::Range(1, 64));
       sub.add_option("--prefill-chunk", a->prefill_chunk,
                      "With --parallel > 1: prompt tokens prefilled between two batch steps (a long prompt holds "
                      "the running streams for one chunk at a time)")
           ->capture_default_str()
           ->check(CLI::Range(int64_t(1), int64_t(1) << 20));
       sub.add_option("--speculate", a->speculate,
                      "Speculative decoding: K drafts a step from the model's MTP head (1-8; 0: off), the same "
                      "answers; with --parallel > 1 each speculating request runs its own steps beside the batch")
           ->capture_default_str();
       sub.add_option("--queue", a->server.max_waiting, "Requests that may wait while every slot is busy (beyond: 503)")
           ->capture_default_str();
       sub.add_option("--max-body-mib", a->max_body_mib, "Largest request body, MiB (beyond: 413)")
           ->capture_default_str()
           ->check(CLI::Range(size_t(1), size_t(1024)));
       sub.add_option("--cors-origin", a->server.cors_origins,
                      "Web origin allowed to call the API from a browser, e.g. http://localhost:3000 (repeatable; "
                      "'*': any). Without it no page of another origin may");
       sub.add_option("--drain-seconds", a->server.drain_seconds,
                      "On SIGTERM/SIGINT, how long a running generation may go on before it is stopped")
           ->capture_default_str()
           ->check(CLI::Range(0.0, 3600.0));
       sub.add_flag("-v,--verbose", a->verbose, "Log every request");
       return [a, parallel] {
         a->parallel_given = parallel->count() > 0;
         return run_serve(*a);
       };
     },
     20}};

}  // namespace
}  // namespace lily::cli
