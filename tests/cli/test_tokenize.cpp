// `lily tokenize`, `lily detokenize` and `lily eval` on a GGUF alone (engine.h
// find_model_tokenizer): tests/fixtures/models/tiny-a/gguf/tiny-a-q8_0.gguf has no tokenizer.json
// beside it, so the commands take the GGUF's own vocabulary, which must give the ids of the
// tokenizer.json it was made from (gguf/tokenizer/tokenizer.json) and decode them back to the
// text. A tokenizer.json beside the file wins (checked with another model's, lily-tiny's, whose
// ids differ); a path with neither is an error naming it.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tokenizer/tokenizer.h"

namespace lily {
namespace {

namespace fs = std::filesystem;

const std::string kGgufDir = std::string(LILY_FIXTURES_DIR) + "/models/tiny-a/gguf";
const std::string kGguf = kGgufDir + "/tiny-a-q8_0.gguf";
const std::string kTokenizerJson = kGgufDir + "/tokenizer/tokenizer.json";

// NFC texts (llama.cpp's converter keeps the vocabulary; lily normalizes as HF does): plain,
// spaces and newlines, digits, non-ASCII, the chat tokens, a text that looks like a token.
const std::vector<std::string> kTexts = {
    "Hello world",
    "  two  spaces\n\nand lines\r\n",
    "Compute 12+35 = 47.",
    "caf\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x8e\x89",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHello<|im_end|>",
    "< |im_end| > im_end|>",
    "x",
};

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

std::string ids_line(const std::vector<int32_t>& ids) {
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) line += (i ? " " : "") + std::to_string(ids[i]);
  return line + "\n";
}

class LilyTokenize : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("lily-cli-tokenize-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Runs `lily ARGS`, stdin from `input` (written to a file).
  Result lily(const std::string& args, const std::string& input = "") {
    std::ofstream(dir_ / "in", std::ios::binary) << input;
    const std::string cmd = std::string(LILY_BINARY) + " " + args + " <" + (dir_ / "in").string() + " >" +
                            (dir_ / "out").string() + " 2>" + (dir_ / "err").string();
    const int raw = std::system(cmd.c_str());
    return {WIFEXITED(raw) ? WEXITSTATUS(raw) : -1, slurp(dir_ / "out"), slurp(dir_ / "err")};
  }

  // `text` as one shell word (kTexts hold no single quote).
  static std::string quoted(const std::string& text) { return "'" + text + "'"; }

  fs::path dir_;
};

TEST_F(LilyTokenize, AGgufAloneGivesTheIdsOfItsTokenizerJson) {
  ASSERT_FALSE(fs::exists(kGgufDir + "/tokenizer.json"));
  const Tokenizer json = Tokenizer::load(kTokenizerJson);
  for (const std::string& text : kTexts) {
    const std::string want = ids_line(json.encode(text));
    const Result from_stdin = lily("tokenize -m " + kGguf, text);
    ASSERT_EQ(from_stdin.status, 0) << from_stdin.err;
    EXPECT_EQ(from_stdin.out, want) << text;
    const Result from_argument = lily("tokenize -m " + kGguf + " " + quoted(text));
    ASSERT_EQ(from_argument.status, 0) << from_argument.err;
    EXPECT_EQ(from_argument.out, want) << text;
  }
}

TEST_F(LilyTokenize, DetokenizeOfAGgufRoundTrips) {
  const Tokenizer json = Tokenizer::load(kTokenizerJson);
  for (const std::string& text : kTexts) {
    const std::string ids = ids_line(json.encode(text));
    const Result from_stdin = lily("detokenize -m " + kGguf, ids);
    ASSERT_EQ(from_stdin.status, 0) << from_stdin.err;
    EXPECT_EQ(from_stdin.out, text);
    std::string commas = ids.substr(0, ids.size() - 1);
    std::replace(commas.begin(), commas.end(), ' ', ',');
    const Result from_argument = lily("detokenize -m " + kGguf + " " + quoted(commas));
    ASSERT_EQ(from_argument.status, 0) << from_argument.err;
    EXPECT_EQ(from_argument.out, text);
  }
  const Result bad = lily("detokenize -m " + kGguf + " 99999");
  EXPECT_NE(bad.status, 0);
}

// lily-tiny's tokenizer.json copied beside the GGUF: it is the one used (its ids, not tiny-a's).
TEST_F(LilyTokenize, ATokenizerJsonBesideTheGgufWins) {
  fs::copy_file(kGguf, dir_ / "tiny-a-q8_0.gguf");
  const std::string beside = std::string(LILY_SOURCE_DIR) + "/models/lily-tiny/tokenizer.json";
  fs::copy_file(beside, dir_ / "tokenizer.json");
  const std::string text = "Compute 12+35 = 47.";
  const std::vector<int32_t> want = Tokenizer::load(beside).encode(text);
  ASSERT_NE(want, Tokenizer::load(kTokenizerJson).encode(text));
  const Result r = lily("tokenize -m " + (dir_ / "tiny-a-q8_0.gguf").string() + " " + quoted(text));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, ids_line(want));
}

TEST_F(LilyTokenize, APathWithoutATokenizerIsAnErrorNamingIt) {
  fs::create_directories(dir_ / "empty");
  const Result none = lily("tokenize -m " + (dir_ / "empty").string() + " x");
  EXPECT_NE(none.status, 0);
  EXPECT_NE(none.err.find((dir_ / "empty").string() + " has no tokenizer"), std::string::npos) << none.err;
  const Result missing = lily("detokenize -m " + (dir_ / "missing.gguf").string() + " 1");
  EXPECT_NE(missing.status, 0);
  EXPECT_NE(missing.err.find("missing.gguf does not exist"), std::string::npos) << missing.err;
}

// `lily eval` tokenizes with the GGUF's vocabulary: the same ids, so the same numbers, as with
// the tokenizer.json beside the file.
TEST_F(LilyTokenize, EvalOfAGgufAloneEqualsItWithItsTokenizerJson) {
  const std::string text = "Hello, how are you? What is 12 + 30? It is 42.\n";
  std::ofstream(dir_ / "text.txt", std::ios::binary) << text;
  const std::string args = " --backend cpu --json --text " + (dir_ / "text.txt").string();
  const Result alone = lily("eval -m " + kGguf + args);
  ASSERT_EQ(alone.status, 0) << alone.err;
  fs::create_directories(dir_ / "with-json");
  fs::copy_file(kGguf, dir_ / "with-json" / "tiny-a-q8_0.gguf");
  fs::copy_file(kTokenizerJson, dir_ / "with-json" / "tokenizer.json");
  const Result beside = lily("eval -m " + (dir_ / "with-json" / "tiny-a-q8_0.gguf").string() + args);
  ASSERT_EQ(beside.status, 0) << beside.err;
  const auto a = nlohmann::json::parse(alone.out), b = nlohmann::json::parse(beside.out);
  EXPECT_EQ(a["tokens"].get<int64_t>(), int64_t(Tokenizer::load(kTokenizerJson).encode(text).size()));
  EXPECT_EQ(a["tokens"], b["tokens"]);
  EXPECT_EQ(a["mean_nll"], b["mean_nll"]);
}

}  // namespace
}  // namespace lily
