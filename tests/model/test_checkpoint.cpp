// Corrupt, truncated and mismatched checkpoints give clear errors, never crashes.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

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

TEST(Checkpoint, NotAModelDirectory) {
  EXPECT_NE(error_of([] { load_model("/nonexistent/model"); }).find("/nonexistent/model"), std::string::npos);
}

}  // namespace
}  // namespace lily
