// gguf_quantize.h: simple reference quantizers for ggml's block formats, for the tests: written
// from the block definitions (not from the decoder in src/model/gguf_dequant.cpp), round to
// nearest, scales chosen so every value is in range. Not ggml's quantizers (those search for
// better scales); a file they write decodes the same way.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "model/gguf_dequant.h"
#include "model/gguf_types.h"

namespace lily::test {

inline uint16_t to_f16_bits(float f) {
  _Float16 h = static_cast<_Float16>(f);
  uint16_t bits;
  std::memcpy(&bits, &h, 2);
  return bits;
}
inline float f16_round(float f) { return float(static_cast<_Float16>(f)); }
inline void put_f16(uint8_t* p, float f) {
  uint16_t h = to_f16_bits(f);
  std::memcpy(p, &h, 2);
}

inline float max_abs(const float* x, int n) {
  float m = 0;
  for (int i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i]));
  return m;
}

inline void quantize_q8_0_block(const float* x, uint8_t* b) {
  const float d = f16_round(max_abs(x, 32) / 127);
  put_f16(b, d);
  for (int j = 0; j < 32; ++j)
    b[2 + j] = uint8_t(int8_t(d == 0 ? 0 : std::clamp(int(std::lround(x[j] / d)), -127, 127)));
}

inline void quantize_q4_0_block(const float* x, uint8_t* b) {
  const float d = f16_round(max_abs(x, 32) / 7);
  put_f16(b, d);
  auto code = [&](float v) { return d == 0 ? 8 : std::clamp(int(std::lround(v / d)) + 8, 0, 15); };
  for (int j = 0; j < 16; ++j) b[2 + j] = uint8_t(code(x[j]) | code(x[j + 16]) << 4);
}

// Q4_K / Q5_K scales: 8 six-bit (scale, min) pairs packed into 12 bytes. Bytes 0-3: scale j
// (j < 4) in the low 6 bits, the top 2 bits of scale j + 4 above; bytes 4-7: the same for the
// mins; bytes 8-11: the low nibbles of scale j + 4 and min j + 4.
inline void pack_scales_k4(const int* sc, const int* m, uint8_t* out) {
  for (int j = 0; j < 4; ++j) {
    out[j] = uint8_t((sc[j] & 63) | (sc[j + 4] >> 4) << 6);
    out[j + 4] = uint8_t((m[j] & 63) | (m[j + 4] >> 4) << 6);
    out[j + 8] = uint8_t((sc[j + 4] & 0xF) | (m[j + 4] & 0xF) << 4);
  }
}

// Q4_K (levels 15) and Q5_K (levels 31): per sub-block of 32, x ~ d sc q - dmin m with the
// sub-block's minimum at q = 0; the 6-bit sc rounded up so the maximum stays in range.
inline void quantize_k_block(const float* x, uint8_t* b, int levels) {
  float scale[8], mn[8];
  for (int s = 0; s < 8; ++s) {
    float lo = 0, hi = 0;
    for (int j = 0; j < 32; ++j) lo = std::min(lo, x[32 * s + j]), hi = std::max(hi, x[32 * s + j]);
    mn[s] = -lo;
    scale[s] = (hi - lo) / float(levels);
  }
  const float d = f16_round(*std::max_element(scale, scale + 8) / 63);
  const float dmin = f16_round(*std::max_element(mn, mn + 8) / 63);
  int sc[8], m[8];
  for (int s = 0; s < 8; ++s) {
    sc[s] = d == 0 ? 0 : std::min(63, int(std::ceil(scale[s] / d)));
    m[s] = dmin == 0 ? 0 : std::min(63, int(std::lround(mn[s] / dmin)));
  }
  put_f16(b, d);
  put_f16(b + 2, dmin);
  pack_scales_k4(sc, m, b + 4);
  uint8_t* qh = b + 16;
  uint8_t* qs = b + (levels == 31 ? 48 : 16);
  if (levels == 31) std::memset(qh, 0, 32);
  for (int s = 0; s < 8; ++s) {
    const float step = d * float(sc[s]), offset = dmin * float(m[s]);
    for (int l = 0; l < 32; ++l) {
      const int q = step == 0 ? 0 : std::clamp(int(std::lround((x[32 * s + l] + offset) / step)), 0, levels);
      // Value l of sub-block s: byte 32 (s / 2) + l, low nibble for even s; the fifth bit in
      // bit s of qh[l].
      uint8_t& byte = qs[32 * (s / 2) + l];
      if (s % 2 == 0) byte = uint8_t((byte & 0xF0) | (q & 0xF));
      else byte = uint8_t((byte & 0x0F) | (q & 0xF) << 4);
      if (levels == 31) qh[l] = uint8_t(qh[l] | ((q >> 4) & 1) << s);
    }
  }
}

