// SPDX-License-Identifier: Apache-2.0
// Arithmetic on sizes, strides, offsets and byte counts that come from callers: a product or sum
// that wraps is undefined behaviour in signed types, and a wrapped size passes every check after
// it, so each one is computed here and its overflow reported.
#pragma once

#include <cstdint>
#include <optional>

namespace kiln::detail {

// a * b, or nullopt when the exact product does not fit T.
template <class T>
constexpr std::optional<T> checked_mul(T a, T b) {
  T product{};
  if (__builtin_mul_overflow(a, b, &product)) return std::nullopt;
  return product;
}

// a + b, or nullopt when the exact sum does not fit T.
template <class T>
constexpr std::optional<T> checked_add(T a, T b) {
  T sum{};
  if (__builtin_add_overflow(a, b, &sum)) return std::nullopt;
  return sum;
}

// ceil(a / b) for a >= 0 and b > 0, without the overflow of (a + b - 1) / b near int64's maximum.
constexpr std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return a / b + (a % b != 0 ? 1 : 0);
}

}  // namespace kiln::detail
