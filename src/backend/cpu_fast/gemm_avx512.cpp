// gemm_avx512.cpp: the prefill product on AVX-512 F + BW + VL + VNNI (gemm.h has the formula).
//
// Per panel of 16 rows of W:
//   1. unpack, group by group: the codes to 16 registers a group of 64 columns, register i
//      holding for each row j (dword j) the codes of the 4 columns kQuadOrder[4 i ..] as bytes.
//      4-bit: the 32 bytes of 4 rows (4 q + m, q = 0..3) go to the lanes of 2 registers
//      (vinserti64x4, vshufi64x2), a 4 x 4 transpose of dwords within the lanes (vpunpck*dq,
//      *qdq) gathers 4 bytes of every row, and their nibbles are split (and, shift): 24
//      shuffles and 24 logic operations a group. 8-bit: even and odd bytes deinterleaved first
//      (vpshufb), so both widths take the same columns.
//   2. products, a tile of up to kTokenTile = 8 tokens at a time: per group and token, 16
//      vpdpbusd of the registers with the token's half a and 16 with its half b (4 columns of
//      int8 broadcast from memory), then
//        acc += float(256 A + B) * scale * unit[t,g] + bias * qsum[t,g]
//      (shift, add, convert, multiply, 2 FMA): 32 vpdpbusd and 6 other operations a token and
//      group of 16 rows. The first tile unpacks each group just before its products, so the
//      shuffles of one overlap the multiplications of the last; later tiles reload them.
// The integer sums are exact: |code| <= 255, |a|, |b| <= 128, 64 products < 2^31.
// g++ 12 reports the deliberately undefined registers inside its own AVX-512 intrinsics
// (_mm512_undefined_*) as maybe-uninitialized or uninitialized (GCC PR 105593, fixed in g++ 13);
// the pragmas must be in force where the header is read.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <utility>

#include "backend/cpu_fast/gemm.h"

#define LILY_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))

namespace lily::cpu_fast::detail {

namespace {

constexpr int64_t kPanel = 16;  // rows of W a panel (the dwords of a register)
constexpr int kPerGroup = 16;   // unpacked registers a group of 64 columns
constexpr int64_t kAhead = 2;   // panels between the one read and the one fetched

// A span of memory the next panel reads, prefetched towards L2 a slice per group of this one.
struct Ahead {
  const char* p = nullptr;
  int64_t lines = 0, per_group = 0;  // 64-byte lines, and how many a group
};

Ahead ahead_of(const void* p, int64_t bytes, int64_t groups) {
  const int64_t lines = (bytes + 63) / 64;
  return {static_cast<const char*>(p), lines, (lines + groups - 1) / groups};
}

// A panel's 16 rows read 16 short streams at once, more than the hardware prefetchers follow
// from memory (an expert's matrix is read once per prefill): each group of this panel fetches
// its slice of the next panel's codes, scales and biases, a panel's work (~6 K cycles) ahead.
LILY_AVX512 inline void prefetch_slice(const Ahead& a, int64_t g) {
  for (int64_t l = g * a.per_group, end = std::min(a.lines, l + a.per_group); l < end; ++l)
    _mm_prefetch(a.p + 64 * l, _MM_HINT_T1);
}

// r[m] (m = 0..3): lane q holds 4 dwords of row 4 q + m. out[d]: lane q holds dword d of rows
// 4 q + 0..3, so dword 4 q + m of out[d] is row 4 q + m's dword d.
LILY_AVX512 inline void transpose_dwords(const __m512i r[4], __m512i out[4]) {
  const __m512i u01l = _mm512_unpacklo_epi32(r[0], r[1]), u01h = _mm512_unpackhi_epi32(r[0], r[1]);
  const __m512i u23l = _mm512_unpacklo_epi32(r[2], r[3]), u23h = _mm512_unpackhi_epi32(r[2], r[3]);
  out[0] = _mm512_unpacklo_epi64(u01l, u23l);
  out[1] = _mm512_unpackhi_epi64(u01l, u23l);
  out[2] = _mm512_unpacklo_epi64(u01h, u23h);
  out[3] = _mm512_unpackhi_epi64(u01h, u23h);
}

// 32 bytes from each of p and q: [p | q].
LILY_AVX512 inline __m512i load_rows32(const uint8_t* p, const uint8_t* q) {
  const __m256i first = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_inserti64x4(_mm512_castsi256_si512(first), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)), 1);
}

