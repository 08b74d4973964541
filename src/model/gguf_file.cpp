// gguf_file.cpp: the GGUF header parser (gguf_file.h has the layout): a cursor over the file's
// bytes that checks every read, the metadata values, the tensor table and the data section.
#include "model/gguf_file.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "base/error.h"

namespace lily {

namespace {

// GGML_MAX_DIMS: ggml tensors have at most 4 dimensions.
constexpr uint32_t kMaxDims = 4;
// Most elements one tensor may have (and the largest dimension), as for safetensors: 2^48.
constexpr uint64_t kMaxElements = uint64_t(1) << 48;
// Longest key and tensor name we accept (real ones are under 64 bytes: ggml's GGML_MAX_NAME).
constexpr uint64_t kMaxNameBytes = 65536;
// Smallest encoding of one metadata entry (empty key, type, one-byte value) and of one tensor
// entry (empty name, 0 dims, type, offset): a count above remaining / this cannot be real.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;
constexpr uint64_t kMinTensorBytes = 8 + 4 + 4 + 8;

// Reads little-endian values from a byte span; every read checks that the bytes are there.
class Cursor {
 public:
  explicit Cursor(std::span<const std::byte> bytes) : bytes_(bytes) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return bytes_.size() - pos_; }

  std::span<const std::byte> take(uint64_t n, const char* what) {
    if (n > remaining())
      fail("{} needs {} bytes at offset {}, but the file ends {} bytes later (truncated file?)", what, n, pos_,
           remaining());
    auto out = bytes_.subspan(pos_, n);
    pos_ += n;
    return out;
  }
  template <typename T>
  T read(const char* what) {
    T v;
    std::memcpy(&v, take(sizeof(T), what).data(), sizeof(T));  // x86-64 and arm64: little-endian
    return v;
  }
  std::string string(const char* what, uint64_t max_bytes = std::numeric_limits<uint64_t>::max()) {
    uint64_t n = read<uint64_t>(what);
    if (n > max_bytes) fail("{} is {} bytes long, more than the {} allowed", what, n, max_bytes);
    if (n > remaining())
      fail("{} is {} bytes long at offset {}, past the end of the file ({} bytes left)", what, n, pos_, remaining());
    auto s = take(n, what);
    return std::string(reinterpret_cast<const char*>(s.data()), s.size());
  }

