// cmd_chat.cpp: `lily chat`, an interactive terminal chat, and `lily run`, one-shot use in
// scripts. Both go through the same ChatService as the server (template, session cache,
// reasoning / answer split).
//
// lily chat: multi-turn and streaming; the reasoning is shown dimmed, apart from the answer.
// Ctrl-C during a reply stops the reply (the session goes on); Ctrl-C at the prompt or EOF
// (Ctrl-D) ends the session. Commands: /reset, /think on|off, /exit.
// lily run -p TEXT: prints the answer on stdout (the reasoning, if any, on stderr).
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string_view>

#include "base/error.h"
#include "cli/command.h"
#include "cli/model_options.h"
#include "runtime/chat_service.h"
#include "runtime/speculative.h"

namespace lily::cli {
namespace {

std::atomic<bool> g_interrupted{false};

void on_sigint(int) { g_interrupted = true; }

// SIGINT sets a flag; a blocking read at the prompt is interrupted too (no SA_RESTART).
void install_sigint_handler() {
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;
  sigaction(SIGINT, &sa, nullptr);
}

struct SamplingArgs {
  std::optional<float> temperature, top_p, min_p;
  std::optional<int> top_k;
  std::optional<uint64_t> seed;
  int64_t max_tokens = 0;  // 0: what the context leaves
  int64_t ctx_size = 4096;
  int speculate = 0;

  void add_to(CLI::App& sub) {
    sub.add_option("--temperature", temperature, "Sampling temperature (default: generation_config.json; 0: greedy)");
    sub.add_option("--top-p", top_p, "Nucleus sampling mass");
    sub.add_option("--top-k", top_k, "Sample from the k most likely tokens (0: off)");
    sub.add_option("--min-p", min_p, "Drop tokens below min_p times the top probability");
    sub.add_option("--seed", seed, "Random seed");
    sub.add_option("-n,--max-tokens", max_tokens, "Most tokens per reply (0: what the context leaves)");
    sub.add_option("-c,--ctx-size", ctx_size, "Context size in tokens")->capture_default_str();
    sub.add_option("--speculate", speculate,
                   "Speculative decoding: K drafts a step from the model's MTP head (1-8; 0: off). The same "
                   "answers (greedy: the same tokens; sampling: the same distribution)")
        ->capture_default_str();
  }
  CompletionOptions options(const ChatService& service) const {
    CompletionOptions o;
    o.sampling = service.default_sampling();
    if (temperature) o.sampling.temperature = *temperature;
    if (top_p) o.sampling.top_p = *top_p;
    if (top_k) o.sampling.top_k = *top_k;
    if (min_p) o.sampling.min_p = *min_p;
    if (seed) o.sampling.seed = *seed;
    if (max_tokens > 0) o.max_tokens = max_tokens;
    return o;
  }
};

struct Session {
  std::unique_ptr<Engine> engine;
  std::unique_ptr<ChatService> service;
};

Session open_session(const ModelOptions& model, const SamplingArgs& sampling) {
  Session s;
  s.engine = model.load_engine(sampling.ctx_size);
  check_speculate(s.engine->backend(), sampling.speculate);
  const int64_t ctx_size = sampling.ctx_size;
  ChatServiceOptions options;
  options.speculate = sampling.speculate;
  options.context_size = std::min<int64_t>(ctx_size, s.engine->config().max_position_embeddings);
  options.cache_bytes = uint64_t(1) << 30;
  // The engine's tokenizer: tokenizer.json, or a GGUF's own vocabulary (engine.h find_tokenizer).
  const Tokenizer* tokenizer = s.engine->tokenizer();
  if (!tokenizer)
    fail("{} has no tokenizer: no tokenizer.json, and no tokenizer.ggml.* metadata in a GGUF",
         model.resolved_model_dir());
  s.service = std::make_unique<ChatService>(*s.engine, *tokenizer, options);
  return s;
}

// Whether `out` takes ANSI escapes: a terminal, not TERM=dumb, no NO_COLOR (https://no-color.org).
// A pipe or a file gets plain text.
bool ansi(FILE* out) {
  const char* term = std::getenv("TERM");
  return isatty(fileno(out)) && !std::getenv("NO_COLOR") && !(term && std::string_view(term) == "dumb");
}

// Prints a streamed reply: reasoning dimmed (on a terminal) and apart, then the answer.
class ReplyPrinter {
 public:
  ReplyPrinter(FILE* reasoning_out, FILE* answer_out) : rout_(reasoning_out), aout_(answer_out) {
    dim_ = ansi(reasoning_out);
  }
  bool operator()(const ChatDelta& d) {
    if (!d.reasoning.empty()) {
      if (!in_reasoning_) std::fputs(dim_ ? "\x1b[2m" : "[thinking] ", rout_), in_reasoning_ = true;
      std::fputs(d.reasoning.c_str(), rout_);
      std::fflush(rout_);
    }
    if (!d.content.empty() || !d.tool_calls.empty()) end_reasoning();
    if (!d.content.empty()) std::fputs(d.content.c_str(), aout_);
    for (const ToolCall& c : d.tool_calls)
      std::fprintf(aout_, "[tool call] %s(%s)\n", c.name.c_str(), c.arguments.c_str());
    std::fflush(aout_);
    return !g_interrupted;
  }
  void end_reasoning() {
    if (!in_reasoning_) return;
    std::fputs(dim_ ? "\x1b[0m\n\n" : "\n\n", rout_);
    std::fflush(rout_);
    in_reasoning_ = false;
  }

