// GET /metrics' counters from completions (Metrics::count_completion, prometheus): issue 37's
// speculative decoding counters sum the drafts over completions, and stay at 0 without them.
#include <gtest/gtest.h>

#include <string>

#include "server/server.h"

namespace lily::server {
namespace {

// The value of an unlabelled metric in the exposition text ("" when it is missing).
std::string value_of(const std::string& text, const std::string& name) {
  const std::string line = "\n" + name + " ";
  const size_t at = text.find(line);
  if (at == std::string::npos) return "";
  const size_t start = at + line.size();
  return text.substr(start, text.find('\n', start) - start);
}

CompletionResult completion(int64_t drafted, int64_t accepted) {
  CompletionResult r;
  r.usage.prompt_tokens = 20;
  r.usage.completion_tokens = 10;
  r.timings.decoded_tokens = 10;
  r.timings.drafted_tokens = drafted;
  r.timings.accepted_tokens = accepted;
  r.timings.speculative = drafted > 0;
  return r;
}

TEST(Metrics, SpeculativeCountersSumTheDrafts) {
  Metrics metrics;
  auto text = [&] { return metrics.prometheus(0, SlotStats{}, PrefixCacheStats{}, true, 0); };
  EXPECT_EQ(value_of(text(), "lily_speculative_drafted_tokens_total"), "0");
  EXPECT_EQ(value_of(text(), "lily_speculative_accepted_tokens_total"), "0");
  metrics.count_completion(completion(0, 0), 0);  // plain decoding
  metrics.count_completion(completion(9, 7), 0);
  metrics.count_completion(completion(6, 2), 0);
  const std::string out = text();
  EXPECT_EQ(value_of(out, "lily_speculative_drafted_tokens_total"), "15") << out;
  EXPECT_EQ(value_of(out, "lily_speculative_accepted_tokens_total"), "9") << out;
  EXPECT_EQ(value_of(out, "lily_generated_tokens_total"), "30") << out;
  EXPECT_NE(out.find("# TYPE lily_speculative_drafted_tokens_total counter\n"), std::string::npos) << out;
}

}  // namespace
}  // namespace lily::server
