// gguf_file.h: GGUF files (llama.cpp's checkpoint format, spec §5c), parsed and bounds-checked.
//
// Layout (GGUF v2/v3, little-endian):
//   "GGUF" | u32 version | u64 tensor_count | u64 kv_count
//   kv_count x  { string key | u32 value_type | value }      string = u64 length + bytes
//                value: a scalar, a string, or an array = u32 element_type + u64 count + elements
//   tensor_count x { string name | u32 n_dims | n_dims x u64 ne | u32 ggml_type | u64 offset }
//   padding to `general.alignment` (default 32) | the data section
// ne is ggml's order, fastest-varying first: a [rows, cols] matrix is ne = {cols, rows}. A tensor's
// offset is relative to the data section and a multiple of the alignment.
// Everything is checked against the bytes before it is used: each count, length and offset
// against what is left of the file (a hostile count never becomes a huge allocation), the
// types, the dimensions and their product, the alignment, tensors inside the data section and
// not overlapping, names unique. A damaged file is an Error naming the file and what is wrong.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/mapped_file.h"
#include "model/gguf_types.h"

namespace lily {

enum class GgufValueType : uint32_t {
  u8 = 0,
  i8 = 1,
  u16 = 2,
  i16 = 3,
  u32 = 4,
  i32 = 5,
  f32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  u64 = 10,
  i64 = 11,
  f64 = 12,
};
const char* to_string(GgufValueType type);

// One metadata value. Numbers (scalars and arrays) keep their little-endian bytes, which point
// into the file, and are decoded on access; strings are copied.
struct GgufValue {
  GgufValueType type = GgufValueType::u8;
  GgufValueType element_type = GgufValueType::u8;  // arrays only
  uint64_t count = 1;                              // arrays: the number of elements
  std::span<const std::byte> raw;                  // numbers: `count` elements of their type
  std::string text;                                // string
  std::vector<std::string> texts;                  // array of strings

  bool is_array() const { return type == GgufValueType::array; }
  // Scalars; each throws naming the type it found when the value is not of that kind.
  int64_t as_int() const;   // any integer type (or bool); a u64 above INT64_MAX is an error
  double as_float() const;  // any number
  bool as_bool() const;
  const std::string& as_string() const;
  // Arrays of numbers / strings.
  std::vector<int64_t> int_array() const;
  std::vector<float> float_array() const;
  const std::vector<std::string>& string_array() const;
  // "u32 40", "string \"qwen35moe\"", "array<string>[248320]" (for lily info and messages).
  std::string describe() const;
};

struct GgufTensor {
  std::string name;
  GgmlType type = GgmlType::F32;
  std::vector<int64_t> ne;          // ggml order: ne[0] varies fastest
  uint64_t offset = 0;              // within the data section
  std::span<const std::byte> data;  // the tensor's bytes, in the file
  std::string file;                 // which file holds it (for messages)

  int64_t numel() const;
  int64_t rows() const { return ne.empty() ? 1 : numel() / ne[0]; }  // all but ne[0]
  std::string shape_string() const;                                  // "{2048, 248320}", ggml order
};

struct GgufHeader {
  uint32_t version = 0;
  uint64_t alignment = 32;
  uint64_t data_offset = 0;  // where the data section starts in the file
  std::map<std::string, GgufValue> metadata;
  std::vector<GgufTensor> tensors;  // in the file's order

  const GgufValue* find(const std::string& key) const;  // nullptr when absent
  const GgufValue& get(const std::string& key) const;   // throws naming the key
};

// The header of a GGUF file's bytes, validated as above; views point into `file_bytes`. `path`
// names the file in the views and errors. GgufFile maps a file and calls this (the fuzzer
// tests/fuzz/fuzz_gguf.cpp calls it on its inputs).
GgufHeader parse_gguf(std::span<const std::byte> file_bytes, const std::string& path);

// Whether `path` is a GGUF file: the extension .gguf, or the magic bytes.
bool is_gguf_path(const std::string& path);

// One .gguf file, mapped and validated.
class GgufFile {
 public:
  explicit GgufFile(const std::string& path);
  const GgufHeader& header() const { return header_; }
  const std::string& path() const { return file_->path(); }

 private:
  std::shared_ptr<MappedFile> file_;
  GgufHeader header_;
};

// A GGUF model: one file, one shard of a split set (NAME-00001-of-00003.gguf: every shard is
// opened, the metadata read from the first), or a directory holding one of those. The split
// keys (split.no, split.count, split.tensors.count) are checked when present.
class GgufModel {
 public:
  explicit GgufModel(const std::string& path);

  const std::map<std::string, GgufValue>& metadata() const { return files_.front()->header().metadata; }
  const GgufValue* find_metadata(const std::string& key) const;
  const GgufTensor* find(const std::string& name) const;  // nullptr when absent
  const GgufTensor& get(const std::string& name) const;   // throws naming the tensor
  std::vector<const GgufTensor*> tensors() const;         // in file order, shard by shard
  std::vector<std::string> paths() const;
  uint64_t tensor_bytes() const;
  // Bytes of tensor data by storage type, largest first ("the quant mix").
  std::vector<std::pair<GgmlType, uint64_t>> bytes_by_type() const;

 private:
  std::vector<std::unique_ptr<GgufFile>> files_;
  std::map<std::string, const GgufTensor*> index_;
};

// The shard paths of the split set `path` belongs to, in order; {path} when it is not a shard.
// Throws when a shard is missing.
std::vector<std::string> gguf_split_paths(const std::string& path);

}  // namespace lily
