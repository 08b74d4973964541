// tool_choice forcing without a model: the opening each tool_choice forces, and when it goes in
// over the rounds of a reply (at once with thinking off; after </think>, or in place of a stop
// token that came before it, with thinking on).
#include <gtest/gtest.h>

#include "runtime/tool_call_forcing.h"

#include <algorithm>

#include "base/error.h"
#include "tokenizer/tokenizer.h"

namespace lily {
namespace {

constexpr int32_t kThinkEnd = 7;
constexpr int32_t kImEnd = 9;

json tools_named(std::initializer_list<const char*> names) {
  json tools = json::array();
  for (const char* name : names) tools.push_back(json{{"type", "function"}, {"function", {{"name", name}}}});
  return tools;
}

TEST(ForcedCallOpening, AutoAndNoneForceNothing) {
  EXPECT_EQ(forced_call_opening({ToolChoice::Mode::automatic, ""}, tools_named({"a", "b"})), "");
  EXPECT_EQ(forced_call_opening({ToolChoice::Mode::none, ""}, tools_named({"a"})), "");
}

TEST(ForcedCallOpening, ANamedFunctionIsWrittenOutWithItsLineEnd) {
  EXPECT_EQ(forced_call_opening({ToolChoice::Mode::function, "get_time"}, tools_named({"get_weather", "get_time"})),
            "<tool_call>\n<function=get_time>\n");
}

TEST(ForcedCallOpening, RequiredLeavesTheNameToTheModelUnlessThereIsOneTool) {
  EXPECT_EQ(forced_call_opening({ToolChoice::Mode::required, ""}, tools_named({"a", "b"})), "<tool_call>\n<function");
  EXPECT_EQ(forced_call_opening({ToolChoice::Mode::required, ""}, tools_named({"only"})),
            "<tool_call>\n<function=only>\n");
  // A tools entry may be the function itself; one without a string name leaves the name open.
  EXPECT_EQ(forced_call_opening({ToolChoice::Mode::required, ""}, json::array({json{{"name", "bare"}}})),
            "<tool_call>\n<function=bare>\n");
  EXPECT_EQ(forced_call_opening({ToolChoice::Mode::required, ""}, json::array({json{{"name", 3}}})),
            "<tool_call>\n<function");
}

// Issue 17 (4): the opening for "required" ended on "=", a token the tokenizer never produces
// before a name ("=get" is one token), and the model went on with "_currency". Every opening
// must encode to a prefix of the encoding of the call it opens, on a tokenizer trained with the
// Qwen3.6 pipeline (models/lily-tiny), for names of every shape.
TEST(ForcedCallOpening, regression_opening_ends_on_a_token_boundary_17) {
  const Tokenizer tokenizer = Tokenizer::load(std::string(LILY_SOURCE_DIR) + "/models/lily-tiny/tokenizer.json");
  const char* names[] = {"get_weather", "convert_currency", "_currency", "a", "f-1", "Run", "x2y", "名前", "9lives"};
  json tools = json::array();
  for (const char* name : names) tools.push_back(json{{"type", "function"}, {"function", {{"name", name}}}});
  for (const char* name : names) {
    const std::string call = "<tool_call>\n<function=" + std::string(name) +
                             ">\n<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>";
    const std::vector<int32_t> whole = tokenizer.encode(call);
    auto is_token_prefix = [&](const std::string& opening) {
      const std::vector<int32_t> head = tokenizer.encode(opening);
      return call.starts_with(opening) && head.size() <= whole.size() &&
             std::equal(head.begin(), head.end(), whole.begin());
    };
    const std::string required = forced_call_opening({ToolChoice::Mode::required, ""}, tools);
    EXPECT_TRUE(is_token_prefix(required)) << name << ": \"" << required << "\" is not a token prefix of the call";
    const std::string named = forced_call_opening({ToolChoice::Mode::function, name}, tools);
    EXPECT_TRUE(is_token_prefix(named)) << name << ": \"" << named << "\" is not a token prefix of the call";
    const std::string single = forced_call_opening({ToolChoice::Mode::required, ""}, tools_named({name}));
    EXPECT_EQ(single, named);
  }
}

TEST(ToolCallForcing, ThinkingOffForcesAtTheStartAndNeverWaits) {
  ToolCallForcing f("<tool_call>\n<function=", false, kThinkEnd);
  EXPECT_EQ(f.at_start(), "<tool_call>\n<function=");
  EXPECT_EQ(f.waits_for(), std::nullopt);
  EXPECT_EQ(f.at_start(), "");  // once
}

TEST(ToolCallForcing, ThinkingOnWaitsForThinkEndThenFollowsIt) {
  ToolCallForcing f("<tool_call>\n<function=f>\n", true, kThinkEnd);
  EXPECT_EQ(f.at_start(), "");
  EXPECT_EQ(f.waits_for(), std::optional<int32_t>(kThinkEnd));
  ToolCallForcing::Step step = f.after_round(kThinkEnd);
  EXPECT_EQ(step.text, "\n\n<tool_call>\n<function=f>\n");
  EXPECT_FALSE(step.replaces_last);
  EXPECT_EQ(f.waits_for(), std::nullopt);
  EXPECT_THROW(f.after_round(kThinkEnd), Error);
}

TEST(ToolCallForcing, AStopTokenBeforeThinkEndIsReplacedByAClosingThinkEnd) {
  ToolCallForcing f("<tool_call>\n<function=", true, kThinkEnd);
  ToolCallForcing::Step step = f.after_round(kImEnd);
  EXPECT_EQ(step.text, "\n</think>\n\n<tool_call>\n<function=");
  EXPECT_TRUE(step.replaces_last);
  EXPECT_EQ(f.waits_for(), std::nullopt);
}

TEST(ToolCallForcing, NothingToForceOrNoThinkEndNeverWaits) {
  ToolCallForcing none("", true, kThinkEnd);
  EXPECT_EQ(none.at_start(), "");
  EXPECT_EQ(none.waits_for(), std::nullopt);
  ToolCallForcing no_think_end("<tool_call>\n<function=", true, std::nullopt);
  EXPECT_EQ(no_think_end.at_start(), "");
  EXPECT_EQ(no_think_end.waits_for(), std::nullopt);
}

}  // namespace
}  // namespace lily