 private:
  std::span<const std::byte> bytes_;
  uint64_t pos_ = 0;
};

// Bytes of one number of `type`; 0 for string and array.
uint64_t scalar_bytes(GgufValueType type) {
  switch (type) {
    case GgufValueType::u8:
    case GgufValueType::i8:
    case GgufValueType::boolean: return 1;
    case GgufValueType::u16:
    case GgufValueType::i16: return 2;
    case GgufValueType::u32:
    case GgufValueType::i32:
    case GgufValueType::f32: return 4;
    case GgufValueType::u64:
    case GgufValueType::i64:
    case GgufValueType::f64: return 8;
    case GgufValueType::string:
    case GgufValueType::array: return 0;
  }
  return 0;
}

GgufValueType value_type(uint32_t id, const char* what) {
  if (id > uint32_t(GgufValueType::f64)) fail("{} type {} is not a GGUF value type (0..12)", what, id);
  return GgufValueType(id);
}

bool is_integer(GgufValueType t) {
  return t == GgufValueType::u8 || t == GgufValueType::i8 || t == GgufValueType::u16 || t == GgufValueType::i16 ||
         t == GgufValueType::u32 || t == GgufValueType::i32 || t == GgufValueType::u64 || t == GgufValueType::i64 ||
         t == GgufValueType::boolean;
}

bool is_number(GgufValueType t) { return is_integer(t) || t == GgufValueType::f32 || t == GgufValueType::f64; }

template <typename T>
T load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

int64_t decode_int(GgufValueType t, const std::byte* p) {
  switch (t) {
    case GgufValueType::u8:
    case GgufValueType::boolean: return load<uint8_t>(p);
    case GgufValueType::i8: return load<int8_t>(p);
    case GgufValueType::u16: return load<uint16_t>(p);
    case GgufValueType::i16: return load<int16_t>(p);
    case GgufValueType::u32: return load<uint32_t>(p);
    case GgufValueType::i32: return load<int32_t>(p);
    case GgufValueType::i64: return load<int64_t>(p);
    case GgufValueType::u64: {
      uint64_t v = load<uint64_t>(p);
      if (v > uint64_t(std::numeric_limits<int64_t>::max())) fail("u64 value {} does not fit an int64", v);
      return int64_t(v);
    }
    default: fail("a {} is not an integer", to_string(t));
  }
}

double decode_float(GgufValueType t, const std::byte* p) {
  if (t == GgufValueType::f32) return load<float>(p);
  if (t == GgufValueType::f64) return load<double>(p);
  if (t == GgufValueType::u64) return double(load<uint64_t>(p));
  return double(decode_int(t, p));
}

GgufValue read_array(Cursor& in) {
  GgufValue v;
  v.type = GgufValueType::array;
  v.element_type = value_type(in.read<uint32_t>("array element type"), "array element");
  v.count = in.read<uint64_t>("array length");
  if (v.element_type == GgufValueType::array) fail("arrays of arrays are not supported");
  if (v.element_type == GgufValueType::string) {
    if (v.count > in.remaining() / 8)
      fail("array of {} strings does not fit the {} bytes left in the file", v.count, in.remaining());
    v.texts.reserve(size_t(v.count));
    for (uint64_t i = 0; i < v.count; ++i) v.texts.push_back(in.string("array string"));
    return v;
  }
  uint64_t size = scalar_bytes(v.element_type);
  if (v.count > in.remaining() / size)
    fail("array of {} x {} does not fit the {} bytes left in the file", v.count, to_string(v.element_type),
         in.remaining());
  v.raw = in.take(v.count * size, "array");
  return v;
}

GgufValue read_value(Cursor& in, GgufValueType type) {
  if (type == GgufValueType::array) return read_array(in);
  GgufValue v;
  v.type = type;
  if (type == GgufValueType::string) v.text = in.string("string value");
  else v.raw = in.take(scalar_bytes(type), to_string(type));
  if (type == GgufValueType::boolean && uint8_t(v.raw[0]) > 1) fail("bool value {} is not 0 or 1", uint8_t(v.raw[0]));
  return v;
}

void read_metadata(Cursor& in, uint64_t kv_count, GgufHeader& out) {
  if (kv_count > in.remaining() / kMinKvBytes)
    fail("header says {} metadata entries, but the file has room for at most {}", kv_count,
         in.remaining() / kMinKvBytes);
  for (uint64_t i = 0; i < kv_count; ++i) {
    std::string key = with_context(fmt::format("metadata entry {}", i),
                                   [&] { return in.string("key", kMaxNameBytes); });
    with_context(fmt::format("metadata '{}'", key), [&] {
      GgufValueType type = value_type(in.read<uint32_t>("value type"), "value");
      GgufValue value = read_value(in, type);
      if (!out.metadata.emplace(key, std::move(value)).second) fail("the key appears twice");
    });
  }
}

uint64_t read_alignment(const GgufHeader& h) {
  const GgufValue* v = h.find("general.alignment");
  if (!v) return 32;
  return with_context("metadata 'general.alignment'", [&] {
    if (v->type != GgufValueType::u32) fail("must be a u32, not {}", v->describe());
    uint64_t a = uint64_t(v->as_int());
    if (a == 0 || (a & (a - 1)) != 0) fail("{} is not a power of two", a);
    return a;
  });
}

GgufTensor read_tensor_entry(Cursor& in) {
  GgufTensor t;
  t.name = in.string("tensor name", kMaxNameBytes);
  with_context(fmt::format("tensor '{}'", t.name), [&] {
    uint32_t n_dims = in.read<uint32_t>("dimension count");
    if (n_dims > kMaxDims) fail("has {} dimensions; ggml allows at most {}", n_dims, kMaxDims);
    uint64_t count = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t dim = in.read<uint64_t>("dimension");
      // Every dimension is bounded too: after a 0, count stays 0 and would not catch a 2^63.
      if (dim > kMaxElements || (dim != 0 && count > kMaxElements / dim))
        fail("dimension {} = {} makes the tensor too large", d, dim);
      count *= dim;
      t.ne.push_back(int64_t(dim));
    }
    uint32_t type_id = in.read<uint32_t>("type");
    auto info = ggml_type_info(type_id);
    if (!info) fail("type id {} is not a ggml type this lily knows", type_id);
    t.type = info->type;
    if (!t.ne.empty() && t.ne[0] % info->block_size != 0)
      fail("ne[0] = {} is not a multiple of {}'s block of {} values", t.ne[0], info->name, info->block_size);
    t.offset = in.read<uint64_t>("data offset");
  });
  return t;
}

