// gemm.h: the fast CPU path's prefill product, y[t] = W x[t] for a block of n tokens, over
// affine-quantized weights with groups of 64 columns (4- or 8-bit codes; spec §5b):
//
//   y[t, r] = sum_g ( scale[r,g] unit[t,g] sum_{c in g} code[r,c] x16[t,c]  +  bias[r,g] qsum[t,g] )
//
// with x quantized per group of 64 to 16-bit integers as for the GEMV kernels (x16, unit, qsum:
// quantized_input.h, the same rounding and the same error bound).
//
// The tokens are prepared once per input (TokenBatch), for the kernel of the active instruction
// set:
//   avx512  a blocked GEMM (gemm_avx512.cpp): per panel of 16 rows of W, the codes are unpacked
//           once, 16 rows x 4 columns (one byte each) a register, and each register meets a tile
//           of up to kTokenTile tokens by vpdpbusd with those 4 columns of the token broadcast;
//           x16 = 256 a + b in two int8 halves (a, b in [-128, 127]), so a register costs 2
//           vpdpbusd a token, and the group's int32 sums 256 A + B are scaled into fp32 sums.
//   avx2    the integer GEMV kernel 4 tokens at a time (gemv_tokens_avx2_integer: each group's
//           codes loaded and split into nibbles once for the 4), x as QuantizedInput per token.
//   scalar  the GEMV kernel token by token (gemv.h).
// Matrices of other formats or group sizes have each row dequantized once a call.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "backend/cpu_fast/gemv.h"
#include "backend/cpu_fast/quantized_input.h"
#include "base/thread_team.h"
#include "model/weights.h"

