// step_args.h: what the persistent decode kernel (decode_kernel.cu) gets, as plain structs that the
// host fills (persistent_decode.cpp) and the device reads: the task list flattened into arrays, the
// weights of every layer, the step's scratch buffers and one sequence's state. No CUDA headers, so
// host code and tests compile it with g++.
//
// Buffer layouts are decode_tasks.h's (T rows, U expert slots, S attention splits), in device
// memory; the sequence state is CudaSequenceState's (conv state [K-1, conv_dim] oldest tap first,
// recurrent state [Hv, 128, 128], KV caches [capacity, nkv, 256] bf16).
#pragma once

#include <cstdint>

namespace lily::cuda::persistent {

constexpr int kThreads = 512;             // every block: 16 warps
constexpr int kMaxLayers = 64;            // SequenceArgs' arrays
constexpr uint32_t kNoCounter = ~0u;      // DeviceTask: no wait in this slot
constexpr int kScratchBytes = 96 * 1024;  // dynamic shared memory every op may use
constexpr int kMaxBlockTasks = 320;       // tasks a block's list may hold (kept in shared memory)
constexpr int kTraceMarks = 5;            // StepArgs::trace: times a task

// One task (task_list.h's Task without what only the checker needs). At most two waits.
struct DeviceTask {
  uint16_t op = 0, layer = 0, slot = 0, row = 0, rows = 1, pad = 0;
  uint32_t first = 0, count = 0;
  int32_t signal = -1;                          // counter to add 1 to when done; -1: none
  uint32_t wait[2] = {kNoCounter, kNoCounter};  // counters, and the count each must reach
  uint32_t wait_count[2] = {0, 0};
  uint32_t known = kNoCounter;  // expert slots: the top_k's counter, after which the weights are known
  uint32_t known_count = 0;
};

// An affine-quantized matrix (mlx layout, gpu_types.h's QMatrix) as the device reads it; a stack of
// `batch` matrices for the routed experts.
struct DeviceMatrix {
  const uint32_t* codes = nullptr;   // [batch, rows, cols * bits / 32]
  const uint16_t* scales = nullptr;  // [batch, rows, cols / 64] bf16 bits
  const uint16_t* biases = nullptr;
  int rows = 0, cols = 0, bits = 4;
};

struct DeviceLayer {
  int attention = 0;                  // 1: gated attention, 0: Gated DeltaNet
  const float* input_norm = nullptr;  // [H] effective gains
  const float* post_norm = nullptr;
  DeviceMatrix in_proj;   // fused: [qkv; z; b; a] or [q, gate; k; v]
  DeviceMatrix out_proj;  // out_proj or o_proj
  // DeltaNet
  const float* conv1d = nullptr;      // [conv_dim, K]
  const float* A_log = nullptr;       // [Hv]
  const float* dt_bias = nullptr;     // [Hv]
  const float* gated_norm = nullptr;  // [128]
  // attention
  const float* q_norm = nullptr;  // [256]
  const float* k_norm = nullptr;
  // MoE
  DeviceMatrix router;              // [E, H] 8-bit
  DeviceMatrix shared_expert_gate;  // [1, H] 8-bit
  DeviceMatrix gate, up, down;      // stacks [E, I, H], [E, I, H], [E, H, I]
  DeviceMatrix shared_gate, shared_up, shared_down;
};

// The model's sizes the ops need.
struct Dims {
  int T = 1, parallel = 0;  // rows of the step; parallel: one sequence per row
  int H = 0, E = 0, k = 0, I = 0, V = 0, slots = 0;
  int proj_stride = 0, mixer_stride = 0;  // floats a row of proj, of mixer
  int splits = 0;                         // attention splits a layer
  int nq = 0, nkv = 0, head_dim = 256, rotary_dim = 64;
  float rope_theta = 1e7f, eps = 1e-6f;
  int Hk = 0, Hv = 0, conv_k = 4;  // DeltaNet: key heads, value heads (dk = dv = 128), conv taps
};

// The step's scratch (decode_tasks.h's DecodeBuffer), device pointers.
struct StepBuffers {
  const int32_t* token = nullptr;  // [T]
  float* hidden = nullptr;         // [T, H]
  float* proj = nullptr;           // [T, proj_stride]
  float* mixer = nullptr;          // [T, mixer_stride]
  float* moe_input = nullptr;      // [T, H]
  float* router_logits = nullptr;  // [T, E + 1]
  int32_t* slot_ids = nullptr;     // [U]
  float* slot_weights = nullptr;   // [U, T]
  float* act = nullptr;            // [U + 1, T, I]
  float* partials = nullptr;       // [T, S, nq, head_dim + 2]: o (unnormalised), m, l
  float* logits = nullptr;         // [T, V]
  uint32_t* counters = nullptr;    // zeroed before each step
};

// One sequence's state, by layer index (the other kind's entries are null).
struct SequenceArgs {
  int32_t* position = nullptr;  // the next token's position (= cached rows)
  int capacity = 0;
  float* conv[kMaxLayers] = {};
  float* ssm[kMaxLayers] = {};
  uint16_t* k_cache[kMaxLayers] = {};
  uint16_t* v_cache[kMaxLayers] = {};
};

struct StepArgs {
  const DeviceTask* tasks = nullptr;      // every block's tasks, one block after another
  const uint32_t* block_begin = nullptr;  // [blocks + 1]: block b runs tasks [begin[b], begin[b + 1])
  const DeviceLayer* layers = nullptr;    // [layers]
  DeviceMatrix embed, lm_head;
  const float* final_norm = nullptr;
  Dims dims;
  StepBuffers buf;
  SequenceArgs seq;
  // Optional, [tasks, kTraceMarks] ns (thread 0): a task's begin, inputs ready, input row staged,
  // products done (its warp's part), done; 0 where the op has no such point.
  uint64_t* trace = nullptr;
  uint32_t lookahead_bytes = 192 * 1024;  // next tasks' weights a block keeps in flight into L2
  int prefetch_own = 1;                   // 1: a task's own weights into L2 when it starts waiting
};

}  // namespace lily::cuda::persistent
