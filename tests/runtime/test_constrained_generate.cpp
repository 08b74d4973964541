// generate() under a grammar (GenerateRequest::grammar), on the random-weight test model
// (tests/server/fixtures/tiny-chat) with its real tokenizer as the grammar's vocabulary. The model
// is poisoned: a wrapper raises the logits of tokens the grammar forbids (a control token, an id
// of the padded tail, letters where the schema wants digits) far above the rest, so an unmasked
// row would always pick them. Whatever the sampler setting, the reply must be a document of the
// grammar (checked by tests/grammar's own parser and validator), the grammar's end must end the
// generation, and no decode step may go through the backend's candidates.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "../grammar/json_reference.h"
#include "grammar/grammars.h"
#include "grammar/matcher.h"
#include "runtime/engine.h"
#include "runtime/generate.h"

namespace lily {
namespace {

using test::RefParser;
using test::RefValidator;
using json = nlohmann::ordered_json;

const std::string kModelDir = std::string(LILY_SOURCE_DIR) + "/tests/server/fixtures/tiny-chat";

// The wrapped backend's logits, with `poison` raised by `delta` (+60: a logit the random model
// never reaches); counts forward_candidates calls, which a grammar must never make.
class PoisonBackend final : public Backend {
 public:
  PoisonBackend(Backend& inner, std::vector<int32_t> poison, float delta = 60.0f)
      : inner_(inner), poison_(std::move(poison)), delta_(delta) {}
  std::string name() const override { return "poisoned(" + inner_.name() + ")"; }
  const ModelConfig& config() const override { return inner_.config(); }
  std::unique_ptr<SequenceState> new_sequence(int64_t capacity) override { return inner_.new_sequence(capacity); }
  void forward(SequenceState& state, std::span<const int32_t> tokens, LogitsWanted wanted,
               std::vector<float>& logits) override {
    inner_.forward(state, tokens, wanted, logits);
    if (wanted == LogitsWanted::none) return;
    for (int32_t id : poison_) logits[logits.size() - size_t(config().vocab_size) + size_t(id)] += delta_;
  }
  bool forward_candidates(SequenceState&, int32_t, int, int32_t, std::vector<TokenLogit>&) override {
    ++candidate_calls;
    return false;
  }
  int candidate_calls = 0;

 private:
  Backend& inner_;
  std::vector<int32_t> poison_;
  float delta_;
};

struct Model {
  std::unique_ptr<Engine> engine = Engine::load(EngineOptions{kModelDir, "cpu", 0});
  Tokenizer tokenizer = Tokenizer::load_from_model_dir(kModelDir);
  std::shared_ptr<const grammar::Vocabulary> vocab = std::make_shared<const grammar::Vocabulary>(
      grammar::Vocabulary::from_tokenizer(tokenizer, engine->config().vocab_size));
  int32_t id(const char* token) const { return *tokenizer.token_id(token); }
};

Model& model() {
  static Model m;
  return m;
}

struct Outcome {
  GenerateResult result;
  std::string text;  // the reply's text, its stop token left out
  int64_t fed = 0;   // tokens the state was fed
};

Outcome run(Backend& backend, grammar::GrammarMatcher* matcher, SamplingParams sampling, int64_t max_tokens) {
  Model& m = model();
  GenerateRequest g;
  g.prompt = m.tokenizer.encode("<|im_start|>user\nGive me JSON<|im_end|>\n<|im_start|>assistant\n");
  g.max_new_tokens = max_tokens;
  g.sampling = sampling;
  g.stop_tokens = {m.id("<|im_end|>"), m.id("<|endoftext|>")};
  g.vocab_limit = m.tokenizer.vocab_size();
  g.grammar = matcher;
  auto state = backend.new_sequence(1024);
  Outcome r;
  r.result = generate(backend, *state, g, [](const GeneratedToken&) { return true; });
  r.fed = state->length() - int64_t(g.prompt.size());
  std::vector<int32_t> text_ids = r.result.tokens;
  if (!text_ids.empty() && m.vocab->is_stop(text_ids.back())) text_ids.pop_back();
  r.text = m.tokenizer.decode(text_ids);
  return r;
}

std::vector<SamplingParams> every_setting() {
  std::vector<SamplingParams> out;
  auto add = [&](float t, int k, float p, float min_p, float penalty, uint64_t seed) {
    SamplingParams s;
    s.temperature = t, s.top_k = k, s.top_p = p, s.min_p = min_p, s.presence_penalty = penalty, s.seed = seed;
    out.push_back(s);
  };
  add(0.0f, 0, 1.0f, 0.0f, 0.0f, 1);    // greedy
  add(1.0f, 0, 1.0f, 0.0f, 0.0f, 2);    // the whole distribution
  add(0.6f, 20, 0.95f, 0.0f, 0.0f, 3);  // Qwen's recommendation
  add(1.2f, 5, 1.0f, 0.1f, 0.0f, 4);    // top-k with min-p
  add(1.0f, 20, 0.9f, 0.0f, 1.5f, 5);   // penalties
  return out;
}

// Bounded everywhere (enums, lengths, item counts) so that a random model finishes it.
const json kSchema = json::parse(R"({"type": "object", "properties": {
    "unit": {"enum": ["c", "f", "k"]},
    "code": {"type": "string", "minLength": 2, "maxLength": 5},
    "ok": {"type": "boolean"},
    "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 1, "maxItems": 3},
    "note": {"anyOf": [{"type": "null"}, {"const": 7}]}},
  "required": ["unit", "code", "ok", "tags"]})");

