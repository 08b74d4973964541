// gguf_dequant.cpp: the reference decoders of ggml's block formats (gguf_dequant.h): one plain
// function per block type, one block at a time.
#include "model/gguf_dequant.h"

#include <cstring>

#include "base/bf16.h"
#include "base/error.h"

namespace lily {

namespace {

float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return half_to_float(h);
}

// block_q4_0 { f16 d; u8 qs[16]; }
void q4_0_block(const uint8_t* b, float* y) {
  const float d = f16_at(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * float((qs[j] & 0xF) - 8);
    y[j + 16] = d * float((qs[j] >> 4) - 8);
  }
}

// block_q4_1 { f16 d; f16 m; u8 qs[16]; }
void q4_1_block(const uint8_t* b, float* y) {
  const float d = f16_at(b), m = f16_at(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * float(qs[j] & 0xF) + m;
    y[j + 16] = d * float(qs[j] >> 4) + m;
  }
}

// The 5-bit codes of Q5_0 / Q5_1: value j (0..15) is the low nibble of qs[j] with bit j of qh
// above it, value j + 16 the high nibble with bit j + 16.
void q5_codes(const uint8_t* qh_bytes, const uint8_t* qs, int* q) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, 4);
  for (int j = 0; j < 16; ++j) {
    q[j] = (qs[j] & 0xF) | int((qh >> j) & 1) << 4;
    q[j + 16] = (qs[j] >> 4) | int((qh >> (j + 16)) & 1) << 4;
  }
}

// block_q5_0 { f16 d; u8 qh[4]; u8 qs[16]; }   x = d (q - 16)
void q5_0_block(const uint8_t* b, float* y) {
  const float d = f16_at(b);
  int q[32];
  q5_codes(b + 2, b + 6, q);
  for (int j = 0; j < 32; ++j) y[j] = d * float(q[j] - 16);
}

// block_q5_1 { f16 d; f16 m; u8 qh[4]; u8 qs[16]; }   x = d q + m
void q5_1_block(const uint8_t* b, float* y) {
  const float d = f16_at(b), m = f16_at(b + 2);
  int q[32];
  q5_codes(b + 4, b + 8, q);
  for (int j = 0; j < 32; ++j) y[j] = d * float(q[j]) + m;
}

// block_iq4_nl { f16 d; u8 qs[16]; }   x = d kIq4nl[q]
void iq4_nl_block(const uint8_t* b, float* y) {
  const float d = f16_at(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * float(kIq4nlValues[qs[j] & 0xF]);
    y[j + 16] = d * float(kIq4nlValues[qs[j] >> 4]);
  }
}

// block_q8_0 { f16 d; i8 qs[32]; }
void q8_0_block(const uint8_t* b, float* y) {
  const float d = f16_at(b);
  for (int j = 0; j < 32; ++j) y[j] = d * float(int8_t(b[2 + j]));
}