// Places each tensor in the data section: aligned, inside it, not overlapping another.
void place_tensors(std::span<const std::byte> data, GgufHeader& h, const std::string& path) {
  std::vector<std::pair<uint64_t, uint64_t>> ranges;  // [begin, end) of the tensors holding bytes
  std::vector<size_t> order;                          // their indices in h.tensors
  for (size_t i = 0; i < h.tensors.size(); ++i) {
    GgufTensor& t = h.tensors[i];
    with_context(fmt::format("tensor '{}'", t.name), [&] {
      const GgmlTypeInfo& info = ggml_type_info(t.type);
      const uint64_t bytes = uint64_t(t.numel()) / uint64_t(info.block_size) * uint64_t(info.block_bytes);
      if (t.offset % h.alignment != 0)
        fail("data offset {} is not a multiple of the alignment {}", t.offset, h.alignment);
      if (t.offset > data.size() || bytes > data.size() - t.offset)
        fail("{} bytes at data offset {} run past the end of the file (the data section is {} bytes; truncated?)",
             bytes, t.offset, data.size());
      t.data = data.subspan(t.offset, bytes);
      t.file = path;
      if (bytes == 0) return;
      ranges.emplace_back(t.offset, t.offset + bytes);
      order.push_back(i);
    });
  }
  std::vector<size_t> by_offset(ranges.size());
  for (size_t i = 0; i < by_offset.size(); ++i) by_offset[i] = i;
  std::sort(by_offset.begin(), by_offset.end(), [&](size_t a, size_t b) { return ranges[a] < ranges[b]; });
  for (size_t k = 1; k < by_offset.size(); ++k) {
    const auto& prev = ranges[by_offset[k - 1]];
    const auto& cur = ranges[by_offset[k]];
    if (cur.first < prev.second)
      fail("tensors '{}' (bytes {}..{}) and '{}' (bytes {}..{}) overlap in the data section",
           h.tensors[order[by_offset[k - 1]]].name, prev.first, prev.second, h.tensors[order[by_offset[k]]].name,
           cur.first, cur.second);
  }
}

void read_header_start(Cursor& in, GgufHeader& out) {
  auto magic = in.take(4, "the magic \"GGUF\"");
  if (std::memcmp(magic.data(), "GGUF", 4) != 0) fail("not a GGUF file: the first 4 bytes are not \"GGUF\"");
  out.version = in.read<uint32_t>("version");
  if (out.version == 0x03000000u || out.version == 0x02000000u)
    fail("a big-endian GGUF file (version bytes {:#010x}); lily reads little-endian ones", out.version);
  if (out.version == 1) fail("GGUF version 1 (before 2023-08) is not supported; convert it again");
  if (out.version != 2 && out.version != 3) fail("GGUF version {} is not supported (2 or 3)", out.version);
}

}  // namespace

const char* to_string(GgufValueType type) {
  static constexpr const char* kNames[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                           "bool", "string", "array", "u64", "i64", "f64"};
  return uint32_t(type) <= uint32_t(GgufValueType::f64) ? kNames[uint32_t(type)] : "?";
}

int64_t GgufValue::as_int() const {
  if (!is_integer(type)) fail("expected an integer, found {}", describe());
  return decode_int(type, raw.data());
}

double GgufValue::as_float() const {
  if (!is_number(type)) fail("expected a number, found {}", describe());
  return decode_float(type, raw.data());
}

bool GgufValue::as_bool() const {
  if (type != GgufValueType::boolean) fail("expected a bool, found {}", describe());
  return uint8_t(raw[0]) != 0;
}

