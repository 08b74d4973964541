// decode_tasks.h: the decode step of T rows (1..8) as a task list (task_list.h), built from the
// model's config at load time (issue 16): which tasks there are, which block runs each and in what
// order, what each waits for, and the byte ranges it reads and writes, so that check_task_list
// proves the list cannot deadlock or race before a persistent kernel walks it.
//
// The rows of a step (DecodeRows) are of one kind:
//   verify    T consecutive tokens of one sequence (speculative drafts being verified): row r is at
//             position p + r, the DeltaNet recurrence steps through the rows in order, attention of
//             row r sees the cache and rows 0..r of the step (causal among the step's own rows)
//   parallel  one token each of T sequences, each with its own DeltaNet state, KV cache and position
// A verify step leaves the DeltaNet state after its last row; with DecodeRows::keep_states it also
// keeps the state after every earlier row (spec §4: a snapshot per draft position), for taking
// rejected drafts back.
// Every op below works on all T rows at once (its weights read once for all of them) unless it says
// otherwise; T = 1 is the step DecodeStep runs today (decode_step.cpp). One layer after another:
//   embed        h[t] = embed[token[t]]
//   in_proj      proj[t] = RMSNorm(h[t]) @ W_in^T      tiles of rows of the fused input projection;
//                a DeltaNet layer's conv channels (q, k, v) leave it as u = silu(conv(taps, proj)),
//                the task updating their conv state (the conv is per channel: the task that
//                computes a channel owns it; verify rows in order)
//   deltanet     o = the delta rule step of a range of value columns (l2 norms of q and k, gates,
//                the recurrent state of those columns), before the gated norm; verify: a task
//                steps through rows 0..T-1 in order on one state (which stays in the block: read
//                and written once a step); parallel: a task a (sequence, range of columns)
//   attention    partials of one split of the KV cache (a task a range of KV heads and their query
//                heads), then combines (a task a range of query heads) into the gated output;
//                verify: every split takes all T rows' queries (each cache row read once), split 0
//                also appends the T rows' k and v and attends to them causally (row r to 0..r);
//                parallel: splits and a combine a sequence, over its own cache
//   out_proj     h[t] += mixer[t] @ W_out^T            tiles of rows of h; a DeltaNet layer's mixer
//                through the gated norm first (per head: w * rmsnorm(o) * silu(z))
//   router       logits of the experts and the shared expert's gate of x[t] = RMSNorm(h[t]), tiles
//                of rows; each task normalizes h itself, the first also writes x
//   top_k        each row's k experts and weights, gathered into the union of the rows' experts:
//                slot u (of min(E, T k)) holds the u-th distinct expert (rows in order, each row's
//                choices by weight; -1 past the last) and each row's weight for it (0: not chosen)
//   gate_up      act[u][t] = silu(G_u x[t]) * (U_u x[t])   per slot (the union's, then 1 shared),
//                tiles of rows, for the rows that chose the slot's expert (all rows: shared)
//   down         h[t] += w[u][t] D_u act[u][t]         per slot, tiles of rows of h (accumulated)
//   lm_head      logits[t] = RMSNorm(h[t]) @ lm_head^T tiles of rows; advance: positions += 1
//                (verify: the one position += T)
// An expert is a slot of the union, not of a row, so a GPU task reads its weights once for every
// row that chose it; an empty slot (fewer distinct experts than slots) is a task that only
// signals. Dependencies are a stage's whole output, except the MoE: a slot's down tiles wait only
// for that slot's gate/up tiles (and the top-k), and the shared expert's gate/up only for the
// routers (not top-k), so expert work starts as soon as its own inputs exist; with one row, a
// routed slot's gate/up tiles also wait only for the routers and choose the slot's expert
// themselves (the top-k rule's rank `slot`: one warp's work, a hop saved). Tasks go to blocks
// round-robin in step order, so every block's list is in step order (what makes the list
// deadlock-free with all blocks resident).
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cuda/persistent/task_list.h"
#include "model/config.h"

