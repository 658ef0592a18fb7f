// SPDX-License-Identifier: Apache-2.0
// Reads KILN_* environment variables (README, "Knobs") and merges them with Options.
#include "core/config.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <optional>

#include <fmt/format.h>

#include "core/checked_math.hpp"
#include "kiln/error.hpp"

namespace kiln::detail {
namespace {

std::optional<std::string> env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

std::vector<std::filesystem::path> split_paths(const std::string& text) {
  std::vector<std::filesystem::path> paths;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t end = std::min(text.find(':', start), text.size());
    if (end > start) paths.emplace_back(text.substr(start, end - start));
    start = end + 1;
  }
  return paths;
}

thread_local Interface t_interface = Interface::cpp;

std::optional<std::filesystem::path> default_cache_dir() {
  if (auto xdg = env("XDG_CACHE_HOME")) return std::filesystem::path(*xdg) / "kiln";
  if (auto home = env("HOME")) return std::filesystem::path(*home) / ".cache" / "kiln";
  return std::nullopt;
}

}  // namespace

Interface current_interface() {
  return t_interface;
}

InterfaceScope::InterfaceScope(Interface interface) : previous_(t_interface) {
  t_interface = interface;
}

InterfaceScope::~InterfaceScope() {
  t_interface = previous_;
}

std::string knob_name(Knob knob) {
  // How each interface spells a knob; empty where it has none, and then only the variable is
  // named.
  struct Spelling {
    std::string_view cpp, c, cli, env;
  };
  const auto [cpp, c, cli, env] = [&]() -> Spelling {
    switch (knob) {
      case Knob::backend: return {"Options::backend", "", "--backend", "KILN_BACKEND"};
      case Knob::target:
        return {"Options::target", "kiln_warmup's target argument", "--target", "KILN_TARGET"};
      case Knob::kernels_dir:
        return {"Options::kernels_dir", "", "--kernels-dir", "KILN_KERNELS_DIR"};
      case Knob::device:
        return {"Options::device", "the tensors' DLPack device_id",
                "CUDA_VISIBLE_DEVICES (kiln uses the first visible device)", ""};
      case Knob::debug: return {"Options::debug", "", "", "KILN_DEBUG"};
      case Knob::warmup:
        return {"Runtime::warmup or `kiln warm`", "kiln_warmup or `kiln warm`", "`kiln warm`", ""};
      case Knob::compile_only:
        return {"Runtime::compile or `kiln warm --target`",
                "kiln_warmup's target argument or `kiln warm --target`", "`kiln warm --target`",
                ""};
    }
    return {};
  }();
  const std::string_view name = t_interface == Interface::c     ? c
                                : t_interface == Interface::cli ? cli
                                                                : cpp;
  if (name.empty()) return std::string(env);
  if (env.empty()) return std::string(name);
  return fmt::format("{} or {}", name, env);
}

std::uint64_t parse_bytes(const std::string& text, std::string_view what) {
  const auto refuse = [&](std::string_view why) {
    throw Error(
        ErrorCategory::invalid_argument,
        fmt::format("{} is '{}': {}expected a byte count: a whole or decimal number with an "
                    "optional K, M, G or T suffix (powers of 1024, any case, B or iB may "
                    "follow), such as 1073741824, 512M, 512m or 1.5G",
                    what, text, why));
  };
  // Digits, an optional fraction, then a suffix; from_chars alone would also take a sign or hex.
  const std::size_t whole = std::min(text.find_first_not_of("0123456789"), text.size());
  std::size_t end = whole;
  if (end < text.size() && text[end] == '.') {
    end = std::min(text.find_first_not_of("0123456789", end + 1), text.size());
  }
  const std::string_view fraction = std::string_view(text).substr(whole, end - whole);
  std::string suffix(text.substr(end));
  std::transform(suffix.begin(), suffix.end(), suffix.begin(), [](char c) {
    return static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  });
  constexpr std::pair<std::string_view, int> kUnits[] = {
      {"", 0},     {"B", 0},  {"K", 10},  {"KB", 10},  {"KIB", 10}, {"M", 20},  {"MB", 20},
      {"MIB", 20}, {"G", 30}, {"GB", 30}, {"GIB", 30}, {"T", 40},   {"TB", 40}, {"TIB", 40}};
  const auto unit = std::find_if(std::begin(kUnits), std::end(kUnits),
                                 [&](const auto& u) { return u.first == suffix; });
  if (text.starts_with('-')) refuse("a byte count cannot be negative; ");
  if (whole == 0 || fraction == "." || unit == std::end(kUnits)) refuse("");
  const int shift = unit->second;
  if (!fraction.empty() && shift == 0) {
    refuse("a count of bytes is whole: drop the fraction, or give a unit such as 1.5K; ");
  }
  std::uint64_t value = 0;
  const auto [end_of_whole, ec] = std::from_chars(text.data(), text.data() + whole, value);
  std::optional<std::uint64_t> bytes =
      ec == std::errc() ? checked_mul(value, std::uint64_t{1} << shift) : std::nullopt;
  if (bytes && fraction.size() > 1) {
    // The fraction's bytes, rounded down; by hand, as strtod would follow the locale's decimal
    // point. A fraction below 1 of at most 2^40 bytes loses far less than a byte in a double.
    double part = 0;
    for (auto digit = fraction.rbegin(); *digit != '.'; ++digit)
      part = (part + (*digit - '0')) / 10;
    bytes = checked_add(*bytes, static_cast<std::uint64_t>(std::ldexp(part, shift)));
  }
  if (!bytes) {
    throw Error(ErrorCategory::invalid_argument,
                fmt::format("{} is '{}': that is more than 2^64 - 1 bytes (16 EiB), the most a "
                            "byte count can hold; use a smaller count, such as 8G",
                            what, text));
  }
  return *bytes;
}

