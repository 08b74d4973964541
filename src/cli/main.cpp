// main.cpp: the `lily` executable. Subcommands live in cmd_*.cpp (see command.h).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "base/error.h"
#include "cli/command.h"

namespace lily::cli {

std::vector<Command>& command_registry() {
  static std::vector<Command> registry;
  return registry;
}

std::string default_model_dir() {
  if (const char* env = std::getenv("LILY_MODEL")) return env;
  // The embedded default model sits next to the source tree the binary was built from.
  return std::string(LILY_SOURCE_DIR) + "/models/lily-tiny";
}

}  // namespace lily::cli

int main(int argc, char** argv) {
  using namespace lily::cli;
  CLI::App app{"lily: a fast inference engine for Qwen3.6-35B-A3B"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "lily 0.1.0");

  auto& commands = command_registry();
  std::stable_sort(commands.begin(), commands.end(),
                   [](const Command& a, const Command& b) { return a.order < b.order; });
  std::function<int()> selected;
  for (auto& command : commands) {
    CLI::App* sub = app.add_subcommand(command.name, command.description);
    auto run = command.setup(*sub);
    sub->callback([run, &selected] { selected = run; });
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    return selected ? selected() : 0;
  } catch (const lily::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