// Q6_K: 16 sub-blocks of 16, x ~ d sc (q - 32), q in [0, 63], sc int8.
inline void quantize_q6_k_block(const float* x, uint8_t* b) {
  float scale[16];
  for (int s = 0; s < 16; ++s) scale[s] = max_abs(x + 16 * s, 16) / 31;
  const float d = f16_round(*std::max_element(scale, scale + 16) / 127);
  uint8_t* ql = b;
  uint8_t* qh = b + 128;
  auto* sc = reinterpret_cast<int8_t*>(b + 192);
  std::memset(b, 0, 192);
  for (int s = 0; s < 16; ++s) sc[s] = int8_t(d == 0 ? 0 : std::min(127, int(std::ceil(scale[s] / d))));
  put_f16(b + 208, d);
  for (int v = 0; v < 256; ++v) {
    const float step = d * float(sc[v / 16]);
    const int q = (step == 0 ? 0 : std::clamp(int(std::lround(x[v] / step)), -32, 31)) + 32;
    // Value v: half v / 128; within it k = (v % 128) / 32, l = v % 32: a nibble of
    // ql[64 half + l + 32 (k % 2)] (low for k < 2), bits 2k of qh[32 half + l].
    const int half = v / 128, k = (v % 128) / 32, l = v % 32;
    uint8_t& byte = ql[64 * half + l + 32 * (k % 2)];
    byte = uint8_t(byte | (q & 0xF) << (k < 2 ? 0 : 4));
    qh[32 * half + l] = uint8_t(qh[32 * half + l] | (q >> 4) << (2 * k));
  }
}

// IQ4_XS: per sub-block of 32 a 6-bit scale ls (x ~ d (ls - 32) grid[q]), the nearest grid value.
inline void quantize_iq4_xs_block(const float* x, uint8_t* b) {
  float scale[8];
  for (int s = 0; s < 8; ++s) scale[s] = max_abs(x + 32 * s, 32) / 127;
  const float d = f16_round(*std::max_element(scale, scale + 8) / 31);
  put_f16(b, d);
  uint16_t scales_h = 0;
  std::memset(b + 4, 0, 4);
  for (int s = 0; s < 8; ++s) {
    const int ls = d == 0 ? 32 : std::min(63, 32 + int(std::ceil(scale[s] / d)));
    b[4 + s / 2] = uint8_t(b[4 + s / 2] | (ls & 0xF) << (4 * (s % 2)));
    scales_h = uint16_t(scales_h | (ls >> 4) << (2 * s));
    const float dl = d * float(ls - 32);
    for (int j = 0; j < 16; ++j) {
      int q[2];
      for (int h = 0; h < 2; ++h) {
        float best = INFINITY;
        for (int c = 0; c < 16; ++c) {
          const float e = std::fabs(x[32 * s + j + 16 * h] - dl * float(kIq4nlValues[c]));
          if (e < best) best = e, q[h] = c;
        }
      }
      b[8 + 16 * s + j] = uint8_t(q[0] | q[1] << 4);
    }
  }
  std::memcpy(b + 2, &scales_h, 2);
}

// A row of n values (whole blocks) in `type`: F32, F16, BF16 stored as such, the others through
// the block quantizers above.
inline std::vector<uint8_t> quantize_gguf_row(GgmlType type, const float* x, int64_t n) {
  const GgmlTypeInfo& info = ggml_type_info(type);
  std::vector<uint8_t> out(size_t(n / info.block_size * info.block_bytes));
  for (int64_t b = 0; b < n / info.block_size; ++b) {
    const float* xb = x + b * info.block_size;
    uint8_t* ob = out.data() + b * info.block_bytes;
    switch (type) {
      case GgmlType::F32: std::memcpy(ob, xb, 4); break;
      case GgmlType::F16: put_f16(ob, *xb); break;
      case GgmlType::BF16: {
        uint32_t u;
        std::memcpy(&u, xb, 4);
        const uint16_t h = uint16_t((u + 0x7FFF + ((u >> 16) & 1)) >> 16);  // round to nearest even
        std::memcpy(ob, &h, 2);
        break;
      }
      case GgmlType::Q8_0: quantize_q8_0_block(xb, ob); break;
      case GgmlType::Q4_0: quantize_q4_0_block(xb, ob); break;
      case GgmlType::Q4_K: quantize_k_block(xb, ob, 15); break;
      case GgmlType::Q5_K: quantize_k_block(xb, ob, 31); break;
      case GgmlType::Q6_K: quantize_q6_k_block(xb, ob); break;
      case GgmlType::IQ4_XS: quantize_iq4_xs_block(xb, ob); break;
      default: throw std::runtime_error("quantize_gguf_row: no quantizer for this type");
    }
  }
  return out;
}

// The types both the reference decoder and the fast kernels take.
inline constexpr GgmlType kGgufTestTypes[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16,
                                              GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_K,
                                              GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_XS};

}  // namespace lily::test
