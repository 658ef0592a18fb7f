// SPDX-License-Identifier: Apache-2.0
// `kiln info`: the backends, devices, default target, kernel sources, cache and JIT mode in use.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "core/config.hpp"
#include "core/user_text.hpp"
#include "kiln/error.hpp"
#include "kiln/kiln.h"

extern char** environ;

namespace kiln::cli {
namespace {

using Json = nlohmann::ordered_json;

struct InfoArgs {
  CommonArgs common;
  bool json = false;
};

// What `kiln info` reports beyond Runtime::info().
struct Facts {
  RuntimeInfo runtime;
  std::string target_problem;  // why there is no default target, when there is none
  std::optional<std::filesystem::path> cache_dir;  // nullopt: no HOME, no KILN_CACHE_DIR
  std::string cache_problem;                       // why the cache cannot be used, when it cannot
  bool cache_missing = false;                      // it is not there yet: a runtime would create it
  std::size_t cache_entries = 0;
  std::uint64_t cache_bytes = 0;
  std::uint64_t cache_max_bytes = 0;               // 0: no cap
  std::map<std::string, std::string> environment;  // the KILN_* variables set, by name
};

// The KILN_* variables of this process, which is where most of kiln's settings come from.
std::map<std::string, std::string> kiln_variables() {
  std::map<std::string, std::string> variables;
  for (char** variable = environ; *variable != nullptr; ++variable) {
    const std::string_view text = *variable;
    const std::size_t eq = text.find('=');
    if (text.starts_with("KILN_") && eq != std::string_view::npos) {
      variables.emplace(text.substr(0, eq), text.substr(eq + 1));
    }
  }
  return variables;
}

Facts gather(const Options& options) {
  Facts facts;
  // NOTE: the cache is only looked at, never created nor written (the runtime's compiler memos
  // would be): the runtime that reports on backends and targets is memory-only.
  Options memory_only = options;
  memory_only.cache_dir = std::filesystem::path();
  Runtime runtime(memory_only);
  facts.runtime = runtime.info();
  if (facts.runtime.target.empty()) {
    try {
      runtime.target();
    } catch (const Error& e) {
      facts.target_problem = e.what();
    }
  }
  facts.cache_max_bytes = detail::resolve_config(options).cache_max_bytes;
  facts.environment = kiln_variables();
  const detail::DiskCache cache = open_disk_cache(options, /*create_root=*/false);
  facts.cache_dir = cache.root();
  facts.cache_missing = cache.root_missing();
  try {
    require_writable(cache);
  } catch (const Error& e) {
    facts.cache_problem = e.what();
  }
  for (const auto& entry : cache.list(/*verify=*/false)) {
    ++facts.cache_entries;
    facts.cache_bytes += entry.size;
  }
  return facts;
}

std::string_view jit_name(JitMode mode) {
  switch (mode) {
    case JitMode::on: return "on";
    case JitMode::strict: return "strict";
    case JitMode::off: return "off";
  }
  return "?";
}

Json to_json(const Facts& facts) {
  const RuntimeInfo& info = facts.runtime;
  Json backends = Json::array();
  for (const BackendInfo& backend : info.backends) {
    Json devices = Json::array();
    for (const DeviceInfo& device : backend.devices) {
      devices.push_back({{"ordinal", device.ordinal},
                         {"name", device.name},
                         {"target", device.target},
                         {"multiprocessors", device.multiprocessors},
                         {"memory_bytes", device.memory_bytes},
                         {"max_threads_per_block", device.max_threads_per_block},
                         {"max_shared_bytes_per_block", device.max_shared_bytes_per_block}});
    }
    backends.push_back({{"name", backend.name},
                        {"compiler", backend.compiler},
                        {"compiler_found", backend.compiler_found},
                        {"driver", backend.driver},
                        {"driver_found", backend.driver_found},
                        {"devices", devices}});
  }
  Json ro_dirs = Json::array();
  for (const auto& dir : info.cache_ro_dirs) ro_dirs.push_back(dir.string());
  // NOTE: null stands for "none": no default target, the embedded sources, a memory-only cache.
  const auto path_or_null = [](const std::filesystem::path& path) {
    return path.empty() ? Json(nullptr) : Json(path.string());
  };
  return {{"version", KILN_VERSION},
          {"build", kiln_build_id()},
          {"backend", info.backend},
          {"backends", backends},
          {"target", info.target.empty() ? Json(nullptr) : Json(info.target)},
          {"target_problem", facts.target_problem},
          {"kernels_dir", path_or_null(info.kernels_dir)},
          {"cache",
           {{"dir", path_or_null(facts.cache_dir.value_or(""))},
            {"problem", facts.cache_problem},
            {"entries", facts.cache_entries},
            {"bytes", facts.cache_bytes},
            {"max_bytes", facts.cache_max_bytes},
            {"ro_dirs", ro_dirs}}},
          {"jit", jit_name(info.jit)},
          {"environment", facts.environment}};
}

void print_field(std::string_view label, std::string_view value) {
  fmt::print("{:<16}{}\n", label, value);
}

void print_text(const Facts& facts) {
  const RuntimeInfo& info = facts.runtime;
  print_field("kiln", KILN_VERSION);
  print_field("build", kiln_build_id());
  print_field("backend", info.backend);
  std::vector<std::vector<std::string>> devices;
  for (const BackendInfo& backend : info.backends) {
    print_field(fmt::format("{} compiler", backend.name),
                backend.compiler_found ? backend.compiler : "missing: " + backend.compiler);
    print_field(fmt::format("{} driver", backend.name),
                backend.driver_found ? backend.driver : "missing: " + backend.driver);
    for (const DeviceInfo& device : backend.devices) {
      devices.push_back(
          {backend.name, std::to_string(device.ordinal), device.name, device.target,
           std::to_string(device.multiprocessors), human_bytes(device.memory_bytes),
           std::to_string(device.max_threads_per_block),
           human_bytes(static_cast<std::uint64_t>(device.max_shared_bytes_per_block))});
    }
  }
  if (devices.empty()) {
    print_field("devices", "none");
  } else {
    fmt::print("devices\n");
    print_table(
        stdout,
        {"BACKEND", "ORDINAL", "NAME", "TARGET", "SMS", "MEMORY", "CTA THREADS", "CTA SMEM"},
        devices);
  }
  print_field("target", info.target.empty() ? "none: " + facts.target_problem : info.target);
  print_field("kernels", info.kernels_dir.empty() ? "the copy embedded in libkiln"
                                                  : info.kernels_dir.string());
  if (facts.cache_problem.empty()) {
    print_field("cache", fmt::format("{} ({} entries, {})", facts.cache_dir->string(),
                                     facts.cache_entries, human_bytes(facts.cache_bytes)));
  } else {
    print_field("cache", (facts.cache_missing ? "" : "memory-only: ") + facts.cache_problem);
  }
  print_field("cache cap", facts.cache_max_bytes ? human_bytes(facts.cache_max_bytes)
                                                 : "none (KILN_CACHE_MAX_BYTES sets one)");
  if (info.cache_ro_dirs.empty()) print_field("read-only tiers", "none");
  for (const auto& dir : info.cache_ro_dirs) print_field("read-only tier", dir.string());
  print_field("jit", jit_name(info.jit));
  if (facts.environment.empty()) print_field("environment", "no KILN_* variable is set");
  std::string_view label = "environment";
  for (const auto& [name, value] : facts.environment) {
    // NOTE: a variable's value is anyone's text; it must not drive the terminal.
    print_field(label, detail::printable(name + "=" + value));
    label = "";
  }
}

}  // namespace

void add_info_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<InfoArgs>();
  CLI::App* command = app.add_subcommand(
      "info", "Show backends, devices, the default target, kernel sources and the cache");
  add_common_options(*command, args->common, TargetCount::one);
  command->add_flag("--json", args->json, "Print the same as JSON");
  command->callback([args, &exit_code] {
    const Facts facts = gather(to_options(args->common));
    if (args->json) {
      fmt::print("{}\n", to_json(facts).dump(2));
    } else {
      print_text(facts);
    }
    exit_code = kSuccess;
  });
}

}  // namespace kiln::cli
