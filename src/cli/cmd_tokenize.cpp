// cmd_tokenize.cpp: `lily tokenize` and `lily detokenize`, the tokenizer on stdin/stdout.
//
//   printf 'Hello<|im_end|>' | lily tokenize -m DIR     ->  "9707 248046\n"
//   lily tokenize -m FILE.gguf 'Hello<|im_end|>'        ->  "9707 248046\n"
//   echo "9707 248046" | lily detokenize -m DIR         ->  "Hello<|im_end|>"  (no newline added)
//   lily detokenize -m FILE.gguf 9707,248046            ->  "Hello<|im_end|>"
//
// The text (the ids) is the argument when given, else stdin exactly as read (a trailing newline
// is part of the text). -m needs only the tokenizer, found as the engine finds it (engine.h
// find_model_tokenizer): tokenizer.json in the model directory, else a GGUF's own vocabulary;
// no weights are read. Special-token strings in the text become their tokens, as HF does.
#include <cctype>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/error.h"
#include "cli/command.h"
#include "runtime/engine.h"
#include "tokenizer/tokenizer.h"

namespace lily::cli {
namespace {

std::string read_stdin() {
  std::string text;
  char buffer[1 << 16];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), stdin)) > 0) text.append(buffer, n);
  LILY_CHECK(!std::ferror(stdin), "reading stdin failed");
  return text;
}

// Ids separated by whitespace and/or commas (brackets are ignored too, so "[1, 2]" works).
std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (c == ',' || c == '[' || c == ']' || std::isspace(static_cast<unsigned char>(c))) {
      ++i;
      continue;
    }
    size_t end = i;
    while (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end]))) ++end;
    LILY_CHECK(end > i && end - i <= 9, "expected a token id at offset {}, found '{}'", i, text.substr(i, 16));
    ids.push_back(static_cast<int32_t>(std::stol(text.substr(i, end - i))));
    i = end;
  }
  return ids;
}

// -m and the optional positional input both commands take.
struct TokenizerArgs {
  std::string model = default_model_dir();
  std::string argument;                // the input, when given on the command line
  const CLI::Option* given = nullptr;  // its option: count() says whether it was given

  void add_to(CLI::App& sub, const char* name, const char* help) {
    sub.add_option("-m,--model", model,
                   "Model directory or GGUF file (its tokenizer.json, else the GGUF's own vocabulary)");
    given = sub.add_option(name, argument, help);
  }
  std::string input() const { return given->count() ? argument : read_stdin(); }
};

const CommandRegistration tokenize_command{
    Command{"tokenize", "Print the token ids of a UTF-8 text (the argument, or stdin)",
            [](CLI::App& sub) {
              auto a = std::make_shared<TokenizerArgs>();
              a->add_to(sub, "text", "The text to tokenize (default: stdin, exactly as read)");
              return std::function<int()>([a] {
                const Tokenizer tokenizer = load_model_tokenizer(a->model).tokenizer;
                const std::vector<int32_t> ids = tokenizer.encode(a->input());
                std::string line;
                for (size_t i = 0; i < ids.size(); ++i) {
                  if (i) line += ' ';
                  line += std::to_string(ids[i]);
                }
                line += '\n';
                std::fwrite(line.data(), 1, line.size(), stdout);
                return 0;
              });
            },
            20}};

const CommandRegistration detokenize_command{
    Command{"detokenize", "Print the text of token ids (the argument, or stdin; whitespace or comma separated)",
            [](CLI::App& sub) {
              auto a = std::make_shared<TokenizerArgs>();
              a->add_to(sub, "ids", "The ids to decode, whitespace or comma separated (default: stdin)");
              return std::function<int()>([a] {
                const Tokenizer tokenizer = load_model_tokenizer(a->model).tokenizer;
                const std::string text = tokenizer.decode(parse_ids(a->input()));
                std::fwrite(text.data(), 1, text.size(), stdout);
                return 0;
              });
            },
            21}};

}  // namespace
}  // namespace lily::cli
