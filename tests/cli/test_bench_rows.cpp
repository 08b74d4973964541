// test_bench_rows.cpp: `lily bench --decode-rows T` end to end on the tiny fixture model (CPU):
// steps of T consecutive tokens (and, --decode-batch, of one token of T sequences) are measured
// and reported against their bytes, and an out-of-range T is refused with a message before any
// measurement. The request loop (--decode-loop generate / stepwise) reports its decode row and
// says which loop ran.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <array>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

namespace {

// The command's exit status and standard output.
std::pair<int, std::string> run(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return {-1, out};
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int status = pclose(p);
  return {status, out};
}

std::string bench(const std::string& args) {
  return std::string(LILY_BINARY) + " bench -m " + LILY_FIXTURES_DIR +
         "/models/tiny-a/mlx-q4 --backend cpu --prefill-lengths none --decode-tokens 2 --repeats 1 " + args;
}

// The table rows of `lily bench ... --json` with `args` (none, and a failure, if it fails).
nlohmann::json json_rows(const std::string& args) {
  auto [status, out] = run(bench(args + " --json 2>/dev/null"));
  EXPECT_EQ(status, 0) << args << ": " << out;
  return status == 0 ? nlohmann::json::parse(out)["rows"] : nlohmann::json::array();
}

TEST(BenchRows, StepsOfFourRowsAgainstTheirBytes) {
  if (!std::filesystem::exists(LILY_BINARY)) GTEST_SKIP() << "no lily binary at " << LILY_BINARY;
  const auto one = json_rows("--decode-depths 16,32"), four = json_rows("--decode-depths 16,32 --decode-rows 4");
  ASSERT_EQ(one.size(), 2u);
  ASSERT_EQ(four.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(one[i]["kind"], "decode");
    EXPECT_EQ(one[i]["rows"], 1);
    EXPECT_EQ(four[i]["kind"], "verify");
    EXPECT_EQ(four[i]["rows"], 4);
    EXPECT_EQ(four[i]["length"], one[i]["length"]);
    const double seconds = four[i]["seconds"], tokens_per_second = four[i]["tokens_per_second"];
    EXPECT_GT(seconds, 0.0);
    EXPECT_NEAR(tokens_per_second * seconds, 4.0, 1e-6);  // a step's 4 tokens
    // GB/s of a step's bytes: more bytes than one row's (the union of four tokens' experts)
    // over the step's time.
    const double bytes4 = double(four[i]["rate"]) * seconds,
                 bytes1 = double(one[i]["rate"]) * double(one[i]["seconds"]);
    EXPECT_GT(bytes4, bytes1);
    EXPECT_LT(bytes4, 4 * bytes1);
  }
}

// --decode-batch: steps of one token of each of 3 sequences, each filled to the depth: more bytes
// than 3 rows of one sequence (every sequence's own state and cache), reported as batch3.
TEST(BenchRows, StepsOfThreeSequencesAgainstTheirBytes) {
  if (!std::filesystem::exists(LILY_BINARY)) GTEST_SKIP() << "no lily binary at " << LILY_BINARY;
  const auto rows = json_rows("--decode-depths 16 --decode-rows 3"),
             batch = json_rows("--decode-depths 16 --decode-rows 3 --decode-batch");
  ASSERT_EQ(rows.size(), 1u);
  ASSERT_EQ(batch.size(), 1u);
  EXPECT_EQ(batch[0]["kind"], "batch");
  EXPECT_EQ(batch[0]["rows"], 3);
  EXPECT_EQ(batch[0]["length"], 16);
  const double seconds = batch[0]["seconds"];
  EXPECT_NEAR(double(batch[0]["tokens_per_second"]) * seconds, 3.0, 1e-6);
  EXPECT_GT(double(batch[0]["rate"]) * seconds, double(rows[0]["rate"]) * double(rows[0]["seconds"]));
  auto [plain_status, plain] = run(bench("--decode-depths 16 --decode-rows 3 --decode-batch 2>&1"));
  ASSERT_EQ(plain_status, 0) << plain;
  EXPECT_NE(plain.find("| batch3 |"), std::string::npos) << plain;
  auto [one_status, one] = run(bench("--decode-depths 16 --decode-batch 2>&1"));  // one sequence is no batch
  EXPECT_NE(one_status, 0);
  EXPECT_NE(one.find("--decode-batch"), std::string::npos) << one;
}

TEST(BenchRows, RequestLoopChainedOrStepwise) {
  if (!std::filesystem::exists(LILY_BINARY)) GTEST_SKIP() << "no lily binary at " << LILY_BINARY;
  for (const char* loop : {"generate", "stepwise"}) {
    SCOPED_TRACE(loop);
    auto [status, out] = run(bench(std::string("--decode-depths 16 --decode-loop ") + loop + " 2>&1"));
    ASSERT_EQ(status, 0) << out;
    EXPECT_NE(out.find("| decode  |      16 |"), std::string::npos) << out;
    EXPECT_EQ(out.find("stepwise (generate") != std::string::npos, std::string(loop) == "stepwise") << out;
  }
  auto [status, out] = run(bench("--decode-depths 16 --decode-loop chained 2>&1"));
  EXPECT_NE(status, 0) << "not a loop";
}

TEST(BenchRows, RefusesRowsOutOfRange) {
  if (!std::filesystem::exists(LILY_BINARY)) GTEST_SKIP() << "no lily binary at " << LILY_BINARY;
  for (const char* rows : {"0", "9"}) {
    auto [status, out] = run(bench(std::string("--decode-depths 16 --decode-rows ") + rows + " 2>&1"));
    EXPECT_NE(status, 0) << rows;
    EXPECT_NE(out.find("--decode-rows"), std::string::npos) << out;
  }
  auto [status, out] = run(bench("--decode-depths 16 --decode-rows 4 --decode-loop generate 2>&1"));
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("--decode-rows"), std::string::npos) << out;
}

}  // namespace
