// gguf_dequant.h: ggml's block formats decoded to float, written from their definitions (the
// block_* structs of ggml-common.h); the reference the fast kernels are tested against.
//
// d, dmin: f16 scales; q: the codes; a row of n values is n / QK blocks, in order.
//   F32, F16, BF16  plain values
//   Q4_0   32 values, 18 B: d, qs[16]     x[j] = d (lo4(qs[j]) - 8), x[j+16] = d (hi4(qs[j]) - 8)
//   Q4_1   32 values, 20 B: d, m, qs[16]  x[j] = d lo4(qs[j]) + m, x[j+16] = d hi4(qs[j]) + m
//   Q5_0   32 values, 22 B: d, qh (u32), qs[16]   q[j] = lo4(qs[j]) | bit j of qh << 4,
//          q[j+16] = hi4(qs[j]) | bit j+16 of qh << 4;  x = d (q - 16)
//   Q5_1   32 values, 24 B: d, m, qh, qs[16]      the same codes;  x = d q + m
//   IQ4_NL 32 values, 18 B: d, qs[16]     x[j] = d kIq4nl[lo4(qs[j])], x[j+16] = d kIq4nl[hi4(qs[j])]
//   (llama-quantize writes Q5_0 / Q5_1 / IQ4_NL for the rows a Q4_K / Q5_K / IQ4_XS block of
//   256 does not divide; the fast CPU path decodes them row by row, gemv_rows_dequantizing)
//   Q8_0   32 values, 34 B: d, qs[32]     x[j] = d qs[j] (int8)
//   Q4_K  256 values, 144 B: d, dmin, scales[12], qs[128]; 8 sub-blocks of 32, each a 6-bit scale
//         sc and min m (get_scale_min_k4 below):  x = d sc q - dmin m,  q 4-bit; sub-blocks
//         2i and 2i+1 take the low and high nibbles of qs[32i .. 32i+32)
//   Q5_K  256 values, 176 B: d, dmin, scales[12], qh[32], qs[128]; Q4_K with a 5th bit per
//         value: bit (sub-block) of qh[j] for value j of that sub-block
//   Q6_K  256 values, 210 B: ql[128], qh[64], scales[16] (int8), d; 16 sub-blocks of 16:
//         x = d scales[s] (q - 32), q = 4 bits of ql | 2 bits of qh << 4 (layout in the .cpp)
//   IQ4_XS 256 values, 136 B: d, scales_h (u16), scales_l[4], qs[128]; 8 sub-blocks of 32, a
//         6-bit scale ls = lo4 | 2 bits of scales_h << 4:  x = d (ls - 32) kIq4nl[q], q 4-bit
#pragma once

#include <cstdint>

#include "model/gguf_types.h"

namespace lily {

// The non-uniform 4-bit grid of IQ4_NL and IQ4_XS (ggml's kvalues_iq4nl).
inline constexpr int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

// Whether dequantize_gguf_row decodes `type`.
bool gguf_dequant_supported(GgmlType type);

// Decodes a row of n values (n a multiple of the type's block size) stored at `row`.
void dequantize_gguf_row(GgmlType type, const void* row, int64_t n, float* out);

// Q4_K / Q5_K: sub-block j's (0..7) 6-bit scale and min from the 12 packed bytes (ggml's
// get_scale_min_k4). Sub-blocks 0-3: the low 6 bits of bytes j and j + 4. Sub-blocks 4-7: a
// nibble of byte j + 4 with the top 2 bits of bytes j - 4 (scale) and j (min) above it.
inline void gguf_scale_min_k4(int j, const uint8_t* q, uint8_t* scale, uint8_t* min) {
  if (j < 4) {
    *scale = q[j] & 63;
    *min = q[j + 4] & 63;
  } else {
    *scale = uint8_t((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *min = uint8_t((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

}  // namespace lily
