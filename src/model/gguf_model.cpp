// gguf_model.cpp: GGUF files mapped (GgufFile) and a model's files together (GgufModel): one
// file, a split set NAME-0000k-of-0000N.gguf, or a directory holding one of those.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>

#include "base/error.h"
#include "model/gguf_file.h"

namespace lily {

namespace fs = std::filesystem;

namespace {

// NAME-00001-of-00003.gguf: llama.cpp's gguf-split names (5 digits, shards counted from 1).
const std::regex& split_name() {
  static const std::regex re(R"((.*)-(\d{5})-of-(\d{5})\.gguf)");
  return re;
}

// The one GGUF model a directory holds: a single file, or the first shard of one split set.
std::string gguf_in_directory(const std::string& dir) {
  std::vector<std::string> singles, firsts, all;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (!entry.is_regular_file() || entry.path().extension() != ".gguf") continue;
    std::string name = entry.path().filename().string();
    all.push_back(name);
    std::smatch m;
    if (!std::regex_match(name, m, split_name())) singles.push_back(name);
    else if (m[2] == "00001") firsts.push_back(name);
  }
  if (all.empty()) fail("{} holds no .gguf file", dir);
  if (singles.size() + firsts.size() != 1) {
    std::sort(all.begin(), all.end());
    fail("{} holds {} GGUF models ({}); name the file to load", dir, singles.size() + firsts.size(),
         fmt::join(all, ", "));
  }
  return (fs::path(dir) / (singles.empty() ? firsts.front() : singles.front())).string();
}

// split.no / split.count of shard `index` (0-based) of `count`, when the shard has them.
void check_split_keys(const GgufHeader& h, size_t index, size_t count) {
  if (const GgufValue* no = h.find("split.no"))
    with_context("metadata 'split.no'", [&] {
      if (no->as_int() != int64_t(index)) fail("is {}, but the file name says shard {}", no->as_int(), index);
    });
  if (const GgufValue* n = h.find("split.count"))
    with_context("metadata 'split.count'", [&] {
      if (n->as_int() != int64_t(count)) fail("is {}, but the file names say {} shards", n->as_int(), count);
    });
}

}  // namespace

bool is_gguf_path(const std::string& path) {
  if (fs::path(path).extension() == ".gguf") return true;
  char magic[4] = {};
  std::ifstream in(path, std::ios::binary);
  return in.read(magic, 4) && std::string_view(magic, 4) == "GGUF";
}

std::vector<std::string> gguf_split_paths(const std::string& path) {
  std::smatch m;
  const std::string name = fs::path(path).filename().string();
  if (!std::regex_match(name, m, split_name())) return {path};
  const int count = std::stoi(m[3].str());
  const int index = std::stoi(m[2].str());
  if (count < 1 || index < 1 || index > count) fail("{}: shard {} of {} is not a valid split name", path, index, count);
  std::vector<std::string> out;
  for (int k = 1; k <= count; ++k) {
    fs::path p = fs::path(path).parent_path() / fmt::format("{}-{:05d}-of-{:05d}.gguf", m[1].str(), k, count);
    if (!fs::is_regular_file(p))
      fail("{} is shard {} of {}, but shard {} ({}) is missing", path, index, count, k, p.string());
    out.push_back(p.string());
  }
  return out;
}

GgufFile::GgufFile(const std::string& path) {
  file_ = with_context(path, [&] { return std::make_shared<MappedFile>(path); });
  header_ = parse_gguf(file_->bytes(), path);
}

GgufModel::GgufModel(const std::string& path) {
  std::error_code ec;
  const std::string file = fs::is_directory(path, ec) ? gguf_in_directory(path) : path;
  const std::vector<std::string> shards = gguf_split_paths(file);
  int64_t tensor_count = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    files_.push_back(std::make_unique<GgufFile>(shards[i]));
    const GgufHeader& h = files_.back()->header();
    if (shards.size() > 1) with_context(shards[i], [&] { check_split_keys(h, i, shards.size()); });
    for (const GgufTensor& t : h.tensors) {
      auto [it, inserted] = index_.emplace(t.name, &t);
      if (!inserted) fail("tensor '{}' appears in both {} and {}", t.name, it->second->file, shards[i]);
    }
    tensor_count += int64_t(h.tensors.size());
  }
  if (const GgufValue* n = find_metadata("split.tensors.count"))
    with_context(shards.front() + ": metadata 'split.tensors.count'", [&] {
      if (n->as_int() != tensor_count) fail("is {}, but the shards hold {} tensors", n->as_int(), tensor_count);
    });
}

const GgufValue* GgufModel::find_metadata(const std::string& key) const { return files_.front()->header().find(key); }

const GgufTensor* GgufModel::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

const GgufTensor& GgufModel::get(const std::string& name) const {
  const GgufTensor* t = find(name);
  if (!t) fail("missing tensor '{}' in {}", name, files_.front()->path());
  return *t;
}

std::vector<const GgufTensor*> GgufModel::tensors() const {
  std::vector<const GgufTensor*> out;
  for (const auto& f : files_)
    for (const GgufTensor& t : f->header().tensors) out.push_back(&t);
  return out;
}

std::vector<std::string> GgufModel::paths() const {
  std::vector<std::string> out;
  for (const auto& f : files_) out.push_back(f->path());
  return out;
}

uint64_t GgufModel::tensor_bytes() const {
  uint64_t n = 0;
  for (const GgufTensor* t : tensors()) n += t->data.size();
  return n;
}

std::vector<std::pair<GgmlType, uint64_t>> GgufModel::bytes_by_type() const {
  std::map<GgmlType, uint64_t> sums;
  for (const GgufTensor* t : tensors()) sums[t->type] += t->data.size();
  std::vector<std::pair<GgmlType, uint64_t>> out(sums.begin(), sums.end());
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  return out;
}

}  // namespace lily