 private:
  FILE* rout_;
  FILE* aout_;
  bool dim_ = false, in_reasoning_ = false;
};

struct RunArgs {
  ModelOptions model;
  SamplingArgs sampling;
  std::string prompt, system;
  bool no_think = false;
};

int run_run(const RunArgs& a) {
  Session s = open_session(a.model, a.sampling);
  install_sigint_handler();
  ChatRequest request;
  if (!a.system.empty()) request.messages.push_back(json{{"role", "system"}, {"content", a.system}});
  request.messages.push_back(json{{"role", "user"}, {"content", a.prompt}});
  request.template_options.enable_thinking = !a.no_think;
  request.options = a.sampling.options(*s.service);
  ReplyPrinter printer(stderr, stdout);
  CompletionResult r = s.service->complete_chat(request, std::ref(printer));
  printer.end_reasoning();
  if (!r.content.empty() && r.content.back() != '\n') std::fputc('\n', stdout);
  return r.cancelled ? 130 : 0;
}

struct ChatArgs {
  ModelOptions model;
  SamplingArgs sampling;
  std::string system;
  bool no_think = false;
};

int run_chat(const ChatArgs& a) {
  Session s = open_session(a.model, a.sampling);
  install_sigint_handler();
  json messages = json::array();
  if (!a.system.empty()) messages.push_back(json{{"role", "system"}, {"content", a.system}});
  const json initial = messages;
  bool think = !a.no_think;
  std::fprintf(stderr, "lily chat: /reset starts over, /think on|off, /exit (or Ctrl-D) ends; Ctrl-C stops a reply.\n");
  std::string line;
  while (true) {
    g_interrupted = false;
    std::fputs("\n> ", stdout);
    std::fflush(stdout);
    if (!std::getline(std::cin, line) || g_interrupted) break;
    if (line.empty()) continue;
    if (line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      messages = initial;
      std::puts("(conversation cleared)");
      continue;
    }
    if (line == "/think on" || line == "/think off") {
      think = line == "/think on";
      std::printf("(thinking %s)\n", think ? "on" : "off");
      continue;
    }
    if (line[0] == '/') {
      std::puts("commands: /reset, /think on|off, /exit");
      continue;
    }
    messages.push_back(json{{"role", "user"}, {"content", line}});
    ChatRequest request;
    request.messages = messages;
    request.template_options.enable_thinking = think;
    request.options = a.sampling.options(*s.service);
    ReplyPrinter printer(stdout, stdout);
    CompletionResult r;
    try {
      r = s.service->complete_chat(request, std::ref(printer));
    } catch (const Error& e) {
      messages.erase(messages.end() - 1);
      std::fprintf(stderr, "error: %s\n", e.what());
      continue;
    }
    printer.end_reasoning();
    if (r.cancelled) std::fputs(" [stopped]", stdout);
    std::fputc('\n', stdout);
    json reply{{"role", "assistant"}, {"content", r.content}};
    if (!r.reasoning.empty()) reply["reasoning_content"] = r.reasoning;
    if (!r.tool_calls.empty()) {
      json calls = json::array();
      for (const ToolCall& c : r.tool_calls) {
        calls.push_back(
            json{{"id", c.id}, {"type", "function"}, {"function", json{{"name", c.name}, {"arguments", c.arguments}}}});
      }
      reply["tool_calls"] = calls;
    }
    messages.push_back(reply);
    const bool dim = ansi(stderr);
    std::fprintf(stderr, "%s[%lld prompt tokens (%lld cached), %lld generated, %.1f tokens/s]%s\n",
                 dim ? "\x1b[2m" : "", (long long)r.usage.prompt_tokens, (long long)r.usage.cached_tokens,
                 (long long)r.usage.completion_tokens,
                 r.timings.decode_seconds > 0 ? double(r.timings.decoded_tokens) / r.timings.decode_seconds : 0.0,
                 dim ? "\x1b[0m" : "");
  }
  std::fputc('\n', stdout);
  return 0;
}

CommandRegistration chat_command{{"chat", "Chat with the model in the terminal (multi-turn, streaming)",
                                  [](CLI::App& sub) {
                                    auto a = std::make_shared<ChatArgs>();
                                    a->model.add_to(sub);
                                    a->sampling.add_to(sub);
                                    sub.add_option("--system", a->system, "System prompt");
                                    sub.add_flag("--no-think", a->no_think, "Start with thinking off");
                                    return [a] { return run_chat(*a); };
                                  },
                                  10}};

CommandRegistration run_command{{"run", "Answer one prompt (-p TEXT) and exit; the answer goes to stdout",
                                 [](CLI::App& sub) {
                                   auto a = std::make_shared<RunArgs>();
                                   a->model.add_to(sub);
                                   a->sampling.add_to(sub);
                                   sub.add_option("-p,--prompt", a->prompt, "The user message")->required();
                                   sub.add_option("--system", a->system, "System prompt");
                                   sub.add_flag("--no-think", a->no_think,
                                                "Thinking off (no reasoning before the answer)");
                                   return [a] { return run_run(*a); };
                                 },
                                 11}};

}  // namespace
}  // namespace lily::cli
