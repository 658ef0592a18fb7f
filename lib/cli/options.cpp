// SPDX-License-Identifier: Apache-2.0
// The options every `kiln` subcommand takes, and the disk cache they resolve to.
#include "cli/commands.hpp"

#include "core/config.hpp"
#include "core/log.hpp"

namespace kiln::cli {

namespace {

CLI::Option_group* settings_group(CLI::App& command) {
  return command.add_option_group("Settings", "Override the matching KILN_* environment variables");
}

void add_cache_options(CLI::Option_group& group, CommonArgs& args) {
  group.add_option("--cache-dir", args.cache_dir, "Writable cache root (KILN_CACHE_DIR)")
      ->type_name("DIR");
  group.add_option("--log", args.log, "error, warn, info or debug (KILN_LOG)");
}

}  // namespace

void add_cache_options(CLI::App& command, CommonArgs& args) {
  add_cache_options(*settings_group(command), args);
}

void add_common_options(CLI::App& command, CommonArgs& args, TargetCount targets) {
  CLI::Option_group* group = settings_group(command);
  group
      ->add_option("--kernels-dir", args.kernels_dir,
                   "Kernel source tree to compile from (KILN_KERNELS_DIR)")
      ->type_name("DIR");
  CLI::Option* target = group->add_option(
      "--target", args.targets,
      targets == TargetCount::many
          ? "Target to build for, e.g. sm_90a or gfx90a; repeat to build for several"
          : "Target for specs that name none, e.g. sm_90a or gfx90a (KILN_TARGET)");
  // NOTE: one value per --target, so that `--target sm_90a FILE` leaves FILE positional.
  target->allow_extra_args(false);
  if (targets == TargetCount::one) target->expected(1);
  group->add_option("--backend", args.backend, "cuda or hip (KILN_BACKEND)");
  group->add_option("--jit", args.jit, "on, strict or off (KILN_JIT)");
  add_cache_options(*group, args);
}

Options to_options(const CommonArgs& args) {
  Options options;
  options.kernels_dir = args.kernels_dir;
  options.cache_dir = args.cache_dir;
  if (args.targets.size() == 1) options.target = args.targets.front();
  options.backend = args.backend;
  if (args.jit) options.jit = detail::parse_jit_mode(*args.jit, "--jit");
  if (args.log) options.log_level = detail::parse_log_level(*args.log, "--log");
  return options;
}

detail::DiskCache open_disk_cache(const Options& options, bool create_root) {
  const detail::Config config = detail::resolve_config(options);
  // The cache's warnings then follow --log and KILN_LOG, as they do inside a Runtime.
  detail::set_log_level(config.log_level);
  return detail::DiskCache(detail::DiskCacheConfig{.root = config.cache_dir,
                                                   .ro_roots = config.cache_ro_dirs,
                                                   .max_bytes = config.cache_max_bytes,
                                                   .create_root = create_root});
}

}  // namespace kiln::cli
