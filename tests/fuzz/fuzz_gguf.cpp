// fuzz_gguf.cpp: a GGUF file's bytes as src/model reads them (parse_gguf: the header, every
// metadata value, the tensor table, the data section).
//
// Input: the whole file. A finding: a crash, a sanitizer report (ASan sees a view that reaches
// past the input: every accepted tensor's first and last byte are read, every value decoded),
// a leak, an exception other than lily::Error, or accepted tensors that break what the header
// validation promises (inside the data section, whole blocks, bytes = blocks x block bytes).
// The first row of each accepted tensor of a type lily decodes goes through the reference
// decoder and the fast CPU dot product (any bytes are a valid block: no crash, no read past
// the row). tokenizer.ggml.* metadata, when there is some, becomes a tokenizer
// (model/gguf_vocabulary, Tokenizer::from_ggml) that encodes a fixed text and decodes it back,
// and gives its stop set (gguf_stop_token_ids).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include <vector>
#include "backend/cpu_fast/gemv_gguf.h"
#include "base/error.h"
#include "model/gguf_dequant.h"
#include "model/gguf_file.h"
#include "model/gguf_vocabulary.h"
#include "tokenizer/tokenizer.h"

namespace {
volatile unsigned g_sink;  // keeps the reads

// Decodes a value the way a loader would, whatever its type; lily::Error is the only way out.
unsigned touch(const lily::GgufValue& v) {
  unsigned sum = unsigned(v.describe().size());
  try {
    if (v.is_array()) {
      if (v.element_type == lily::GgufValueType::string) sum += unsigned(v.string_array().size());
      else sum += unsigned(v.float_array().size()) + unsigned(v.int_array().size());
    } else if (v.type == lily::GgufValueType::string) {
      sum += unsigned(v.as_string().size());
    } else {
      sum += unsigned(v.as_float() > 0) + unsigned(v.as_int() & 0xff);
    }
  } catch (const lily::Error&) {
  }
  return sum;
}

// The tokenizer of the metadata, when it holds one and it is accepted, run once each way.
unsigned touch_tokenizer(const lily::GgufHeader& header) {
  try {
    std::optional<lily::GgmlVocabulary> v = lily::gguf_vocabulary(header.metadata);
    if (!v) return 0;
    const lily::Tokenizer t = lily::Tokenizer::from_ggml(*v, "fuzz.gguf");
    const std::vector<int32_t> ids = t.encode("the the<|im_end|> \xc3\xa9\xff<think>x");
    return unsigned(ids.size() + t.decode(ids).size());
  } catch (const lily::Error&) {
    return 0;
  }
}

// The stop set of the metadata (gguf_stop_token_ids), whatever its tokenizer keys hold.
unsigned touch_stop_tokens(const lily::GgufHeader& header) {
  try {
    return unsigned(lily::gguf_stop_token_ids(header.metadata, 1 << 20).size());
  } catch (const lily::Error&) {
    return 0;
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  lily::GgufHeader header;
  try {
    header = lily::parse_gguf(bytes, "fuzz.gguf");
  } catch (const lily::Error&) {
    return 0;
  }
  unsigned sum = 0;
  for (const auto& [key, value] : header.metadata) sum += touch(value);
  sum += touch_tokenizer(header) + touch_stop_tokens(header);
  if (header.data_offset > size || (header.data_offset % header.alignment != 0 && header.data_offset != size))
    std::abort();
  for (const lily::GgufTensor& t : header.tensors) {
    const lily::GgmlTypeInfo& info = lily::ggml_type_info(t.type);
    if (!t.ne.empty() && t.ne[0] % info.block_size != 0) std::abort();
    if (t.data.size() != uint64_t(t.numel() / info.block_size * info.block_bytes)) std::abort();
    if (t.data.data() < bytes.data() + header.data_offset || t.data.data() + t.data.size() > bytes.data() + size)
      std::abort();
    if (!t.data.empty()) sum += unsigned(t.data.front()) + unsigned(t.data.back());
    (void)t.shape_string();
    const int64_t n = t.ne.empty() ? 1 : t.ne[0];
    if (n > 0 && n <= 4096 && !t.data.empty() && lily::gguf_dequant_supported(t.type)) {
      std::vector<float> row(static_cast<size_t>(n)), x(static_cast<size_t>(n), 1.0f);
      lily::dequantize_gguf_row(t.type, t.data.data(), n, row.data());
      if (lily::cpu_fast::gguf_gemv_supported(t.type))
        sum += unsigned(lily::cpu_fast::gguf_dot(t.type, t.data.data(), x.data(), n) > 0);
      sum += unsigned(row.front() > 0);
    }
  }
  g_sink = sum;
  return 0;
}
