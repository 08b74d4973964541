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
//                               must name a token (only checked: lily's stops come from gguf_config)
//   tokenizer.ggml.add_{bos,eos}_token   bool, optional (checked; lily never adds either)
//   tokenizer.chat_template     string, optional (checked; lily renders the Qwen3.6 template it
//                               has built in, src/chat)
#pragma once

#include <map>
#include <optional>
#include <string>

#include "model/gguf_file.h"
#include "tokenizer/ggml_vocabulary.h"

namespace lily {

// nullopt when there is no tokenizer.ggml.model (a GGUF of weights only). Throws lily::Error
// naming the key and what it holds when a key is mistyped or an id is out of range.
std::optional<GgmlVocabulary> gguf_vocabulary(const std::map<std::string, GgufValue>& metadata);

}  // namespace lily
