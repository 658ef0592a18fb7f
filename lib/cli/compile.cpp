// SPDX-License-Identifier: Apache-2.0
// `kiln compile`: compiles one spec and prints what the compiler said about it.
#include <fmt/format.h>

#include <memory>
#include <string>
#include <vector>

#include "cli/commands.hpp"
#include "core/user_text.hpp"
#include "jit/manifest.hpp"
#include "kiln/error.hpp"
#include "params/registry.hpp"

namespace kiln::cli {
namespace {

struct CompileArgs {
  CommonArgs common;
  std::string spec;
  std::vector<std::string> variants;  // NAME=FILE
  bool source = false;
};

// The variants `--variant NAME=FILE` gave.
std::vector<Variant> read_variants(const std::vector<std::string>& given) {
  std::vector<Variant> variants;
  for (const std::string& arg : given) {
    const std::size_t eq = arg.find('=');
    if (eq == std::string::npos) {
      throw kiln::Error(
          kiln::ErrorCategory::invalid_argument,
          fmt::format("--variant {} must be NAME=FILE: the variant's name and the file "
                      "holding its code",
                      detail::printable(arg)));
    }
    variants.push_back(
        detail::read_variant(std::string_view(arg).substr(0, eq), arg.substr(eq + 1)));
  }
  return variants;
}

// -1 means the backend does not report the value.
std::string reported(int value, std::string_view unit) {
  return value < 0 ? std::string("not reported") : fmt::format("{}{}", value, unit);
}

// Where the binary came from: the Runtime's counters before and after the one compile.
std::string_view origin(const Stats& before, const Stats& after) {
  if (after.compiles > before.compiles) return "a fresh compile";
  if (after.disk_hits > before.disk_hits) return "the disk cache";
  return "memory";
}

// The dynamic shared memory the family's launch asks for, or why that is not known.
std::string dynamic_shared(const KernelSpec& spec) {
  const std::optional<long long> bytes = detail::dynamic_shared_bytes(spec);
  if (!bytes) {
    return fmt::format("not known: {} is not one of kiln's kernels, so its launch decides",
                       spec.entry);
  }
  return fmt::format("{} bytes at launch", *bytes);
}

void print_info(const KernelInfo& info, std::string_view from, const std::string& dynamic) {
  const auto field = [](std::string_view label, std::string_view value) {
    fmt::print("{:<14}{}\n", label, value);
  };
  field("spec", info.spec);
  field("key", info.key);
  field("target", info.target);
  field("compiler", info.compiler);
  field("from", from);
  field("lowered name", info.lowered_name);
  field("registers", reported(info.registers, ""));
  field("spill", reported(info.spill_bytes, " bytes"));
  field("shared", reported(info.shared_bytes, " bytes static"));
  field("dynamic smem", dynamic);
  field("stack", reported(info.stack_bytes, " bytes"));
  field("compile time", human_ms(info.compile_ms));
  fmt::print("compiler log\n{}\n", info.log.empty() ? "  (empty)" : info.log);
}

int run(const CompileArgs& args) {
  const KernelSpec spec = parse_spec(args.spec, read_variants(args.variants));
  Runtime runtime(to_options(args.common));
  if (args.source) fmt::print("generated source\n{}\n", runtime.generated_source(spec));
  const Stats before = runtime.stats();
  const KernelInfo info = runtime.compile(spec);
  print_info(info, origin(before, runtime.stats()), dynamic_shared(spec));
  return kSuccess;
}

}  // namespace

void add_compile_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<CompileArgs>();
  CLI::App* command = app.add_subcommand("compile",
                                         "Compile one spec (or find it in the cache) and show "
                                         "registers, spills, shared memory and log");
  add_common_options(*command, args->common, TargetCount::one);
  command->add_option("spec", args->spec, "Canonical spec, as `kiln warm` manifests list them")
      ->type_name("SPEC")
      ->required();
  command->add_flag("--source", args->source, "Also print the unit handed to the compiler");
  command
      ->add_option("--variant", args->variants,
                   "A user variant the spec names ({variant NAME HASH}) and the file holding its "
                   "code; repeat for several")
      ->type_name("NAME=FILE");
  command->callback([args, &exit_code] { exit_code = run(*args); });
}

}  // namespace kiln::cli
