// ggml_vocabulary.h: a tokenizer as a llama.cpp GGUF stores it (the tokenizer.ggml.* metadata),
// plain data: model/gguf_vocabulary reads it out of a GGUF's metadata, Tokenizer::from_ggml
// builds lily's tokenizer from it (tokenizer_ggml.cpp). Depends on nothing.
//
// llama.cpp's converter (convert_hf_to_gguf.py, get_vocab_base and gguf-py SpecialVocab) writes a
// Hugging Face tokenizer.json as: one token per id up to the model's vocab_size, BPE vocabulary
// entries in their byte-level form ("Ġthe") typed NORMAL, added tokens by their content typed
// CONTROL (special, or looking special: "<|...|>") or USER_DEFINED, the ids nothing defines as
// "[PAD<id>]" typed UNUSED, and model.merges as "left right" strings in rank order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lily {

// tokenizer.ggml.token_type values (llama.cpp's llama_token_type / gguf-py TokenType).
enum class GgmlTokenType : int32_t {
  undefined = 0,
  normal = 1,
  unknown = 2,
  control = 3,
  user_defined = 4,
  unused = 5,
  byte = 6,
};

struct GgmlVocabulary {
  std::string model;                 // tokenizer.ggml.model: "gpt2" is byte-level BPE
  std::string pre;                   // tokenizer.ggml.pre: the pre-tokenizer ("qwen35")
  std::vector<std::string> tokens;   // tokenizer.ggml.tokens: the text of each id
  std::vector<int32_t> token_types;  // tokenizer.ggml.token_type (GgmlTokenType); empty: all normal
  std::vector<std::string> merges;   // tokenizer.ggml.merges: "left right", lowest rank first
};

}  // namespace lily
