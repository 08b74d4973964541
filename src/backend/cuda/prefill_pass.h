// prefill_pass.h: the model for a pass of T tokens on the GPU (prefill, 1 < T <= the plan's
// chunk_tokens), launch by launch, with the kernels the plan picked (kernel_plan.h). It reads like
// backend/cpu/forward.cpp; longer prompts are several passes, the caches carrying the context.
#pragma once

#include <cstdint>

#include "backend/cuda/batch_rows.h"
#include "backend/cuda/common/device_buffer.h"
#include "backend/cuda/gemm/split_k.h"
#include "backend/cuda/gpu_weights.h"
#include "backend/cuda/kernel_plan.h"
#include "backend/cuda/sequence_state.h"

namespace lily::cuda {

// The device buffers of a PrefillPass, in bytes (a pass of plan.prefill.chunk_tokens tokens):
// computed before anything is allocated (memory_plan.h), and what the constructor allocates.
struct PrefillWorkspace {
  uint64_t tokens = 0, h = 0, normed = 0, wide = 0, z = 0, b = 0, a = 0, k = 0, v = 0, mixer_out = 0, xp = 0;
  uint64_t moe = 0, deltanet = 0, attention = 0, logits = 0;
  uint64_t total() const;
};
PrefillWorkspace prefill_workspace(const GpuWeights& w, const KernelPlan& plan);

// The hidden rows a pass hands back (Backend::forward_hidden): RMSNorm(h; final norm) of rows
// [first_row, T) into host ([T - first_row, H]); first_row == T or host null: none.
struct HiddenRows {
  int first_row = 0;
  float* host = nullptr;
};

class PrefillPass {
 public:
  PrefillPass(const GpuWeights& w, const KernelPlan& plan);

  // tokens [T] (host) through the model, appended to s (its device position advanced by T); the
  // logits of rows [first_row, T) go to host_logits ([T - first_row, V], asynchronous copies in
  // stream order: the caller synchronizes before reading them or reusing `tokens`), and the
  // hidden rows asked for to theirs. first_row == T: no logits.
  void run(CudaSequenceState& s, const int32_t* tokens, int T, int first_row, float* host_logits, cudaStream_t stream,
           HiddenRows hidden = {});

  // T rows of the MTP head (spec §6; mtp_pass.cpp) appended to s's MTP cache (its device position
  // advanced by T): row t takes hidden[t] ([T, H] host, post-norm rows) and tokens[t]; the logits
  // of rows [first_row, T) to host_logits ([T - first_row, V]) and the head's post-norm rows m to
  // host_m ([T - first_row, H]). Asynchronous as run() is. The weights must have the head.
  void run_mtp(CudaSequenceState& s, const float* hidden, const int32_t* tokens, int T, int first_row,
               float* host_logits, float* host_m, cudaStream_t stream);

  // The same pass from tokens already in device_tokens(), its logits left in device_logits()
  // ([T - first_row, V], at most kLogitRows rows): no host memory touched, so a graph can
  // capture it (pass_graph.h).
  void record(CudaSequenceState& s, int T, int first_row, cudaStream_t stream);
  // A batch step: token r of device_tokens() appended to row r's sequence (rows' tables, N <=
  // kMaxBatchRows), each row's next-token logits left in device_logits() [N, V]. The projections,
  // experts and logits are the pass's for N tokens (they treat every token alone); the attention
  // and DeltaNet cores read each row's own state (gated_attention_decode_rows,
  // gated_deltanet_decode_rows), and each row's position advances by one.
  void record_batch(const BatchRows& rows, int N, cudaStream_t stream);
  int32_t* device_tokens() const { return tokens_.as<int32_t>(); }
  const float* device_logits() const { return logits_.as<float>(); }
  static constexpr int kLogitRows = 64;  // rows of logits computed (and copied to the host) at once

 private:
  void layers(CudaSequenceState* s, int T);  // every layer; s null: a batch step (batch_)
  // cache null: a batch step (each row's own, batch_'s attention(index))
  void gated_attention(const GpuLayer& layer, const KvCache* cache, size_t index, int T);
  void gated_deltanet(const GpuLayer& layer, CudaSequenceState* s, size_t index, int T);
  void output_projection(const QMatrix& W, int T, const bf16* xp = nullptr);
  // The pass's GEMMs on the plan's kernel: x [T, K] fp32 for gemm_q4, or converted once into
  // xp_ (bf16 in the wgmma GEMM's K order) for every product that reads it.
  struct GemmInput {
    const float* x;
    const bf16* xp;  // nullptr: gemm_q4
  };
  GemmInput normed_input(const float* gain, int T);  // RMSNorm(h; gain)
  GemmInput gemm_input(const float* x, int T, int K);
  RowsOutput qkv_parts(const GpuAttention& a);  // the fused projections' parts to their buffers
  RowsOutput in_proj_parts(const GpuDeltaNet& d);
  bool fused_gemm(const QMatrix& fused, const GemmInput& in) const;              // one wgmma launch for its parts
  void gemm(const QMatrix& W, const GemmInput& in, float* y, int T);             // y = x @ W^T
  void gemm_accumulate(const QMatrix& W, const GemmInput& in, float* y, int T);  // y += x @ W^T
  void sparse_moe(const GpuLayer& layer, const DecodeLayerPlan& plan, int T);
  void pass(CudaSequenceState& s, int T, int first_row, float* host_logits, cudaStream_t stream, HiddenRows hidden);
  void logits(int first_row, int T, float* host_logits, const float* gain);
  void normed_rows(int first_row, int T, const float* gain, float* host);
  // y = x @ W^T (accumulate: y +=), x [T, W.cols] fp32: gemv_rows for the plan's dense rows, else
  // the pass's GEMM (the MTP head's fc halves).
  void project(const QMatrix& W, const float* x, float* y, int T, bool accumulate);

  const GpuWeights& w_;
  const ModelConfig& c_;
  const KernelPlan& plan_;
  cudaStream_t stream_ = nullptr;  // of the pass being run
  // Activations of one pass of up to chunk_tokens rows (device).
  DeviceBuffer tokens_;               // int32 [T]
  DeviceBuffer h_, normed_;           // [T, H]
  DeviceBuffer wide_;                 // [T, max(conv_dim, 2 * nq * hd)]: qkv or q,gate
  DeviceBuffer z_;                    // [T, max(Hv * 128, H)]
  DeviceBuffer b_, a_;                // [T, Hv]
  DeviceBuffer k_, v_;                // [T, nkv * hd]
  DeviceBuffer mixer_out_;            // [T, max(Hv * 128, nq * hd, H)]: input of out_proj / o_proj
  DeviceBuffer xp_;                   // bf16 [T, max(H, Hv * 128, nq * hd)]: the wgmma GEMM's input
  DeviceBuffer moe_scratch_;          // routing, plan and intermediates of the grouped MoE
  DeviceBuffer deltanet_scratch_;     // conv outputs and the chunked rule's intermediates
  DeviceBuffer attention_scratch_;    // the split attention's partial states (short passes, batch steps)
  const BatchRows* batch_ = nullptr;  // the rows of the batch step being recorded
  DeviceBuffer logits_;               // [kLogitRows, V]: rows of logits on their way to the host
  SplitKScratch split_;               // the short passes' split-K products (split_k.h)
};

}  // namespace lily::cuda
