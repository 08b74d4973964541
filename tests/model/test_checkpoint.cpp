// Corrupt, truncated and mismatched checkpoints give clear errors, never crashes.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>

#include "base/error.h"
#include "fixture.h"
#include "model/checkpoint/load.h"
#include "model/checkpoint/safetensors.h"

namespace lily {
namespace {

namespace fs = std::filesystem;

// A scratch copy of a fixture layout that a test may damage.
class ScratchModel {
 public:
  explicit ScratchModel(const std::string& layout) {
    dir_ = fs::temp_directory_path() / ("lily-ckpt-" + std::to_string(::getpid()) + "-" + std::to_string(counter_++));
    fs::create_directories(dir_);
    for (auto& e : fs::directory_iterator(test::fixture_dir("tiny-a") + "/" + layout))
      fs::copy(e.path(), dir_ / e.path().filename());
  }
  ~ScratchModel() { fs::remove_all(dir_); }
  std::string dir() const { return dir_.string(); }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }

 private:
  fs::path dir_;
  static inline int counter_ = 0;
};

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

std::string header_file(const std::string& json, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[size_t(i)] = char((n >> (8 * i)) & 0xff);
  return out + json + data;
}

TEST(Safetensors, ReadsAValidFile) {
  ScratchModel m("mlx-q4");
  write_bytes(m.file("x.bin"),
              header_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"format":"pt"}})",
                          std::string(8, '\1')));
  SafetensorsFile f(m.file("x.bin"));
  ASSERT_EQ(f.tensors().size(), 1u);
  EXPECT_EQ(f.tensors().at("a").shape, (std::vector<int64_t>{2}));
  EXPECT_EQ(f.metadata().at("format"), "pt");
}

