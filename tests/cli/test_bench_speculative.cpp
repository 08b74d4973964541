// test_bench_speculative.cpp: `lily bench --speculate K --chat` (cli/bench_speculative.h) on
// lily-tiny (its trained MTP head, the fast CPU backend): the chat prompt is the one the
// held-out tests were written with (models/lily-tiny/heldout.json renders them through the same
// template), and a run whose speculative tokens differ from plain decoding's fails, naming the
// first difference, where an honest one passes.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/cpu_fast/cpu_fast.h"
#include "base/error.h"
#include "cli/bench_speculative.h"
#include "model/checkpoint/load.h"
#include "model/weights.h"

namespace lily::cli {
namespace {

const std::string kLilyTiny = std::string(LILY_SOURCE_DIR) + "/models/lily-tiny";

nlohmann::json heldout_test(size_t i) {
  std::ifstream in(kLilyTiny + "/heldout.json");
  return nlohmann::json::parse(in)["tests"][i];
}

// A backend whose verify steps (forward_hidden of several rows with every row's logits) pick,
// from the `wrong_from`-th on, another token than the model's at the first row: speculative
// decoding then departs from plain decoding, which never verifies.
class WrongVerify : public Backend {
 public:
  WrongVerify(Backend& inner, int wrong_from) : inner_(inner), wrong_from_(wrong_from) {}
  std::string name() const override { return inner_.name(); }
  const ModelConfig& config() const override { return inner_.config(); }
  std::string mtp_unavailable() const override { return inner_.mtp_unavailable(); }
  std::unique_ptr<SequenceState> new_sequence(int64_t capacity) override { return inner_.new_sequence(capacity); }
  void forward(SequenceState& state, std::span<const int32_t> tokens, LogitsWanted wanted,
               std::vector<float>& logits) override {
    inner_.forward(state, tokens, wanted, logits);
  }
  void forward_mtp(SequenceState& state, std::span<const float> hidden, std::span<const int32_t> tokens,
                   LogitsWanted wanted, std::vector<float>& logits, std::vector<float>& mtp_hidden) override {
    inner_.forward_mtp(state, hidden, tokens, wanted, logits, mtp_hidden);
  }
  void forward_hidden(SequenceState& state, std::span<const int32_t> tokens, LogitsWanted wanted,
                      std::vector<float>& logits, LogitsWanted hidden_rows, std::vector<float>& hidden) override {
    inner_.forward_hidden(state, tokens, wanted, logits, hidden_rows, hidden);
    if (wanted != LogitsWanted::all || tokens.size() < 2 || ++verifies_ < wrong_from_) return;
    const auto top = std::max_element(logits.begin(), logits.begin() + config().vocab_size);
    logits[size_t(top - logits.begin() + 1) % size_t(config().vocab_size)] = *top + 1.0f;  // the next id wins
  }

 private:
  Backend& inner_;
  int wrong_from_, verifies_ = 0;
};

struct LilyTiny {
  std::shared_ptr<ModelWeights> weights = load_model(kLilyTiny);
  std::unique_ptr<Backend> backend = make_cpu_fast_backend(weights);
  Tokenizer tokenizer = Tokenizer::load_from_model_dir(kLilyTiny);
};

SpeculativeBench options(int drafts) {
  SpeculativeBench o;
  o.drafts = drafts;
  o.tokens = 24;
  o.repeats = 1;
  o.title = "lily-tiny (test)";
  return o;
}

TEST(BenchSpeculative, TheChatPromptIsTheTemplatesWithItsStopTokens) {
  LilyTiny m;
  const nlohmann::json t = heldout_test(0);  // thinking on, one user message, as the bench renders
  ASSERT_EQ(t["messages"].size(), 1u);
  const std::string text = t["messages"][0]["content"].get<std::string>();
  const ChatContext c = chat_context(m.tokenizer, m.weights->generation.eos_token_ids, text);
  EXPECT_EQ(c.text, text);
  EXPECT_EQ(c.prompt, m.tokenizer.encode(t["prompt"].get<std::string>())) << t["prompt"];
  const int32_t im_end = m.tokenizer.token_id("<|im_end|>").value();
  EXPECT_NE(std::find(c.stop_tokens.begin(), c.stop_tokens.end(), im_end), c.stop_tokens.end());
  for (int id : m.weights->generation.eos_token_ids)
    EXPECT_EQ(std::count(c.stop_tokens.begin(), c.stop_tokens.end(), id), 1) << id;
  EXPECT_EQ(chat_prompt_text("", ""), kDefaultBenchPrompt);
  EXPECT_EQ(chat_prompt_text("Hi", ""), "Hi");
  EXPECT_THROW(chat_context(m.tokenizer, {}, ""), Error);
}

TEST(BenchSpeculative, PassesWhenTheTokensAgree) {
  LilyTiny m;
  const ChatContext c = chat_context(m.tokenizer, m.weights->generation.eos_token_ids, kDefaultBenchPrompt);
  for (int drafts : {1, 3}) EXPECT_NO_THROW(run_speculative_bench(*m.backend, c, options(drafts), true)) << drafts;
}

TEST(BenchSpeculative, FailsNamingTheFirstDifferentToken) {
  LilyTiny m;
  const ChatContext c = chat_context(m.tokenizer, m.weights->generation.eos_token_ids, kDefaultBenchPrompt);
  WrongVerify wrong(*m.backend, 3);
  try {
    run_speculative_bench(wrong, c, options(2), false);
    FAIL() << "speculative tokens unlike plain decoding's passed";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("did not give plain decoding's tokens"), std::string::npos) << what;
    EXPECT_NE(what.find("token "), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace lily::cli
