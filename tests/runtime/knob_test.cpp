// Messages name the knobs of the interface the caller came through (lib/config.hpp, Knob), and
// a missing device is explained by its root cause first.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "cli/run_kiln.hpp"
#include "config.hpp"
#include "kiln/elementwise.hpp"
#include "kiln/error.hpp"
#include "kiln/runtime.hpp"
#include "support.hpp"

namespace kiln::test {
namespace {

using detail::Interface;
using detail::InterfaceScope;
using detail::Knob;
using detail::knob_name;

TEST_CASE("each interface names its own knobs, and the variables are common", "[config]") {
  CHECK(knob_name(Knob::target) == "Options::target or KILN_TARGET");
  CHECK(knob_name(Knob::device) == "Options::device");
  {
    const InterfaceScope cli(Interface::cli);
    CHECK(knob_name(Knob::target) == "--target or KILN_TARGET");
    CHECK(knob_name(Knob::kernels_dir) == "--kernels-dir or KILN_KERNELS_DIR");
    CHECK(knob_name(Knob::debug) == "KILN_DEBUG");
    CHECK(knob_name(Knob::compile_only) == "`kiln warm --target`");
    {
      const InterfaceScope c(Interface::c);
      CHECK(knob_name(Knob::target) == "kiln_warmup's target argument or KILN_TARGET");
      CHECK(knob_name(Knob::backend) == "KILN_BACKEND");
      CHECK(knob_name(Knob::device) == "the tensors' DLPack device_id");
    }
    CHECK(detail::current_interface() == Interface::cli);
  }
  CHECK(detail::current_interface() == Interface::cpp);
}

// A runtime on cuda device 63, which no machine has, and no target.
Runtime& deviceless_runtime() {
  static TempDir cache;
  static Runtime runtime = [] {
    Options options = isolated_options(cache.path(), "");
    options.backend = "cuda";
    options.device = 63;
    return Runtime(options);
  }();
  return runtime;
}

std::string target_error() {
  try {
    return "a target: " + deviceless_runtime().target().name();
  } catch (const Error& e) {
    return e.what();
  }
}

bool cuda_driver_found() {
  for (const BackendInfo& backend : deviceless_runtime().info().backends) {
    if (backend.name == "cuda") return backend.driver_found;
  }
  return false;
}

TEST_CASE("no device and no target: the root cause first, then the caller's knob", "[runtime]") {
  if (std::getenv("KILN_TARGET") != nullptr) {
    WARN("KILN_TARGET is set, so every runtime has a target");
    return;
  }
  const std::string message = target_error();
  INFO(message);
  if (cuda_driver_found()) {
    CHECK(message.starts_with("there is no cuda device 63 (the driver counts "));
  } else {
    CHECK(
        message.starts_with("the cuda driver is unavailable (the CUDA driver (libcuda.so.1) "
                            "not found"));
    CHECK(contains(message, "so there is no cuda device 63"));
  }
  CHECK(contains(message, "give Options::target or KILN_TARGET (e.g. sm_90a"));
  {
    const InterfaceScope c(Interface::c);
    CHECK(contains(target_error(), "give kiln_warmup's target argument or KILN_TARGET"));
  }
  const InterfaceScope cli(Interface::cli);
  CHECK(contains(target_error(), "give --target or KILN_TARGET"));
}

TEST_CASE("a warm-up's worker threads name their caller's knobs", "[runtime]") {
  if (std::getenv("KILN_TARGET") != nullptr) return;  // as above
  std::vector<KernelSpec> specs = unary_default_specs();
  specs.resize(std::min<std::size_t>(specs.size(), 8));
  const InterfaceScope cli(Interface::cli);
  const WarmupReport report = deviceless_runtime().warmup(specs, {.threads = 4, .load = false});
  REQUIRE(report.items.size() == specs.size());
  for (const WarmupItem& item : report.items) {
    INFO(item.error);
    CHECK(item.status == WarmupStatus::failed);
    CHECK(contains(item.error, "give --target or KILN_TARGET"));
  }
}

TEST_CASE("the kiln command names its own options in messages", "[cli]") {
  const TempDir scratch, cache;
  const Result r =
      run_kiln(scratch.path(), cache.path(), {"warm", "--kernels-dir", "/nonexistent/kernels"});
  INFO(r.err);
  CHECK(r.code != 0);
  CHECK(contains(r.err, "(--kernels-dir or KILN_KERNELS_DIR)"));
  CHECK_FALSE(contains(r.err, "Options::"));
}

}  // namespace
}  // namespace kiln::test
