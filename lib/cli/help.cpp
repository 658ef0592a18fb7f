// SPDX-License-Identifier: Apache-2.0
// `kiln help [COMMAND...]`, and the usage that `kiln` and `kiln cache` print when given no command.
#include <fmt/format.h>

#include <memory>

#include "cli/commands.hpp"
#include "kiln/error.hpp"

namespace kiln::cli {

std::string help_of(const CLI::App& command) {
  std::string path;
  for (const CLI::App* named = &command; named != nullptr; named = named->get_parent()) {
    path = named->get_name() + (path.empty() ? "" : " ") + path;
  }
  // NOTE: not App::help(), which shows the help of the command parsed below this one instead:
  // `kiln help` would show help's own.
  return command.get_formatter()->make_help(&command, path, CLI::AppFormatMode::Normal);
}

const CLI::App* lacking_command(const CLI::App& app) {
  const CLI::App* command = &app;
  while (true) {
    const std::vector<const CLI::App*> subs = subcommands_of(*command);
    if (subs.empty()) return nullptr;
    const auto chosen =
        std::find_if(subs.begin(), subs.end(), [](const CLI::App* sub) { return sub->parsed(); });
    if (chosen == subs.end()) return command;
    command = *chosen;
  }
}

void add_help_command(CLI::App& app, int& exit_code) {
  auto words = std::make_shared<std::vector<std::string>>();
  CLI::App* command =
      app.add_subcommand("help", "Show the commands, or a command's usage and options");
  command->add_option("command", *words, "The command, such as `info` or `cache ls`")
      ->type_name("COMMAND...");
  command->callback([&app, words, &exit_code] {
    const auto named = named_command(app, *words);
    if (const auto* error = std::get_if<std::string>(&named)) {
      throw Error(ErrorCategory::invalid_argument, *error);
    }
    fmt::print("{}", help_of(*std::get<const CLI::App*>(named)));
    exit_code = kSuccess;
  });
}

}  // namespace kiln::cli
