// pretokenizer.h: the Split(Regex, behavior="isolated") pre-tokenizer of tokenizer.json (spec §1.2).
//
// HF `tokenizers` runs the pattern with Oniguruma; we run it with PCRE2 (UTF + UCP + JIT), which
// has the same ordered-alternation backtracking semantics and the same \p{L} \p{M} \p{N}. The one
// difference is `\s`: Oniguruma's is the Unicode White_Space property, PCRE2's UCP `\s` leaves out
// U+0085 (NEL). So `\s` and `\S` are rewritten to an explicit White_Space class before compiling.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace lily {

class SplitPretokenizer {
 public:
  // Compiles an Oniguruma-syntax `pattern`; throws lily::Error on a pattern PCRE2 rejects.
  explicit SplitPretokenizer(const std::string& pattern);
  ~SplitPretokenizer();
  SplitPretokenizer(const SplitPretokenizer&) = delete;
  SplitPretokenizer& operator=(const SplitPretokenizer&) = delete;

  // Splits valid UTF-8 `text` into pieces that cover it exactly: every match of the pattern, and
  // every stretch between matches ("isolated"). Appends them to `pieces`. Thread-safe.
  void split(std::string_view text, std::vector<std::string_view>& pieces) const;

 private:
  struct Compiled;
  std::unique_ptr<Compiled> compiled_;
};

// The Qwen3.5 / Qwen3.6 split pattern (spec §1.2), exactly as in HF tokenization_qwen3_5.py.
extern const char* const kQwen35SplitPattern;
// Qwen2's (and Qwen3's): the same without the combining marks \p{M} (llama.cpp's pre "qwen2").
extern const char* const kQwen2SplitPattern;

}  // namespace lily
