// The `kiln` command: parses the command line, runs one subcommand, turns errors into exit codes.
#include <fmt/format.h>

#include <cstdio>
#include <string_view>

#include "cli/commands.hpp"
#include "kiln/error.hpp"

int main(int argc, char** argv) {
  using namespace kiln::cli;
  CLI::App app("Compiles, caches and inspects kiln's run-time compiled GPU kernels.", "kiln");
  app.set_version_flag("--version", "kiln " KILN_VERSION);
  app.require_subcommand(1);
  int exit_code = kSuccess;
  add_info_command(app, exit_code);
  add_warm_command(app, exit_code);
  add_compile_command(app, exit_code);
  add_cache_commands(app, exit_code);
  try {
    app.parse(argc, argv);
    return exit_code;
  } catch (const CLI::ParseError& e) {
    // NOTE: --help and --version arrive as ParseErrors with exit code 0.
    if (e.get_exit_code() == 0) return app.exit(e);
    fmt::print(stderr, "kiln: error: {}\nRun 'kiln --help' or 'kiln <command> --help'.\n",
               e.what());
    return kUsage;
  } catch (const kiln::CompileError& e) {
    // Its message already starts with "kiln:" and carries the log, options, key and source path.
    const std::string_view message = e.what();
    fmt::print(stderr, "{}{}", message, message.ends_with('\n') ? "" : "\n");
    return kFailure;
  } catch (const kiln::Error& e) {
    fmt::print(stderr, "kiln: error: {}\n", e.what());
    return e.category() == kiln::ErrorCategory::invalid_argument ? kUsage : kFailure;
  } catch (const std::exception& e) {
    fmt::print(stderr, "kiln: error: {}\n", e.what());
    return kFailure;
  }
}
