// prefill.h: the layers over a block of T tokens (a prompt) on the prefill product (gemm.h),
// each one parallel region of cpu_team() (attention_prefill.cpp, deltanet_prefill.cpp,
// moe_prefill.cpp); the same math as the reference layers of backend/cpu/ops.h, whose caches
// they share, and as the decode steps of layers.h token by token. The block may hold several
// sequences (attention_runs, deltanet_runs: a batch step, a token of each): every weight is read
// once for all its rows, the caches and states each sequence's own.
//
//   projections        the members prepare their share of the tokens, then take their share of
//                      the rows of every projection (panels of 16) against all T tokens
//   DeltaNet           causal conv per channel over the tokens; the delta rule token by token per
//                      value head (delta_rule_tokens: one pass over the 64 KB state a token)
//   attention          causal over the cache, per (token, KV head): its query heads together
//   MoE                router, shared expert and routing for all tokens; then each member takes
//                      whole experts from a shared counter, largest first, and runs each expert's
//                      gate, up and down projections against only the tokens routed to it
//
// The buffers come from the caller (the backend owns one set, as for layers.h) and grow once to
// the longest block. Those sized by the context (attention's transposed keys, its scores) are
// each call's own: held, they stayed at the longest context ever seen (~0.5 GB of keys at 256 K
// positions of the full-size model).
#pragma once

#include <atomic>
#include <span>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cpu_fast/gemm.h"
#include "backend/cpu_fast/layers.h"
#include "base/error.h"

namespace lily::cpu_fast {

// One member's buffers for an expert: its tokens' rows gathered, and its intermediate values.
struct ExpertScratch {
  TokenBatch x, act;            // the expert's tokens' x and act = silu(gate x) * up x, prepared
  std::vector<float> rows;      // [n, H] the gathered rows of x
  std::vector<float> gate, up;  // [n, I]
};

struct PrefillScratch {
  TokenBatch x, y;                         // the layer's input, and the input of its last product
  std::vector<GemmScratch> gemm;           // [members]
  std::vector<float> a, b, c, d, e;        // the layers' intermediate values (named where used)
  std::vector<std::vector<float>> member;  // [members] per-member rows: conv taps, delta rule sums
  // MoE
  std::vector<float> logits;                           // [T, E + 1] router logits, then the shared expert's gate logit
  std::vector<Routing> routing;                        // [T]
  std::vector<int32_t> count, first, tokens, slot_of;  // experts' token lists (moe_prefill.cpp)
  std::vector<int32_t> order;                          // experts by tokens routed, most first
  std::vector<ExpertScratch> experts;                  // [members]
  std::atomic<int64_t> next{0};
};

// Rows [row, row + rows) of a block: consecutive tokens of one sequence, whose caches they read
// and append to, the first at `first_position` (attention). A prefill is one run of the block's
// T rows; a batch step (Backend::forward_batch) a run of one row for each sequence. The runs
// cover the block's rows in order.
struct AttentionRun {
  cpu::AttentionCache* cache;
  int64_t first_position, row, rows;
};
struct DeltaNetRun {
  cpu::DeltaNetCache* cache;
  int64_t row, rows;
  cpu::DeltaNetKept kept = {};  // the states to keep after some of the run's rows (ops.h; first_row in the run)
};

// Throws unless `runs` cover rows [0, T) in order, none empty, each with its cache (`what`: the
// layer, in the error).
template <class Run>
void check_runs(std::span<const Run> runs, int64_t T, const char* what) {
  int64_t covered = 0;
  for (size_t r = 0; r < runs.size(); ++r) {
    LILY_CHECK(runs[r].row == covered && runs[r].rows > 0 && runs[r].cache,
               "{}: run {} (rows [{}, +{})) does not follow the one before at row {}", what, r, runs[r].row,
               runs[r].rows, covered);
    covered += runs[r].rows;
  }
  LILY_CHECK(covered == T, "{}: the runs cover {} rows of a block of {}", what, covered, T);
}

// Gated full attention (spec §2.4) of T tokens from `first_position`. x: [T, H] normed -> out:
// [T, H]. Appends T rows to the cache.
void attention_prefill(const AttentionWeights& w, const ModelConfig& c, cpu::AttentionCache& cache,
                       int64_t first_position, const float* x, int64_t T, float* out, PrefillScratch& s);
// The same for T rows of one or more sequences: the projections against all T rows, each run's
// attention over its own cache (a run of one row reads it as the decode step does, attend()).
void attention_runs(const AttentionWeights& w, const ModelConfig& c, std::span<const AttentionRun> runs, const float* x,
                    int64_t T, float* out, PrefillScratch& s);

// Gated DeltaNet (spec §2.6) of T tokens. x: [T, H] normed -> out: [T, H]. Advances conv and SSM state.
void deltanet_prefill(const DeltaNetWeights& w, const ModelConfig& c, cpu::DeltaNetCache& cache, const float* x,
                      int64_t T, float* out, PrefillScratch& s);
// The same for T rows of one or more sequences: the projections against all T rows, each run's
// conv and delta rule on its own state.
void deltanet_runs(const DeltaNetWeights& w, const ModelConfig& c, std::span<const DeltaNetRun> runs, const float* x,
                   int64_t T, float* out, PrefillScratch& s);

// Sparse MoE with the gated shared expert (spec §2.7) of T tokens. x: [T, H] normed -> out: [T, H].
void moe_prefill(const MoeWeights& w, const ModelConfig& c, const float* x, int64_t T, float* out, PrefillScratch& s);

// One query token's query heads that read one KV head, over the first `visible` positions.
struct AttentionHeads {
  const float* q;  // [heads] rows of d at q_stride: normed, rotated
  int64_t q_stride;
  const float* gate;  // [heads] rows of d at gate_stride
  int64_t gate_stride;
  const float* keys_t;  // [d, keys_stride] the KV head's keys transposed, 0 from `visible` to a multiple of 16
  int64_t keys_stride;  // (attend_in_place_avx512: keys_t is [visible] rows of d at keys_stride, the cache's)
  const float* values;  // [visible] rows of d at values_stride
  int64_t values_stride;
  float* o;  // [heads] rows of d at o_stride: softmax(q k^T / sqrt(d)) v * sigmoid(gate)
  int64_t o_stride;
  int64_t heads, visible, d;
};

// Inside a region: this member's share of x's tokens prepared (x reset before the region).
void prepare_share(TokenBatch& x, const ThreadTeam::Member& m);

}  // namespace lily::cpu_fast

namespace lily::cpu_fast::detail {
// The heads on AVX-512 F (attention_avx512.cpp): up to 8 heads, d a multiple of 32; returns
// false (doing nothing) otherwise. scores: [heads, keys_stride] scratch.
bool attend_heads_avx512(const AttentionHeads& a, float* scores);
// The same with the keys read in place, as the cache holds them (a token of a decode step or of a
// batch's row: no transpose); d a multiple of 64. scores: [heads, visible] scratch.
bool attend_in_place_avx512(const AttentionHeads& a, float* scores);
}  // namespace lily::cpu_fast::detail
