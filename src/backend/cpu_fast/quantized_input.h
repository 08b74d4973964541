// quantized_input.h: an activation row x prepared once for every GEMV that reads it.
//
// The integer kernels take x quantized per group of 64 columns (the weights' group) to 16-bit
// integers made of two int8 halves, so that byte-wide dot products (vpdpbusd, vpmaddubsw) take
// them:
//
//   unit[g] = max_{c in g} |x[c]| / 32258      x16[c] = round(x[c] / unit[g])  in [-32258, 32258]
//   x16[c] = 254 a[c] + b[c]  with  a[c] = round(x16[c] / 254),  so a, b in [-127, 127]
//   |x[c] - unit[g] x16[c]| <= unit[g] / 2
//
// For a weight row w = scale * code + bias (spec §5b), over a group:
//
//   sum_c w[c] x[c]  ~  scale unit sum_c code[c] x16[c]  +  bias unit sum_c x16[c]
//                     =  scale unit (254 sum_c code a + sum_c code b)  +  bias qsum
//
// with the integer sums exact in int32. The error is sum_c w[c] (x[c] - unit x16[c]), at most
// unit / 2 * sum_c |w[c]| per group: about 2^-16 of the group's largest |x| times sum |w|, the
// precision of 16-bit activations (the bound tests/cpu_fast/test_gemv.cpp checks). One int8
// half alone (x ~ 254 unit a) was tried first: it moved lily-tiny's logits by 8-13% of their
// largest value (the routers' top-k flipped), far outside the bar of 1%.
#pragma once

#include <cstdint>
#include <vector>

namespace lily::cpu_fast {

// Columns per quantization group of x: the integer kernels take weights of this group size.
constexpr int kInputGroup = 64;

struct QuantizedInput {
  const float* x = nullptr;  // [cols] as given: the fp32 kernels read it
  int64_t cols = 0;
  int group_size = 0;        // the sums' group (any multiple of 16); 64 when quantized
  bool quantized = false;    // whether the fields below `sum` hold x (group_size == 64)
  std::vector<float> sum;    // [groups rounded up to 16] sum of x over each group; 0 in the padding
  std::vector<float> unit;   // [groups rounded up to 16] unit[g]; 0 in the padding
  std::vector<float> qsum;   // [groups rounded up to 16] unit[g] * sum of x16 over the group
  std::vector<int16_t> x16;  // [cols] x16 in column order
  // [cols rounded up to 128] a and b in the order of 4-bit codes' nibbles: per block of 128
  // columns from B, the columns of the low nibbles of its 64 code bytes (B, B+2, .., B+126)
  // then those of the high nibbles (B+1, B+3, .., B+127); 0 in the padding.
  std::vector<int8_t> a_nibbles, b_nibbles;
};

// Prepares x [cols] for matrices of `group_size` (cols a multiple of it); reuses out's buffers.
// The integer part is filled when group_size == kInputGroup.
void quantize_input(const float* x, int64_t cols, int group_size, QuantizedInput& out);

// The same in two steps, for x written by several threads: reset_input sizes the buffers (and
// zeroes the padding), then quantize_groups fills groups [g0, g1) of x (read from out.x), so
// threads that wrote disjoint groups can each quantize their own.
void reset_input(const float* x, int64_t cols, int group_size, QuantizedInput& out);
void quantize_groups(QuantizedInput& out, int64_t g0, int64_t g1);

}  // namespace lily::cpu_fast
