// SPDX-License-Identifier: Apache-2.0
// KernelSpec: what one compiled kernel is, in a canonical and printable form.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "kiln/variant.hpp"

namespace kiln {

// e4m3 and e5m2: fp8 (OCP's E4M3FN, with no infinities, and E5M2), as torch.float8_e4m3fn and
// torch.float8_e5m2 hold them; KV caches only, read by f16 or bf16 queries.
enum class DType : std::uint8_t { f16, bf16, f32, f64, i32, i64, e4m3, e5m2 };

std::string_view to_string(DType dtype) noexcept;
std::size_t size_of(DType dtype) noexcept;
constexpr bool is_fp8(DType dtype) noexcept {
  return dtype == DType::e4m3 || dtype == DType::e5m2;
}

// A named compile-time constant of the generated unit: `static constexpr` int or bool, or a
// `using` alias for a dtype.
struct Constant {
  std::string name;
  std::variant<std::int64_t, bool, DType> value;

  friend bool operator==(const Constant&, const Constant&) = default;
};

// What one kernel is: the source that defines it, the templated entry it instantiates and the
// constants it is instantiated with. Sizes, strides and scales are never constants: they belong
// in the family's Params struct, so one binary serves every size.
struct KernelSpec {
  std::string source;  // path under kernels_src, e.g. "elementwise/unary.cuh"
  std::string entry;   // qualified kernel template, e.g. "kiln::unary"
  std::string params;  // the family's Params type, e.g. "kiln::UnaryParams" (see kiln/params/)
  std::vector<Constant> constants;
  std::vector<std::string> options;  // extra compiler options, e.g. "-DKILN_TRACE=1"
  std::string target;                // "sm_90a", "gfx90a"; empty: the runtime's device
  // A user variant's name and device code (kiln/variant.hpp), put in the generated unit; empty
  // code: none. Only the attention kernels take one.
  std::string variant_name;
  std::string variant_code;

  KernelSpec& set(std::string name, std::int64_t value);
  KernelSpec& set(std::string name, int value) { return set(std::move(name), std::int64_t{value}); }
  KernelSpec& set(std::string name, bool value);
  KernelSpec& set(std::string name, DType value);

  friend bool operator==(const KernelSpec&, const KernelSpec&) = default;
};

// One line that names the spec completely, with constants sorted by name, so two specs that
// compile the same code print the same:
//   elementwise/unary.cuh:kiln::unary<block_size=256,dtype=bf16,op=3>(kiln::UnaryParams) [-DX]
//   @sm_90a
// A variant prints as {variant NAME HASH} after the Params, HASH the first 16 hex digits of its
// code's XXH3-64, so that two variants of one name print apart.
std::string to_string(const KernelSpec& spec);

// Parses what to_string prints. Throws kiln::Error (invalid_argument) naming the bad part. A
// spec that names a user variant ({variant NAME HASH}) takes its code from `variants`: the one
// of that name whose code hashes to HASH (variant_hash). Throws (unsupported) for one when
// `variants` is empty, since its line does not carry its code, and (not_found) when none of
// them matches.
KernelSpec parse_spec(std::string_view text, std::span<const Variant> variants = {});

// The hash a spec prints for a variant's code: XXH3-64 of the code, as 16 hex digits.
std::string variant_hash(std::string_view code);

// A hash of every field, in the order written (equal specs hash equal), for maps keyed by spec:
// the runtime's memory hits hash a spec instead of printing it.
std::size_t hash_value(const KernelSpec& spec) noexcept;

}  // namespace kiln

template <>
struct std::hash<kiln::KernelSpec> {
  std::size_t operator()(const kiln::KernelSpec& spec) const noexcept {
    return kiln::hash_value(spec);
  }
};
