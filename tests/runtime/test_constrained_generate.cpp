// generate() under a grammar (GenerateRequest::grammar), on the random-weight test model
// (tests/server/fixtures/tiny-chat) with its real tokenizer as the grammar's vocabulary. The model
// is poisoned: a wrapper raises the logits of tokens the grammar forbids (a control token, an id
// of the padded tail, letters where the schema wants digits) far above the rest, so an unmasked
// row, or candidates selected without the mask, would always pick them. Every decode path runs:
// the whole row masked on the host, the backend's candidates selected among the allowed ids
// (Backend::forward_candidates with AllowedTokens), and a chain whose steps select and draw among
// them (Backend::chain_tokens with ChainChoice::allowed), both done on the host by the wrapper as
// the GPU does them. Whatever the sampler setting, the reply must be a document of the grammar
// (checked by tests/grammar's own parser and validator), the paths must give the same tokens,
// and the grammar's end must end the generation. LILY_TEST_BACKEND=cuda compares the GPU's own
// masked selection with its whole row.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "../grammar/json_reference.h"
#include "candidate_backends.h"
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

using test::WrappedBackend;
using Mode = WrappedBackend::Mode;
constexpr Mode kEveryPath[] = {Mode::whole_row, Mode::candidates, Mode::chained};

const char* to_string(Mode mode) {
  return mode == Mode::whole_row    ? "whole row"
         : mode == Mode::candidates ? "masked candidates"
         : mode == Mode::chained    ? "masked chain"
                                    : "mask ignored";
}

// The wrapped backend's logits, with `poison` raised by `delta` (+60: a logit the random model
// never reaches).
WrappedBackend poisoned(Backend& inner, Mode mode, std::vector<int32_t> poison, float delta = 60.0f) {
  return WrappedBackend(inner, mode, [poison = std::move(poison), delta](std::span<float> row, int) {
    for (int32_t id : poison) row[size_t(id)] += delta;
  });
}

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

// The candidates generate() asks for at this setting (0: the whole row).
int candidates_needed(const SamplingParams& sampling) {
  return Sampler(sampling, model().tokenizer.vocab_size()).candidates_needed();
}

// Whether generate() chains the steps at this setting on a backend that offers chains (the
// penalties go with the chain; the whole row does not).
bool chains(const SamplingParams& sampling) {
  return Sampler(sampling, model().tokenizer.vocab_size()).candidates_after_penalties() > 0;
}

// Forbidden everywhere: a control token and an id of the padded tail (beyond the tokenizer);
// forbidden almost everywhere: "X" and "{" (allowed once, at the start).
std::vector<int32_t> poison_ids() {
  Model& m = model();
  std::vector<int32_t> poison{m.id("<|im_start|>"), m.engine->config().vocab_size - 1};
  for (const char* text : {"X", "{"})
    for (int32_t id : m.tokenizer.encode(text)) poison.push_back(id);
  return poison;
}

TEST(ConstrainedGenerate, PoisonedTokensAreNeverProducedAndTheReplyValidates) {
  Model& m = model();
  const std::vector<int32_t> poison = poison_ids();
  auto compiled = std::make_shared<const grammar::CompiledGrammar>(grammar::json_schema_grammar(kSchema), m.vocab);
  for (Mode mode : kEveryPath) {
    for (const SamplingParams& sampling : every_setting()) {
      SCOPED_TRACE(testing::Message() << to_string(mode) << ", temperature " << sampling.temperature << " top_k "
                                      << sampling.top_k << " seed " << *sampling.seed);
      WrappedBackend backend = poisoned(m.engine->backend(), mode, poison);
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
      // Candidates whenever the sampler's draw allows them (greedy, top-k), every decode step
      // after the first, each with the grammar's mask; the whole row otherwise.
      const bool candidates = mode == Mode::candidates && candidates_needed(sampling) > 0;
      EXPECT_EQ(backend.calls, candidates ? int(r.result.tokens.size()) - 1 : 0);
      EXPECT_EQ(backend.masked_calls, backend.calls);
      // A chain under the mask wherever the draw needs only the best few once penalised.
      const bool chained = mode == Mode::chained && chains(sampling);
      EXPECT_EQ(backend.chains, chained ? 1 : 0);
      EXPECT_EQ(backend.masked_chains, backend.chains);
      EXPECT_GT(r.result.grammar_seconds, 0.0);
    }
  }
  // The poison works: unconstrained, the poisoned tokens are what the model writes.
  for (Mode mode : kEveryPath) {
    WrappedBackend backend = poisoned(m.engine->backend(), mode, poison);
    const Outcome free_run = run(backend, nullptr, every_setting()[0], 8);
    for (int32_t id : free_run.result.tokens) EXPECT_NE(std::find(poison.begin(), poison.end(), id), poison.end());
  }
}