TEST(ConstrainedGenerate, PoisonedTokensAreNeverProducedAndTheReplyValidates) {
  Model& m = model();
  // Forbidden everywhere: a control token and an id of the padded tail (beyond the tokenizer);
  // forbidden almost everywhere: "X" and "{" (allowed once, at the start).
  std::vector<int32_t> poison{m.id("<|im_start|>"), m.engine->config().vocab_size - 1};
  for (const char* text : {"X", "{"})
    for (int32_t id : m.tokenizer.encode(text)) poison.push_back(id);
  PoisonBackend backend(m.engine->backend(), poison);
  auto compiled = std::make_shared<const grammar::CompiledGrammar>(grammar::json_schema_grammar(kSchema), m.vocab);
  for (const SamplingParams& sampling : every_setting()) {
    SCOPED_TRACE(testing::Message() << "temperature " << sampling.temperature << " top_k " << sampling.top_k << " seed "
                                    << *sampling.seed);
    grammar::GrammarMatcher matcher(compiled);
    const Outcome r = run(backend, &matcher, sampling, 400);
    EXPECT_EQ(r.result.finish, FinishReason::stop) << r.text;
    const auto doc = RefParser(r.text, 32).document();
    ASSERT_TRUE(doc) << "not JSON: " << r.text;
    EXPECT_TRUE(RefValidator(kSchema).valid(kSchema, *doc)) << r.text;
    for (int32_t id : r.result.tokens) {
      EXPECT_NE(id, poison[0]);
      EXPECT_NE(id, poison[1]);
    }
    EXPECT_EQ(backend.candidate_calls, 0) << "a grammar needs the whole row";
    EXPECT_GT(r.result.grammar_seconds, 0.0);
  }
  // The poison works: unconstrained, the poisoned tokens are what the model writes.
  const Outcome free_run = run(backend, nullptr, every_setting()[0], 8);
  EXPECT_NE(std::find(poison.begin(), poison.end(), free_run.result.tokens[0]), poison.end());
}

// No whitespace after the value: once "yes" or "no" is closed nothing can follow (must_stop),
// and the generation ends there as a stop, with no stop token sampled and the last token not fed.
TEST(ConstrainedGenerate, TheGrammarsEndEndsTheGenerationAsAStop) {
  Model& m = model();
  grammar::GrammarOptions no_ws;
  no_ws.max_whitespace = 0;
  auto compiled = std::make_shared<const grammar::CompiledGrammar>(
      grammar::json_schema_grammar(json::parse(R"({"enum": ["yes", "no"]})"), no_ws), m.vocab);
  for (const SamplingParams& sampling : every_setting()) {
    grammar::GrammarMatcher matcher(compiled);
    const Outcome r = run(m.engine->backend(), &matcher, sampling, 50);
    EXPECT_EQ(r.result.finish, FinishReason::stop);
    EXPECT_TRUE(r.text == "\"yes\"" || r.text == "\"no\"") << r.text;
    EXPECT_FALSE(m.vocab->is_stop(r.result.tokens.back()));
    EXPECT_TRUE(matcher.must_stop());
    EXPECT_EQ(r.fed, int64_t(r.result.tokens.size()) - 1) << "the grammar's last token is not fed back";
  }
}

