// cmd_eval.cpp: `lily eval`, teacher-forced consistency of a model on a text.
//
//   lily eval -m DIR|FILE.gguf --text FILE [--ref-logits FILE] [--tokenizer FILE] [--max-tokens N] [--json]
//
// The text is tokenized with the model's tokenizer as the engine finds it (engine.h
// find_model_tokenizer: tokenizer.json in the model directory, else a GGUF's own vocabulary) or
// with --tokenizer FILE; nothing is added. One teacher-forced forward over all T tokens (chunked
// by the backend) gives logits [T, vocab].
//   NLL        = mean over t = 0..T-2 of  logsumexp(logits[t]) - logits[t][id[t+1]]   (nats)
//   perplexity = exp(NLL)
// The softmax runs over the model's full logit row (config vocab_size, including ids the
// tokenizer does not define), as transformers' loss does, so the numbers compare with theirs.
//
// --ref-logits FILE: float32 little-endian [T, vocab] logits of the same ids from another
// implementation (tools/eval_reference.py writes them with transformers). Reported besides:
// the reference's NLL and perplexity computed the same way, the differences, top-1 agreement
// (argmax of lily's row == argmax of the reference row, over all T positions), and
// max |lily - ref| / max |ref| over all logits.
#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/error.h"
#include "cli/command.h"
#include "cli/model_options.h"
#include "runtime/engine.h"
#include "tokenizer/tokenizer.h"

namespace lily::cli {
namespace {

static_assert(std::endian::native == std::endian::little, "--ref-logits files are little-endian float32");

struct EvalArgs {
  ModelOptions model;
  std::string text_file, ref_file, tokenizer_file;
  int64_t max_tokens = 0;  // 0: the whole text
  bool json = false;
};

// Per-row statistics of one [T, vocab] logits matrix against the text's ids.
struct LogitStats {
  double mean_nll = 0;          // nats, over the T-1 predictions
  std::vector<int32_t> argmax;  // [T]
};

LogitStats logit_stats(const std::vector<float>& logits, const std::vector<int32_t>& ids, int64_t vocab) {
  const int64_t T = int64_t(ids.size());
  LogitStats s;
  s.argmax.resize(size_t(T));
  double nll_sum = 0;
  for (int64_t t = 0; t < T; ++t) {
    const float* row = logits.data() + t * vocab;  // [vocab] f32
    int64_t best = 0;
    for (int64_t v = 1; v < vocab; ++v)
      if (row[v] > row[best]) best = v;
    s.argmax[size_t(t)] = int32_t(best);
    if (t + 1 == T) break;  // the last row predicts a token the text does not have
    double sum = 0;         // logsumexp, shifted by the row maximum
    for (int64_t v = 0; v < vocab; ++v) sum += std::exp(double(row[v]) - double(row[best]));
    nll_sum += double(row[best]) + std::log(sum) - double(row[ids[size_t(t) + 1]]);
  }
  s.mean_nll = nll_sum / double(T - 1);
  return s;
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read --text {}", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<float> read_ref_logits(const std::string& path, int64_t T, int64_t vocab) {
  std::error_code ec;
  const uint64_t bytes = std::filesystem::file_size(path, ec);
  if (ec) fail("cannot read --ref-logits {}: {}", path, ec.message());
  const uint64_t want = uint64_t(T) * uint64_t(vocab) * sizeof(float);
  if (bytes != want) {
    std::string rows = bytes % (uint64_t(vocab) * 4) == 0
                           ? fmt::format("it holds {} rows of {}", bytes / (uint64_t(vocab) * 4), vocab)
                           : fmt::format("that is not a whole number of rows of {}", vocab);
    fail("--ref-logits {}: {} bytes, expected float32 [T={}, vocab={}] = {} bytes ({}); the reference must "
         "use the same token ids (the same tokenizer, nothing added, the same --max-tokens) and the same model",
         path, bytes, T, vocab, want, rows);
  }
  std::vector<float> logits(size_t(T * vocab));
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(logits.data()), std::streamsize(want));
  if (!in) fail("reading --ref-logits {} failed", path);
  for (float x : logits)
    if (!std::isfinite(x)) fail("--ref-logits {} holds non-finite values", path);
  return logits;
}

int run_eval(const EvalArgs& a) {
  LILY_CHECK(a.max_tokens >= 0, "--max-tokens must not be negative");
  const std::string model_dir = a.model.resolved_model_dir();
  // Tokenized before the weights are read, so a text too short fails at once.
  const ModelTokenizer tokenizer = a.tokenizer_file.empty()
                                       ? load_model_tokenizer(model_dir)
                                       : ModelTokenizer{Tokenizer::load(a.tokenizer_file), a.tokenizer_file};
  std::vector<int32_t> ids = tokenizer.tokenizer.encode(read_text_file(a.text_file));
  if (a.max_tokens > 0 && int64_t(ids.size()) > a.max_tokens) ids.resize(size_t(a.max_tokens));
  const int64_t T = int64_t(ids.size());
  LILY_CHECK(T >= 2, "--text {} has {} token(s); perplexity needs at least 2", a.text_file, T);

  auto engine = a.model.load_engine();
  const int64_t vocab = engine->config().vocab_size;
  check_tokenizer_fits(tokenizer.tokenizer, engine->config(), tokenizer.source);
  LILY_CHECK(T <= engine->config().max_position_embeddings,
             "the text has {} tokens, more than the model's {} positions; pass --max-tokens", T,
             engine->config().max_position_embeddings);

  auto t0 = std::chrono::steady_clock::now();
  auto state = engine->backend().new_sequence(T);
  std::vector<float> logits;  // [T, vocab] f32
  engine->backend().forward(*state, ids, LogitsWanted::all, logits);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  LILY_CHECK(int64_t(logits.size()) == T * vocab, "the backend returned {} logits, expected {} x {}", logits.size(), T,
             vocab);
  const LogitStats ours = logit_stats(logits, ids, vocab);

  nlohmann::json out = {{"model", model_dir},
                        {"backend", engine->backend().name()},
                        {"text", a.text_file},
                        {"tokens", T},
                        {"predictions", T - 1},
                        {"vocab", vocab},
                        {"forward_seconds", seconds},
                        {"mean_nll", ours.mean_nll},
                        {"perplexity", std::exp(ours.mean_nll)}};
  if (!a.ref_file.empty()) {
    const std::vector<float> ref = read_ref_logits(a.ref_file, T, vocab);
    const LogitStats theirs = logit_stats(ref, ids, vocab);
    int64_t agree = 0;
    for (int64_t t = 0; t < T; ++t) agree += ours.argmax[size_t(t)] == theirs.argmax[size_t(t)];
    double max_diff = 0, max_ref = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      max_diff = std::max(max_diff, std::fabs(double(logits[i]) - double(ref[i])));
      max_ref = std::max(max_ref, std::fabs(double(ref[i])));
    }
    out["reference"] = {{"file", a.ref_file},
                        {"mean_nll", theirs.mean_nll},
                        {"perplexity", std::exp(theirs.mean_nll)},
                        {"perplexity_difference", std::exp(ours.mean_nll) - std::exp(theirs.mean_nll)},
                        {"mean_nll_difference", ours.mean_nll - theirs.mean_nll},
                        {"top1_agree", agree},
                        {"top1_agreement", double(agree) / double(T)},
                        {"max_abs_logit_diff", max_diff},
                        {"max_abs_ref_logit", max_ref},
                        {"relative_max_diff", max_ref > 0 ? max_diff / max_ref : 0.0}};
  }