// The draw from the backend's masked candidates is the draw from the masked row: the same tokens
// at every setting that uses candidates (greedy, top-k with top-p or min-p; same seed), for a
// schema and for a grammar that allows fewer tokens than top_k at most steps (the candidates are
// then all the allowed tokens).
TEST(ConstrainedGenerate, MaskedCandidatesGiveTheWholeRowTokens) {
  Model& m = model();
  grammar::GrammarOptions no_ws;
  no_ws.max_indent = -1;
  const std::shared_ptr<const grammar::CompiledGrammar> grammars[] = {
      std::make_shared<const grammar::CompiledGrammar>(grammar::json_schema_grammar(kSchema), m.vocab),
      std::make_shared<const grammar::CompiledGrammar>(
          grammar::json_schema_grammar(json::parse(R"({"enum": ["yes", "no", "maybe"]})"), no_ws), m.vocab)};
  int compared = 0, chained = 0;
  for (const auto& compiled : grammars) {
    for (SamplingParams sampling : every_setting()) {
      if (!chains(sampling)) continue;
      for (uint64_t seed : {*sampling.seed, uint64_t(77), uint64_t(78)}) {
        sampling.seed = seed;
        SCOPED_TRACE(testing::Message() << "temperature " << sampling.temperature << " top_k " << sampling.top_k
                                        << " presence " << sampling.presence_penalty << " seed " << seed);
        WrappedBackend whole_row = poisoned(m.engine->backend(), Mode::whole_row, poison_ids());
        grammar::GrammarMatcher a(compiled);
        const Outcome want = run(whole_row, &a, sampling, 400);
        if (candidates_needed(sampling) > 0) {  // no penalties: the stepwise candidates too
          WrappedBackend candidates = poisoned(m.engine->backend(), Mode::candidates, poison_ids());
          grammar::GrammarMatcher b(compiled);
          const Outcome got = run(candidates, &b, sampling, 400);
          EXPECT_EQ(got.result.tokens, want.result.tokens)
              << "whole row: " << want.text << "\ncandidates: " << got.text;
          EXPECT_EQ(got.result.finish, want.result.finish);
          EXPECT_EQ(candidates.calls, int(got.result.tokens.size()) - 1);
          ++compared;
        }
        WrappedBackend chain = poisoned(m.engine->backend(), Mode::chained, poison_ids());
        grammar::GrammarMatcher c(compiled);
        const Outcome got = run(chain, &c, sampling, 400);
        EXPECT_EQ(got.result.tokens, want.result.tokens) << "whole row: " << want.text << "\nchain: " << got.text;
        EXPECT_EQ(got.result.finish, want.result.finish);
        EXPECT_EQ(chain.masked_chains, 1);
        // Ended by the grammar or a stop token, the chain's step ahead fed the last token too.
        EXPECT_EQ(got.fed, want.fed + (got.result.finish == FinishReason::stop ? 1 : 0));
        ++chained;
      }
    }
  }
  EXPECT_EQ(compared, 2 * 3 * 3);
  EXPECT_EQ(chained, 2 * 4 * 3) << "the penalised setting chains too";
}

// Sampled draws differ between seeds at these settings: the comparison above is not vacuous.
TEST(ConstrainedGenerate, SeedsChangeTheMaskedCandidatesDraw) {
  Model& m = model();
  auto compiled = std::make_shared<const grammar::CompiledGrammar>(grammar::json_schema_grammar(kSchema), m.vocab);
  SamplingParams hot;
  hot.temperature = 1.5f, hot.top_k = 20;
  std::vector<std::vector<int32_t>> replies;
  for (uint64_t seed : {1, 2, 3}) {
    hot.seed = seed;
    WrappedBackend backend = poisoned(m.engine->backend(), Mode::candidates, poison_ids());
    grammar::GrammarMatcher matcher(compiled);
    replies.push_back(run(backend, &matcher, hot, 400).result.tokens);
  }
  EXPECT_TRUE(replies[0] != replies[1] || replies[0] != replies[2]);
}