// 4-bit group g of the panel (32 bytes a row) to its 16 registers out[16]. Rows 4 q + m (q = 0..3)
// go to the 4 lanes of z[h][m], h = 0 their first 16 bytes, h = 1 the next; after the
// transpose, register d of h holds every row's bytes 16 h + 4 d .. + 3, whose low nibbles are
// columns 32 h + 8 d + 2 j (register 8 h + 2 d) and high nibbles those + 1 (8 h + 2 d + 1).
LILY_AVX512 inline void unpack_group_q4(const uint8_t* codes, int64_t stride, int64_t g, __m512i* out) {
  const uint8_t* p = codes + g * 32;  // row j's bytes of the group at p + j * stride
  __m512i z[2][4];
  for (int m = 0; m < 4; ++m) {
    const __m512i a = load_rows32(p + m * stride, p + (4 + m) * stride);
    const __m512i b = load_rows32(p + (8 + m) * stride, p + (12 + m) * stride);
    z[0][m] = _mm512_shuffle_i64x2(a, b, 0x88);  // lanes: rows m, 4 + m, 8 + m, 12 + m, bytes 0..15
    z[1][m] = _mm512_shuffle_i64x2(a, b, 0xDD);  // bytes 16..31
  }
  const __m512i nibbles = _mm512_set1_epi8(0x0F);
  for (int h = 0; h < 2; ++h) {
    __m512i d[4];
    transpose_dwords(z[h], d);
    for (int k = 0; k < 4; ++k) {
      out[8 * h + 2 * k] = _mm512_and_si512(d[k], nibbles);
      out[8 * h + 2 * k + 1] = _mm512_and_si512(_mm512_srli_epi16(d[k], 4), nibbles);
    }
  }
}

// 8-bit group g (64 bytes a row: lanes s = 0..3 are columns 16 s .. 16 s + 15) to its 16
// registers out[16]. Within each 8 bytes (columns 8 c ..), the even bytes then the odd (vpshufb), so
// that after the transpose the dwords are columns 8 c + 2 j + n: kQuadOrder with 32 h + 8 d =
// 8 c.
LILY_AVX512 inline void unpack_group_q8(const uint8_t* codes, int64_t stride, int64_t g, __m512i* out) {
  const uint8_t* p = codes + g * 64;  // row j's bytes of the group at p + j * stride
  const __m512i split = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15));
  __m512i lanes[4][4];  // [s][m]: lane q holds lane s of row 4 q + m, its bytes split
  for (int m = 0; m < 4; ++m) {
    __m512i v[4];
    for (int q = 0; q < 4; ++q) v[q] = _mm512_shuffle_epi8(_mm512_loadu_si512(p + (4 * q + m) * stride), split);
    const __m512i t0 = _mm512_shuffle_i64x2(v[0], v[1], 0x44), t1 = _mm512_shuffle_i64x2(v[0], v[1], 0xEE);
    const __m512i t2 = _mm512_shuffle_i64x2(v[2], v[3], 0x44), t3 = _mm512_shuffle_i64x2(v[2], v[3], 0xEE);
    lanes[0][m] = _mm512_shuffle_i64x2(t0, t2, 0x88);
    lanes[1][m] = _mm512_shuffle_i64x2(t0, t2, 0xDD);
    lanes[2][m] = _mm512_shuffle_i64x2(t1, t3, 0x88);
    lanes[3][m] = _mm512_shuffle_i64x2(t1, t3, 0xDD);
  }
  for (int s = 0; s < 4; ++s) {  // lane s: columns 8 c + 2 j + n for c = 2 s (dwords 0, 1), 2 s + 1 (2, 3)
    __m512i d[4];
    transpose_dwords(lanes[s], d);
    for (int k = 0; k < 4; ++k) out[4 * s + k] = d[k];
  }
}

