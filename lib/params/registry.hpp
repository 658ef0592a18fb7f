// SPDX-License-Identifier: Apache-2.0
// The Params structs that kernels take, as the host library compiled them, and the schema of each
// of kiln's kernels (the constants its template reads and the shared memory its launch asks for),
// as the families' descriptions (lib/kernels) give them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "kernels/kernel.hpp"
#include "kiln/spec.hpp"

namespace kiln::detail {

struct ParamsLayout {
  std::string_view type;    // "kiln::UnaryParams"
  std::string_view header;  // "kiln/params/elementwise.h", injected into the JIT compile
  std::size_t size;         // sizeof on the host; the generated unit static_asserts it
  std::size_t alignment;    // alignof on the host; asserted likewise
  bool holds_score;         // holds a ScoreParams: a kernel taking it may take a user variant
};

// Throws kiln::Error (invalid_argument) listing the known types when `type` is not one.
const ParamsLayout& params_layout(std::string_view type);

// The Params types that hold a score, whose kernels take user variants ("kiln::AttentionParams").
std::vector<std::string_view> variant_params();

// The schema of `entry`; null when it is not one of kiln's kernels (a kernel of the caller's own
// tree, in its own namespace).
const KernelSchema* kernel_schema(std::string_view entry);

// The name of `value` when the constant `constant` of kiln's kernel `entry` is an enumeration
// that has it (kiln::unary's op: 4 is "sin"); empty otherwise.
std::string_view value_name(std::string_view entry, std::string_view constant, std::int64_t value);

// Throws kiln::Error (invalid_argument) naming every missing, unknown, mistyped or out-of-range
// constant when
// `spec` is for one of kiln's kernels, or for an entry in the kiln:: namespace that is none of
// them, or names another Params type than its kernel takes. Specs for other kernels pass.
void check_schema(const KernelSpec& spec);

// The dynamic shared memory a launch of `spec` asks for, in bytes; nullopt when it is not one
// of kiln's kernels. `spec` must pass check_schema().
std::optional<long long> dynamic_shared_bytes(const KernelSpec& spec);

}  // namespace kiln::detail
