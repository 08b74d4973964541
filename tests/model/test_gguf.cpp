// GGUF parsing (src/model/gguf_file.h): a file written by tests/model/gguf_writer.h parsed back,
// split sets and directories, and damaged files, each of which must give a clear error.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <limits>

#include "base/error.h"
#include "gguf_writer.h"
#include "model/gguf_file.h"

namespace lily {
namespace {

namespace fs = std::filesystem;
using test::GgufWriter;
using test::pattern_bytes;

// Two tensors of different types, and metadata of every value type.
GgufWriter sample_writer() {
  GgufWriter w;
  w.str("general.architecture", "qwen35moe");
  w.u8("t.u8", 200);
  w.i8("t.i8", -100);
  w.u16("t.u16", 60000);
  w.i16("t.i16", -30000);
  w.u32("qwen35moe.block_count", 41);
  w.i32("t.i32", -7);
  w.u64("t.u64", uint64_t(1) << 40);
  w.i64("t.i64", -(int64_t(1) << 40));
  w.f32("qwen35moe.rope.freq_base", 1e7f);
  w.f64("t.f64", 0.125);
  w.boolean("t.bool", true);
  w.array<int32_t>("qwen35moe.rope.dimension_sections", GgufValueType::i32, {11, 11, 10, 0});
  w.array<float>("tokenizer.ggml.scores", GgufValueType::f32, {0.5f, -1.25f});
  w.strings("tokenizer.ggml.tokens", {"a", "", "\xc4\xa0the"});
  w.tensor("token_embd.weight", 8, {64, 3}, pattern_bytes(3 * 2 * 34, 1));  // Q8_0: 2 blocks per row
  w.tensor("output_norm.weight", 0, {64}, pattern_bytes(64 * 4, 7));        // F32
  return w;
}

std::vector<std::byte> sample_file() { return sample_writer().build(); }

GgufHeader parse(const std::vector<std::byte>& file) { return parse_gguf(file, "t.gguf"); }

// The message of the Error parse_gguf throws on `file`; fails the test when it does not throw.
std::string parse_error(const std::vector<std::byte>& file) {
  try {
    parse(file);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "parse_gguf accepted a damaged file";
  return "";
}

#define EXPECT_PARSE_ERROR(file, text) EXPECT_PRED_FORMAT2(::testing::IsSubstring, text, parse_error(file))

TEST(Gguf, ParsesEveryValueTypeAndTheTensorTable) {
  GgufWriter w = sample_writer();
  const auto file = w.build();
  const GgufHeader h = parse(file);
  EXPECT_EQ(h.version, 3u);
  EXPECT_EQ(h.alignment, 32u);
  EXPECT_EQ(h.data_offset, w.layout().data_at);
  EXPECT_EQ(h.data_offset % 32, 0u);
  EXPECT_EQ(h.get("general.architecture").as_string(), "qwen35moe");
  EXPECT_EQ(h.get("t.u8").as_int(), 200);
  EXPECT_EQ(h.get("t.i8").as_int(), -100);
  EXPECT_EQ(h.get("t.u16").as_int(), 60000);
  EXPECT_EQ(h.get("t.i16").as_int(), -30000);
  EXPECT_EQ(h.get("qwen35moe.block_count").as_int(), 41);
  EXPECT_EQ(h.get("t.i32").as_int(), -7);
  EXPECT_EQ(h.get("t.u64").as_int(), int64_t(1) << 40);
  EXPECT_EQ(h.get("t.i64").as_int(), -(int64_t(1) << 40));
  EXPECT_EQ(h.get("qwen35moe.rope.freq_base").as_float(), 1e7);
  EXPECT_EQ(h.get("t.f64").as_float(), 0.125);
  EXPECT_TRUE(h.get("t.bool").as_bool());
  EXPECT_EQ(h.get("qwen35moe.rope.dimension_sections").int_array(), (std::vector<int64_t>{11, 11, 10, 0}));
  EXPECT_EQ(h.get("tokenizer.ggml.scores").float_array(), (std::vector<float>{0.5f, -1.25f}));
  EXPECT_EQ(h.get("tokenizer.ggml.tokens").string_array(), (std::vector<std::string>{"a", "", "\xc4\xa0the"}));
  EXPECT_EQ(h.get("tokenizer.ggml.tokens").describe(), "array<string>[3]");
  EXPECT_EQ(h.get("qwen35moe.block_count").describe(), "u32 41");

  ASSERT_EQ(h.tensors.size(), 2u);
  const GgufTensor& emb = h.tensors[0];
  EXPECT_EQ(emb.name, "token_embd.weight");
  EXPECT_EQ(emb.type, GgmlType::Q8_0);
  EXPECT_EQ(emb.ne, (std::vector<int64_t>{64, 3}));
  EXPECT_EQ(emb.rows(), 3);
  EXPECT_EQ(emb.shape_string(), "{64, 3}");
  EXPECT_EQ(emb.data.data(), file.data() + h.data_offset);
  EXPECT_EQ(std::vector<std::byte>(emb.data.begin(), emb.data.end()), pattern_bytes(204, 1));
  const GgufTensor& norm = h.tensors[1];
  EXPECT_EQ(norm.type, GgmlType::F32);
  EXPECT_EQ(norm.offset, 224u);  // 204 rounded up to 32
  EXPECT_EQ(std::vector<std::byte>(norm.data.begin(), norm.data.end()), pattern_bytes(256, 7));
}

TEST(Gguf, WrongAccessorTypesAreErrorsNamingTheType) {
  const auto file = sample_file();  // the numbers are views into it
  const GgufHeader h = parse(file);
  EXPECT_THROW(h.get("general.architecture").as_int(), Error);
  EXPECT_THROW(h.get("t.u32-missing"), Error);
  EXPECT_THROW(h.get("tokenizer.ggml.tokens").int_array(), Error);
  EXPECT_THROW(h.get("t.bool").as_string(), Error);
  try {
    h.get("qwen35moe.block_count").as_string();
    FAIL();
  } catch (const Error& e) {
    EXPECT_PRED_FORMAT2(::testing::IsSubstring, "u32 41", e.what());
  }
}

TEST(Gguf, HonoursGeneralAlignment) {
  GgufWriter w = sample_writer();
  w.u32("general.alignment", 64);
  const auto file = w.build(64);
  const GgufHeader h = parse(file);
  EXPECT_EQ(h.alignment, 64u);
  EXPECT_EQ(h.data_offset % 64, 0u);
  EXPECT_EQ(h.tensors[1].offset, 256u);
  EXPECT_EQ(std::vector<std::byte>(h.tensors[1].data.begin(), h.tensors[1].data.end()), pattern_bytes(256, 7));
}

TEST(Gguf, AFileWithoutTensorsMayEndAtItsMetadata) {
  GgufWriter w;
  w.str("general.architecture", "x");
  auto file = w.build();
  file.resize(w.layout().value_at[0] + 8 + 1);  // no padding after the last value
  const GgufHeader h = parse(file);
  EXPECT_TRUE(h.tensors.empty());
  EXPECT_EQ(h.get("general.architecture").as_string(), "x");
}

// Every prefix of a valid file is an error (never a crash, never accepted).
TEST(GgufDamaged, TruncatedAtEveryByte) {
  const auto file = sample_file();
  for (size_t n = 0; n < file.size(); ++n) {
    std::vector<std::byte> cut(file.begin(), file.begin() + std::ptrdiff_t(n));
    const std::string msg = parse_error(cut);
    EXPECT_FALSE(msg.empty()) << "cut at " << n;
    EXPECT_EQ(msg.rfind("t.gguf: ", 0), 0u) << msg;
  }
  std::vector<std::byte> cut(file.begin(), file.end() - 1);
  EXPECT_PARSE_ERROR(cut, "run past the end of the file");
  cut.assign(file.begin(), file.begin() + 10);
  EXPECT_PARSE_ERROR(cut, "truncated");
}

TEST(GgufDamaged, WrongMagicAndVersions) {
  auto file = sample_file();
  file[0] = std::byte('g');
  EXPECT_PARSE_ERROR(file, "not a GGUF file");
  file = sample_file();
  GgufWriter::patch<uint32_t>(file, 4, 1);
  EXPECT_PARSE_ERROR(file, "GGUF version 1");
  GgufWriter::patch<uint32_t>(file, 4, 4);
  EXPECT_PARSE_ERROR(file, "GGUF version 4 is not supported");
  GgufWriter::patch<uint32_t>(file, 4, 0x03000000u);
  EXPECT_PARSE_ERROR(file, "big-endian");
  GgufWriter::patch<uint32_t>(file, 4, 2);
  EXPECT_NO_THROW(parse(file));  // v2 has v3's layout
}

TEST(GgufDamaged, AbsurdCounts) {
  GgufWriter w = sample_writer();
  auto file = w.build();
  GgufWriter::patch<uint64_t>(file, w.layout().tensor_count_at, uint64_t(1) << 60);
  EXPECT_PARSE_ERROR(file, "header says 1152921504606846976 tensors");
  file = w.build();
  GgufWriter::patch<uint64_t>(file, w.layout().kv_count_at, ~uint64_t(0));
  EXPECT_PARSE_ERROR(file, "metadata entries, but the file has room for at most");
  file = w.build();
  GgufWriter::patch<uint64_t>(file, w.layout().tensor_count_at, 3);  // one more than the table holds
  EXPECT_FALSE(parse_error(file).empty());
  // The dimension-sections array (entry 12): element type, then the count.
  file = w.build();
  GgufWriter::patch<uint64_t>(file, w.layout().value_at[12] + 4, uint64_t(1) << 62);
  EXPECT_PARSE_ERROR(file, "array of 4611686018427387904 x i32 does not fit");
  file = w.build();
  GgufWriter::patch<uint64_t>(file, w.layout().value_at[14] + 4, uint64_t(1) << 61);  // the tokens
  EXPECT_PARSE_ERROR(file, "array of 2305843009213693952 strings does not fit");
}

TEST(GgufDamaged, StringLengthsPastTheEnd) {
  GgufWriter w = sample_writer();
  auto file = w.build();
  GgufWriter::patch<uint64_t>(file, w.layout().key_at[3], uint64_t(1) << 63);
  EXPECT_PARSE_ERROR(file, "metadata entry 3: key is 9223372036854775808 bytes long");
  file = w.build();
  GgufWriter::patch<uint64_t>(file, w.layout().value_at[0], file.size());  // the architecture string
  EXPECT_PARSE_ERROR(file, "metadata 'general.architecture': string value is");
  EXPECT_PARSE_ERROR(file, "past the end of the file");
  file = w.build();
  GgufWriter::patch<uint64_t>(file, w.layout().value_at[14] + 12 + 8 + 1, uint64_t(1) << 40);  // 2nd token
  EXPECT_PARSE_ERROR(file, "metadata 'tokenizer.ggml.tokens': array string is 1099511627776 bytes long");
  file = w.build();
  GgufWriter::patch<uint64_t>(file, w.layout().tensor_at[1], 100000);
  EXPECT_PARSE_ERROR(file, "tensor entry 1: tensor name is 100000 bytes long, more than the 65536 allowed");
}

TEST(GgufDamaged, BadValueTypes) {
  GgufWriter w = sample_writer();
  auto file = w.build();
  GgufWriter::patch<uint32_t>(file, w.layout().value_type_at[1], 13);
  EXPECT_PARSE_ERROR(file, "metadata 't.u8': value type 13 is not a GGUF value type");
  file = w.build();
  GgufWriter::patch<uint32_t>(file, w.layout().value_at[12], uint32_t(GgufValueType::array));
  EXPECT_PARSE_ERROR(file, "arrays of arrays are not supported");
  file = w.build();
  GgufWriter::patch<uint32_t>(file, w.layout().value_at[12], 77);
  EXPECT_PARSE_ERROR(file, "array element type 77 is not a GGUF value type");
  file = w.build();
  GgufWriter::patch<uint8_t>(file, w.layout().value_at[11], 2);
  EXPECT_PARSE_ERROR(file, "metadata 't.bool': bool value 2 is not 0 or 1");
}

TEST(GgufDamaged, DuplicateKeysAndTensorNames) {
  GgufWriter w = sample_writer();
  w.u32("t.u8", 1);
  EXPECT_PARSE_ERROR(w.build(), "metadata 't.u8': the key appears twice");
  GgufWriter v = sample_writer();
  v.tensor("output_norm.weight", 0, {8}, pattern_bytes(32, 0));
  EXPECT_PARSE_ERROR(v.build(), "tensor 'output_norm.weight' appears twice");
}

TEST(GgufDamaged, BadAlignment) {
  GgufWriter w = sample_writer();
  w.u32("general.alignment", 48);
  EXPECT_PARSE_ERROR(w.build(48), "'general.alignment': 48 is not a power of two");
  GgufWriter v = sample_writer();
  v.u32("general.alignment", 0);
  EXPECT_PARSE_ERROR(v.build(), "0 is not a power of two");
  GgufWriter u = sample_writer();
  u.str("general.alignment", "32");
  EXPECT_PARSE_ERROR(u.build(), "must be a u32, not string \"32\"");
}

TEST(GgufDamaged, UnknownTensorTypes) {
  GgufWriter w = sample_writer();
  for (uint32_t id : {4u, 5u, 31u, 40u, 1000u, 0xffffffffu}) {
    auto file = w.build();
    GgufWriter::patch<uint32_t>(file, w.layout().type_at[1], id);
    EXPECT_PARSE_ERROR(file, fmt::format("tensor 'output_norm.weight': type id {} is not a ggml type", id));
  }
}

TEST(GgufDamaged, BadDimensions) {
  GgufWriter w = sample_writer();
  auto file = w.build();
  GgufWriter::patch<uint32_t>(file, w.layout().n_dims_at[1], 5);
  EXPECT_PARSE_ERROR(file, "has 5 dimensions; ggml allows at most 4");
  file = w.build();
  GgufWriter::patch<uint32_t>(file, w.layout().n_dims_at[0], 0xffffffffu);
  EXPECT_PARSE_ERROR(file, "has 4294967295 dimensions");
  // {2^32, 2^32}: each dimension fits, the product does not.
  file = w.build();
  GgufWriter::patch<uint64_t>(file, w.layout().dims_at[0], uint64_t(1) << 32);
  GgufWriter::patch<uint64_t>(file, w.layout().dims_at[0] + 8, uint64_t(1) << 32);
  EXPECT_PARSE_ERROR(file, "dimension 1 = 4294967296 makes the tensor too large");
  // 0 then 2^63: the product stays 0, the dimension is still refused.
  file = w.build();
  GgufWriter::patch<uint64_t>(file, w.layout().dims_at[0], 0);
  GgufWriter::patch<uint64_t>(file, w.layout().dims_at[0] + 8, uint64_t(1) << 63);
  EXPECT_PARSE_ERROR(file, "dimension 1 = 9223372036854775808 makes the tensor too large");
  // Q8_0 rows hold whole blocks of 32.
  file = w.build();
  GgufWriter::patch<uint64_t>(file, w.layout().dims_at[0], 48);
  EXPECT_PARSE_ERROR(file, "ne[0] = 48 is not a multiple of Q8_0's block of 32 values");
}

TEST(GgufDamaged, TensorOffsets) {
  GgufWriter w = sample_writer();
  auto file = w.build();
  GgufWriter::patch<uint64_t>(file, w.layout().offset_at[1], 1u << 20);
  EXPECT_PARSE_ERROR(file, "tensor 'output_norm.weight': 256 bytes at data offset 1048576 run past the end");
  file = w.build();
  GgufWriter::patch<uint64_t>(file, w.layout().offset_at[1], ~uint64_t(0) - 31);  // offset + size wraps
  EXPECT_PARSE_ERROR(file, "run past the end of the file");
  file = w.build();
  GgufWriter::patch<uint64_t>(file, w.layout().offset_at[1], 200);
  EXPECT_PARSE_ERROR(file, "data offset 200 is not a multiple of the alignment 32");
  file = w.build();
  GgufWriter::patch<uint64_t>(file, w.layout().offset_at[1], 192);
  EXPECT_PARSE_ERROR(file,
                     "tensors 'token_embd.weight' (bytes 0..204) and 'output_norm.weight' (bytes 192..448) overlap");
  file = w.build();
  GgufWriter::patch<uint64_t>(file, w.layout().offset_at[0], 224);  // both at 224
  EXPECT_PARSE_ERROR(file, "overlap in the data section");
}

TEST(GgufDamaged, DimsThatMakeTheDataTooLarge) {
  GgufWriter w = sample_writer();
  auto file = w.build();
  GgufWriter::patch<uint64_t>(file, w.layout().dims_at[0] + 8, uint64_t(1) << 30);  // rows
  EXPECT_PARSE_ERROR(file, "tensor 'token_embd.weight': 73014444032 bytes at data offset 0 run past the end");
}

// A temporary directory removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() / ("lily-gguf-" + std::to_string(::getpid()) + "-" + std::to_string(counter_++));
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::string path() const { return path_.string(); }

 private:
  fs::path path_;
  static inline int counter_ = 0;
};

std::string model_error(const std::string& path) {
  try {
    GgufModel m(path);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "GgufModel accepted " << path;
  return "";
}

// Shard k (0-based) of a 3-way split: its own tensor, the split keys, metadata in the first.
std::vector<std::byte> shard(int k, int count, int tensors_total, int no) {
  GgufWriter w;
  if (k == 0) w.str("general.architecture", "qwen35moe");
  w.u16("split.no", uint16_t(no));
  w.u16("split.count", uint16_t(count));
  w.i32("split.tensors.count", tensors_total);
  w.tensor(fmt::format("blk.{}.attn_norm.weight", k), 0, {16}, pattern_bytes(64, uint8_t(k)));
  return w.build();
}

TEST(GgufModelFiles, OneFileAndADirectoryHoldingIt) {
  TempDir dir;
  GgufWriter::save(sample_file(), dir.file("m.gguf"));
  for (const std::string& path : {dir.file("m.gguf"), dir.path()}) {
    GgufModel m(path);
    EXPECT_EQ(m.paths(), std::vector<std::string>{dir.file("m.gguf")});
    EXPECT_EQ(m.get("token_embd.weight").type, GgmlType::Q8_0);
    EXPECT_EQ(m.find("nope"), nullptr);
    EXPECT_EQ(m.tensor_bytes(), 204u + 256u);
    auto mix = m.bytes_by_type();
    ASSERT_EQ(mix.size(), 2u);
    EXPECT_EQ(mix[0], (std::pair<GgmlType, uint64_t>{GgmlType::F32, 256}));
    EXPECT_EQ(mix[1], (std::pair<GgmlType, uint64_t>{GgmlType::Q8_0, 204}));
  }
  EXPECT_TRUE(is_gguf_path(dir.file("m.gguf")));
  GgufWriter::save(sample_file(), dir.file("other.gguf"));
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "holds 2 GGUF models (m.gguf, other.gguf)", model_error(dir.path()));
}

TEST(GgufModelFiles, SplitSets) {
  TempDir dir;
  for (int k = 0; k < 3; ++k)
    GgufWriter::save(shard(k, 3, 3, k), dir.file(fmt::format("m-{:05d}-of-00003.gguf", k + 1)));
  for (const std::string& path : {dir.file("m-00001-of-00003.gguf"), dir.file("m-00002-of-00003.gguf"), dir.path()}) {
    GgufModel m(path);
    EXPECT_EQ(m.paths().size(), 3u);
    EXPECT_EQ(m.tensors().size(), 3u);
    EXPECT_EQ(m.get("blk.2.attn_norm.weight").file, dir.file("m-00003-of-00003.gguf"));
    EXPECT_EQ(m.find_metadata("general.architecture")->as_string(), "qwen35moe");
  }
  // A shard that says it is another one, a wrong tensor total, a missing shard.
  GgufWriter::save(shard(1, 3, 3, 2), dir.file("m-00002-of-00003.gguf"));
  EXPECT_PRED_FORMAT2(::testing::IsSubstring,
                      "m-00002-of-00003.gguf: metadata 'split.no': is 2, but the file name says shard 1",
                      model_error(dir.path()));
  GgufWriter::save(shard(1, 3, 3, 1), dir.file("m-00002-of-00003.gguf"));
  GgufWriter::save(shard(0, 3, 4, 0), dir.file("m-00001-of-00003.gguf"));
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "'split.tensors.count': is 4, but the shards hold 3 tensors",
                      model_error(dir.path()));
  fs::remove(dir.file("m-00003-of-00003.gguf"));
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "shard 3 (" + dir.file("m-00003-of-00003.gguf") + ") is missing",
                      model_error(dir.file("m-00001-of-00003.gguf")));
}

TEST(GgufModelFiles, ATensorInTwoShards) {
  TempDir dir;
  GgufWriter::save(shard(0, 2, 2, 0), dir.file("m-00001-of-00002.gguf"));
  GgufWriter::save(shard(0, 2, 2, 1), dir.file("m-00002-of-00002.gguf"));
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "tensor 'blk.0.attn_norm.weight' appears in both",
                      model_error(dir.file("m-00001-of-00002.gguf")));
}

TEST(GgufModelFiles, ADirectoryWithoutGguf) {
  TempDir dir;
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "holds no .gguf file", model_error(dir.path()));
}

}  // namespace
}  // namespace lily