// scales or biases [rows, groups] bf16 of the panel's 16 rows (row j at params + j * groups)
// to [groups, 16] fp32, 8 groups at a time: the 16 bytes of rows 4 q + m (q = 0..3) in the
// lanes of one register per m, a transpose of dwords within the lanes (transpose_dwords), and
// dword j of register p holds row j's groups 2 p (low half) and 2 p + 1 (high half), widened
// by a shift or a mask.
LILY_AVX512 void unpack_params(const bf16* params, int64_t groups, float* out) {
  for (int64_t g0 = 0; g0 < groups; g0 += 8) {
    const int64_t n = std::min<int64_t>(8, groups - g0);
    const __mmask8 mask = __mmask8((1u << n) - 1u);
    __m512i z[4], d[4];
    for (int m = 0; m < 4; ++m) {
      // rows m, 4 + m, 8 + m, 12 + m into lanes 0..3 (immediates spelled out: -O2 does not unroll)
      const bf16* r = params + m * groups + g0;
      const int64_t q = 4 * groups;
      __m512i v = _mm512_zextsi128_si512(_mm_maskz_loadu_epi16(mask, r));
      v = _mm512_inserti32x4(v, _mm_maskz_loadu_epi16(mask, r + q), 1);
      v = _mm512_inserti32x4(v, _mm_maskz_loadu_epi16(mask, r + 2 * q), 2);
      z[m] = _mm512_inserti32x4(v, _mm_maskz_loadu_epi16(mask, r + 3 * q), 3);
    }
    transpose_dwords(z, d);
    for (int64_t p = 0; 2 * p < n; ++p) {
      _mm512_store_ps(out + (g0 + 2 * p) * kPanel, _mm512_castsi512_ps(_mm512_slli_epi32(d[p], 16)));
      if (2 * p + 1 < n)
        _mm512_store_ps(out + (g0 + 2 * p + 1) * kPanel,
                        _mm512_castsi512_ps(_mm512_and_si512(d[p], _mm512_set1_epi32(-65536))));
    }
  }
}

// The panel: its 16 rows' codes (row j at codes + j * stride), and where their unpacked
// registers go.
struct Panel {
  const uint8_t* row0;
  int64_t stride;
  __m512i* codes;                // [groups][16]
  const float *scales, *biases;  // [groups][16]
  int64_t groups;
  Ahead next[3];  // the next panel's codes, scales, biases (lines 0 when there is none)
};

