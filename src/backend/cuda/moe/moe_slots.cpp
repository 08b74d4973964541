// moe_slots.cpp: the MoE block of a step of T rows (T = 1 .. kMoeSlotsMaxRows) on the decode
// kernels, the rows a grid dimension (moe_decode.h):
//
//   x, logits, sg = moe_route_rows(h)            x[t] = RMSNorm(h[t]), logits[t] = x[t] Wr^T,
//                                                sg[t] = x[t] . w_sg (the logit)
//   act[t, s] = silu(G_e x[t]) * (U_e x[t])      moe_gate_up, grid (I / 16, k + 1, T)
//   h[t] += sum_s w_s D_e act[t, s]              moe_down, grid (H / 16, T), slot k weighted by
//                                                sigmoid(sg[t])
// Three launches where a short pass's moe_rows_accumulate takes five (route, top-k with the
// plan, the grouped gate/up and down, the combine): each row's slot reads its own expert, so an
// expert two rows chose is read twice (from L2 the second time when the blocks run together).
// Tested: tests/cuda/test_moe.cu (SlotsMatchEachRowAlone: T = 1 .. 16 against cpu::sparse_moe row
// by row; the pass through it in test_cuda_forward).
#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/moe/moe_decode.h"
#include "backend/cuda/moe/moe_route_rows.h"

namespace lily::cuda {

namespace {

// The scratch's parts, each 16-byte aligned: logits [T, E], sg [T], act [T, k + 1, I].
struct SlotsScratch {
  size_t logits = 0, sg = 0, act = 0, bytes = 0;
};

size_t align16(size_t n) { return (n + 15) / 16 * 16; }

SlotsScratch slots_scratch(const GpuMoe& w, int T, int k) {
  SlotsScratch s;
  s.sg = align16(size_t(T) * size_t(w.router.rows) * 4);
  s.act = s.sg + align16(size_t(T) * 4);
  s.bytes = s.act + align16(size_t(T) * size_t(k + 1) * size_t(w.experts_gate.rows) * 4);
  return s;
}

}  // namespace

size_t moe_slots_scratch_bytes(const GpuMoe& w, int T, int k) { return slots_scratch(w, T, k).bytes; }

void moe_slots_accumulate(GateUpKernel gate_up, const GpuMoe& w, float* h, const float* gain, float eps, int T, int k,
                          void* scratch, float* x, cudaStream_t stream) {
  LILY_CHECK(T >= 1 && T <= kMoeSlotsMaxRows, "moe_slots_accumulate: {} rows (1 to {})", T, kMoeSlotsMaxRows);
  const SlotsScratch parts = slots_scratch(w, T, k);
  uint8_t* base = static_cast<uint8_t*>(scratch);
  MoeDecodeArgs args;
  args.w = &w, args.gain = gain, args.eps = eps, args.k = k, args.rows = T, args.shared_gate_logit = true;
  args.buffers = {h, x, reinterpret_cast<float*>(base + parts.logits), reinterpret_cast<float*>(base + parts.sg),
                  reinterpret_cast<float*>(base + parts.act)};
  // x = RMSNorm(h); logits = x Wr^T; sg = x . w_sg
  moe_route_rows(w, h, T, gain, eps, x, args.buffers.logits, args.buffers.shared_weight, stream);
  // act[t, s] = silu(G_s x[t]) * (U_s x[t]) for the top-k experts of each row and the shared one
  moe_gate_up(gate_up, args, stream);
  // h[t] += sum_s w_s D_s act[t, s]
  moe_down(args, stream);
}

}  // namespace lily::cuda
