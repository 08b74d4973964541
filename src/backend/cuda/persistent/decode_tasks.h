// decode_tasks.h: the decode step of one token as a task list (task_list.h), built from the model's
// config at load time (issue 16): which tasks there are, which block runs each and in what order,
// what each waits for, and the byte ranges it reads and writes, so that check_task_list proves the
// list cannot deadlock or race before a persistent kernel walks it.
//
// The step, as DecodeStep runs it today (decode_step.cpp), one layer after another:
//   embed        h = embed[token]
//   in_proj      proj = RMSNorm(h) @ W_in^T           tiles of rows of the fused input projection
//   deltanet     y = the DeltaNet step of value heads  (conv and recurrent state of those heads)
//   attention    partials of one split of the KV cache, then a combine into the gated output
//   out_proj     h += mixer @ W_out^T                  tiles of rows of h
//   moe_norm     x = RMSNorm(h)
//   router       logits of the experts and the shared expert's gate, tiles of rows
//   top_k        the k experts and their weights
//   gate_up      act_s = silu(G_s x) * (U_s x)         per slot (k routed, 1 shared), tiles of rows
//   down         h += w_s D_s act_s                    per slot, tiles of rows of h (accumulated)
//   lm_head      logits = RMSNorm(h) @ lm_head^T       tiles of rows; advance: position += 1
// Dependencies are a stage's whole output, except the MoE: a slot's down tiles wait only for that
// slot's gate/up tiles, and the shared expert's gate/up only for x (not for the router), so expert
// work starts as soon as its own inputs exist. Tasks go to blocks round-robin in step order, so
// every block's list is in step order (what makes the list deadlock-free with all blocks resident).
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
  moe_norm,
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
  int blocks = 132;           // resident blocks (one per SM)
  int in_proj_rows = 96;      // rows of the fused input projection a task
  int out_proj_rows = 32;     // rows of h an out_proj task
  int router_rows = 32;       // router rows a task (the experts' and the shared gate's)
  int expert_rows = 32;       // rows of one slot's intermediate a gate/up task
  int down_rows = 128;        // rows of h a down task of one slot
  int lm_head_rows = 2048;    // vocabulary rows an lm_head task
  int deltanet_heads = 2;     // value heads a DeltaNet task (a multiple of value heads per key head)
  int attention_splits = 16;  // splits of the KV cache a layer (one combine task after them)
};

// The step's buffers (Access::buffer); the state of layer l (DeltaNet conv + recurrent state, or
// the KV cache) is buffer kLayerState + l.
enum DecodeBuffer : uint32_t {
  kToken,
  kHidden,        // h [H] fp32
  kProj,          // the input projection's output [rows] fp32
  kMixer,         // the mixer's output [max(value dim, q width)] fp32
  kMoeInput,      // x [H] fp32
  kRouterLogits,  // [E + 1] fp32 (the shared expert's gate last)
  kTopK,          // [k] expert ids and [k] weights
  kAct,           // [k + 1 slots, I] fp32
  kPartials,      // attention splits' partial outputs
  kLogits,        // [V] fp32
  kPosition,
  kLayerState,
};

// Symbolic rows of the KV cache: the splits read rows [0, kCacheRows), the first split writes this
// token's row after them (its own k and v it takes from proj).
inline constexpr uint64_t kCacheRows = uint64_t(1) << 20;

struct DecodeTasks {
  TaskList list;
  std::vector<uint64_t> buffer_bytes;  // by buffer id: the extent every access stays within
};

// Throws lily::Error for a config or tiling it cannot cut (sizes that are not positive, DeltaNet
// tasks that would split a key head's channels).
DecodeTasks build_decode_tasks(const ModelConfig& c, const DecodeTiling& tiling);

}  // namespace lily::cuda::persistent
