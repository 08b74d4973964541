// gguf_config.h: lily's ModelConfig and GenerationConfig from a `qwen35moe` GGUF's metadata
// (spec §5c: the llama.cpp keys and the HF fields they come from).
//
//   block_count - nextn_predict_layers   num_layers (the MTP block, when present, is the last)
//   embedding_length                     hidden_size
//   attention.head_count / head_count_kv / key_length (= value_length)   attention heads, head_dim
//   rope.dimension_count / freq_base     rotary_dim, rope_theta
//   ssm.group_count / time_step_rank     linear_num_key_heads / linear_num_value_heads
//   ssm.state_size, ssm.inner_size / time_step_rank   linear key / value head dims
//   ssm.conv_kernel                      linear_conv_kernel_dim
//   expert_count / expert_used_count / expert_feed_forward_length /
//   expert_shared_feed_forward_length    the MoE sizes
//   full_attention_interval (default 4)  layer i is full attention when (i + 1) % interval == 0
//   token_embd.weight ne[1]              vocab_size; no output.weight: tied embeddings
//   tokenizer.ggml.eos_token_id          a stop token; <|im_end|> and <|endoftext|> of the
//                                        vocabulary the others (gguf_vocabulary.h gguf_stop_token_ids)
// A missing, mistyped or unsupported value is an error naming the key and the value found.
#pragma once

#include "model/config.h"
#include "model/gguf_file.h"

namespace lily {

struct GgufModelConfig {
  ModelConfig config;
  GenerationConfig generation;
  int nextn_layers = 0;  // qwen35moe.nextn_predict_layers: MTP blocks after the main ones
};

GgufModelConfig gguf_model_config(const GgufModel& model);

}  // namespace lily
