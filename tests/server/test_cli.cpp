// `lily run` and `lily chat` end to end on the tiny-chat test model.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <tuple>
#include <utility>

#include <nlohmann/json.hpp>

namespace {

const std::string kModel = std::string(LILY_SOURCE_DIR) + "/tests/server/fixtures/tiny-chat";

// Runs a shell command; returns its exit status and stdout.
std::pair<int, std::string> run(const std::string& command) {
  FILE* p = popen(command.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST(Cli, RunPrintsTheAnswerAndIsDeterministicWhenGreedy) {
  const std::string cmd = std::string(LILY_BINARY) + " run -m " + kModel +
                          " -p 'Hello' -n 12 --temperature 0 --no-think 2>/dev/null";
  auto [status, out] = run(cmd);
  EXPECT_EQ(status, 0);
  EXPECT_FALSE(out.empty());
  EXPECT_EQ(run(cmd).second, out);
}

TEST(Cli, ChatHandlesTurnsAndCommands) {
  const std::string cmd = "printf 'Hello\\n/think off\\nHi again\\n/reset\\n/help\\nBye\\n' | " +
                          std::string(LILY_BINARY) + " chat -m " + kModel + " -n 6 --temperature 0 2>/dev/null";
  auto [status, out] = run(cmd);
  EXPECT_EQ(status, 0);
  EXPECT_NE(out.find("(thinking off)"), std::string::npos) << out;
  EXPECT_NE(out.find("(conversation cleared)"), std::string::npos) << out;
  EXPECT_NE(out.find("commands: /reset"), std::string::npos) << out;
}

TEST(Cli, regression_chat_piped_ansi_17) {
  // Piped (stdout and stderr not a terminal): plain text, no ANSI escape anywhere.
  const std::string cmd = "printf 'Hello\\nAgain\\n' | TERM=xterm-256color " + std::string(LILY_BINARY) + " chat -m " +
                          kModel + " -n 6 --temperature 0 2>&1";
  auto [status, out] = run(cmd);
  EXPECT_EQ(status, 0);
  EXPECT_NE(out.find("prompt tokens"), std::string::npos) << out;
  EXPECT_EQ(out.find('\x1b'), std::string::npos) << out;
}

// `lily bench --json` on lily-tiny on the CPU, one repeat, with `flags`: its output and the JSON
// (a failed run fails the test).
std::pair<std::string, nlohmann::json> bench_json(const std::string& flags) {
  auto [status, out] = run(std::string(LILY_BINARY) + " bench -m " + LILY_SOURCE_DIR +
                           "/models/lily-tiny --backend cpu --json --repeats 1 " + flags + " 2>/dev/null");
  EXPECT_EQ(status, 0) << out;
  return {out, status == 0 ? nlohmann::json::parse(out) : nlohmann::json::object({{"rows", nlohmann::json::array()}})};
}

// `lily bench` on the CPU (issue 20): the threads' read bandwidth and FMA rate measured at the
// start, and each row stated against them; lily-tiny, sizes small enough for the sanitizers.
TEST(Cli, BenchOnTheCpuStatesSpeedAgainstMeasuredCeilings) {
  const auto [out, j] = bench_json("--prefill-lengths 16 --decode-depths 8 --decode-tokens 4");
  const double bandwidth = j["copy_bandwidth_gbps"].get<double>(), tflops = j["peak_tflops"].get<double>();
  EXPECT_TRUE(bandwidth > 0.1 && bandwidth < 1e4) << out;  // GB/s: a memory, not an error
  EXPECT_TRUE(tflops > 1e-3 && tflops < 1e3) << out;       // a CPU, not the H200's 790
  ASSERT_EQ(j["rows"].size(), 2u) << out;
  EXPECT_EQ(j["rows"][0]["kind"], "prefill");
  EXPECT_EQ(j["rows"][1]["kind"], "decode");
  for (const auto& row : j["rows"]) {
    EXPECT_GT(row["tokens_per_second"].get<double>(), 0) << out;
    // prefill against the FMA rate (TFLOP/s), decode against the read bandwidth (GB/s)
    const double ceiling = row["kind"] == "prefill" ? tflops : bandwidth;
    EXPECT_NEAR(row["percent_of_peak"].get<double>(), 100 * row["rate"].get<double>() / ceiling, 1e-6) << out;
  }
}

// --prefill-lengths none: decode rows only (what a profiler of the decode step runs).
TEST(Cli, BenchWithoutPrefillRunsDecodeOnly) {
  const auto [out, j] = bench_json("--prefill-lengths none --decode-depths 8,16 --decode-tokens 2");
  ASSERT_EQ(j["rows"].size(), 2u) << out;
  for (const auto& row : j["rows"]) EXPECT_EQ(row["kind"], "decode") << out;
}

// Issue 37: `lily bench --speculate K --chat` decodes lily-tiny's greedy reply to a real chat
// prompt (its trained MTP head drafting): one row, the speculative tokens plain decoding's (the
// run would fail otherwise), more than one token a step, the drafts counted per position.
TEST(Cli, BenchSpeculatesOnARealChatPrompt) {
  const auto [out, j] = bench_json("--speculate 2 --chat --decode-tokens 40");
  ASSERT_EQ(j["rows"].size(), 1u) << out;
  const auto& row = j["rows"][0];
  EXPECT_EQ(row["same_tokens"], true) << out;
  EXPECT_GT(row["depth"].get<int>(), 10) << "the rendered prompt's tokens: " << out;
  EXPECT_GE(row["generated_tokens"].get<int>(), 2) << out;
  EXPECT_LE(row["generated_tokens"].get<int>(), 40) << out;
  EXPECT_GT(row["tokens_per_step"].get<double>(), 1.0) << "lily-tiny's head keeps drafts: " << out;
  ASSERT_EQ(row["drafted"].size(), 2u) << out;
  for (size_t k = 0; k < 2; ++k) {
    EXPECT_GT(row["drafted"][k].get<int>(), 0) << out;
    EXPECT_LE(row["accepted"][k].get<int>(), row["drafted"][k].get<int>()) << out;
  }
  EXPECT_GT(row["speculative_tokens_per_second"].get<double>(), 0) << out;
}

// The chat prompt's options: errors that name them, before the model loads.
TEST(Cli, BenchChatPromptOptionsFailWithTheirNames) {
  const std::string bench = std::string(LILY_BINARY) + " bench -m " + LILY_SOURCE_DIR + "/models/lily-tiny ";
  auto [status, out] = run(bench + "--speculate 1 --prompt-file /nonexistent/prompt.txt 2>&1");
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("--prompt-file /nonexistent/prompt.txt"), std::string::npos) << out;
  std::tie(status, out) = run(bench + "--chat 2>&1");
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("--speculate"), std::string::npos) << out;
  std::tie(status, out) = run(bench + "--speculate 1 --prompt hi --decode-depths 8 2>&1");
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("--decode-depths"), std::string::npos) << out;
}

TEST(Cli, regression_serve_port_range_17) {
  auto [status, out] = run(std::string(LILY_BINARY) + " serve -m " + kModel + " --port 99999 2>&1");
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("--port"), std::string::npos) << out;
  EXPECT_EQ(out.find("listening"), std::string::npos) << out;
}

TEST(Cli, ServeFailsCleanlyWhenItCannotListen) {
  // An address that cannot be bound: the server must fail with a message, not hang.
  auto [status, out] = run(std::string(LILY_BINARY) + " serve -m " + kModel + " --host 256.0.0.1 --port 1 2>&1");
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("cannot listen"), std::string::npos) << out;
}

}  // namespace