  if (a.json) {
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  std::printf("text        %s: %lld tokens, %lld predictions (vocab %lld)\n", a.text_file.c_str(), (long long)T,
              (long long)(T - 1), (long long)vocab);
  std::printf("model       %s on %s (forward %.2f s, %.0f tokens/s)\n", model_dir.c_str(),
              engine->backend().name().c_str(), seconds, double(T) / seconds);
  if (!out.contains("reference")) {
    std::printf("mean NLL    %.6f nats\nperplexity  %.6f\n", ours.mean_nll, std::exp(ours.mean_nll));
    return 0;
  }
  const auto& r = out["reference"];
  std::printf("reference   %s\n\n", a.ref_file.c_str());
  std::printf("%-20s %14s %14s %14s\n", "", "lily", "reference", "difference");
  std::printf("%-20s %14.6f %14.6f %+14.3e\n", "mean NLL (nats)", ours.mean_nll, r["mean_nll"].get<double>(),
              r["mean_nll_difference"].get<double>());
  std::printf("%-20s %14.6f %14.6f %+14.3e\n", "perplexity", std::exp(ours.mean_nll), r["perplexity"].get<double>(),
              r["perplexity_difference"].get<double>());
  std::printf("\ntop-1 agreement      %lld / %lld positions (%.2f%%)\n", (long long)r["top1_agree"].get<int64_t>(),
              (long long)T, 100.0 * r["top1_agreement"].get<double>());
  std::printf("max |logit diff|     %.3e (max |ref| %.3e, relative %.3e)\n", r["max_abs_logit_diff"].get<double>(),
              r["max_abs_ref_logit"].get<double>(), r["relative_max_diff"].get<double>());
  return 0;
}

CommandRegistration eval_command{
    {"eval", "Teacher-forced perplexity of a text; with --ref-logits, agreement with reference logits",
     [](CLI::App& sub) {
       auto a = std::make_shared<EvalArgs>();
       a->model.add_to(sub);
       sub.add_option("--text", a->text_file, "Text file (UTF-8), tokenized as it is, nothing added")->required();
       sub.add_option("--ref-logits", a->ref_file,
                      "Reference float32 little-endian logits [T, vocab] of the same tokens "
                      "(tools/eval_reference.py)");
       sub.add_option("--tokenizer", a->tokenizer_file,
                      "tokenizer.json to use (default: the model's: its directory's tokenizer.json, else a GGUF's "
                      "own vocabulary)");
       sub.add_option("--max-tokens", a->max_tokens, "Evaluate only the first N tokens of the text (0: all)")
           ->capture_default_str();
       sub.add_flag("--json", a->json, "Print JSON instead of a table");
       return [a] { return run_eval(*a); };
     },
     52}};

}  // namespace
}  // namespace lily::cli
