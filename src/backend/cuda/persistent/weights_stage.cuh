// weights_stage.cuh: a product task's weights brought into shared memory before its inputs are
// ready (issue 16: "weights brought into shared memory ahead of their dependencies"). Thread 0, when
// a task starts (once an expert slot's expert is known), issues bulk copies (cp.async.bulk, the
// TMA engine) of the task's rows of each matrix it reads into the weight area (kWeightBytes after
// the scratch) and arms an mbarrier with their bytes; then it waits for the task's inputs. The op
// waits on the mbarrier and reads its rows from shared memory:
//
//   part j of a task: rows [r0, r0 + n) of entry e of matrix m, laid out as
//     codes  [n, cols * bits / 128] uint4 | scales [n, cols / 64] bf16 | biases [n, cols / 64] bf16
//   one part after another (each 16-byte aligned), in weight_parts' order.
//
// Staged: in_proj (its rows of the fused matrix), out_proj, gate_up (G then U of the slot's
// expert), down. Not staged: lm_head (more rows a task than the area holds), the router (8-bit,
// two matrices), the cores (their state is strided).
// Tested: tests/cuda/test_persistent_decode.cpp (the step's logits against the chain's).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/persistent/decode_tasks.h"
#include "backend/cuda/persistent/step_args.h"

namespace lily::cuda::persistent {

__shared__ uint64_t stage_bar;     // the weight area's mbarrier (one arrival a staged task)
__shared__ uint32_t stage_parity;  // the phase the current task's staging completes

// One matrix's rows as block_rows_dot reads them (global memory, or the weight area).
struct Rows {
  const uint4* codes;
  const uint16_t* scales;
  const uint16_t* biases;
  int cpr;  // 16-byte chunks a row
};

// A part of a task's weights: rows [r0, r0 + n) of entry e of m.
struct WeightPart {
  const DeviceMatrix* m = nullptr;
  int e = 0;
  int64_t r0 = 0;
  int n = 0;
};

// The slot's expert: -2 the shared expert (slot U), -1 an empty slot (after the top-k).
__device__ __forceinline__ int slot_expert(const StepArgs& a, const DeviceTask& t) {
  return t.slot == a.dims.slots ? -2 : __ldcg(a.buf.slot_ids + t.slot);
}

// The parts a staged task reads (0 for a task that stages nothing).
__device__ __forceinline__ int weight_parts(const StepArgs& a, const DeviceTask& t, WeightPart (&p)[2]) {
  const DeviceLayer& L = a.layers[t.layer];
  switch (DecodeOp(t.op)) {
    case DecodeOp::in_proj: p[0] = {&L.in_proj, 0, t.first, int(t.count)}; return 1;
    case DecodeOp::out_proj: p[0] = {&L.out_proj, 0, t.first, int(t.count)}; return 1;
    case DecodeOp::gate_up: {
      const int e = slot_expert(a, t);
      if (e == -1) return 0;
      p[0] = {e < 0 ? &L.shared_gate : &L.gate, e < 0 ? 0 : e, t.first, int(t.count)};
      p[1] = {e < 0 ? &L.shared_up : &L.up, e < 0 ? 0 : e, t.first, int(t.count)};
      return 2;
    }
    case DecodeOp::down: {
      const int e = slot_expert(a, t);
      if (e == -1) return 0;
      p[0] = {e < 0 ? &L.shared_down : &L.down, e < 0 ? 0 : e, t.first, int(t.count)};
      return 1;
    }
    default: return 0;
  }
}

// Bytes of each array of a part.
__device__ __forceinline__ uint32_t code_bytes(const WeightPart& p) {
  return uint32_t(p.n) * uint32_t(p.m->cols) * uint32_t(p.m->bits) / 8;
}
__device__ __forceinline__ uint32_t scale_bytes(const WeightPart& p) {
  return uint32_t(p.n) * uint32_t(p.m->cols / 64) * 2;
}

// The part's rows in global memory (row i of the part at index r0 + i) and in the weight area
// at `at` (row i at index i); advances `at` past the part.
__device__ __forceinline__ Rows global_rows(const WeightPart& p) {
  const DeviceMatrix& m = *p.m;
  const int64_t words = int64_t(m.cols) * m.bits / 32, groups = m.cols / 64;
  return Rows{reinterpret_cast<const uint4*>(m.codes + int64_t(p.e) * m.rows * words),
              m.scales + int64_t(p.e) * m.rows * groups, m.biases + int64_t(p.e) * m.rows * groups, int(words / 4)};
}
__device__ __forceinline__ Rows staged_rows(const WeightPart& p, unsigned char*& at) {
  const uint32_t c = code_bytes(p), s = scale_bytes(p);
  Rows r{reinterpret_cast<const uint4*>(at), reinterpret_cast<const uint16_t*>(at + c),
         reinterpret_cast<const uint16_t*>(at + c + s), p.m->cols * p.m->bits / 128};
  at += c + 2 * s;
  return r;
}

__device__ __forceinline__ void stage_init() {
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(uint32_t(__cvta_generic_to_shared(&stage_bar))));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    stage_parity = 0;
  }
}

__device__ __forceinline__ void bulk_copy(unsigned char* dst, const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   uint32_t(__cvta_generic_to_shared(dst))),
               "l"(src), "r"(bytes), "r"(uint32_t(__cvta_generic_to_shared(&stage_bar)))
               : "memory");
}

// Thread 0: the task's parts into the weight area `area` (the previous task is done with it),
// the mbarrier armed with their bytes; stage_parity names the phase to wait for. Returns the
// bytes (0: nothing staged, the mbarrier untouched).
__device__ __forceinline__ uint32_t issue_stage(const StepArgs& a, const DeviceTask& t, unsigned char* area,
                                                uint32_t& phase) {
  WeightPart p[2];
  const int parts = weight_parts(a, t, p);
  uint32_t bytes = 0;
  for (int j = 0; j < parts; ++j) bytes += code_bytes(p[j]) + 2 * scale_bytes(p[j]);
  if (bytes == 0) return 0;
  // The area was last read by the generic proxy (the previous task's loads); order those reads
  // before the bulk copies' writes.
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  asm volatile(
      "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(uint32_t(__cvta_generic_to_shared(&stage_bar))),
      "r"(bytes)
      : "memory");
  unsigned char* at = area;
  for (int j = 0; j < parts; ++j) {
    const Rows g = global_rows(p[j]);
    const int64_t groups = p[j].m->cols / 64;
    const uint32_t c = code_bytes(p[j]), s = scale_bytes(p[j]);
    bulk_copy(at, g.codes + p[j].r0 * g.cpr, c);
    bulk_copy(at + c, g.scales + p[j].r0 * groups, s);
    bulk_copy(at + c + s, g.biases + p[j].r0 * groups, s);
    at += c + 2 * s;
  }
  stage_parity = phase;
  phase ^= 1;
  return bytes;
}

// Every thread: until the current task's weights are in the area.
__device__ __forceinline__ void wait_stage() {
  const uint32_t bar = uint32_t(__cvta_generic_to_shared(&stage_bar)), parity = stage_parity;
  uint32_t done = 0;
  while (!done)
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
}

}  // namespace lily::cuda::persistent
