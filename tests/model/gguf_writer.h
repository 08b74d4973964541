// gguf_writer.h: a small GGUF writer for the tests (the layout of src/model/gguf_file.h), written
// from the format, independent of the parser; it records where each field went so a test can
// damage a file at a known place.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "model/gguf_file.h"

namespace lily::test {

class GgufWriter {
 public:
  // Where the fields of the last build() went (byte offsets in the file).
  struct Layout {
    size_t version_at = 4, tensor_count_at = 8, kv_count_at = 16;
    std::vector<size_t> key_at;                                  // each metadata entry's key length
    std::vector<size_t> value_type_at;                           // each entry's value type
    std::vector<size_t> value_at;                                // each entry's value (an array: its element type)
    std::vector<size_t> tensor_at;                               // each tensor entry's name length
    std::vector<size_t> n_dims_at, dims_at, type_at, offset_at;  // per tensor
    size_t data_at = 0;                                          // the data section
  };

  void u8(const std::string& k, uint8_t v) { scalar(k, GgufValueType::u8, &v, 1); }
  void i8(const std::string& k, int8_t v) { scalar(k, GgufValueType::i8, &v, 1); }
  void u16(const std::string& k, uint16_t v) { scalar(k, GgufValueType::u16, &v, 2); }
  void i16(const std::string& k, int16_t v) { scalar(k, GgufValueType::i16, &v, 2); }
  void u32(const std::string& k, uint32_t v) { scalar(k, GgufValueType::u32, &v, 4); }
  void i32(const std::string& k, int32_t v) { scalar(k, GgufValueType::i32, &v, 4); }
  void u64(const std::string& k, uint64_t v) { scalar(k, GgufValueType::u64, &v, 8); }
  void i64(const std::string& k, int64_t v) { scalar(k, GgufValueType::i64, &v, 8); }
  void f32(const std::string& k, float v) { scalar(k, GgufValueType::f32, &v, 4); }
  void f64(const std::string& k, double v) { scalar(k, GgufValueType::f64, &v, 8); }
  void boolean(const std::string& k, bool v) {
    uint8_t b = v;
    scalar(k, GgufValueType::boolean, &b, 1);
  }
  void str(const std::string& k, const std::string& v) {
    Entry e{k, GgufValueType::string, {}};
    put_string(e.value, v);
    kv_.push_back(e);
  }
  template <typename T>
  void array(const std::string& k, GgufValueType element, const std::vector<T>& v) {
    Entry e{k, GgufValueType::array, {}};
    put(e.value, uint32_t(element));
    put(e.value, uint64_t(v.size()));
    for (const T& x : v) put(e.value, x);
    kv_.push_back(e);
  }
  void strings(const std::string& k, const std::vector<std::string>& v) {
    Entry e{k, GgufValueType::array, {}};
    put(e.value, uint32_t(GgufValueType::string));
    put(e.value, uint64_t(v.size()));
    for (const std::string& s : v) put_string(e.value, s);
    kv_.push_back(e);
  }

  // A tensor of ggml type id `type` and dims `ne` (ggml order) holding `data`.
  void tensor(const std::string& name, uint32_t type, std::vector<uint64_t> ne, std::vector<std::byte> data) {
    tensors_.push_back({name, type, std::move(ne), std::move(data)});
  }

  std::vector<std::byte> build(uint64_t alignment = 32) {
    layout_ = {};
    std::vector<std::byte> out;
    out.insert(out.end(), reinterpret_cast<const std::byte*>("GGUF"), reinterpret_cast<const std::byte*>("GGUF") + 4);
    put(out, uint32_t(3));
    put(out, uint64_t(tensors_.size()));
    put(out, uint64_t(kv_.size()));
    for (const Entry& e : kv_) {
      layout_.key_at.push_back(out.size());
      put_string(out, e.key);
      layout_.value_type_at.push_back(out.size());
      put(out, uint32_t(e.type));
      layout_.value_at.push_back(out.size());
      out.insert(out.end(), e.value.begin(), e.value.end());
    }
    uint64_t offset = 0;
    for (const Tensor& t : tensors_) {
      layout_.tensor_at.push_back(out.size());
      put_string(out, t.name);
      layout_.n_dims_at.push_back(out.size());
      put(out, uint32_t(t.ne.size()));
      layout_.dims_at.push_back(out.size());
      for (uint64_t d : t.ne) put(out, d);
      layout_.type_at.push_back(out.size());
      put(out, t.type);
      layout_.offset_at.push_back(out.size());
      put(out, offset);
      offset += (t.data.size() + alignment - 1) / alignment * alignment;
    }
    out.resize((out.size() + alignment - 1) / alignment * alignment);
    layout_.data_at = out.size();
    for (const Tensor& t : tensors_) {
      out.insert(out.end(), t.data.begin(), t.data.end());
      out.resize((out.size() + alignment - 1) / alignment * alignment);
    }
    return out;
  }
  const Layout& layout() const { return layout_; }

  template <typename T>
  static void patch(std::vector<std::byte>& file, size_t at, T v) {
    std::memcpy(file.data() + at, &v, sizeof(T));
  }
  static void save(const std::vector<std::byte>& file, const std::string& path) {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(file.data()), std::streamsize(file.size()));
  }

 private:
  struct Entry {
    std::string key;
    GgufValueType type;
    std::vector<std::byte> value;
  };
  struct Tensor {
    std::string name;
    uint32_t type;
    std::vector<uint64_t> ne;
    std::vector<std::byte> data;
  };
  template <typename T>
  static void put(std::vector<std::byte>& out, T v) {
    const auto* p = reinterpret_cast<const std::byte*>(&v);
    out.insert(out.end(), p, p + sizeof(T));
  }
  static void put_string(std::vector<std::byte>& out, const std::string& s) {
    put(out, uint64_t(s.size()));
    const auto* p = reinterpret_cast<const std::byte*>(s.data());
    out.insert(out.end(), p, p + s.size());
  }
  void scalar(const std::string& k, GgufValueType t, const void* v, size_t n) {
    Entry e{k, t, std::vector<std::byte>(n)};
    std::memcpy(e.value.data(), v, n);
    kv_.push_back(e);
  }

  std::vector<Entry> kv_;
  std::vector<Tensor> tensors_;
  Layout layout_;
};

// n bytes of a recognisable pattern (byte i = seed + i).
inline std::vector<std::byte> pattern_bytes(size_t n, uint8_t seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::byte(uint8_t(seed + i));
  return v;
}

}  // namespace lily::test
