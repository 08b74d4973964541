// cmd_tokenize.cpp: `lily tokenize` and `lily detokenize`, the tokenizer on stdin/stdout.
//
//   printf 'Hello<|im_end|>' | lily tokenize -m DIR     ->  "9707 248046\n"
//   echo "9707 248046" | lily detokenize -m DIR         ->  "Hello<|im_end|>"  (no newline added)
//
// stdin is used exactly as read (a trailing newline is part of the text). DIR needs only
// tokenizer.json. Special-token strings in the text become their tokens, as HF does.
#include <cctype>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/error.h"
#include "cli/command.h"
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

const CommandRegistration tokenize_command{
    Command{"tokenize", "Print the token ids of the UTF-8 text on stdin",
            [](CLI::App& sub) {
              auto model_dir = std::make_shared<std::string>(default_model_dir());
              sub.add_option("-m,--model", *model_dir, "Model directory (needs tokenizer.json)");
              return std::function<int()>([model_dir] {
                const Tokenizer tokenizer = Tokenizer::load_from_model_dir(*model_dir);
                const std::vector<int32_t> ids = tokenizer.encode(read_stdin());
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
    Command{"detokenize", "Print the text of the token ids on stdin (whitespace or comma separated)",
            [](CLI::App& sub) {
              auto model_dir = std::make_shared<std::string>(default_model_dir());
              sub.add_option("-m,--model", *model_dir, "Model directory (needs tokenizer.json)");
              return std::function<int()>([model_dir] {
                const Tokenizer tokenizer = Tokenizer::load_from_model_dir(*model_dir);
                const std::string text = tokenizer.decode(parse_ids(read_stdin()));
                std::fwrite(text.data(), 1, text.size(), stdout);
                return 0;
              });
            },
            21}};

}  // namespace
}  // namespace lily::cli
