// SPDX-License-Identifier: Apache-2.0
// The `kiln` command: parses the command line, runs one subcommand, turns errors into exit codes.
#include <fmt/format.h>

#include <cstdio>
#include <string_view>

#include "cli/commands.hpp"
#include "core/config.hpp"
#include "core/user_text.hpp"
#include "kiln/error.hpp"
#include "kiln/kiln.h"

namespace {

// `message` with its lines kept and the control characters within them escaped: errors echo
// specs, manifests and arguments, which must not drive the terminal.
std::string for_terminal(std::string_view message) {
  std::string shown;
  while (true) {
    const std::size_t newline = message.find('\n');
    shown += kiln::detail::escaped(message.substr(0, newline));
    if (newline == std::string_view::npos) return shown;
    shown += '\n';
    message.remove_prefix(newline + 1);
  }
}

// NOTE: CLI11 2.1.2 takes an empty argument for the name of a nameless option group (such as
// "Settings") and then spins forever on any unknown option after it (`kiln info "" --fix`), or
// ignores it; no kiln argument can be empty, so it is refused before CLI11 sees it.
int first_empty_argument(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (*argv[i] == '\0') return i;
  }
  return 0;
}

// Lists `command`'s commands, and theirs, under "Commands", as the usage calls them.
void name_commands_so(CLI::App& command) {
  for (CLI::App* sub : command.get_subcommands({})) {
    if (sub->get_name().empty()) continue;  // an option group
    sub->group("Commands");
    name_commands_so(*sub);
  }
}

int usage_error(std::string_view message) {
  fmt::print(stderr, "kiln: error: {}\nRun 'kiln --help' or 'kiln <command> --help'.\n",
             for_terminal(message));
  return kiln::cli::kUsage;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace kiln::cli;
  const kiln::detail::InterfaceScope cli_interface(kiln::detail::Interface::cli);
  if (const int empty = first_empty_argument(argc, argv)) {
    return usage_error(fmt::format(
        "argument {} is empty: kiln takes no empty arguments (is a shell variable unset?)", empty));
  }
  CLI::App app("Compiles, caches and inspects kiln's run-time compiled GPU kernels.", "kiln");
  app.set_version_flag(
      "--version", fmt::format("kiln {} (libkiln built from {})", KILN_VERSION, kiln_build_id()));
  app.get_formatter()->label("SUBCOMMAND", "COMMAND");
  app.get_formatter()->label("SUBCOMMANDS", "COMMANDS");
  int exit_code = kSuccess;
  add_info_command(app, exit_code);
  add_warm_command(app, exit_code);
  add_compile_command(app, exit_code);
  add_cache_commands(app, exit_code);
  add_help_command(app, exit_code);
  name_commands_so(app);
  // NOTE: one command at most; given none, kiln prints its usage and commands (below), as git
  // does, and so does `kiln cache`.
  app.require_subcommand(0, 1);
  if (const auto unknown = unknown_command(app, argc, argv)) return usage_error(*unknown);
  try {
    app.parse(argc, argv);
    if (const CLI::App* lacking = lacking_command(app)) {
      fmt::print("{}", help_of(*lacking));
      return kFailure;
    }
    return exit_code;
  } catch (const CLI::ParseError& e) {
    // NOTE: --help and --version arrive as ParseErrors with exit code 0.
    if (e.get_exit_code() == 0) return app.exit(e);
    return usage_error(e.what());
  } catch (const kiln::CompileError& e) {
    // Its message already starts with "kiln:" and carries the log, options, key and source path.
    const std::string message = for_terminal(e.what());
    fmt::print(stderr, "{}{}", message, message.ends_with('\n') ? "" : "\n");
    return kFailure;
  } catch (const kiln::Error& e) {
    fmt::print(stderr, "kiln: error: {}\n", for_terminal(e.what()));
    return e.category() == kiln::ErrorCategory::invalid_argument ? kUsage : kFailure;
  } catch (const std::exception& e) {
    fmt::print(stderr, "kiln: error: {}\n", for_terminal(e.what()));
    return kFailure;
  }
}
