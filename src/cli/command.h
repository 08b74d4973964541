// command.h: how a `lily` subcommand plugs into the command line.
//
// Each cmd_*.cpp file defines its subcommands and registers them with a static
// CommandRegistration; main.cpp builds the CLI11 app from the registry. The cli sources are
// compiled straight into the executable, so every registration is linked.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace lily::cli {

struct Command {
  std::string name;
  std::string description;
  // Adds the subcommand's options to `sub` and returns the function that runs it; that
  // function returns the process exit code.
  std::function<std::function<int()>(CLI::App& sub)> setup;
  int order = 100;  // position in `lily --help`
};

std::vector<Command>& command_registry();

struct CommandRegistration {
  explicit CommandRegistration(Command command) { command_registry().push_back(std::move(command)); }
};

// The model directory used when -m is not given (the embedded default model).
std::string default_model_dir();

}  // namespace lily::cli
