// The default model models/lily-tiny answering its held-out tests (models/lily-tiny/heldout.json)
// greedily through lily's own stack: the ChatService as `lily run` / `lily serve` use it (chat
// template, tokenizer, CPU forward of the 4-bit checkpoint, reasoning / content / tool-call
// parsing). Held out from training: number pairs with (7a + 13b) % 10 == 0 and six cities.
//
// Issue 5's bar is >= 80% held-out arithmetic and >= 2 of 3 exact held-out tool calls, with
// thinking on. The committed lily-tiny measures 129/150 = 86% and 5/6 exact (all held-out
// questions, tests/server/run_heldout_eval.sh through lily serve and the openai client). Here,
// on a 40-question sample, arithmetic must reach 75% (86% minus a sampling margin: the sample's
// standard error is ~5.5 points), and at least 2 of 3 tool calls must be exact.
//
// LILY_E2E_FULL=1 runs all 150 arithmetic questions instead of 40 (about 4x longer).
// LILY_TEST_BACKEND=cuda runs on the GPU.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <regex>

#include "runtime/chat_service.h"

namespace lily {
namespace {

const std::string kModelDir = std::string(LILY_SOURCE_DIR) + "/models/lily-tiny";
const std::string kBackend = std::getenv("LILY_TEST_BACKEND") ? std::getenv("LILY_TEST_BACKEND") : "cpu";
constexpr double kArithmeticFloor = 0.75;  // on the 40-question sample (issue 5's bar on all 150: 0.80)
constexpr double kIssueArithmeticBar = 0.80;
constexpr size_t kArithmeticSample = 40;
constexpr int64_t kMaxTokens = 320;  // the longest held-out reasoning is about 110 tokens

class LilyTiny : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::ifstream in(kModelDir + "/heldout.json");
    ASSERT_TRUE(in) << "cannot read " << kModelDir << "/heldout.json";
    heldout_ = new json(json::parse(in));
    engine_ = Engine::load(EngineOptions{kModelDir, kBackend, 0}).release();
    service_ = new ChatService(*engine_, Tokenizer::load_from_model_dir(kModelDir),
                               ChatServiceOptions{4096, uint64_t(256) << 20});
  }
  static void TearDownTestSuite() {
    delete service_;
    delete engine_;
    delete heldout_;
  }

  // The held-out tests of one kind (and thinking setting), in file order.
  static std::vector<json> tests(const std::string& kind, bool thinking = true) {
    std::vector<json> out;
    if (!heldout_) return out;  // heldout.json did not load (SetUpTestSuite failed)
    for (const json& t : (*heldout_)["tests"])
      if (t["kind"] == kind && t["enable_thinking"].get<bool>() == thinking) out.push_back(t);
    return out;
  }

  static ChatRequest request(const json& test) {
    ChatRequest r;
    r.messages = test["messages"];
    r.tools = test["tools"];
    r.template_options.enable_thinking = test["enable_thinking"].get<bool>();
    r.options.sampling.temperature = 0;  // greedy
    r.options.max_tokens = kMaxTokens;
    return r;
  }

  // Greedy answer; also checks that lily renders the prompt the model was trained on.
  static CompletionResult answer(const json& test) {
    ChatRequest r = request(test);
    EXPECT_EQ(render_chat_template(r.messages, r.tools, r.template_options), test["prompt"].get<std::string>());
    return service_->complete_chat(r, [](const ChatDelta&) { return true; });
  }

  static json* heldout_;
  static Engine* engine_;
  static ChatService* service_;
};

json* LilyTiny::heldout_ = nullptr;
Engine* LilyTiny::engine_ = nullptr;
ChatService* LilyTiny::service_ = nullptr;

// heldout.json's rule: the last integer of the content.
std::string last_integer(const std::string& text) {
  static const std::regex integer("-?[0-9]+");
  std::string last;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), integer); it != std::sregex_iterator(); ++it)
    last = it->str();
  return last;
}

bool has_think_tag(const std::string& s) {
  return s.find("<think>") != std::string::npos || s.find("</think>") != std::string::npos;
}

