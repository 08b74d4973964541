// safetensors.h: memory-mapped safetensors checkpoints, one file or sharded.
//
// Format: an 8-byte little-endian header length N, N bytes of JSON
//   {"name": {"dtype": "BF16", "shape": [out, in], "data_offsets": [begin, end]}, ..., "__metadata__": {...}}
// then the data block; offsets are relative to the start of the data block.
// Every header is validated against the file before any tensor is touched: well-formed JSON,
// a sane header size, known dtypes, offsets in bounds and not overlapping, and
// bytes == dtype size x product(shape). A corrupt file is an error naming file and tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/mapped_file.h"

namespace lily {

enum class DType { BOOL, U8, I8, F8_E4M3, F8_E5M2, I16, U16, F16, BF16, I32, U32, F32, I64, U64, F64 };

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);

struct TensorView {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::span<const std::byte> data;  // points into the mapped file
  std::string file;                 // which file holds it (for messages)

  int64_t numel() const;
  std::string shape_string() const;  // "[8192, 2048]"
};

// The tensors and metadata of a safetensors file's bytes, validated as above; views point into
// `file_bytes`. `path` names the file in the views and in errors. SafetensorsFile maps a file
// and calls this (the fuzzer tests/fuzz/fuzz_safetensors.cpp calls it on its inputs).
struct SafetensorsHeader {
  std::map<std::string, TensorView> tensors;
  std::map<std::string, std::string> metadata;
};
SafetensorsHeader parse_safetensors(std::span<const std::byte> file_bytes, const std::string& path);

// One .safetensors file, mapped and validated.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);

  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return file_->path(); }

 private:
  std::shared_ptr<MappedFile> file_;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a model directory: model.safetensors.index.json (sharded), else every
// *.safetensors file in the directory. Tensor names must be unique across files.
class Checkpoint {
 public:
  explicit Checkpoint(const std::string& model_dir);

  const TensorView* find(const std::string& name) const;  // nullptr when absent
  const TensorView& get(const std::string& name) const;   // throws naming the tensor
  bool contains(const std::string& name) const { return find(name) != nullptr; }
  std::vector<std::string> names() const;
  const std::string& dir() const { return dir_; }
  uint64_t total_bytes() const;

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*> index_;
};

}  // namespace lily
