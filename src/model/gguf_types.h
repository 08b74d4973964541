// gguf_types.h: ggml's tensor storage types, as a GGUF file's tensor table names them.
//
// Each type stores a row of ne[0] values as ne[0] / block_size blocks of block_bytes bytes
// (ggml-common.h's block_* structs; gguf_dequant.h has the layouts lily reads). The ids are
// ggml's (`enum ggml_type`); ids ggml retired (4, 5, 31-33, 36-38) are unknown here too.
#pragma once

#include <cstdint>
#include <optional>

namespace lily {

enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
  MXFP4 = 39,
};

struct GgmlTypeInfo {
  GgmlType type;
  const char* name;     // "Q4_K"
  int64_t block_size;   // values per block
  int64_t block_bytes;  // bytes per block
};

// The type with ggml id `id`; nullopt for an id ggml does not define.
std::optional<GgmlTypeInfo> ggml_type_info(uint32_t id);
const GgmlTypeInfo& ggml_type_info(GgmlType type);
const char* to_string(GgmlType type);

// Bytes of a row of `n` values; n must be a multiple of the type's block size.
int64_t ggml_row_bytes(GgmlType type, int64_t n);

}  // namespace lily
