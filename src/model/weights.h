// weights.h: the model's weights, one typed struct per layer kind, with HF names.
//
// Matrices are views: their bytes live in the memory-mapped checkpoint or in buffers the
// loader owns (ModelWeights::storage). A matrix is either plain (f32 / bf16 / f16), affine
// quantized (spec §5b: 4-bit or 8-bit codes, bf16 scale and bias per group of 64 inputs), or a
// GGUF tensor in one of ggml's block formats (model/gguf_dequant.h), rows as the file has them.
// Norm gains are stored as the effective multiplier in fp32: for the zero-centred norms
// that is 1 + w (HF stores w; mlx and GGUF store 1 + w), for the DeltaNet gated norm w.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/bf16.h"
#include "model/config.h"
#include "model/gguf_types.h"

namespace lily {

enum class MatrixFormat { f32, bf16, f16, affine, gguf };

// A linear layer's weight, [rows = out features, cols = in features], row-major.
struct Matrix {
  int64_t rows = 0, cols = 0;
  MatrixFormat format = MatrixFormat::f32;
  const void* data = nullptr;    // plain: rows*cols values; affine: uint32 codes [rows, cols*bits/32];
                                 // gguf: rows of ggml_row_bytes(gguf_type, cols) bytes
  const bf16* scales = nullptr;  // affine: [rows, cols/group_size]
  const bf16* biases = nullptr;  // affine: [rows, cols/group_size]
  int bits = 0;
  int group_size = 0;
  GgmlType gguf_type = GgmlType::F32;  // gguf: the block format

  bool empty() const { return data == nullptr; }
  bool quantized() const { return format == MatrixFormat::affine; }
  // Writes row r as cols floats.
  void dequantize_row(int64_t r, float* out) const;
  // Bytes the weight occupies (codes + scales + biases, or the plain values).
  uint64_t bytes() const;
  std::string describe() const;  // "q4g64 [512, 2048]" / "bf16 [512, 2048]" / "gguf Q4_K [512, 2048]"
};

// Routed experts: one gate/up/down matrix per expert (views into stacked or per-expert tensors).
struct ExpertWeights {
  std::vector<Matrix> gate_proj;  // [E] x [I, H]
  std::vector<Matrix> up_proj;    // [E] x [I, H]
  std::vector<Matrix> down_proj;  // [E] x [H, I]
};

// Sparse MoE block, in every layer (spec §2.7).
struct MoeWeights {
  Matrix router;  // mlp.gate                [E, H]
  ExpertWeights experts;
  Matrix shared_gate_proj;    // mlp.shared_expert.gate_proj [Is, H]
  Matrix shared_up_proj;      // mlp.shared_expert.up_proj   [Is, H]
  Matrix shared_down_proj;    // mlp.shared_expert.down_proj [H, Is]
  Matrix shared_expert_gate;  // mlp.shared_expert_gate      [1, H]
};

// Gated full attention (spec §2.4).
struct AttentionWeights {
  Matrix q_proj;              // [2 * nq * 256, H]: per head 256 query rows then 256 gate rows
  Matrix k_proj;              // [nkv * 256, H]
  Matrix v_proj;              // [nkv * 256, H]
  Matrix o_proj;              // [H, nq * 256]
  std::vector<float> q_norm;  // [256] effective gain (1 + w)
  std::vector<float> k_norm;  // [256] effective gain (1 + w)
};

// Gated DeltaNet (spec §2.6).
struct DeltaNetWeights {
  Matrix in_proj_qkv;          // [2*Hk*128 + Hv*128, H]  rows q | k | v, head-major
  Matrix in_proj_z;            // [Hv*128, H]
  Matrix in_proj_b;            // [Hv, H]  beta logits
  Matrix in_proj_a;            // [Hv, H]  decay input
  Matrix out_proj;             // [H, Hv*128]
  std::vector<float> conv1d;   // [conv_dim, K]  depthwise causal conv; w[c, K-1] multiplies the current token
  std::vector<float> A_log;    // [Hv]
  std::vector<float> dt_bias;  // [Hv]
  std::vector<float> norm;     // [128] gated RMSNorm weight (plain, not zero-centred)
};

struct LayerWeights {
  LayerKind kind = LayerKind::linear_attention;
  std::vector<float> input_layernorm;           // [H] effective gain
  std::vector<float> post_attention_layernorm;  // [H] effective gain
  AttentionWeights attention;                   // when kind == full_attention
  DeltaNetWeights deltanet;                     // when kind == linear_attention
  MoeWeights moe;
};

// The multi-token-prediction head (spec §5a, §6): one full-attention MoE decoder layer between
// two input norms and its own final norm. It has no embedding or lm_head of its own: it reads
// the main model's embed_tokens and lm_head.
struct MtpWeights {
  Matrix fc;                                 // mtp.fc [H, 2H]: columns [0, H) the embedding, [H, 2H) the hidden
  std::vector<float> pre_fc_norm_embedding;  // [H] effective gain (1 + w)
  std::vector<float> pre_fc_norm_hidden;     // [H] effective gain (1 + w)
  LayerWeights layer;                        // mtp.layers.0, kind full_attention
  std::vector<float> norm;                   // mtp.norm [H] effective gain (1 + w)
};

// Where the weights came from.
enum class CheckpointLayout { hf, mlx, gguf };
std::string to_string(CheckpointLayout layout);

struct ModelWeights {
  ModelConfig config;
  GenerationConfig generation;
  CheckpointLayout layout = CheckpointLayout::hf;
  std::string model_dir;

  Matrix embed_tokens;  // [vocab, H]
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm;  // [H] effective gain
  Matrix lm_head;                 // [vocab, H]

  // The MTP head when the checkpoint (or LoadOptions::mtp_dir) has mtp.*; absent otherwise
  // (mlx-community conversions drop it). mtp_dir: the directory it was read from.
  std::optional<MtpWeights> mtp;
  std::string mtp_dir;

  // Keeps the mapped files and any converted buffers alive.
  std::vector<std::shared_ptr<void>> storage;

  // The main text decoder's parameters (dequantized count) and bytes as held in memory, without
  // the MTP head (a decode step reads none of it); mtp_weight_bytes(): the MTP head's (0 when absent).
  uint64_t parameter_count() const;
  uint64_t weight_bytes() const;
  uint64_t mtp_weight_bytes() const;
};

}  // namespace lily