namespace lily::cpu_fast {

// The columns of a group of 64 in the order a panel's unpacked registers take them: register
// i (0..15) of a group holds columns kQuadOrder[4 i .. 4 i + 3] of each row (gemm_avx512.cpp:
// i = 8 h + 2 d + n holds the low (n = 0) or high (n = 1) nibbles of the row's bytes
// 16 h + 4 d .. + 3, columns 32 h + 8 d + 2 j + n).
constexpr std::array<int, kInputGroup> make_quad_order() {
  std::array<int, kInputGroup> order{};
  for (int i = 0; i < kInputGroup / 4; ++i)
    for (int j = 0; j < 4; ++j) order[size_t(4 * i + j)] = 32 * (i / 8) + 8 * ((i / 2) % 4) + 2 * j + i % 2;
  return order;
}
inline constexpr std::array<int, kInputGroup> kQuadOrder = make_quad_order();

// Tokens a tile of a TokenBatch: the AVX-512 kernel meets a panel's registers with a tile of
// tokens at a time (3 accumulators a token).
constexpr int kTokenTile = 8;

// n rows of x [n, cols] prepared for products with matrices of `cols` columns.
struct TokenBatch {
  const float* x = nullptr;  // [n, cols] as given: the fallback for matrices the kernels do not take
  int64_t n = 0, cols = 0;
  bool tiled = false;  // which form below holds x (the active ISA's)
  // tiled: per tile of kTokenTile tokens (the last one narrower: w = min(8, n - 8 T)), the
  // tokens interleaved so that the kernel reads a tile through one pointer:
  //   quads  [tiles][groups][16][2][w]  the halves a (then b) of x16 of columns
  //                                     kQuadOrder[4 i .. 4 i + 3] of the group, 4 int8 an int32
  //   unit, qsum  [tiles][groups][w]
  // Tile T starts at 8 T * cols / 2 in quads and at 8 T * groups in unit and qsum.
  std::vector<int32_t> quads;
  std::vector<float> unit, qsum;
  std::vector<QuantizedInput> tokens;  // not tiled: [n] each token as the GEMV kernels take it
};

// Where token t's half (0: a, 1: b) of quad i of group g is in TokenBatch::quads, and its
// group's unit and qsum.
inline int64_t quad_index(const TokenBatch& b, int64_t t, int64_t g, int64_t i, int half) {
  const int64_t tile = t / kTokenTile, w = std::min<int64_t>(kTokenTile, b.n - tile * kTokenTile);
  return tile * kTokenTile * (b.cols / 2) + ((g * (kInputGroup / 4) + i) * 2 + half) * w + t % kTokenTile;
}
inline int64_t group_index(const TokenBatch& b, int64_t t, int64_t g) {
  const int64_t tile = t / kTokenTile, w = std::min<int64_t>(kTokenTile, b.n - tile * kTokenTile);
  return tile * kTokenTile * (b.cols / kInputGroup) + g * w + t % kTokenTile;
}

// Sizes `out` for n rows of x (cols a multiple of 64, else only the fallback is kept), then
// prepares rows [t0, t1): members of a region may each prepare their share after one reset.
void reset_tokens(const float* x, int64_t n, int64_t cols, TokenBatch& out);
void prepare_tokens(TokenBatch& out, int64_t t0, int64_t t1);
void prepare_tokens(const float* x, int64_t n, int64_t cols, TokenBatch& out);  // both, on this thread

// Rows `tokens` (indices into `from`, in order) copied into `out`, as if prepared from their
// rows, which are copied into `rows` [n, cols] (out.x).
void gather_tokens(const TokenBatch& from, const int32_t* tokens, int64_t n, TokenBatch& out, std::vector<float>& rows);

// Whether the integer kernels take W: affine with groups of 64. Other matrices have each row
// dequantized once a call, against every token's fp32 row.
bool gemm_supported(const Matrix& W);

// One thread's buffers for the AVX-512 kernel: a panel of W unpacked (grows to the widest W).
struct GemmScratch {
  std::vector<uint8_t> panel;         // [groups, 16, 64] the unpacked codes
  std::vector<float> scales, biases;  // [groups, 16]
  std::vector<uint8_t> rows;          // [16, row bytes] a short panel's codes
  std::vector<bf16> params;           // [2, 16, groups] a short panel's scales and biases
};

// Rows [r0, r1) of y[t * y_stride + r] = W x[t] for the n tokens of x (x prepared for W.cols).
// `then`: the matrix this thread multiplies next, whose first rows are fetched ahead.
void gemm_rows(const Matrix& W, const TokenBatch& x, int64_t r0, int64_t r1, float* y, int64_t y_stride,
               GemmScratch& scratch, const Matrix* then = nullptr);

// A product whose tokens are prepared: y [x->n, W->rows].
struct PreparedGemm {
  const Matrix* W;
  const TokenBatch* x;
  float* y;
};
// Inside a parallel region: this member's share of the rows of all the products (whole panels
// of 16 rows, split by weights read), each against all its tokens.
void gemm_share(const PreparedGemm* products, size_t count, const ThreadTeam::Member& member, GemmScratch& scratch);

// y[T, W.rows] = x[T, W.cols] W^T as one region of cpu_team(): the members prepare their share
// of the tokens, then take their share of W's panels. The buffers are the caller's.
void gemm_parallel(const Matrix& W, const float* x, int64_t T, float* y, TokenBatch& batch,
                   std::vector<GemmScratch>& scratch);

// The same for T = 1 through the GEMV kernels (gemv_parallel), for T > 1 gemm_parallel; with
// buffers of its own for T > 1 (tests, tools: the backend keeps them).
void linear(const Matrix& W, const float* x, int64_t T, float* y, GemvScratch& scratch);
void linear(const Matrix& W, const float* x, int64_t T, float* y);

}  // namespace lily::cpu_fast

namespace lily::cpu_fast::detail {
// The AVX-512 kernel (gemm_avx512.cpp): only called where isa_supported(Isa::avx512), for W
// with gemm_supported(W) and x tiled.
void gemm_rows_avx512(const Matrix& W, const TokenBatch& x, int64_t r0, int64_t r1, float* y, int64_t y_stride,
                      GemmScratch& scratch, const Matrix* then);
// Any matrix: rows dequantized once, then dot products with the n rows of x [n, W.cols].
void gemm_rows_dequantizing(const Matrix& W, const float* x, int64_t n, int64_t r0, int64_t r1, float* y,
                            int64_t y_stride);
}  // namespace lily::cpu_fast::detail
