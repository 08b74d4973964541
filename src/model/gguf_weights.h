// gguf_weights.h: a `qwen35moe` GGUF (llama.cpp's layout, spec §5c) as lily's ModelWeights.
//
// What the converter changed, and what the loader does with it:
//   kept    matrices in their block format, read where they lie in the mapped file (F32, F16,
//           BF16 as lily's plain formats; the block types as MatrixFormat::gguf); norms stored
//           as the effective gain (HF's w + 1), which is what lily holds; conv1d {K, C} is
//           lily's [C][K]; attn_q keeps HF's per-head query | gate rows; split gate/up experts
//           are views into the stacked tensors (a fused ffn_gate_up_exps too).
//   undone  the V-head reorder (HF grouped order n = kh * r + j, GGUF tiled n' = j * Hk + kh):
//           the rows of attn_qkv's V part, attn_gate, ssm_alpha, ssm_beta, the V channels of
//           conv1d, ssm_dt and ssm_a go back to HF order by moving whole rows (exact, any
//           type); ssm_out's columns by moving blocks within each row when the type's block
//           divides a head's 128 columns (F32, F16, BF16, Q4_0, Q8_0), else the matrix is
//           decoded to f32 in HF order (exact, 4 bytes a weight: lily's kernels take the heads
//           in HF order); ssm_a = -exp(A_log) becomes A_log = log(-ssm_a).
// The MTP block (nextn_predict_layers = 1: block n_main with its nextn tensors) is read as
// MtpWeights. The tokenizer is not read from the GGUF yet.
#pragma once

#include <memory>
#include <string>

#include "model/weights.h"

namespace lily {

// `path`: a .gguf file, one shard of a split set, or a directory holding one (GgufModel).
std::shared_ptr<ModelWeights> load_gguf_model(const std::string& path);

}  // namespace lily
