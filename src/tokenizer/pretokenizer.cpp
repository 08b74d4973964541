// pretokenizer.cpp: the split regex on PCRE2 (UTF, UCP, JIT).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/pretokenizer.h"

#include <pcre2.h>

#include "base/error.h"

namespace lily {

const char* const kQwen35SplitPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kQwen2SplitPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

namespace {

// Unicode White_Space (PropList.txt), which is what Oniguruma's \s matches on Unicode strings.
constexpr std::string_view kWhiteSpaceMembers =
    R"(\x{09}-\x{0D}\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

// Rewrites \s and \S (outside or inside character classes) to explicit White_Space classes.
std::string rewrite_whitespace_classes(const std::string& pattern) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[++i];
      if (e == 's') {
        if (in_class) {
          out += kWhiteSpaceMembers;
        } else {
          out += '[';
          out += kWhiteSpaceMembers;
          out += ']';
        }
      } else if (e == 'S') {
        LILY_CHECK(!in_class, "split pattern: \\S inside a character class is not supported");
        out += "[^";
        out += kWhiteSpaceMembers;
        out += ']';
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member, not the end of the class.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

}  // namespace

struct SplitPretokenizer::Compiled {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Compiled() { pcre2_code_free(code); }
};

SplitPretokenizer::SplitPretokenizer(const std::string& pattern) : compiled_(std::make_unique<Compiled>()) {
  const std::string rewritten = rewrite_whitespace_classes(pattern);  // \s as Python's re means it
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  compiled_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten.data()), rewritten.size(),
                                  PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
  if (!compiled_->code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    fail("split pattern '{}': PCRE2 error at offset {}: {}", pattern, error_offset,
         reinterpret_cast<const char*>(message));
  }
  compiled_->jit = pcre2_jit_compile(compiled_->code, PCRE2_JIT_COMPLETE) == 0;
}

SplitPretokenizer::~SplitPretokenizer() = default;

void SplitPretokenizer::split(std::string_view text, std::vector<std::string_view>& pieces) const {
  if (text.empty()) return;
  // Per-call match state keeps the compiled pattern shareable across threads.
  pcre2_match_data* match = pcre2_match_data_create_from_pattern(compiled_->code, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* stack = compiled_->jit ? pcre2_jit_stack_create(32 * 1024, 8 << 20, nullptr) : nullptr;
  if (stack) pcre2_jit_stack_assign(context, nullptr, stack);
  struct Free {
    pcre2_match_data* m;
    pcre2_match_context* c;
    pcre2_jit_stack* s;
    ~Free() {
      pcre2_match_data_free(m);
      pcre2_match_context_free(c);
      pcre2_jit_stack_free(s);
    }
  } free_all{match, context, stack};

  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;      // where the next search starts
  size_t emitted = 0;  // end of the last piece appended
  while (pos < text.size()) {
    const int rc = pcre2_match(compiled_->code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, match, context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      fail("split pattern: PCRE2 match error: {}", reinterpret_cast<const char*>(message));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match);
    const size_t begin = ov[0], end = ov[1];
    if (end == begin) {
      // An empty match produces no piece; step over one character (UTF-8 lead + continuations).
      pos = begin + 1;
      while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
      continue;
    }
    if (begin > emitted) pieces.push_back(text.substr(emitted, begin - emitted));
    pieces.push_back(text.substr(begin, end - begin));
    emitted = pos = end;
  }
  if (emitted < text.size()) pieces.push_back(text.substr(emitted));
}

}  // namespace lily
