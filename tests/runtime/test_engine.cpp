// Engine::load: what a model directory must hold beyond its weights (issue 17's checkpoint
// refusals that need the tokenizer).
#include <gtest/gtest.h>

#include <unistd.h>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "runtime/engine.h"

namespace lily {
namespace {

namespace fs = std::filesystem;

const std::string kLilyTiny = std::string(LILY_SOURCE_DIR) + "/models/lily-tiny";

// A scratch copy of lily-tiny (11 MB) that a test may edit.
class ScratchModel {
 public:
  ScratchModel() : dir_(fs::temp_directory_path() / ("lily-engine-" + std::to_string(::getpid()))) {
    fs::remove_all(dir_);
    fs::copy(kLilyTiny, dir_);
  }
  ~ScratchModel() { fs::remove_all(dir_); }
  std::string dir() const { return dir_.string(); }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }

 private:
  fs::path dir_;
};

std::unique_ptr<Engine> load_cpu(const std::string& dir) {
  EngineOptions options;
  options.model_dir = dir;
  options.backend = "cpu";
  return Engine::load(options);
}

TEST(Engine, LoadsTheDirectorysTokenizer) {
  auto engine = load_cpu(kLilyTiny);
  ASSERT_NE(engine->tokenizer(), nullptr);
  EXPECT_EQ(engine->tokenizer()->vocab_size(), 1862);
  EXPECT_LE(engine->tokenizer()->vocab_size(), engine->config().vocab_size);
}

// Issue 17: a tokenizer whose ids do not fit the model's vocabulary was accepted by the loader
// (an id >= vocab_size has no embedding row; the backends index embed_tokens with it).
TEST(Engine, regression_tokenizer_beyond_the_vocabulary_is_refused_17) {
  ScratchModel m;
  nlohmann::json tokenizer;
  {
    std::ifstream in(m.file("tokenizer.json"));
    tokenizer = nlohmann::json::parse(in);
  }
  tokenizer["added_tokens"].push_back({{"id", 1920},
                                       {"content", "<|extra|>"},
                                       {"single_word", false},
                                       {"lstrip", false},
                                       {"rstrip", false},
                                       {"normalized", false},
                                       {"special", true}});
  std::ofstream(m.file("tokenizer.json")) << tokenizer.dump();
  try {
    load_cpu(m.dir());
    FAIL() << "a tokenizer with id 1920 loaded for a model of vocab_size 1920";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(m.file("tokenizer.json") +
                                         " defines 1921 token ids (0..1920), but the model's vocab_size is 1920"),
              std::string::npos)
        << e.what();
  }
}

// A checkpoint used with token ids only (lily logits) needs no tokenizer.
TEST(Engine, ADirectoryWithoutATokenizerLoads) {
  ScratchModel m;
  fs::remove(m.file("tokenizer.json"));
  auto engine = load_cpu(m.dir());
  EXPECT_EQ(engine->tokenizer(), nullptr);
}

}  // namespace
}  // namespace lily
