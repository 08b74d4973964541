// gpu_weights.h: the whole model in GPU memory, in the layout the kernels read.
//
// Every matrix is affine-quantized (QMatrix, mlx layout): mlx checkpoints are copied as they
// are; plain (bf16/f16/f32) matrices are quantized at load to 4-bit group 64 (8-bit for the
// router and shared_expert_gate, as mlx does). The routed experts of a layer are one
// contiguous stack [E, rows, ...] whatever the checkpoint's expert layout. Norm gains, conv
// weights and DeltaNet scalars are fp32 vectors.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "backend/cuda/common/gpu_types.h"
#include "model/config.h"

namespace lily {
struct ModelWeights;
}

namespace lily::cuda {

// A fused matrix is the row concatenation of projections that read the same input, so one
// launch computes them all; the separate matrices are views of its rows. Its rows are 0 where
// the parts differ in quantization (then they are separate allocations).
struct GpuAttention {
  QMatrix q_proj, k_proj, v_proj, o_proj;
  QMatrix qkv_proj;               // fused [q_proj; k_proj; v_proj]: [8192 + 512 + 512, 2048]
  const float* q_norm = nullptr;  // [256]
  const float* k_norm = nullptr;  // [256]
};

struct GpuDeltaNet {
  QMatrix in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, out_proj;
  QMatrix in_proj_all;             // fused [qkv; z; b; a]: [8192 + 4096 + 32 + 32, 2048]
  const float* conv1d = nullptr;   // [conv_dim, K]
  const float* A_log = nullptr;    // [Hv]
  const float* dt_bias = nullptr;  // [Hv]
  const float* norm = nullptr;     // [128]
};

struct GpuLayer {
  LayerKind kind = LayerKind::linear_attention;
  const float* input_layernorm = nullptr;
  const float* post_attention_layernorm = nullptr;
  GpuAttention attention;
  GpuDeltaNet deltanet;
  GpuMoe moe;
};

// The MTP head (spec §6): mtp.fc is held as its two column halves, so that u = e @ fc_embedding^T
// + hh @ fc_hidden^T never builds the [T, 2H] concatenation; the layer is a full-attention MoE
// layer like the model's, with its own KV cache (CudaSequenceState's MTP cache).
struct GpuMtp {
  QMatrix fc_embedding, fc_hidden;               // [H, H]: mtp.fc's columns [0, H) and [H, 2H)
  const float* pre_fc_norm_embedding = nullptr;  // [H]
  const float* pre_fc_norm_hidden = nullptr;     // [H]
  const float* norm = nullptr;                   // [H] mtp.norm
  GpuLayer layer;                                // mtp.layers.0, kind full_attention
};

class GpuWeights {
 public:
  // Uploads (and quantizes where needed) a loaded model. Prints progress on stderr.
  static std::unique_ptr<GpuWeights> upload(const ModelWeights& weights);

  // No weights yet: a builder fills the fields below with memory from allocate() (upload above;
  // bench/synthetic_weights.cu's random weights of a geometry).
  explicit GpuWeights(const ModelConfig& config) : config_(config) {}
  ~GpuWeights();
  GpuWeights(const GpuWeights&) = delete;
  GpuWeights& operator=(const GpuWeights&) = delete;

  const ModelConfig& config() const { return config_; }
  QMatrix embed_tokens, lm_head;
  const float* final_norm = nullptr;
  std::vector<GpuLayer> layers;
  std::optional<GpuMtp> mtp;  // when the loaded model has mtp.* (ModelWeights::mtp)
  uint64_t bytes() const { return bytes_; }

  // Device memory owned by this object, freed with it.
  void* allocate(uint64_t bytes);

 private:
  ModelConfig config_;
  std::vector<void*> allocations_;
  uint64_t bytes_ = 0;
};

}  // namespace lily::cuda