TEST(Safetensors, RejectsCorruptHeaders) {
  ScratchModel m("mlx-q4");
  struct Case {
    std::string bytes, expect;
  } cases[] = {
      {"abc", "too short"},
      {std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) + "{}", "not plausible"},
      {header_file("{", ""), "not valid JSON"},
      {header_file("[1,2]", ""), "not a JSON object"},
      {header_file(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", std::string(8, '\0')), "past the end"},
      {header_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, '\0')), "needs 12"},
      {header_file(R"({"a":{"dtype":"Q9","shape":[2],"data_offsets":[0,8]}})", std::string(8, '\0')), "unknown dtype"},
      {header_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", std::string(8, '\0')), "reversed"},
      {header_file(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", std::string(8, '\0')), "negative"},
      {header_file(
           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
           std::string(12, '\0')),
       "overlap"},
  };
  for (const auto& c : cases) {
    write_bytes(m.file("bad.safetensors"), c.bytes);
    std::string err = error_of([&] { SafetensorsFile f(m.file("bad.safetensors")); });
    EXPECT_NE(err.find(c.expect), std::string::npos) << "expected '" << c.expect << "' in: " << err;
    EXPECT_NE(err.find("bad.safetensors"), std::string::npos) << "error must name the file: " << err;
  }
}

TEST(Checkpoint, TruncatedShardIsAnError) {
  ScratchModel m("hf-fused");
  std::string shard = m.file("model-00002-of-00003.safetensors");
  fs::resize_file(shard, fs::file_size(shard) - 1000);
  std::string err = error_of([&] { load_model(m.dir()); });
  EXPECT_NE(err.find("truncated"), std::string::npos) << err;
  EXPECT_NE(err.find("model-00002-of-00003"), std::string::npos) << err;
}

TEST(Checkpoint, MissingShardIsAnError) {
  ScratchModel m("hf-fused");
  fs::remove(m.file("model-00003-of-00003.safetensors"));
  std::string err = error_of([&] { load_model(m.dir()); });
  EXPECT_NE(err.find("model-00003-of-00003"), std::string::npos) << err;
}

TEST(Checkpoint, IndexThatDisagreesWithTheShardsIsAnError) {
  ScratchModel m("hf-fused");
  auto index = test::read_json(m.file("model.safetensors.index.json"));
  index["weight_map"]["lm_head.weight"] = "model-00001-of-00003.safetensors";
  index["weight_map"]["model.language_model.not_a_tensor"] = "model-00002-of-00003.safetensors";
  write_bytes(m.file("model.safetensors.index.json"), index.dump());
  std::string err = error_of([&] { load_model(m.dir()); });
  EXPECT_NE(err.find("model.safetensors.index.json"), std::string::npos) << err;
}

TEST(Checkpoint, MisShapedTensorNamesTensorAndShapes) {
  // A config that disagrees with the weights: every matrix has the wrong input width.
  ScratchModel m("hf-per-expert");
  auto cfg = test::read_json(m.file("config.json"));
  cfg["text_config"]["moe_intermediate_size"] = 128;
  write_bytes(m.file("config.json"), cfg.dump());
  std::string err = error_of([&] { load_model(m.dir()); });
  EXPECT_NE(err.find("expected shape [128, 128]"), std::string::npos) << err;
  EXPECT_NE(err.find("found [64, 128]"), std::string::npos) << err;
  EXPECT_NE(err.find("experts.0.gate_proj"), std::string::npos) << err;
}

TEST(Checkpoint, MissingTensorIsNamed) {
  ScratchModel m("hf-per-expert");
  auto cfg = test::read_json(m.file("config.json"));
  cfg["text_config"]["layer_types"][1] = "full_attention";  // layer 1 has no self_attn weights
  write_bytes(m.file("config.json"), cfg.dump());
  std::string err = error_of([&] { load_model(m.dir()); });
  EXPECT_NE(err.find("missing tensor"), std::string::npos) << err;
  EXPECT_NE(err.find("layers.1.self_attn.q_proj.weight"), std::string::npos) << err;
}

TEST(Checkpoint, QuantizationConfigMustAgreeWithShapes) {
  ScratchModel m("mlx-q4");
  auto cfg = test::read_json(m.file("config.json"));
  cfg["quantization"]["bits"] = 8;
  cfg.erase("quantization_config");
  write_bytes(m.file("config.json"), cfg.dump());
  std::string err = error_of([&] { load_model(m.dir()); });
  EXPECT_NE(err.find("4-bit"), std::string::npos) << err;
  EXPECT_NE(err.find("8-bit"), std::string::npos) << err;
}

// Issue 17: a GGUF file or a directory of them was refused with "cannot open .../config.json".
// Issue 41: they load as GGUF; these empty ones say what they lack.
TEST(Checkpoint, regression_gguf_is_named_17) {
  ScratchModel m("mlx-q4");
  const std::string gguf = std::string("GGUF\x03\0\0\0", 8) + std::string(64, '\0');
  const std::string lacks = ": missing metadata key 'general.architecture'";
  write_bytes(m.file("Qwen3.6-35B-A3B-Q4_K_M.gguf"), gguf);
  std::string err = error_of([&] { load_model(m.file("Qwen3.6-35B-A3B-Q4_K_M.gguf")); });
  EXPECT_NE(err.find(m.file("Qwen3.6-35B-A3B-Q4_K_M.gguf") + lacks), std::string::npos) << err;
  // Read as GGUF by its magic when the extension is gone.
  write_bytes(m.file("model.bin"), gguf);
  err = error_of([&] { load_model(m.file("model.bin")); });
  EXPECT_NE(err.find(m.file("model.bin") + lacks), std::string::npos) << err;
  // Any other single file is not a model either.
  err = error_of([&] { load_model(m.file("config.json")); });
  EXPECT_NE(err.find("is a file; lily loads a GGUF file, or a Hugging Face model directory"), std::string::npos) << err;

  // A directory of GGUF files (a split set), no safetensors: read from its first shard.
  const fs::path dir = fs::path(m.dir()) / "gguf-dir";
  fs::create_directories(dir);
  write_bytes((dir / "Qwen3.6-00001-of-00002.gguf").string(), gguf);
  write_bytes((dir / "Qwen3.6-00002-of-00002.gguf").string(), gguf);
  err = error_of([&] { load_model(dir.string()); });
  EXPECT_NE(err.find((dir / "Qwen3.6-00001-of-00002.gguf").string() + lacks), std::string::npos) << err;
  // A model directory that also carries a .gguf loads as the safetensors it is.
  EXPECT_NO_THROW(load_model(m.dir()));
}

// Rewrites the header of a safetensors file with `edit`, keeping its data block.
void edit_header(const std::string& path, const std::function<void(nlohmann::json&)>& edit) {
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(uint8_t(bytes[size_t(i)])) << (8 * i);
  nlohmann::json header = nlohmann::json::parse(bytes.substr(8, n));
  edit(header);
  write_bytes(path, header_file(header.dump(), bytes.substr(8 + n)));
}

// Issue 17: FP8 weights in a checkpoint whose config.json does not say so are named as FP8.
TEST(Checkpoint, regression_fp8_tensors_are_named_17) {
  ScratchModel m("hf-fused");
  const std::string name = "model.language_model.embed_tokens.weight";
  edit_header(m.file("model-00001-of-00003.safetensors"), [&](nlohmann::json& h) {
    auto& t = h[name];
    const uint64_t begin = t["data_offsets"][0];
    const uint64_t numel = t["shape"][0].get<uint64_t>() * t["shape"][1].get<uint64_t>();
    t["dtype"] = "F8_E4M3";
    t["data_offsets"] = {begin, begin + numel};  // one byte per element; the rest of its bytes unused
  });
  const std::string err = error_of([&] { load_model(m.dir()); });
  EXPECT_NE(err.find("tensor '" + name +
                     "' is F8_E4M3: FP8 checkpoints are not supported: use the bf16 or mlx "
                     "4-bit checkpoint"),
            std::string::npos)
      << err;
}

// Issue 17: the ids a model directory names must be rows of its vocabulary.
TEST(Checkpoint, regression_eos_beyond_the_vocabulary_is_refused_17) {
  ScratchModel m("mlx-q4");
  auto generation = test::read_json(m.file("generation_config.json"));
  generation["eos_token_id"] = {2, 384};  // vocab_size 384: ids 0..383
  write_bytes(m.file("generation_config.json"), generation.dump());
  const std::string err = error_of([&] { load_model(m.dir()); });
  EXPECT_NE(err.find("eos_token_id 384 does not fit the model's vocabulary (vocab_size 384)"), std::string::npos)
      << err;
  generation["eos_token_id"] = {2, 383};
  write_bytes(m.file("generation_config.json"), generation.dump());
  EXPECT_NO_THROW(load_model(m.dir()));
}

// config.json nested absurdly deep: refused while parsing, naming the file.
TEST(Checkpoint, DeeplyNestedConfigIsRefused) {
  ScratchModel m("mlx-q4");
  auto cfg = test::read_json(m.file("config.json"));
  std::string text = cfg.dump();
  text.insert(text.size() - 1, R"(, "x": )" + std::string(100000, '[') + std::string(100000, ']'));
  write_bytes(m.file("config.json"), text);
  const std::string err = error_of([&] { load_model(m.dir()); });
  EXPECT_NE(err.find("config.json"), std::string::npos) << err;
  EXPECT_NE(err.find("JSON nested deeper than 64 levels"), std::string::npos) << err;
}

TEST(Checkpoint, NotAModelDirectory) {
  EXPECT_NE(error_of([] { load_model("/nonexistent/model"); }).find("/nonexistent/model"), std::string::npos);
}

}  // namespace
}  // namespace lily