TEST_F(LilyTiny, HeldOutArithmeticWithThinking) {
  std::vector<json> all = tests("arith");
  ASSERT_GE(all.size(), kArithmeticSample);
  const bool full = std::getenv("LILY_E2E_FULL") != nullptr;
  const size_t n = full ? all.size() : kArithmeticSample;
  auto t0 = std::chrono::steady_clock::now();
  int64_t right = 0, tokens = 0;
  for (size_t i = 0; i < n; ++i) {
    const json& test = all[i * all.size() / n];  // spread over the file
    CompletionResult r = answer(test);
    tokens += r.usage.completion_tokens;
    const std::string want = test["expected_answer"], got = last_integer(r.content);
    right += got == want;
    EXPECT_EQ(r.finish_reason, "stop") << test["messages"][0]["content"];
    EXPECT_FALSE(r.reasoning.empty()) << test["messages"][0]["content"];
    if (got != want)
      std::printf("  wrong: %-28s expected %-6s content \"%s\"\n",
                  test["messages"][0]["content"].get<std::string>().c_str(), want.c_str(), r.content.c_str());
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double accuracy = double(right) / double(n);
  std::printf("lily-tiny held-out arithmetic, thinking on, greedy, %s: %lld/%zu = %.1f%% "
              "(regression floor %.0f%%; issue 5's bar %.0f%%: %s) [%lld tokens in %.1f s]\n",
              kBackend.c_str(), (long long)right, n, 100 * accuracy, 100 * kArithmeticFloor, 100 * kIssueArithmeticBar,
              accuracy >= kIssueArithmeticBar ? "met" : "not met", (long long)tokens, seconds);
  EXPECT_GE(accuracy, kArithmeticFloor);
}

TEST_F(LilyTiny, HeldOutToolCallsAreExact) {
  std::vector<json> all = tests("tool_call");
  ASSERT_FALSE(all.empty());
  int exact = 0;
  for (const json& test : all) {
    const std::string question = test["messages"][0]["content"];
    const json& expected = test["expected_tool_call"];
    CompletionResult r = answer(test);
    ASSERT_EQ(r.tool_calls.size(), 1u) << question << "\nreasoning: " << r.reasoning << "\ncontent: " << r.content;
    const ToolCall& call = r.tool_calls[0];
    EXPECT_EQ(call.name, expected["name"].get<std::string>()) << question;
    EXPECT_TRUE(call.id.starts_with("call_")) << call.id;
    json arguments = json::parse(call.arguments);  // the OpenAI wire form: a JSON object as a string
    ASSERT_TRUE(arguments.is_object()) << call.arguments;
    ASSERT_EQ(arguments.size(), 1u) << call.arguments;
    ASSERT_TRUE(arguments.contains("city") && arguments["city"].is_string()) << call.arguments;
    EXPECT_EQ(r.finish_reason, "tool_calls");
    EXPECT_FALSE(r.reasoning.empty()) << question;
    EXPECT_EQ(r.content.find("<tool_call>"), std::string::npos) << r.content;
    const bool match = arguments == expected["arguments"];
    exact += match;
    std::printf("  %-48s -> %s(%s)%s\n", question.c_str(), call.name.c_str(), call.arguments.c_str(),
                match ? "" : (" expected city " + expected["arguments"]["city"].get<std::string>()).c_str());
  }
  std::printf("lily-tiny held-out tool calls, thinking on, greedy, %s: %d/%zu exact (issue 5's bar: 2 of 3)\n",
              kBackend.c_str(), exact, all.size());
  EXPECT_GE(3 * exact, 2 * int(all.size()));
}

TEST_F(LilyTiny, ThinkingOnSplitsReasoningFromTheAnswer) {
  std::vector<json> arith = tests("arith");
  ASSERT_FALSE(arith.empty());
  const json& test = arith[0];  // Compute 947+377, which the current model gets right
  ASSERT_EQ(test["expected_answer"], "1324");
  CompletionResult r = answer(test);
  EXPECT_FALSE(r.reasoning.empty());
  EXPECT_FALSE(has_think_tag(r.reasoning)) << r.reasoning;
  EXPECT_FALSE(has_think_tag(r.content)) << r.content;
  EXPECT_NE(r.reasoning.find("947 + 377"), std::string::npos) << r.reasoning;
  EXPECT_EQ(last_integer(r.content), "1324") << r.content;
  EXPECT_EQ(r.content, "947 + 377 = 1324.");  // stripped: no leading newlines from after </think>
  EXPECT_EQ(r.finish_reason, "stop");
  std::printf("reasoning: %s\ncontent:   %s\n", r.reasoning.c_str(), r.content.c_str());
}

TEST_F(LilyTiny, ThinkingOffGivesNoReasoning) {
  std::vector<json> off = tests("arith", /*thinking=*/false);
  ASSERT_GE(off.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    CompletionResult r = answer(off[i]);
    EXPECT_TRUE(r.reasoning.empty()) << r.reasoning;
    EXPECT_FALSE(r.content.empty());
    EXPECT_FALSE(has_think_tag(r.content)) << r.content;
    EXPECT_EQ(r.finish_reason, "stop");
    std::printf("thinking off: %s -> \"%s\"\n", off[i]["messages"][0]["content"].get<std::string>().c_str(),
                r.content.c_str());
  }
}

}  // namespace
}  // namespace lily