// block_q4_K { f16 d; f16 dmin; u8 scales[12]; u8 qs[128]; }
void q4_k_block(const uint8_t* b, float* y) {
  const float d = f16_at(b), dmin = f16_at(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qs = b + 16;
  for (int i = 0; i < 4; ++i) {  // 64 values: sub-blocks 2i (low nibbles) and 2i + 1 (high)
    uint8_t sc0, m0, sc1, m1;
    gguf_scale_min_k4(2 * i, scales, &sc0, &m0);
    gguf_scale_min_k4(2 * i + 1, scales, &sc1, &m1);
    for (int l = 0; l < 32; ++l) {
      y[64 * i + l] = d * float(sc0) * float(qs[32 * i + l] & 0xF) - dmin * float(m0);
      y[64 * i + 32 + l] = d * float(sc1) * float(qs[32 * i + l] >> 4) - dmin * float(m1);
    }
  }
}

// block_q5_K { f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]; }
void q5_k_block(const uint8_t* b, float* y) {
  const float d = f16_at(b), dmin = f16_at(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + 48;
  for (int i = 0; i < 4; ++i) {
    uint8_t sc0, m0, sc1, m1;
    gguf_scale_min_k4(2 * i, scales, &sc0, &m0);
    gguf_scale_min_k4(2 * i + 1, scales, &sc1, &m1);
    for (int l = 0; l < 32; ++l) {
      const int lo = (qs[32 * i + l] & 0xF) | ((qh[l] >> (2 * i)) & 1) << 4;
      const int hi = (qs[32 * i + l] >> 4) | ((qh[l] >> (2 * i + 1)) & 1) << 4;
      y[64 * i + l] = d * float(sc0) * float(lo) - dmin * float(m0);
      y[64 * i + 32 + l] = d * float(sc1) * float(hi) - dmin * float(m1);
    }
  }
}

// block_q6_K { u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d; }. Each half of 128 values uses 64
// bytes of ql and 32 of qh: value l + 32k (k = 0..3, l = 0..31) takes the low (k = 0, 1) or
// high (k = 2, 3) nibble of ql[l + 32 (k % 2)] and bits 2k..2k+1 of qh[l]; its scale is
// scales[8 * half + 2k + l / 16].
void q6_k_block(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = f16_at(b + 208);
  for (int half = 0; half < 2; ++half) {
    for (int l = 0; l < 32; ++l) {
      const int q[4] = {
          (ql[l] & 0xF) | ((qh[l] >> 0) & 3) << 4,
          (ql[l + 32] & 0xF) | ((qh[l] >> 2) & 3) << 4,
          (ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4,
          (ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4,
      };
      for (int k = 0; k < 4; ++k) y[32 * k + l] = d * float(sc[2 * k + l / 16]) * float(q[k] - 32);
    }
    y += 128, ql += 64, qh += 32, sc += 8;
  }
}

// block_iq4_xs { f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]; }
void iq4_xs_block(const uint8_t* b, float* y) {
  const float d = f16_at(b);
  uint16_t scales_h;
  std::memcpy(&scales_h, b + 2, 2);
  const uint8_t* scales_l = b + 4;
  const uint8_t* qs = b + 8;
  for (int s = 0; s < 8; ++s) {
    const int ls = ((scales_l[s / 2] >> (4 * (s % 2))) & 0xF) | ((scales_h >> (2 * s)) & 3) << 4;
    const float dl = d * float(ls - 32);
    for (int j = 0; j < 16; ++j) {
      y[32 * s + j] = dl * float(kIq4nlValues[qs[16 * s + j] & 0xF]);
      y[32 * s + j + 16] = dl * float(kIq4nlValues[qs[16 * s + j] >> 4]);
    }
  }
}

using BlockFn = void (*)(const uint8_t*, float*);

BlockFn block_decoder(GgmlType type) {
  switch (type) {
    case GgmlType::Q4_0: return q4_0_block;
    case GgmlType::Q4_1: return q4_1_block;
    case GgmlType::Q5_0: return q5_0_block;
    case GgmlType::Q5_1: return q5_1_block;
    case GgmlType::IQ4_NL: return iq4_nl_block;
    case GgmlType::Q8_0: return q8_0_block;
    case GgmlType::Q4_K: return q4_k_block;
    case GgmlType::Q5_K: return q5_k_block;
    case GgmlType::Q6_K: return q6_k_block;
    case GgmlType::IQ4_XS: return iq4_xs_block;
    default: return nullptr;
  }
}

}  // namespace

bool gguf_dequant_supported(GgmlType type) {
  return type == GgmlType::F32 || type == GgmlType::F16 || type == GgmlType::BF16 || block_decoder(type) != nullptr;
}

void dequantize_gguf_row(GgmlType type, const void* row, int64_t n, float* out) {
  const auto* p = static_cast<const uint8_t*>(row);
  switch (type) {
    case GgmlType::F32: std::memcpy(out, p, size_t(n) * 4); return;
    case GgmlType::F16:
      for (int64_t i = 0; i < n; ++i) out[i] = f16_at(p + 2 * i);
      return;
    case GgmlType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        bf16 v;
        std::memcpy(&v, p + 2 * i, 2);
        out[i] = to_float(v);
      }
      return;
    default: break;
  }
  const BlockFn decode = block_decoder(type);
  if (!decode) fail("lily cannot decode ggml type {} yet", to_string(type));
  const GgmlTypeInfo& info = ggml_type_info(type);
  LILY_CHECK(n % info.block_size == 0, "a {} row holds whole blocks of {} values, not {}", info.name, info.block_size,
             n);
  for (int64_t b = 0; b < n / info.block_size; ++b) decode(p + b * info.block_bytes, out + b * info.block_size);
}

}  // namespace lily
