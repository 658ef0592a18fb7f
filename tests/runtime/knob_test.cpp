// SPDX-License-Identifier: Apache-2.0
// Messages name the knobs of the interface the caller came through (lib/core/config.hpp, Knob), and
// a missing device is explained by its root cause first.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "cli/run_kiln.hpp"
#include "core/config.hpp"
#include "kiln/attention.hpp"
#include "kiln/decode.hpp"
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

// A runtime on cuda device 63, which no machine has, compiling for `target` ("": none).
Runtime deviceless(const TempDir& cache, const std::string& target) {
  Options options = isolated_options(cache.path(), target);
  options.backend = "cuda";
  options.device = 63;
  return Runtime(options);
}

// deviceless() with no target.
Runtime& deviceless_runtime() {
  static TempDir cache;
  static Runtime runtime = deviceless(cache, "");
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

// What `call` throws: its message, which must be a not_found error.
std::string not_found(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& e) {
    CHECK(e.category() == ErrorCategory::not_found);
    return e.what();
  }
  FAIL("no error");
  return {};
}

// The runtime of deviceless_runtime()'s device with a target to compile for: a call reaches the
// kernel it would load.
Runtime& deviceless_runtime_with_target() {
  static TempDir cache;
  static Runtime runtime = deviceless(cache, "sm_90a");
  return runtime;
}

// A call on tensors at fake addresses of device 63, which no machine has; each is valid, so only
// the missing device stops it.
struct DevicelessCall {
  static TensorView tensor(std::uintptr_t address, DType dtype,
                           std::initializer_list<std::int64_t> shape) {
    return TensorView::contiguous(reinterpret_cast<void*>(address), dtype, shape, 63);
  }
  TensorView q = tensor(0x10000, DType::bf16, {1, 3, 2, 64});
  TensorView k = tensor(0x20000, DType::bf16, {1, 17, 2, 64});
  TensorView out = tensor(0x30000, DType::bf16, {1, 3, 2, 64});
  TensorView seqlens = tensor(0x40000, DType::i32, {1});
  TensorView lse = tensor(0x50000, DType::f32, {3, 2});
  TensorView merged = tensor(0x60000, DType::bf16, {3, 2, 64});
  TensorView merged_lse = tensor(0x70000, DType::f32, {3, 2});
};

TEST_CASE("a call that runs on a GPU says it needs one first, and gives no compile advice",
          "[runtime]") {
  const DevicelessCall c;
  for (Runtime* runtime : {&deviceless_runtime(), &deviceless_runtime_with_target()}) {
    const bool target = runtime == &deviceless_runtime_with_target();
    if (!target && std::getenv("KILN_TARGET") != nullptr) continue;  // as above
    INFO("a configured target: " << target);
    const std::vector<std::pair<std::string, std::string>> messages = {
        {"kiln::attention",
         not_found([&] { attention(c.q, c.k, c.k, c.out, {}, nullptr, *runtime); })},
        {"kiln::attention_with_kvcache", not_found([&] {
           attention_with_kvcache(c.q, {.k = c.k, .v = c.k, .seqlens = c.seqlens}, c.out, {},
                                  nullptr, *runtime);
         })},
        {"kiln::merge_states", not_found([&] {
           merge_states(c.merged, c.lse, c.merged, c.lse, c.merged, &c.merged_lse, nullptr,
                        *runtime);
         })},
        {"kiln::unary", not_found([&] {
           unary({.op = UnaryOp::gelu, .in = c.q.data, .out = c.out.data, .n = 4}, *runtime);
         })}};
    for (const auto& [call, message] : messages) {
      INFO(message);
      CHECK(message.starts_with(call + " needs a GPU"));
      CHECK(contains(message, "device 63"));
      // Advice to compile without a GPU would not make the call run: warm-up's alone.
      CHECK_FALSE(contains(message, "target"));
      CHECK_FALSE(contains(message, "compile"));
    }
  }
}

TEST_CASE("Runtime::kernel without a device says so before any target advice", "[runtime]") {
  KernelSpec spec = unary_default_specs().front();
  spec.target.clear();
  for (Runtime* runtime : {&deviceless_runtime(), &deviceless_runtime_with_target()}) {
    const std::string message = not_found([&] { runtime->kernel(spec); });
    INFO(message);
    CHECK(message.starts_with("cannot load " + to_string(spec)));
    CHECK(contains(message, "device 63"));
    CHECK(contains(message, "to compile without loading, use Runtime::compile"));
    CHECK_FALSE(contains(message, "Options::target"));
    CHECK_FALSE(contains(message, "explicit target"));
  }
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
