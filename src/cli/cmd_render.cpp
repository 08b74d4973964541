// cmd_render.cpp: `lily render` prints the prompt the chat template renders for an OpenAI
// chat-completions request read on stdin (messages, tools, chat_template_kwargs), generation
// prompt included. The template is built in (src/chat/chat_template.cpp); -m is accepted for
// symmetry with the other commands.
#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>

#include "base/error.h"
#include "chat/chat_template.h"
#include "cli/command.h"

namespace lily::cli {
namespace {

int run_render() {
  std::string input{std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>()};
  json request = json::parse(input, nullptr, /*allow_exceptions=*/false);
  if (request.is_discarded()) fail("stdin is not a valid JSON request");
  std::string prompt = render_chat_request(request);
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  std::fflush(stdout);
  return 0;
}

const CommandRegistration kRender{
    Command{"render", "Print the chat-template prompt for an OpenAI chat request read on stdin",
            [](CLI::App& sub) -> std::function<int()> {
              auto model_dir = std::make_shared<std::string>(default_model_dir());
              sub.add_option("-m,--model", *model_dir, "Model directory (the template is built in)");
              return [model_dir] { return run_render(); };
            },
            60}};

}  // namespace
}  // namespace lily::cli
