// `lily eval` end to end, on the random-weight test model tests/server/fixtures/tiny-chat (the
// tiny-a mlx-q4 checkpoint, vocab 384, with a 377-id tokenizer). The reference logits come from
// `lily logits` on the same ids, so they must agree exactly; a wrong-sized file must fail with
// a message, and perturbed logits must show up as disagreement.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tokenizer/tokenizer.h"

namespace lily {
namespace {

namespace fs = std::filesystem;
const std::string kModel = std::string(LILY_SOURCE_DIR) + "/tests/server/fixtures/tiny-chat";
const std::string kText = "Hello, how are you? The weather in Paris is fine today.\n"
                          "What is 12 + 30? It is 42. Thank you, goodbye!\n";

struct Result {
  int status = -1;
  std::string out, err;
};

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class Eval : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("lily_e2e_eval_" + std::to_string(getpid()));
    fs::create_directories(dir_);
    std::ofstream(dir_ / "text.txt", std::ios::binary) << kText;
  }
  void TearDown() override { fs::remove_all(dir_); }

  Result lily(const std::string& args) {
    Result r;
    const std::string cmd = std::string(LILY_BINARY) + " " + args + " >" + (dir_ / "out").string() + " 2>" +
                            (dir_ / "err").string();
    int raw = std::system(cmd.c_str());
    r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
    r.out = slurp(dir_ / "out");
    r.err = slurp(dir_ / "err");
    return r;
  }

  // Writes lily's own logits of the text's ids to `name` (float32 [T, vocab]).
  std::vector<float> write_lily_logits(const std::string& name) {
    std::vector<int32_t> ids = Tokenizer::load_from_model_dir(kModel).encode(kText);
    std::string list;
    for (int32_t id : ids) {  // not "," + std::to_string(id): a false -Wrestrict of g++ 12 at -O3
      if (!list.empty()) list += ',';
      list += std::to_string(id);
    }
    Result r = lily("logits -m " + kModel + " --backend cpu --ids " + list + " --out " + (dir_ / name).string());
    EXPECT_EQ(r.status, 0) << r.err;
    std::string bytes = slurp(dir_ / name);
    std::vector<float> logits(bytes.size() / sizeof(float));
    std::memcpy(logits.data(), bytes.data(), logits.size() * sizeof(float));
    return logits;
  }

  nlohmann::json eval_json(const std::string& extra) {
    Result r = lily("eval -m " + kModel + " --backend cpu --text " + (dir_ / "text.txt").string() + " --json " + extra);
    EXPECT_EQ(r.status, 0) << r.err;
    return nlohmann::json::parse(r.out);
  }

  void write_floats(const std::string& name, const std::vector<float>& v) {
    std::ofstream(dir_ / name, std::ios::binary)
        .write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * sizeof(float)));
  }

  fs::path dir_;
};

TEST_F(Eval, PerplexityIsFiniteAndAboveOne) {
  nlohmann::json j = eval_json("");
  const int64_t T = j["tokens"];
  EXPECT_EQ(size_t(T), Tokenizer::load_from_model_dir(kModel).encode(kText).size());
  EXPECT_EQ(j["vocab"], 384);
  EXPECT_EQ(j["predictions"], T - 1);
  const double ppl = j["perplexity"];
  EXPECT_TRUE(std::isfinite(ppl));
  EXPECT_GT(ppl, 1.0);
  EXPECT_NEAR(std::log(ppl), j["mean_nll"].get<double>(), 1e-9);
  EXPECT_FALSE(j.contains("reference"));
  std::printf("tiny-chat (random weights): %lld tokens, perplexity %.3f\n", (long long)T, ppl);
}

TEST_F(Eval, LilyLogitsAsReferenceAgreeExactly) {
  write_lily_logits("ref.f32");
  nlohmann::json j = eval_json("--ref-logits " + (dir_ / "ref.f32").string());
  const auto& r = j["reference"];
  EXPECT_EQ(r["top1_agreement"].get<double>(), 1.0);
  EXPECT_EQ(r["top1_agree"], j["tokens"]);
  EXPECT_EQ(r["perplexity_difference"].get<double>(), 0.0);
  EXPECT_EQ(r["perplexity"].get<double>(), j["perplexity"].get<double>());
  EXPECT_EQ(r["max_abs_logit_diff"].get<double>(), 0.0);
  EXPECT_GT(r["max_abs_ref_logit"].get<double>(), 0.0);

  // The table prints the same numbers.
  Result table = lily("eval -m " + kModel + " --backend cpu --text " + (dir_ / "text.txt").string() + " --ref-logits " +
                      (dir_ / "ref.f32").string());
  ASSERT_EQ(table.status, 0) << table.err;
  EXPECT_NE(table.out.find("perplexity"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("(100.00%)"), std::string::npos) << table.out;
  std::printf("%s", table.out.c_str());
}

TEST_F(Eval, WrongSizedReferenceFailsWithAMessage) {
  std::vector<float> logits = write_lily_logits("ref.f32");
  logits.resize(logits.size() - 384);  // one row short
  write_floats("short.f32", logits);
  Result r = lily("eval -m " + kModel + " --backend cpu --text " + (dir_ / "text.txt").string() + " --ref-logits " +
                  (dir_ / "short.f32").string());
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("expected float32 [T="), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("vocab=384"), std::string::npos) << r.err;

  write_floats("ragged.f32", std::vector<float>(logits.begin(), logits.end() - 3));
  r = lily("eval -m " + kModel + " --backend cpu --text " + (dir_ / "text.txt").string() + " --ref-logits " +
           (dir_ / "ragged.f32").string());
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("not a whole number of rows"), std::string::npos) << r.err;

  r = lily("eval -m " + kModel + " --backend cpu --text " + (dir_ / "text.txt").string() + " --ref-logits " +
           (dir_ / "missing.f32").string());
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("missing.f32"), std::string::npos) << r.err;
}

TEST_F(Eval, PerturbedReferenceDisagrees) {
  const int64_t vocab = 384;
  std::vector<float> logits = write_lily_logits("ref.f32");
  const int64_t T = int64_t(logits.size()) / vocab;
  ASSERT_GE(T, 4);
  // Rows 0 and 2 get a new winner; the other rows are untouched.
  for (int64_t t : {0, 2}) {
    float* row = logits.data() + t * vocab;
    int64_t best = std::max_element(row, row + vocab) - row;
    row[(best + 1) % vocab] = row[best] + 5.0f;
  }
  write_floats("perturbed.f32", logits);
  nlohmann::json j = eval_json("--ref-logits " + (dir_ / "perturbed.f32").string());
  const auto& r = j["reference"];
  EXPECT_EQ(r["top1_agree"].get<int64_t>(), T - 2);
  EXPECT_LT(r["top1_agreement"].get<double>(), 1.0);
  EXPECT_GT(r["max_abs_logit_diff"].get<double>(), 5.0);
  EXPECT_NE(r["perplexity_difference"].get<double>(), 0.0);
}

TEST_F(Eval, MaxTokensTruncatesTheText) {
  nlohmann::json j = eval_json("--max-tokens 5");
  EXPECT_EQ(j["tokens"], 5);
  EXPECT_EQ(j["predictions"], 4);
}

}  // namespace
}  // namespace lily
