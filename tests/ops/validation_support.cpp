// SPDX-License-Identifier: Apache-2.0
// What the ops' validation tests share.
#include "ops/validation_support.hpp"

#include <catch2/catch.hpp>

#include <map>
#include <memory>

#include "support.hpp"

namespace kiln::test {

void* fake(std::uintptr_t address) {
  return reinterpret_cast<void*>(address);
}

TensorView view(std::uintptr_t address, DType dtype, std::initializer_list<std::int64_t> shape) {
  return TensorView::contiguous(fake(address), dtype, shape);
}

TensorView reshaped(const TensorView& t, std::initializer_list<std::int64_t> shape) {
  return TensorView::contiguous(t.data, t.dtype, shape, t.device);
}

Runtime& validating_runtime(std::string target) {
  static TempDir cache;
  static std::map<std::string, std::unique_ptr<Runtime>> runtimes;
  std::unique_ptr<Runtime>& runtime = runtimes[target];
  if (!runtime) {
    Options options = isolated_options(cache.path(), target);
    options.jit = JitMode::off;
    options.debug = false;
    runtime = std::make_unique<Runtime>(options);
  }
  return *runtime;
}

Refusal refusal(const std::function<void()>& call,
                const std::function<bool(std::string*)>& supported) {
  try {
    call();
  } catch (const Error& e) {
    if (supported) {
      std::string why;
      CHECK_FALSE(supported(&why));
      CHECK(why == e.what());
    }
    return {e.category(), e.what()};
  }
  FAIL("the call was accepted");
  return {};
}

void check_refusal(const Refusal& r, ErrorCategory category,
                   std::initializer_list<const char*> words) {
  INFO("message: " << r.message);
  CHECK(std::string(to_string(r.category)) == std::string(to_string(category)));
  for (const char* word : words) CHECK_THAT(r.message, Catch::Contains(word));
}

}  // namespace kiln::test