// A backend whose candidates ignore the mask hands over a poisoned token: generate() refuses it
// (an error), never writes it. (Also: the masked-candidates tests above would see the poison.)
TEST(ConstrainedGenerate, CandidatesThatIgnoreTheMaskAreAnErrorNotAWrongReply) {
  Model& m = model();
  auto compiled = std::make_shared<const grammar::CompiledGrammar>(grammar::json_schema_grammar(kSchema), m.vocab);
  for (const SamplingParams& sampling : every_setting()) {
    if (candidates_needed(sampling) == 0) continue;
    WrappedBackend broken = poisoned(m.engine->backend(), Mode::ignores_mask, poison_ids());
    grammar::GrammarMatcher matcher(compiled);
    EXPECT_THROW(run(broken, &matcher, sampling, 400), Error) << "temperature " << sampling.temperature;
    EXPECT_EQ(broken.calls, 1) << "the first decode step's candidates";
  }
}

// After the first token, every logit is NaN (or -inf): no token the grammar allows has a usable
// logit. On the candidates path that is an Error, never a token the grammar forbids: for NaN the
// candidates come back empty, for -inf they are allowed ids at -inf, which generate() leaves out
// as the whole row's sampler does.
TEST(ConstrainedGenerate, NoUsableAllowedLogitIsAnError) {
  Model& m = model();
  auto compiled = std::make_shared<const grammar::CompiledGrammar>(grammar::json_schema_grammar(kSchema), m.vocab);
  for (float bad : {NAN, -INFINITY}) {
    for (const SamplingParams& sampling : every_setting()) {
      for (Mode mode : {Mode::candidates, Mode::chained}) {
        if (mode == Mode::candidates ? candidates_needed(sampling) == 0 : !chains(sampling)) continue;
        SCOPED_TRACE(testing::Message() << bad << ", temperature " << sampling.temperature << ", " << to_string(mode));
        WrappedBackend backend(m.engine->backend(), mode, [bad](std::span<float> row, int rows_before) {
          if (rows_before > 0) std::fill(row.begin(), row.end(), bad);
        });
        grammar::GrammarMatcher matcher(compiled);
        std::vector<int32_t> written;
        GenerateRequest g;
        g.prompt = m.tokenizer.encode("<|im_start|>user\nGive me JSON<|im_end|>\n<|im_start|>assistant\n");
        g.max_new_tokens = 20;
        g.sampling = sampling;
        g.vocab_limit = m.tokenizer.vocab_size();
        g.grammar = &matcher;
        auto state = backend.new_sequence(256);
        EXPECT_THROW(generate(backend, *state, g,
                              [&](const GeneratedToken& t) {
                                written.push_back(t.id);
                                return true;
                              }),
                     Error);
        EXPECT_EQ(written.size(), 1u) << "the prefill's token only";
        EXPECT_EQ(mode == Mode::candidates ? backend.calls : backend.chains, 1);
      }
    }
  }
}

// No whitespace after the value: once "yes" or "no" is closed nothing can follow (must_stop),
// and the generation ends there as a stop, with no stop token sampled and the last token not fed.
TEST(ConstrainedGenerate, TheGrammarsEndEndsTheGenerationAsAStop) {
  Model& m = model();
  grammar::GrammarOptions no_ws;
  no_ws.max_indent = -1;
  auto compiled = std::make_shared<const grammar::CompiledGrammar>(
      grammar::json_schema_grammar(json::parse(R"({"enum": ["yes", "no"]})"), no_ws), m.vocab);
  for (Mode mode : kEveryPath) {
    for (const SamplingParams& sampling : every_setting()) {
      SCOPED_TRACE(testing::Message() << to_string(mode) << ", temperature " << sampling.temperature);
      WrappedBackend backend(m.engine->backend(), mode);
      grammar::GrammarMatcher matcher(compiled);
      const Outcome r = run(backend, &matcher, sampling, 50);
      EXPECT_EQ(r.result.finish, FinishReason::stop);
      EXPECT_TRUE(r.text == "\"yes\"" || r.text == "\"no\"") << r.text;
      EXPECT_FALSE(m.vocab->is_stop(r.result.tokens.back()));
      EXPECT_TRUE(matcher.must_stop());
      // Stepwise the grammar's last token is not fed back; a chain's step ahead fed it.
      const bool chained = mode == Mode::chained && chains(sampling) && r.result.tokens.size() > 1;
      EXPECT_EQ(r.fed, int64_t(r.result.tokens.size()) - (chained ? 0 : 1));
    }
  }
}