// y[t * y_stride + j] for the panel's rows j < `rows` and a tile of kTokens tokens (x: the
// tile's quads [groups][16][2][kTokens], unit and qsum [groups][kTokens]). kBits 4 or 8: each
// group is unpacked just before its products (the first tile), and kept in the panel's
// registers when kStore (more tiles follow); 0: they are unpacked. A vpdpbusd waits ~4 cycles
// for its accumulator: fewer than 3 tokens split each sum in kSplit.
template <int kTokens, int kBits, bool kStore>
LILY_AVX512 void panel_tokens(const Panel& panel, const int32_t* x, const float* unit, const float* qsum, float* y,
                              int64_t y_stride, __mmask16 rows) {
  constexpr int kSplit = kTokens >= 3 ? 1 : (kTokens == 2 ? 2 : 3);
  __m512 acc[kTokens];
  for (int t = 0; t < kTokens; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t g = 0; g < panel.groups; ++g) {
    __m512i* codes = panel.codes + g * kPerGroup;
    __m512i a[kPerGroup];
    if constexpr (kBits != 0)
      for (const Ahead& next : panel.next) prefetch_slice(next, g);
    if constexpr (kBits == 4) unpack_group_q4(panel.row0, panel.stride, g, a);
    else if constexpr (kBits == 8) unpack_group_q8(panel.row0, panel.stride, g, a);
    else
      for (int i = 0; i < kPerGroup; ++i) a[i] = _mm512_load_si512(codes + i);
    if constexpr (kBits != 0 && kStore)
      for (int i = 0; i < kPerGroup; ++i) _mm512_store_si512(codes + i, a[i]);
    __m512i high[kSplit][kTokens], low[kSplit][kTokens];
    for (int k = 0; k < kSplit; ++k)
      for (int t = 0; t < kTokens; ++t) high[k][t] = low[k][t] = _mm512_setzero_si512();
    const int32_t* xg = x + g * kPerGroup * 2 * kTokens;
#pragma GCC unroll 16
    for (int i = 0; i < kPerGroup; ++i) {
      const int k = i % kSplit;
      for (int t = 0; t < kTokens; ++t) {
        high[k][t] = _mm512_dpbusd_epi32(high[k][t], a[i], _mm512_set1_epi32(xg[(2 * i) * kTokens + t]));
        low[k][t] = _mm512_dpbusd_epi32(low[k][t], a[i], _mm512_set1_epi32(xg[(2 * i + 1) * kTokens + t]));
      }
    }
    const __m512 s = _mm512_load_ps(panel.scales + g * kPanel), b = _mm512_load_ps(panel.biases + g * kPanel);
    const float *ug = unit + g * kTokens, *qg = qsum + g * kTokens;
    for (int t = 0; t < kTokens; ++t) {
      __m512i hi = high[0][t], lo = low[0][t];
      for (int k = 1; k < kSplit; ++k) hi = _mm512_add_epi32(hi, high[k][t]), lo = _mm512_add_epi32(lo, low[k][t]);
      const __m512i sum = _mm512_add_epi32(_mm512_slli_epi32(hi, 8), lo);  // x16 = 256 a + b
      const __m512 d = _mm512_mul_ps(_mm512_cvtepi32_ps(sum), s);
      acc[t] = _mm512_fmadd_ps(d, _mm512_set1_ps(ug[t]), acc[t]);
      acc[t] = _mm512_fmadd_ps(b, _mm512_set1_ps(qg[t]), acc[t]);
    }
  }
  for (int t = 0; t < kTokens; ++t) _mm512_mask_storeu_ps(y + t * y_stride, rows, acc[t]);
}

using PanelFn = void (*)(const Panel&, const int32_t*, const float*, const float*, float*, int64_t, __mmask16);

template <int kBits, bool kStore, int... kTokens>
constexpr std::array<PanelFn, sizeof...(kTokens) + 1> panel_fns(std::integer_sequence<int, kTokens...>) {
  return {nullptr, panel_tokens<kTokens + 1, kBits, kStore>...};
}
// [0 unpacked; 1, 2 4-bit; 3, 4 8-bit, the second keeping the registers][tokens 1 .. kTokenTile]
constexpr std::array<PanelFn, kTokenTile + 1> kPanelFns[5] = {
    panel_fns<0, false>(std::make_integer_sequence<int, kTokenTile>()),
    panel_fns<4, false>(std::make_integer_sequence<int, kTokenTile>()),
    panel_fns<4, true>(std::make_integer_sequence<int, kTokenTile>()),
    panel_fns<8, false>(std::make_integer_sequence<int, kTokenTile>()),
    panel_fns<8, true>(std::make_integer_sequence<int, kTokenTile>())};

template <class T>
T* align64(T* p) {
  return reinterpret_cast<T*>((reinterpret_cast<uintptr_t>(p) + 63) & ~uintptr_t(63));
}

}  // namespace

