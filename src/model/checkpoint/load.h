// load.h: a model directory -> ModelWeights, for both checkpoint layouts (spec §5).
//
//   hf  : official Hugging Face safetensors (`model.language_model.*` + `lm_head.weight`, or a
//         flat text-only `model.*`), bf16; experts fused 3-D (`mlp.experts.gate_up_proj`
//         [E, 2I, H], `mlp.experts.down_proj` [E, H, I]) or per expert
//         (`mlp.experts.{e}.{gate,up,down}_proj.weight`); `model.visual.*` skipped; `mtp.*` (the
//         MTP head, top level) loaded when present, its experts per expert as published, or fused.
//   mlx : mlx-community conversions (`language_model.model.*`, `language_model.lm_head`), experts
//         stacked as `mlp.switch_mlp.{gate,up,down}_proj`, affine-quantized matrices
//         (`.weight` uint32 codes + `.scales` + `.biases`), conv1d [C, K, 1], zero-centred
//         norms stored as 1 + w.
//   gguf : a llama.cpp `qwen35moe` GGUF file, split set or directory holding one
//          (model/gguf_weights.h: what is kept and what is undone).
// Every tensor's shape is checked; a missing or mis-shaped tensor is an error naming the
// tensor, the expected and the found shape. That holds for mtp.* too: a checkpoint with part of
// the MTP head does not load.
#pragma once

#include <memory>
#include <string>

#include "model/weights.h"

namespace lily {

struct LoadOptions {
  // Quantize plain (bf16/f16/f32) matrices at load to the mlx affine scheme: 4-bit group 64,
  // router and shared_expert_gate 8-bit. 0 keeps them as stored.
  int quantize_bits = 0;
  // The MTP head (mtp.*) from this directory instead of the model's own: the Hugging Face
  // checkpoint beside an mlx conversion (which drops mtp.*), or any directory of safetensors
  // holding the published mtp.* tensors. Empty: the model directory's mtp.*, if any.
  std::string mtp_dir = {};
};

std::shared_ptr<ModelWeights> load_model(const std::string& model_dir, const LoadOptions& options = {});

// Whether load_model reads `path` as a GGUF model: a GGUF file (llama.cpp's format, spec §5c: by
// its .gguf name or its magic) or a directory holding .gguf files and no .safetensors.
bool is_gguf_model(const std::string& path);

}  // namespace lily
