// SPDX-License-Identifier: Apache-2.0
// The `kiln` command's subcommands and the options and output helpers they share.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "cache/disk.hpp"
#include "kiln/runtime.hpp"

namespace kiln::cli {

// `kiln` exits 0 on success, 1 when the work failed and 2 when it was asked wrongly.
enum ExitCode : int { kSuccess = 0, kFailure = 1, kUsage = 2 };

// The settings subcommands take; each fills the kiln::Options field of the same name.
struct CommonArgs {
  std::optional<std::filesystem::path> kernels_dir;
  std::optional<std::filesystem::path> cache_dir;
  std::vector<std::string> targets;  // several only where TargetCount::many allows
  std::optional<std::string> backend;
  std::optional<std::string> jit;
  std::optional<std::string> log;
};

// How many --target values a subcommand takes: `kiln warm` builds for several at once.
enum class TargetCount { one, many };

// Every setting: for the commands that compile or report on compiling.
void add_common_options(CLI::App& command, CommonArgs& args, TargetCount targets);
// --cache-dir and --log alone: for `kiln cache`, which compiles nothing.
void add_cache_options(CLI::App& command, CommonArgs& args);

// With several targets no single default exists, so Options::target is left to the
// environment; the caller then names a target in every spec.
Options to_options(const CommonArgs& args);

// The disk cache that a Runtime built from `options` would use: the same resolution of options
// and KILN_* variables, so `kiln cache` sees the same root. Only `kiln warm`, which fills it,
// creates a missing root (`create_root`); the commands that inspect it create nothing.
detail::DiskCache open_disk_cache(const Options& options, bool create_root);
// Throws kiln::Error (cache), saying why and how to fix it, when `cache` is memory-only (its
// root missing, say): the commands that act on the disk cache have nothing to act on.
void require_writable(const detail::DiskCache& cache);

// Each declares its subcommands on `app`. The callback of the one that runs stores its exit
// code in `exit_code`; errors are thrown as kiln::Error and reported by main.
void add_info_command(CLI::App& app, int& exit_code);
void add_warm_command(CLI::App& app, int& exit_code);
void add_compile_command(CLI::App& app, int& exit_code);
void add_cache_commands(CLI::App& app, int& exit_code);
void add_help_command(CLI::App& app, int& exit_code);

// What `kiln help COMMAND...` and `kiln COMMAND --help` print: usage, options and commands.
std::string help_of(const CLI::App& command);
// After parsing: the command that holds commands but was given none (`kiln`, `kiln cache`), or
// null.
const CLI::App* lacking_command(const CLI::App& app);

// The named subcommands of `command` (its option groups are nameless ones).
std::vector<const CLI::App*> subcommands_of(const CLI::App& command);
// The command that `words` ("cache", "ls") name below `app`, or the error for the first word that
// names none, as unknown_command() words it.
std::variant<const CLI::App*, std::string> named_command(const CLI::App& app,
                                                         const std::vector<std::string>& words);

// The error for the first word of `argv` that names no subcommand where one is expected, with
// the nearest name: "unknown command 'infos'; did you mean 'info'?".
std::optional<std::string> unknown_command(const CLI::App& app, int argc, char** argv);

// "0 B", "812 B", "1.5 KiB", "2.0 GiB".
std::string human_bytes(std::uint64_t bytes);
// "210 ms" below ten seconds, "12.3 s" above.
std::string human_ms(double ms);

// Left-aligned columns two spaces apart, under a header row; the last column is not padded.
// Every row has as many cells as the header.
void print_table(std::FILE* out, const std::vector<std::string>& header,
                 const std::vector<std::vector<std::string>>& rows);

}  // namespace kiln::cli