void gemm_rows_avx512(const Matrix& W, const TokenBatch& x, int64_t r0, int64_t r1, float* y, int64_t y_stride,
                      GemmScratch& scratch, const Matrix* then) {
  const int64_t cols = W.cols, groups = cols / kInputGroup, row_bytes = cols * W.bits / 8;
  const int64_t n = x.n;
  scratch.panel.resize(size_t(groups * kPerGroup * 64 + 64));
  scratch.scales.resize(size_t(groups * kPanel + 16));
  scratch.biases.resize(scratch.scales.size());
  Panel panel{nullptr,
              row_bytes,
              reinterpret_cast<__m512i*>(align64(scratch.panel.data())),
              align64(scratch.scales.data()),
              align64(scratch.biases.data()),
              groups,
              {}};
  float *scales = align64(scratch.scales.data()), *biases = align64(scratch.biases.data());
  const uint8_t* codes = static_cast<const uint8_t*>(W.data);
  for (int64_t p = r0; p < r1; p += kPanel) {
    const int64_t rows = std::min(kPanel, r1 - p);
    panel.row0 = codes + p * row_bytes;
    const bf16 *scales_of = W.scales + p * groups, *biases_of = W.biases + p * groups;
    if (rows < kPanel) {  // a short panel: its rows copied, the last repeated, so 16 rows at one stride
      scratch.rows.resize(size_t(kPanel * row_bytes));
      scratch.params.resize(size_t(2 * kPanel * groups));
      for (int64_t j = 0; j < kPanel; ++j) {
        const int64_t r = std::min(p + j, r1 - 1);
        std::memcpy(scratch.rows.data() + j * row_bytes, codes + r * row_bytes, size_t(row_bytes));
        std::copy_n(W.scales + r * groups, groups, scratch.params.data() + j * groups);
        std::copy_n(W.biases + r * groups, groups, scratch.params.data() + (kPanel + j) * groups);
      }
      panel.row0 = scratch.rows.data();
      scales_of = scratch.params.data(), biases_of = scratch.params.data() + kPanel * groups;
    }
    unpack_params(scales_of, groups, scales);
    unpack_params(biases_of, groups, biases);
    // The panel kAhead panels on: of this product's rows, else of `then`'s.
    const int64_t next = p + kAhead * kPanel;
    for (Ahead& a : panel.next) a = Ahead{};
    if (next < r1) {
      const int64_t next_rows = std::min(kPanel, r1 - next);
      panel.next[0] = ahead_of(codes + next * row_bytes, next_rows * row_bytes, groups);
      panel.next[1] = ahead_of(W.scales + next * groups, next_rows * groups * 2, groups);
      panel.next[2] = ahead_of(W.biases + next * groups, next_rows * groups * 2, groups);
    } else if (then && gemm_supported(*then) && (next - r1) / kPanel * kPanel < then->rows) {
      const int64_t first = (next - r1) / kPanel * kPanel, rows_then = std::min(kPanel, then->rows - first);
      const int64_t groups_then = then->cols / kInputGroup, bytes_then = then->cols * then->bits / 8;
      panel.next[0] = ahead_of(static_cast<const uint8_t*>(then->data) + first * bytes_then, rows_then * bytes_then,
                               groups);
      panel.next[1] = ahead_of(then->scales + first * groups_then, rows_then * groups_then * 2, groups);
      panel.next[2] = ahead_of(then->biases + first * groups_then, rows_then * groups_then * 2, groups);
    }
    const __mmask16 mask = __mmask16((1u << rows) - 1u);
    for (int64_t t0 = 0; t0 < n; t0 += kTokenTile) {
      const int64_t k = std::min<int64_t>(kTokenTile, n - t0);
      // The first tile unpacks, and keeps the registers for the others.
      const int mode = t0 > 0 ? 0 : (W.bits == 4 ? 1 : 3) + (n > kTokenTile ? 1 : 0);
      kPanelFns[mode][size_t(k)](panel, x.quads.data() + t0 * (cols / 2), x.unit.data() + t0 * groups,
                                 x.qsum.data() + t0 * groups, y + t0 * y_stride + p, y_stride, mask);
    }
  }
}

}  // namespace lily::cpu_fast::detail
