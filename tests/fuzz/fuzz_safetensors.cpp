// fuzz_safetensors.cpp: a safetensors file's bytes as src/model reads them (parse_safetensors:
// the 8-byte header length, the JSON header, every entry checked against the data block).
//
// Input: the whole file. A finding: a crash, a sanitizer report (ASan sees a view that reaches
// past the input: every accepted tensor's first and last byte are read), a leak, an exception
// other than lily::Error, or accepted views that break what the header validation promises.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "base/error.h"
#include "model/checkpoint/safetensors.h"

namespace {
volatile unsigned g_sink;  // keeps the reads of the first and last bytes
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  lily::SafetensorsHeader header;
  try {
    header = lily::parse_safetensors(bytes, "fuzz.safetensors");
  } catch (const lily::Error&) {
    return 0;
  }
  unsigned sum = 0;
  for (const auto& [name, t] : header.tensors) {
    if (t.data.size() != uint64_t(t.numel()) * lily::dtype_size(t.dtype)) std::abort();
    if (t.data.data() < bytes.data() + 8 || t.data.data() + t.data.size() > bytes.data() + bytes.size()) std::abort();
    for (int64_t d : t.shape)
      if (d < 0) std::abort();
    if (!t.data.empty()) sum += unsigned(t.data.front()) + unsigned(t.data.back());
    (void)t.shape_string();
  }
  g_sink = sum;
  return 0;
}
