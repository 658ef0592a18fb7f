// SPDX-License-Identifier: Apache-2.0
// lib/core/config.cpp: byte counts as KILN_CACHE_MAX_BYTES and `kiln cache prune --max-bytes` read
// them (the CLI's side is in cli/cli.cpp).
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>

#include "core/config.hpp"
#include "kiln/error.hpp"
#include "support.hpp"

namespace kiln::test {
namespace {

std::string refusal_of(const std::string& text) {
  try {
    detail::parse_bytes(text, "--max-bytes");
  } catch (const Error& e) {
    CHECK(e.category() == ErrorCategory::invalid_argument);
    return e.what();
  }
  FAIL("'" << text << "' was accepted");
  return {};
}

TEST_CASE("parse_bytes reads digits with an optional K, M, G or T suffix", "[config]") {
  CHECK(detail::parse_bytes("0", "x") == 0);
  CHECK(detail::parse_bytes("1073741824", "x") == 1073741824);
  CHECK(detail::parse_bytes("512K", "x") == 512ull << 10);
  CHECK(detail::parse_bytes("512KB", "x") == 512ull << 10);
  CHECK(detail::parse_bytes("3M", "x") == 3ull << 20);
  CHECK(detail::parse_bytes("3MB", "x") == 3ull << 20);
  CHECK(detail::parse_bytes("8G", "x") == 8ull << 30);
  CHECK(detail::parse_bytes("8GB", "x") == 8ull << 30);
  CHECK(detail::parse_bytes("2T", "x") == 2ull << 40);
  CHECK(detail::parse_bytes("2TB", "x") == 2ull << 40);
  CHECK(detail::parse_bytes("18446744073709551615", "x") == UINT64_MAX);
  CHECK(detail::parse_bytes("16777215T", "x") == 16777215ull << 40);
}

TEST_CASE("parse_bytes takes suffixes in any case, with B or iB, and decimal counts", "[config]") {
  CHECK(detail::parse_bytes("512m", "x") == 512ull << 20);
  CHECK(detail::parse_bytes("5k", "x") == 5ull << 10);
  CHECK(detail::parse_bytes("5KiB", "x") == 5ull << 10);
  CHECK(detail::parse_bytes("8gib", "x") == 8ull << 30);
  CHECK(detail::parse_bytes("8Gb", "x") == 8ull << 30);
  CHECK(detail::parse_bytes("100B", "x") == 100);
  CHECK(detail::parse_bytes("1.5G", "x") == 3ull << 29);
  CHECK(detail::parse_bytes("0.5t", "x") == 1ull << 39);
  CHECK(detail::parse_bytes("1.25K", "x") == 1280);
  // Rounded down to whole bytes: 0.1 KiB is 102.4 bytes.
  CHECK(detail::parse_bytes("0.1K", "x") == 102);
  CHECK(detail::parse_bytes("16777215.5T", "x") == (16777215ull << 40) + (1ull << 39));
}

TEST_CASE("parse_bytes refuses counts beyond 64 bits instead of wrapping", "[config]") {
  // 17179869184G is 2^64 bytes, which wrapped to 0: no cap, or prune deleting everything.
  for (const char* text :
       {"17179869184G", "16777216T", "18446744073709551616", "99999999999999999999999",
        "18014398509481984K", "16777216.5T", "18014398509481983.99999999999999999999K"}) {
    INFO(text);
    const std::string message = refusal_of(text);
    CHECK_THAT(message, Catch::Contains(std::string("--max-bytes is '") + text + "'") &&
                            Catch::Contains("2^64 - 1") && Catch::Contains("smaller count"));
  }
}

TEST_CASE("parse_bytes refuses signs, spaces, other suffixes and empty text", "[config]") {
  for (const char* text :
       {"",   "-1",  "+5",    " 5",     "5 ",   "G",   "5P",  "0x10", "5GG", "12Q",
        "1.", ".5G", "1..5G", "1.5.5G", "1,5G", "1e3", "5Bi", "5iB",  "5 G", "1.5"}) {
    INFO("'" << text << "'");
    CHECK_THAT(refusal_of(text), Catch::Contains(std::string("--max-bytes is '") + text + "'") &&
                                     Catch::Contains("K, M, G or T") && Catch::Contains("512M"));
  }
  CHECK_THAT(refusal_of("-1G"), Catch::Contains("cannot be negative"));
  CHECK_THAT(refusal_of("1.5"), Catch::Contains("drop the fraction"));
}

TEST_CASE("KILN_CACHE_MAX_BYTES beyond 64 bits is an error and not a cache without a cap",
          "[config]") {
  const ScopedEnv bytes("KILN_CACHE_MAX_BYTES", "17179869184G");
  try {
    detail::resolve_config({});
    FAIL("accepted");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("KILN_CACHE_MAX_BYTES is '17179869184G'"));
  }
  const ScopedEnv fits("KILN_CACHE_MAX_BYTES", "16G");
  CHECK(detail::resolve_config({}).cache_max_bytes == 16ull << 30);
}

}  // namespace
}  // namespace kiln::test
