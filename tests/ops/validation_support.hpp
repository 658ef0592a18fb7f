// SPDX-License-Identifier: Apache-2.0
// What the ops' validation tests share: fake device tensors, a runtime that validates but never
// launches, and checks that a refusal names what it should.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>

#include "kiln/error.hpp"
#include "kiln/runtime.hpp"
#include "kiln/tensor.hpp"

namespace kiln::test {

// A fake device address. Validation never dereferences one, and nothing launches on
// validating_runtime(), so these tests run on machines with no GPU.
void* fake(std::uintptr_t address);

// A contiguous view of a fake address.
TensorView view(std::uintptr_t address, DType dtype, std::initializer_list<std::int64_t> shape);

// The same tensor with another shape, contiguous again.
TensorView reshaped(const TensorView& t, std::initializer_list<std::int64_t> shape);

// Compiling is off and the cache empty, so a call that passes validation stops at the kernel
// lookup with a not_found error (KILN_JIT=off, or no driver to load with) instead of launching
// on the fake pointers, GPU or not. The fixed target makes choose() work without a device;
// debug checks are off, as they would read the fake pointers.
Runtime& validating_runtime(std::string target = "sm_90a");

struct Refusal {
  ErrorCategory category;
  std::string message;
};

// The error `call` throws. When `supported` (is_supported() on the same inputs) is given, it
// must refuse with the same message.
Refusal refusal(const std::function<void()>& call,
                const std::function<bool(std::string*)>& supported = {});

// That `r` has `category` and its message contains every one of `words`.
void check_refusal(const Refusal& r, ErrorCategory category,
                   std::initializer_list<const char*> words);

}  // namespace kiln::test
