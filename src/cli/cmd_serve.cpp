// cmd_serve.cpp: `lily serve`, the OpenAI-compatible HTTP server (src/server/, docs/server.md).
#include <cstdio>
#include <filesystem>

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
  bool verbose = false;
};

// The context size when --ctx-size is not given: the model's, at most 32768 tokens.
constexpr int64_t kDefaultContext = 32768;

int run_serve(ServeArgs& a) {
  if (a.verbose) set_log_level(LogLevel::debug);
  auto engine = a.model.load_engine();
  const std::string dir = a.model.resolved_model_dir();
  Tokenizer tokenizer = Tokenizer::load_from_model_dir(dir);
  ChatServiceOptions options;
  const int64_t model_max = engine->config().max_position_embeddings;
  options.context_size = a.ctx_size > 0 ? a.ctx_size : std::min<int64_t>(model_max, kDefaultContext);
  if (options.context_size > model_max) {
    LILY_LOG_WARN("--ctx-size {} is beyond the model's max_position_embeddings {}", options.context_size, model_max);
  }
  options.cache_bytes = a.cache_mib << 20;
  ChatService service(*engine, std::move(tokenizer), options);
  if (a.server.model_name.empty()) {
    a.server.model_name = std::filesystem::path(dir).lexically_normal().filename().string();
    if (a.server.model_name.empty()) a.server.model_name = std::filesystem::path(dir).parent_path().filename().string();
  }
  a.server.max_body_bytes = a.max_body_mib << 20;
  return server::run_server(service, a.server);
}

CommandRegistration serve_command{
    {"serve", "Serve the model over an OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions, ...)",
     [](CLI::App& sub) {
       auto a = std::make_shared<ServeArgs>();
       a->server.model_name.clear();
       a->model.add_to(sub);
       sub.add_option("--host", a->server.host, "Address to listen on (loopback by default)")->capture_default_str();
       sub.add_option("--port", a->server.port, "Port (0: any free port)")->capture_default_str();
       sub.add_option("-c,--ctx-size", a->ctx_size, "Context size in tokens (default: the model's, at most 32768)");
       sub.add_option("--api-key", a->server.api_key, "Require 'Authorization: Bearer KEY' on every route but /health")
           ->envname("LILY_API_KEY");
       sub.add_option("--alias", a->server.model_name, "Model name in the API (default: the model directory's name)");
       sub.add_option("--cache-mib", a->cache_mib, "Memory budget of the session cache, MiB")->capture_default_str();
       sub.add_option("--queue", a->server.max_waiting, "Requests that may wait while one runs (beyond: 503)")
           ->capture_default_str();
       sub.add_option("--max-body-mib", a->max_body_mib, "Largest request body, MiB (beyond: 413)")
           ->capture_default_str();
       sub.add_flag("-v,--verbose", a->verbose, "Log every request");
       return [a] { return run_serve(*a); };
     },
     20}};

}  // namespace
}  // namespace lily::cli