// A poisoned <|im_end|> is taken the first moment the grammar accepts (the closing "}"), never before.
TEST(ConstrainedGenerate, AStopTokenComesExactlyWhenTheGrammarAccepts) {
  Model& m = model();
  PoisonBackend backend(m.engine->backend(), {m.id("<|im_end|>")});
  auto compiled = std::make_shared<const grammar::CompiledGrammar>(grammar::json_schema_grammar(kSchema), m.vocab);
  for (const SamplingParams& sampling : every_setting()) {
    grammar::GrammarMatcher matcher(compiled);
    const Outcome r = run(backend, &matcher, sampling, 400);
    ASSERT_EQ(r.result.finish, FinishReason::stop) << r.text;
    EXPECT_EQ(r.result.tokens.back(), m.id("<|im_end|>"));
    EXPECT_TRUE(matcher.is_finished());
    const auto doc = RefParser(r.text, 32).document();
    ASSERT_TRUE(doc) << r.text;
    EXPECT_TRUE(RefValidator(kSchema).valid(kSchema, *doc)) << r.text;
    EXPECT_EQ(r.text.back(), '}') << "the stop token comes at the first accepting point";
  }
}

// Thinking: the reasoning is free. The model is made one that never writes a token other than
// text (the grammar holds stop and control tokens back until the answer); until it ends its
// reasoning, the constrained run writes exactly its tokens, at every setting.
TEST(ConstrainedGenerate, TheThinkingBlockIsTheModelsOwn) {
  Model& m = model();
  std::vector<int32_t> not_text;
  for (int32_t id = 0; id < m.vocab->size(); ++id)
    if (!m.vocab->is_text(id)) not_text.push_back(id);
  PoisonBackend text_only(m.engine->backend(), not_text, -1000.0f);
  grammar::GrammarOptions thinking;
  thinking.thinking = true;
  auto compiled = std::make_shared<const grammar::CompiledGrammar>(grammar::json_schema_grammar(kSchema, thinking),
                                                                   m.vocab);
  int ended = 0;
  for (const SamplingParams& sampling : every_setting()) {
    SCOPED_TRACE(testing::Message() << "temperature " << sampling.temperature << " seed " << *sampling.seed);
    grammar::GrammarMatcher matcher(compiled);
    const Outcome constrained = run(text_only, &matcher, sampling, 40);
    const Outcome free_run = run(text_only, nullptr, sampling, 40);
    // The free run's tokens up to the one that completes "</think>" (all of them if none does).
    const std::vector<int32_t>& tokens = free_run.result.tokens;
    size_t n = 0;
    while (n < tokens.size() && m.tokenizer.decode(std::span(tokens.data(), n)).find("</think>") == std::string::npos)
      ++n;
    ASSERT_GE(constrained.result.tokens.size(), n);
    EXPECT_TRUE(std::equal(tokens.begin(), tokens.begin() + ptrdiff_t(n), constrained.result.tokens.begin()))
        << "free:        " << free_run.text << "\nconstrained: " << constrained.text;
    if (n < tokens.size()) ++ended;
  }
  std::printf("  %d of %zu runs ended their reasoning within 40 tokens\n", ended, every_setting().size());
}

TEST(ConstrainedGenerate, AGrammarThatHasEndedIsRefused) {
  Model& m = model();
  auto compiled = std::make_shared<const grammar::CompiledGrammar>(grammar::json_object_grammar(), m.vocab);
  grammar::GrammarMatcher matcher(compiled);
  ASSERT_TRUE(matcher.accept_bytes("{}"));
  ASSERT_TRUE(matcher.accept_token(m.id("<|im_end|>")));
  SamplingParams greedy;
  greedy.temperature = 0;
  EXPECT_THROW(run(m.engine->backend(), &matcher, greedy, 5), Error);
}

}  // namespace
}  // namespace lily
