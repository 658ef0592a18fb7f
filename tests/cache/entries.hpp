// SPDX-License-Identifier: Apache-2.0
// Helpers for the cache tests: sample entries, hand edits of entry files, captured warnings.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "cache/disk.hpp"

namespace kiln::test {

// The entry header's offsets as lib/cache/entry_file.hpp documents them, restated here so that
// the tests pin the format instead of borrowing the code under test.
inline constexpr std::size_t kVersionAt = 8;
inline constexpr std::size_t kHeaderSizeAt = 12;
inline constexpr std::size_t kKeyAt = 16;
inline constexpr std::size_t kPayloadBytesAt = 32;
inline constexpr std::size_t kChecksumAt = 40;
inline constexpr std::size_t kMetaBytesAt = 48;
inline constexpr std::size_t kHeaderBytes = 56;

// A distinct, recognisable entry for each seed; its binary is `binary_bytes` long.
detail::Entry sample_entry(int seed, std::size_t binary_bytes = 113);

// Whether two entries agree in key, every metadata field and every binary byte.
bool same_entry(const detail::Entry& a, const detail::Entry& b);

// CHECKs each field of `actual` against `expected`, so that a failure names the field.
void check_same_entry(const detail::Entry& actual, const detail::Entry& expected);

// Where the documentation says `key`'s entry lives under a writable or read-only root.
std::filesystem::path entry_path(const std::filesystem::path& root, const detail::Key& key);

void put_u32(std::string& bytes, std::size_t at, std::uint32_t value);
void put_u64(std::string& bytes, std::size_t at, std::uint64_t value);
std::uint32_t get_u32(const std::string& bytes, std::size_t at);
std::uint64_t get_u64(const std::string& bytes, std::size_t at);

// Replaces the metadata of the entry file at `path` with `meta`, fixing its lengths and checksum
// so that nothing but the metadata can be wrong.
void rewrite_meta(const std::filesystem::path& path, const std::string& meta);
std::string read_meta(const std::filesystem::path& path);

std::int64_t mtime_ns(const std::filesystem::path& path);
void set_mtime(const std::filesystem::path& path, std::int64_t seconds);

// Every non-directory below `dir` (links not followed) whose name ends with `suffix`.
std::vector<std::filesystem::path> files_under(const std::filesystem::path& dir,
                                               std::string_view suffix = "");

// Makes the file or directory `path` another user's as far as this process can: writable by
// everyone, and given to uid 65534 when the tests run as root. Returns how kiln's trust rules
// (lib/cache/trust.hpp) refuse it: the path and what is wrong with it.
std::string make_foreign(const std::filesystem::path& path);

// Collects what is written to stderr (file descriptor 2) while it lives, with warnings enabled.
class CapturedStderr {
 public:
  CapturedStderr();
  ~CapturedStderr();
  CapturedStderr(const CapturedStderr&) = delete;
  CapturedStderr& operator=(const CapturedStderr&) = delete;
  std::string text() const;

 private:
  std::FILE* file_;
  int saved_;
  bool lowered_level_ = false;
};

// How many times `needle` occurs in `text`.
std::size_t count_of(const std::string& text, std::string_view needle);

}  // namespace kiln::test
