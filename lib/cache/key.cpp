// SPDX-License-Identifier: Apache-2.0
// The cache key's text form (32 lowercase hex digits) and its hash for unordered containers.
#include "cache/key.hpp"

#include <cstring>

namespace kiln::detail {
namespace {

constexpr char kHexDigits[] = "0123456789abcdef";

// The value of a lowercase hex digit, or -1. Uppercase is refused so that every key has exactly
// one spelling, the one its entry file is named with.
int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

}  // namespace

std::string Key::hex() const {
  std::string text(2 * bytes.size(), '0');
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    text[2 * i] = kHexDigits[bytes[i] >> 4];
    text[2 * i + 1] = kHexDigits[bytes[i] & 0xf];
  }
  return text;
}

std::optional<Key> Key::from_hex(std::string_view hex) {
  Key key;
  if (hex.size() != 2 * key.bytes.size()) return std::nullopt;
  for (std::size_t i = 0; i < key.bytes.size(); ++i) {
    const int high = hex_value(hex[2 * i]);
    const int low = hex_value(hex[2 * i + 1]);
    if (high < 0 || low < 0) return std::nullopt;
    key.bytes[i] = static_cast<std::uint8_t>(high << 4 | low);
  }
  return key;
}

std::size_t KeyHash::operator()(const Key& key) const noexcept {
  // NOTE: the key is already a uniform 128-bit hash, so any of its bytes make a good hash.
  std::size_t hash;
  std::memcpy(&hash, key.bytes.data(), sizeof(hash));
  return hash;
}

}  // namespace kiln::detail
