// gguf_vocabulary.h: a GGUF's tokenizer.ggml.* metadata read into a GgmlVocabulary
// (tokenizer/ggml_vocabulary.h, plain data) for Tokenizer::from_ggml, every key's type and
// count checked:
//
//   tokenizer.ggml.model        string           "gpt2" (what Tokenizer::from_ggml accepts)
//   tokenizer.ggml.pre          string, optional "qwen35"
//   tokenizer.ggml.tokens       array<string>    one per id (llama.cpp: as many as token_embd rows)
//   tokenizer.ggml.token_type   array<int>, optional, as many as tokens
//   tokenizer.ggml.merges       array<string>, optional "left right"
//   tokenizer.ggml.{bos,eos,eot,unknown,seperator,padding}_token_id   integers, optional: each
//                               must name a token (only checked; eos is a stop: gguf_stop_token_ids)
//   tokenizer.ggml.add_{bos,eos}_token   bool, optional (checked; lily never adds either)
//   tokenizer.chat_template     string, optional (checked; lily renders the Qwen3.6 template it
//                               has built in, src/chat)
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "model/gguf_file.h"
#include "tokenizer/ggml_vocabulary.h"

namespace lily {

// nullopt when there is no tokenizer.ggml.model (a GGUF of weights only). Throws lily::Error
// naming the key and what it holds when a key is mistyped or an id is out of range.
std::optional<GgmlVocabulary> gguf_vocabulary(const std::map<std::string, GgufValue>& metadata);

// A GGUF's stop tokens: the set the Hugging Face checkpoint's generation_config.json lists, which
// a GGUF does not carry (Qwen3.6: eos_token_id [248046 <|im_end|>, 248044 <|endoftext|>], spec
// tokenizer-chat-api.md §1.4; its GGUFs name one of the two as tokenizer.ggml.eos_token_id):
// tokenizer.ggml.eos_token_id when present, then <|im_end|> and <|endoftext|> where the
// vocabulary has them as added tokens (CONTROL or USER_DEFINED, as Tokenizer::token_id finds
// them), each id once. Throws lily::Error naming the key when an id is not below vocab_size
// (the model's embedding rows) or a key is mistyped.
std::vector<int> gguf_stop_token_ids(const std::map<std::string, GgufValue>& metadata, int vocab_size);

}  // namespace lily