// A poisoned <|im_end|> is taken the first moment the grammar accepts (the closing "}"), never before.
TEST(ConstrainedGenerate, AStopTokenComesExactlyWhenTheGrammarAccepts) {
  Model& m = model();
  auto compiled = std::make_shared<const grammar::CompiledGrammar>(grammar::json_schema_grammar(kSchema), m.vocab);
  for (Mode mode : kEveryPath) {
    for (const SamplingParams& sampling : every_setting()) {
      SCOPED_TRACE(testing::Message() << to_string(mode) << ", temperature " << sampling.temperature);
      WrappedBackend backend = poisoned(m.engine->backend(), mode, {m.id("<|im_end|>")});
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
}

// Thinking: the reasoning is free. The model is made one that never writes a token other than
// text (the grammar holds stop and control tokens back until the answer); until it ends its
// reasoning, the constrained run writes exactly its tokens, at every setting, on both paths.
TEST(ConstrainedGenerate, TheThinkingBlockIsTheModelsOwn) {
  Model& m = model();
  std::vector<int32_t> not_text;
  for (int32_t id = 0; id < m.vocab->size(); ++id)
    if (!m.vocab->is_text(id)) not_text.push_back(id);
  grammar::GrammarOptions thinking;
  thinking.thinking = true;
  auto compiled = std::make_shared<const grammar::CompiledGrammar>(grammar::json_schema_grammar(kSchema, thinking),
                                                                   m.vocab);
  int ended = 0;
  for (Mode mode : kEveryPath) {
    for (const SamplingParams& sampling : every_setting()) {
      SCOPED_TRACE(testing::Message() << to_string(mode) << ", temperature " << sampling.temperature << " seed "
                                      << *sampling.seed);
      WrappedBackend text_only = poisoned(m.engine->backend(), mode, not_text, -1000.0f);
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
  }
  std::printf("  %d of %zu runs ended their reasoning within 40 tokens\n", ended,
              std::size(kEveryPath) * every_setting().size());
}

// The backend's own decode under a grammar (under LILY_TEST_BACKEND=cuda the GPU's chain: the
// mask filled while the step runs, uploaded, read by the masked top_candidates, the token drawn
// there, penalties counted there) against the same backend's whole row: the same tokens, greedy,
// sampled and penalised, for a schema and a grammar allowing fewer tokens than top_k. On the CPU
// backend (no candidates or chains of its own) both runs take the whole row: the comparison is
// the GPU's.
TEST(ConstrainedGenerate, BackendMaskedCandidatesMatchTheWholeRow) {
  const char* backend_name = std::getenv("LILY_TEST_BACKEND");
  auto engine = Engine::load(EngineOptions{kModelDir, backend_name ? backend_name : "cpu", 0});
  Model& m = model();
  grammar::GrammarOptions no_ws;
  no_ws.max_indent = -1;
  const std::shared_ptr<const grammar::CompiledGrammar> grammars[] = {
      std::make_shared<const grammar::CompiledGrammar>(grammar::json_schema_grammar(kSchema), m.vocab),
      std::make_shared<const grammar::CompiledGrammar>(
          grammar::json_schema_grammar(json::parse(R"({"enum": ["yes", "no", "maybe"]})"), no_ws), m.vocab)};
  SamplingParams greedy;
  greedy.temperature = 0;
  SamplingParams qwen;
  qwen.temperature = 0.6f, qwen.top_k = 20, qwen.top_p = 0.95f;
  SamplingParams wide;
  wide.temperature = 1.5f, wide.top_k = 256, wide.min_p = 0.01f;
  SamplingParams penalised = qwen;
  penalised.presence_penalty = 1.5f;
  for (const auto& compiled : grammars) {
    for (SamplingParams sampling : {greedy, qwen, wide, penalised}) {
      for (uint64_t seed : {1, 2}) {
        sampling.seed = seed;
        SCOPED_TRACE(testing::Message() << "temperature " << sampling.temperature << " top_k " << sampling.top_k
                                        << " seed " << seed);
        WrappedBackend whole_row(engine->backend(), Mode::whole_row);
        grammar::GrammarMatcher a(compiled), b(compiled);
        const Outcome want = run(whole_row, &a, sampling, 400);
        const Outcome got = run(engine->backend(), &b, sampling, 400);
        EXPECT_EQ(got.result.tokens, want.result.tokens) << "whole row: " << want.text << "\nbackend: " << got.text;
        EXPECT_EQ(got.result.finish, want.result.finish);
      }
    }
  }
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
  WrappedBackend candidates(m.engine->backend(), Mode::candidates);
  EXPECT_THROW(run(candidates, &matcher, greedy, 5), Error);
  WrappedBackend chained(m.engine->backend(), Mode::chained);
  EXPECT_THROW(run(chained, &matcher, greedy, 5), Error);
}

}  // namespace
}  // namespace lily