namespace lily::cuda::persistent {

enum class DecodeOp : uint16_t {
  embed,
  in_proj,
  deltanet_core,
  attention_split,
  attention_combine,
  out_proj,
  router,
  top_k,
  gate_up,
  down,
  lm_head,
  advance,
};
const char* op_name(DecodeOp op);

// How the step is cut into tasks (each in units of the op's output).
struct DecodeTiling {
  int blocks = 132;             // resident blocks (one per SM)
  int in_proj_rows = 96;        // rows of the fused input projection a task
  int out_proj_rows = 32;       // rows of h an out_proj task
  int router_rows = 32;         // router rows a task (the experts' and the shared gate's)
  int expert_rows = 32;         // rows of one slot's intermediate a gate/up task
  int down_rows = 128;          // rows of h a down task of one slot
  int lm_head_rows = 2048;      // vocabulary rows an lm_head task
  int deltanet_columns = 32;    // value columns a DeltaNet task (of [Hv, dv]: dividing dv, or whole heads)
  int attention_splits = 16;    // splits of a KV cache a layer (and sequence)
  int attention_kv_heads = 64;  // KV heads a split task (Task::slot the first, count how many)
  int combine_heads = 16;       // query heads a combine task (of one sequence, after all its splits)
};

// The rows of one step: T tokens of one sequence (verify) or of T sequences (parallel).
struct DecodeRows {
  enum class Kind : uint8_t { verify, parallel };
  int count = 1;  // T, 1..kMaxDecodeRows
  Kind kind = Kind::verify;
  // Verify only: the DeltaNet state (conv taps and recurrent state) after each row but the last, as
  // snapshots 0..T-2 after the sequence's state in its layer buffer, so that rejected drafts can be
  // taken back (restore snapshot j - 1 after accepting j < T rows; the KV cache is cut to n + j).
  bool keep_states = false;
  int sequences() const { return kind == Kind::parallel ? count : 1; }
  int snapshots() const { return keep_states ? count - 1 : 0; }
};
inline constexpr int kMaxDecodeRows = 8;

// The routed slots of the MoE: the union of the rows' experts has at most min(E, T k) of them (the
// shared expert is the slot after them). T = 1: the k experts of the one row, in order.
int expert_slots(const ModelConfig& c, const DecodeRows& rows);

// The step's buffers (Access::buffer), T = DecodeRows::count rows, S the attention splits, U the
// expert slots (expert_slots); the state of layer l (DeltaNet conv + recurrent state, or the KV
// cache), of every sequence one after another (then a DeltaNet layer's snapshots), is buffer
// kLayerState + l.
enum DecodeBuffer : uint32_t {
  kToken,         // [T] int32
  kHidden,        // h [T, H] fp32
  kProj,          // the input projection's output [T, max(attention rows, DeltaNet rows)] fp32
  kMixer,         // the mixer's output [T, max(value dim, q width)] fp32
  kMoeInput,      // x [T, H] fp32
  kRouterLogits,  // [T, E + 1] fp32 (the shared expert's gate last)
  kTopK,          // the union: [U] expert ids (int32, -1: none), then [U, T] weights (fp32, 0: not chosen)
  kAct,           // [U + 1 slots, T, I] fp32
  kPartials,      // attention splits' partial outputs [T, S, heads, head dim + 2] fp32
  kLogits,        // [T, V] fp32
  kPosition,      // verify: [1] the position of row 0; parallel: [T] each sequence's
  kLayerState,
};

// Symbolic rows of the KV cache: the splits read rows [0, kCacheRows), the first split writes the
// step's rows after them (verify: T rows, parallel: each sequence's one; their k and v it takes
// from proj).
inline constexpr uint64_t kCacheRows = uint64_t(1) << 20;

struct DecodeTasks {
  TaskList list;
  DecodeRows rows;
  std::vector<uint64_t> buffer_bytes;  // by buffer id: the extent every access stays within
};

// Throws lily::Error for a config, tiling or rows it cannot cut (sizes that are not positive,
// DeltaNet tasks that would cut a head unevenly, more than kMaxDecodeRows rows).
DecodeTasks build_decode_tasks(const ModelConfig& c, const DecodeTiling& tiling, const DecodeRows& rows = {});

}  // namespace lily::cuda::persistent