const std::string& GgufValue::as_string() const {
  if (type != GgufValueType::string) fail("expected a string, found {}", describe());
  return text;
}

std::vector<int64_t> GgufValue::int_array() const {
  if (!is_array() || !is_integer(element_type)) fail("expected an array of integers, found {}", describe());
  std::vector<int64_t> out(static_cast<size_t>(count));
  const uint64_t size = scalar_bytes(element_type);
  for (uint64_t i = 0; i < count; ++i) out[size_t(i)] = decode_int(element_type, raw.data() + i * size);
  return out;
}

std::vector<float> GgufValue::float_array() const {
  if (!is_array() || !is_number(element_type)) fail("expected an array of numbers, found {}", describe());
  std::vector<float> out(static_cast<size_t>(count));
  const uint64_t size = scalar_bytes(element_type);
  for (uint64_t i = 0; i < count; ++i) out[size_t(i)] = float(decode_float(element_type, raw.data() + i * size));
  return out;
}

const std::vector<std::string>& GgufValue::string_array() const {
  if (!is_array() || element_type != GgufValueType::string) fail("expected an array of strings, found {}", describe());
  return texts;
}

std::string GgufValue::describe() const {
  if (is_array()) return fmt::format("array<{}>[{}]", to_string(element_type), count);
  if (type == GgufValueType::string)
    return text.size() <= 60 ? fmt::format("string \"{}\"", text) : fmt::format("string of {} bytes", text.size());
  if (type == GgufValueType::boolean) return uint8_t(raw[0]) ? "bool true" : "bool false";
  if (type == GgufValueType::f32 || type == GgufValueType::f64)
    return fmt::format("{} {}", to_string(type), decode_float(type, raw.data()));
  if (type == GgufValueType::u64) return fmt::format("u64 {}", load<uint64_t>(raw.data()));
  return fmt::format("{} {}", to_string(type), decode_int(type, raw.data()));
}

int64_t GgufTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;
  return n;
}

std::string GgufTensor::shape_string() const { return fmt::format("{{{}}}", fmt::join(ne, ", ")); }

const GgufValue* GgufHeader::find(const std::string& key) const {
  auto it = metadata.find(key);
  return it == metadata.end() ? nullptr : &it->second;
}

const GgufValue& GgufHeader::get(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) fail("missing metadata key '{}'", key);
  return *v;
}

GgufHeader parse_gguf(std::span<const std::byte> bytes, const std::string& path) {
  return with_context(path, [&] {
    GgufHeader out;
    Cursor in(bytes);
    read_header_start(in, out);
    const uint64_t tensor_count = in.read<uint64_t>("tensor count");
    const uint64_t kv_count = in.read<uint64_t>("metadata count");
    read_metadata(in, kv_count, out);
    out.alignment = read_alignment(out);
    if (tensor_count > in.remaining() / kMinTensorBytes)
      fail("header says {} tensors, but the file has room for at most {}", tensor_count,
           in.remaining() / kMinTensorBytes);
    out.tensors.reserve(size_t(tensor_count));
    for (uint64_t i = 0; i < tensor_count; ++i)
      out.tensors.push_back(with_context(fmt::format("tensor entry {}", i), [&] { return read_tensor_entry(in); }));
    std::vector<std::string> names;
    for (const GgufTensor& t : out.tensors) names.push_back(t.name);
    std::sort(names.begin(), names.end());
    auto dup = std::adjacent_find(names.begin(), names.end());
    if (dup != names.end()) fail("tensor '{}' appears twice in the tensor table", *dup);
    // The data section starts at the next multiple of the alignment; a file without tensors may
    // end before it.
    uint64_t data_offset = (in.pos() + out.alignment - 1) / out.alignment * out.alignment;
    if (data_offset < in.pos()) fail("alignment {} overflows the data offset", out.alignment);
    out.data_offset = std::min<uint64_t>(data_offset, bytes.size());
    if (data_offset > bytes.size() && !out.tensors.empty())
      fail("the data section would start at byte {}, past the end of the file ({} bytes; truncated?)", data_offset,
           bytes.size());
    place_tensors(bytes.subspan(out.data_offset), out, path);
    return out;
  });
}

}  // namespace lily
