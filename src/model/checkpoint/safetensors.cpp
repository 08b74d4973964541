#include "model/checkpoint/safetensors.h"

#include <algorithm>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "model/json_file.h"

namespace lily {

using nlohmann::json;

namespace {

struct DTypeInfo {
  const char* name;
  DType dtype;
  size_t size;
};

constexpr DTypeInfo kDTypes[] = {
    {"BOOL", DType::BOOL, 1},       {"U8", DType::U8, 1},   {"I8", DType::I8, 1},   {"F8_E4M3", DType::F8_E4M3, 1},
    {"F8_E5M2", DType::F8_E5M2, 1}, {"I16", DType::I16, 2}, {"U16", DType::U16, 2}, {"F16", DType::F16, 2},
    {"BF16", DType::BF16, 2},       {"I32", DType::I32, 4}, {"U32", DType::U32, 4}, {"F32", DType::F32, 4},
    {"I64", DType::I64, 8},         {"U64", DType::U64, 8}, {"F64", DType::F64, 8},
};

DType parse_dtype(const std::string& name) {
  for (const auto& info : kDTypes)
    if (name == info.name) return info.dtype;
  fail("unknown dtype \"{}\"", name);
}

// Most elements one tensor may have (and the largest dimension): 2^48, far above any real tensor.
constexpr uint64_t kMaxElements = uint64_t(1) << 48;

// Largest header we accept; real headers are a few hundred KB (the safetensors library caps at 100 MB).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

uint64_t read_u64_le(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | uint64_t(p[i]);
  return v;
}

TensorView parse_entry(const std::string& name, const json& entry, std::span<const std::byte> data_block) {
  if (!entry.is_object()) fail("entry is not an object");
  auto dt = entry.find("dtype");
  auto shape = entry.find("shape");
  auto offsets = entry.find("data_offsets");
  if (dt == entry.end() || !dt->is_string()) fail("missing or non-string 'dtype'");
  if (shape == entry.end() || !shape->is_array()) fail("missing or non-list 'shape'");
  if (offsets == entry.end() || !offsets->is_array() || offsets->size() != 2)
    fail("'data_offsets' must be [begin, end]");

  TensorView t;
  t.name = name;
  t.dtype = parse_dtype(dt->get<std::string>());
  uint64_t count = 1;
  for (const json& d : *shape) {
    if (!d.is_number_unsigned()) fail("shape {} has a non-integer or negative dimension", shape->dump());
    uint64_t dim = d.get<uint64_t>();
    // Every dimension is bounded too: after a 0, count stays 0 and would not catch a 2^63.
    if (dim > kMaxElements || (dim != 0 && count > kMaxElements / dim)) fail("shape {} is too large", shape->dump());
    count *= dim;
    t.shape.push_back(int64_t(dim));
  }
  for (const json& o : *offsets)
    if (!o.is_number_unsigned()) fail("data_offsets {} must be non-negative integers", offsets->dump());
  uint64_t begin = (*offsets)[0].get<uint64_t>(), end = (*offsets)[1].get<uint64_t>();
  if (begin > end) fail("data_offsets {} are reversed", offsets->dump());
  if (end > data_block.size())
    fail("data_offsets {} run past the end of the file (data block is {} bytes; truncated file?)", offsets->dump(),
         data_block.size());
  uint64_t expected = count * dtype_size(t.dtype);
  if (end - begin != expected)
    fail("holds {} bytes but dtype {} x shape {} needs {}", end - begin, dt->get<std::string>(), shape->dump(),
         expected);
  t.data = data_block.subspan(begin, end - begin);
  return t;
}

}  // namespace

size_t dtype_size(DType dtype) {
  for (const auto& info : kDTypes)
    if (info.dtype == dtype) return info.size;
  return 0;
}

const char* dtype_name(DType dtype) {
  for (const auto& info : kDTypes)
    if (info.dtype == dtype) return info.name;
  return "?";
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorView::shape_string() const { return fmt::format("[{}]", fmt::join(shape, ", ")); }

SafetensorsHeader parse_safetensors(std::span<const std::byte> bytes, const std::string& path) {
  return with_context(path, [&] {
    SafetensorsHeader out;
    if (bytes.size() < 8) fail("file is {} bytes, too short for a safetensors header", bytes.size());
    uint64_t header_len = read_u64_le(bytes.data());
    if (header_len > kMaxHeaderBytes) fail("header length {} is not plausible (corrupt file?)", header_len);
    if (header_len > bytes.size() - 8)
      fail("header length {} exceeds the file size {} (truncated file?)", header_len, bytes.size());
    std::string_view header(reinterpret_cast<const char*>(bytes.data() + 8), header_len);
    const json doc = with_context("header", [&] { return parse_json_limited(header); });
    if (!doc.is_object()) fail("header is not a JSON object");
    auto data_block = bytes.subspan(8 + header_len);

    std::vector<std::pair<uint64_t, uint64_t>> ranges;
    for (auto& item : doc.items()) {
      // Not a structured binding: clang 14 (the fuzz build) cannot capture one in the lambda below.
      const std::string& name = item.key();
      const json& entry = item.value();
      if (name == "__metadata__") {
        if (!entry.is_object()) fail("__metadata__ must be an object");
        for (auto& [k, v] : entry.items())
          if (v.is_string()) out.metadata[k] = v.get<std::string>();
        continue;
      }
      TensorView t = with_context(fmt::format("tensor '{}'", name),
                                  [&] { return parse_entry(name, entry, data_block); });
      t.file = path;
      uint64_t begin = uint64_t(t.data.data() - data_block.data());
      if (!t.data.empty()) ranges.emplace_back(begin, begin + t.data.size());
      out.tensors.emplace(name, std::move(t));
    }
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 1; i < ranges.size(); ++i)
      if (ranges[i].first < ranges[i - 1].second)
        fail("tensors overlap in the data block (bytes {}..{} and {}..{})", ranges[i - 1].first, ranges[i - 1].second,
             ranges[i].first, ranges[i].second);
    return out;
  });
}

SafetensorsFile::SafetensorsFile(const std::string& path) {
  file_ = with_context(path, [&] { return std::make_shared<MappedFile>(path); });
  SafetensorsHeader header = parse_safetensors(file_->bytes(), path);
  tensors_ = std::move(header.tensors);
  metadata_ = std::move(header.metadata);
}

Checkpoint::Checkpoint(const std::string& model_dir) : dir_(model_dir) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(model_dir)) fail("model directory {} does not exist", model_dir);
  std::vector<std::string> paths;
  std::map<std::string, std::string> index_map;  // tensor -> shard file named by the index
  fs::path index_path = fs::path(model_dir) / "model.safetensors.index.json";
  if (fs::exists(index_path)) {
    const json index = read_json_file(index_path.string());
    with_context(index_path.string(), [&] {
      if (!index.contains("weight_map") || !index.at("weight_map").is_object()) fail("missing 'weight_map'");
      std::vector<std::string> shards;
      for (auto& [name, file] : index.at("weight_map").items()) {
        if (!file.is_string()) fail("weight_map['{}'] is not a file name", name);
        std::string f = file.get<std::string>();
        if (f.find('/') != std::string::npos || f.find("..") != std::string::npos)
          fail("weight_map['{}'] = \"{}\" is not a plain file name", name, f);
        if (std::find(shards.begin(), shards.end(), f) == shards.end()) shards.push_back(f);
      }
      for (auto& f : shards) paths.push_back((fs::path(model_dir) / f).string());
      for (auto& [name, file] : index.at("weight_map").items()) index_map[name] = file.get<std::string>();
    });
  } else {
    for (auto& entry : fs::directory_iterator(model_dir))
      if (entry.path().extension() == ".safetensors") paths.push_back(entry.path().string());
    std::sort(paths.begin(), paths.end());
  }
  if (paths.empty()) fail("no .safetensors files in {}", model_dir);
  for (auto& p : paths) {
    files_.push_back(std::make_unique<SafetensorsFile>(p));
    for (auto& [name, view] : files_.back()->tensors()) {
      auto [it, inserted] = index_.emplace(name, &view);
      if (!inserted) fail("tensor '{}' appears in both {} and {}", name, it->second->file, p);
    }
  }
  // The index must describe the shards as they are.
  for (auto& [name, file] : index_map) {
    const TensorView* t = find(name);
    if (!t) fail("model.safetensors.index.json lists tensor '{}' in {}, but no shard holds it", name, file);
    if (fs::path(t->file).filename() != file)
      fail("model.safetensors.index.json puts tensor '{}' in {}, but it is in {}", name, file, t->file);
  }
}

const TensorView* Checkpoint::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

const TensorView& Checkpoint::get(const std::string& name) const {
  const TensorView* t = find(name);
  if (!t) fail("missing tensor '{}' in {}", name, dir_);
  return *t;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  for (auto& [name, _] : index_) out.push_back(name);
  return out;
}

uint64_t Checkpoint::total_bytes() const {
  uint64_t n = 0;
  for (auto& [_, t] : index_) n += t->data.size();
  return n;
}

}  // namespace lily
