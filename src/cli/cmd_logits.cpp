// cmd_logits.cpp: `lily logits` writes the logits after every token of a sequence (and, with
// --hidden-out, the hidden rows after the final norm: the h_i the MTP head takes), and
// `lily generate` prints greedy continuations; both are the engine's testing interface.
#include <cstdio>
#include <fstream>

#include "backend/backend.h"
#include "base/error.h"
#include "cli/command.h"
#include "cli/model_options.h"
#include "runtime/generate.h"
#include "runtime/speculative.h"

namespace lily::cli {
namespace {

struct LogitsArgs {
  ModelOptions model;
  std::string ids, out, hidden_out;
};

// values [rows, cols] -> `path`, float32 little-endian, row-major.
void write_f32(const std::string& path, const std::vector<float>& values, int64_t rows, int64_t cols,
               const char* what) {
  std::ofstream out(path, std::ios::binary);
  if (!out) fail("cannot write {}", path);
  out.write(reinterpret_cast<const char*>(values.data()), std::streamsize(values.size() * sizeof(float)));
  if (!out) fail("writing {} failed", path);
  std::fprintf(stderr, "wrote float32 %s [%lld, %lld] to %s\n", what, (long long)rows, (long long)cols, path.c_str());
}

int run_logits(const LogitsArgs& a) {
  std::vector<int32_t> ids = parse_id_list(a.ids);
  LILY_CHECK(!ids.empty(), "--ids is empty");
  auto engine = a.model.load_engine();
  Backend& backend = engine->backend();
  auto state = backend.new_sequence(int64_t(ids.size()));
  const int64_t T = int64_t(ids.size()), V = engine->config().vocab_size, H = engine->config().hidden_size;
  std::vector<float> logits, hidden;  // [T, V], [T, H]
  if (a.hidden_out.empty()) {
    backend.forward(*state, ids, LogitsWanted::all, logits);
  } else {
    try {
      backend.forward_hidden(*state, ids, LogitsWanted::all, logits, LogitsWanted::all, hidden);
    } catch (const Error& e) {
      fail("--hidden-out: the {} backend cannot hand back the post-norm hidden rows ({}); --backend reference "
           "can",
           backend.name(), e.what());
    }
  }
  write_f32(a.out, logits, T, V, "logits");
  if (!a.hidden_out.empty()) write_f32(a.hidden_out, hidden, T, H, "post-norm hidden rows");
  return 0;
}

CommandRegistration logits_command{
    {"logits", "Write float32 logits [number of ids, vocab] after each token of --ids",
     [](CLI::App& sub) {
       auto a = std::make_shared<LogitsArgs>();
       a->model.add_to(sub);
       sub.add_option("--ids", a->ids, "Token ids, comma separated")->required();
       sub.add_option("--out", a->out, "Output file (float32 little-endian)")->required();
       sub.add_option("--hidden-out", a->hidden_out,
                      "Also write the hidden rows after the final norm (the MTP head's input), float32 [number of "
                      "ids, hidden]");
       return [a] { return run_logits(*a); };
     },
     50}};

struct GenerateArgs {
  ModelOptions model;
  std::string ids;
  int64_t n = 16;
  int speculate = 0;
};

int run_generate(const GenerateArgs& a) {
  std::vector<int32_t> ids = parse_id_list(a.ids);
  LILY_CHECK(!ids.empty(), "--ids is empty");
  LILY_CHECK(a.n >= 1, "-n must be at least 1");
  auto engine = a.model.load_engine();
  check_speculate(engine->backend(), a.speculate);
  auto state = engine->backend().new_sequence(int64_t(ids.size()) + a.n);
  GenerateRequest request;
  request.prompt = ids;
  request.max_new_tokens = a.n;
  request.sampling.temperature = 0;  // greedy
  request.speculate = a.speculate;
  std::vector<int32_t> out;
  GenerateResult r = generate(engine->backend(), *state, request, [&](const GeneratedToken& t) {
    out.push_back(t.id);
    return true;
  });
  for (size_t i = 0; i < out.size(); ++i) std::printf(i ? ",%d" : "%d", out[i]);
  std::printf("\n");
  std::fprintf(stderr, "prefill %lld tokens in %.3f s, decoded %zu tokens in %.3f s (%.1f tokens/s)\n",
               (long long)ids.size(), r.prefill_seconds, out.size(), r.decode_seconds,
               r.decode_seconds > 0 ? double(out.size()) / r.decode_seconds : 0.0);
  if (a.speculate > 0) {
    const SpeculationStats& st = r.speculation;
    std::fprintf(stderr, "speculate %d: %lld steps, %.2f tokens a step; accepted per draft position:", a.speculate,
                 (long long)st.steps, st.steps ? double(st.step_tokens) / double(st.steps) : 0.0);
    for (size_t k = 0; k < st.drafted.size(); ++k)
      std::fprintf(stderr, " %lld/%lld", (long long)st.accepted[k], (long long)st.drafted[k]);
    std::fprintf(stderr, "\n");
  }
  return 0;
}

CommandRegistration generate_command{
    {"generate", "Print N greedy token ids after --ids (no stop tokens)",
     [](CLI::App& sub) {
       auto a = std::make_shared<GenerateArgs>();
       a->model.add_to(sub);
       sub.add_option("--ids", a->ids, "Prompt token ids, comma separated")->required();
       sub.add_option("-n", a->n, "Number of tokens to generate")->capture_default_str();
       sub.add_option("--speculate", a->speculate,
                      "K drafts a step from the MTP head (1-8; 0: off): the same tokens, fewer steps")
           ->capture_default_str();
       return [a] { return run_generate(*a); };
     },
     51}};

}  // namespace
}  // namespace lily::cli