JitMode parse_jit_mode(std::string_view text, std::string_view what) {
  if (text == "on") return JitMode::on;
  if (text == "strict") return JitMode::strict;
  if (text == "off") return JitMode::off;
  throw Error(ErrorCategory::invalid_argument,
              fmt::format("{} is '{}': expected on, strict or off", what, text));
}

LogLevel parse_log_level(std::string_view text, std::string_view what) {
  if (text == "error") return LogLevel::error;
  if (text == "warn") return LogLevel::warn;
  if (text == "info") return LogLevel::info;
  if (text == "debug") return LogLevel::debug;
  throw Error(ErrorCategory::invalid_argument,
              fmt::format("{} is '{}': expected error, warn, info or debug", what, text));
}

bool parse_switch(std::string_view text, std::string_view what) {
  if (text == "1" || text == "true" || text == "on") return true;
  if (text == "0" || text == "false" || text == "off") return false;
  throw Error(ErrorCategory::invalid_argument,
              fmt::format("{} is '{}': expected 1, true or on, or 0, false or off", what, text));
}

Config resolve_config(const Options& options) {
  Config config;
  if (const auto backend = options.backend ? options.backend : env("KILN_BACKEND")) {
    config.backend = parse_backend(*backend);
    if (!config.backend) {
      throw Error(ErrorCategory::invalid_argument,
                  fmt::format("backend is '{}' ({}): expected cuda or hip", *backend,
                              knob_name(Knob::backend)));
    }
  }
  if (const auto target = options.target ? options.target : env("KILN_TARGET")) {
    config.target = Target(*target);
  }
  config.kernels_dir = options.kernels_dir;
  if (!config.kernels_dir) {
    if (auto dir = env("KILN_KERNELS_DIR")) config.kernels_dir = *dir;
  }
  config.cache_dir = options.cache_dir;
  if (!config.cache_dir) {
    if (auto dir = env("KILN_CACHE_DIR")) {
      config.cache_dir = *dir;
    } else {
      config.cache_dir = default_cache_dir();
    }
  } else if (config.cache_dir->empty()) {
    config.cache_dir.reset();  // Options' way to ask for no disk cache
  }
  if (options.cache_ro_dirs) {
    config.cache_ro_dirs = *options.cache_ro_dirs;
  } else if (auto dirs = env("KILN_CACHE_RO_DIRS")) {
    config.cache_ro_dirs = split_paths(*dirs);
  }
  if (options.cache_ro_trust) {
    config.cache_ro_trust = *options.cache_ro_trust;
  } else if (auto trust = env("KILN_CACHE_RO_TRUST")) {
    config.cache_ro_trust = parse_switch(*trust, "KILN_CACHE_RO_TRUST");
  }
  if (options.cache_max_bytes) {
    config.cache_max_bytes = *options.cache_max_bytes;
  } else if (auto bytes = env("KILN_CACHE_MAX_BYTES")) {
    config.cache_max_bytes = parse_bytes(*bytes, "KILN_CACHE_MAX_BYTES");
  }
  if (options.jit) {
    config.jit = *options.jit;
  } else if (auto mode = env("KILN_JIT")) {
    config.jit = parse_jit_mode(*mode, "KILN_JIT");
  }
  if (options.log_level) {
    config.log_level = *options.log_level;
  } else if (auto level = env("KILN_LOG")) {
    config.log_level = parse_log_level(*level, "KILN_LOG");
  }
  config.dump_dir = options.dump_dir;
  if (!config.dump_dir) {
    if (auto dir = env("KILN_DUMP_DIR")) config.dump_dir = *dir;
  }
  config.record = options.record;
  if (!config.record) {
    if (auto file = env("KILN_RECORD")) config.record = *file;
  }
  if (options.debug) {
    config.debug = *options.debug;
  } else if (auto debug = env("KILN_DEBUG")) {
    config.debug = parse_switch(*debug, "KILN_DEBUG");
  }
  if (options.device < 0) {
    throw Error(ErrorCategory::invalid_argument,
                fmt::format("{} is {}: device ordinals start at 0", knob_name(Knob::device),
                            options.device));
  }
  config.device = options.device;
  return config;
}

}  // namespace kiln::detail
