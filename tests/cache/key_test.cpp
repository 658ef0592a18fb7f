// SPDX-License-Identifier: Apache-2.0
// Tests of the cache key's text form and hash.
#include "cache/key.hpp"

#include <catch2/catch.hpp>
#include <string>

namespace kiln::detail {
namespace {

Key counting_key() {
  Key key;
  for (std::size_t i = 0; i < key.bytes.size(); ++i) {
    key.bytes[i] = static_cast<std::uint8_t>(i * 17);  // 0x00, 0x11, ..., 0xff
  }
  return key;
}

TEST_CASE("a key prints as 32 lowercase hex digits, first byte first", "[cache]") {
  CHECK(counting_key().hex() == "00112233445566778899aabbccddeeff");
  CHECK(Key{}.hex() == std::string(32, '0'));
}

TEST_CASE("a key parses back from its hex", "[cache]") {
  const std::optional<Key> parsed = Key::from_hex("00112233445566778899aabbccddeeff");
  REQUIRE(parsed);
  CHECK(*parsed == counting_key());
  Key odd;
  odd.bytes = {0xde, 0xad, 0xbe, 0xef, 0x01, 0x23, 0x45, 0x67,
               0x89, 0xab, 0xcd, 0xef, 0xf0, 0x0f, 0x80, 0x7f};
  CHECK(Key::from_hex(odd.hex()) == odd);
}

TEST_CASE("from_hex refuses anything but exactly 32 lowercase hex digits", "[cache]") {
  const std::string good = "00112233445566778899aabbccddeeff";
  const std::string bad = GENERATE(std::string(), std::string(31, 'a'), std::string(33, 'a'),
                                   std::string("00112233445566778899AABBCCDDEEFF"),
                                   std::string("0011223344556677 899aabbccddeeff"),
                                   std::string("g0112233445566778899aabbccddeeff"),
                                   std::string("00112233445566778899aabbccddeef/"));
  CAPTURE(bad);
  CHECK_FALSE(Key::from_hex(bad));
  CHECK(Key::from_hex(good));
}

TEST_CASE("KeyHash is equal for equal keys and differs when the key does", "[cache]") {
  const KeyHash hash;
  Key a = counting_key();
  const Key copy = a;
  CHECK(hash(a) == hash(copy));
  a.bytes[0] ^= 1;
  CHECK(hash(a) != hash(copy));
}

}  // namespace
}  // namespace kiln::detail
