// SPDX-License-Identifier: Apache-2.0
// The cache key: XXH3-128 over everything that decides the compiled bytes.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kiln::detail {

struct Key {
  std::array<std::uint8_t, 16> bytes{};

  std::string hex() const;  // 32 lowercase hex digits
  static std::optional<Key> from_hex(std::string_view hex);
  friend bool operator==(const Key&, const Key&) = default;
  friend auto operator<=>(const Key&, const Key&) = default;
};

struct KeyHash {
  std::size_t operator()(const Key& key) const noexcept;
};

}  // namespace kiln::detail
