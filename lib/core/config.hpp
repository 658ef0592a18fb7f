// SPDX-License-Identifier: Apache-2.0
// The one place that reads KILN_* environment variables and merges them with Options.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "kiln/runtime.hpp"
#include "kiln/target.hpp"

namespace kiln::detail {

struct Config {
  std::optional<Vendor> backend;  // from "cuda" or "hip"
  std::optional<Target> target;
  std::optional<std::filesystem::path> kernels_dir;  // from Options or KILN_KERNELS_DIR
  std::optional<std::filesystem::path> cache_dir;    // nullopt: no usable default (no HOME)
  std::vector<std::filesystem::path> cache_ro_dirs;
  bool cache_ro_trust = false;
  std::uint64_t cache_max_bytes = 0;
  JitMode jit = JitMode::on;
  LogLevel log_level = LogLevel::warn;
  std::optional<std::filesystem::path> dump_dir;
  std::optional<std::filesystem::path> record;  // the manifest KILN_RECORD appends specs to
  bool debug = false;
  int device = 0;
};

// Options win over the environment, the environment over defaults. A malformed variable is a
// kiln::Error (invalid_argument) naming the variable, its value and what it accepts.
Config resolve_config(const Options& options);

JitMode parse_jit_mode(std::string_view text, std::string_view what);
LogLevel parse_log_level(std::string_view text, std::string_view what);
// 1, true or on; 0, false or off (KILN_DEBUG).
bool parse_switch(std::string_view text, std::string_view what);
// A byte count: digits with an optional K, M, G or T suffix (or KB, MB, GB, TB; powers of 1024),
// for KILN_CACHE_MAX_BYTES and `kiln cache prune`. Anything else, or a count beyond 2^64 - 1,
// is a kiln::Error (invalid_argument) naming `what` and the text.
std::uint64_t parse_bytes(const std::string& text, std::string_view what);

// The interface a thread serves: messages name the knobs its caller can turn.
enum class Interface { cpp, c, cli };

// Knobs that messages tell the caller to turn.
// warmup: loading kernels ahead of the hot path; compile_only: compiling for a given target
// without loading.
enum class Knob { backend, target, kernels_dir, device, debug, warmup, compile_only };

// `knob` as this thread's interface spells it, with its KILN_* variable where it has one:
// "Options::target or KILN_TARGET" in C++, "--target or KILN_TARGET" in the CLI.
std::string knob_name(Knob knob);

// This thread's interface: C++ unless an InterfaceScope says otherwise.
Interface current_interface();

// Sets this thread's interface until it is destroyed: the C API's calls, the CLI's main, and
// a warm-up's worker threads (to their caller's).
class InterfaceScope {
 public:
  explicit InterfaceScope(Interface interface);
  ~InterfaceScope();
  InterfaceScope(const InterfaceScope&) = delete;
  InterfaceScope& operator=(const InterfaceScope&) = delete;

 private:
  Interface previous_;
};

}  // namespace kiln::detail
