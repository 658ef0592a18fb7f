// SPDX-License-Identifier: Apache-2.0
// Helpers for the cache tests: sample entries, hand edits of entry files, captured warnings.
#include "cache/entries.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <stdexcept>

#include "core/log.hpp"
#include "support.hpp"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace kiln::test {

namespace fs = std::filesystem;

detail::Entry sample_entry(int seed, std::size_t binary_bytes) {
  detail::Entry entry;
  for (std::size_t i = 0; i < entry.key.bytes.size(); ++i) {
    entry.key.bytes[i] = static_cast<std::uint8_t>(seed * 53 + static_cast<int>(i) * 29 + 7);
  }
  // A canonical spec for the target below, as the loader checks.
  entry.meta.spec = fmt::format(
      "elementwise/unary.cuh:kiln::unary<block_size=256,dtype=f16,items_per_thread=4,op={}>"
      "(kiln::UnaryParams) @sm_90a",
      seed);
  entry.meta.target = "sm_90a";
  entry.meta.compiler = "nvrtc 12.4";
  entry.meta.lowered_name = fmt::format("_Z6kernelILi{}EEvv", seed);
  entry.meta.compile_ms = 812.25 + seed;
  entry.meta.registers = 40 + seed;
  entry.meta.spill_bytes = 0;
  entry.meta.shared_bytes = 16384;
  entry.meta.stack_bytes = 8;
  entry.meta.log = fmt::format("line 1: \"quoted\"\n\tline 2 \\ backslash, seed {}", seed);
  entry.binary.resize(binary_bytes);
  for (std::size_t i = 0; i < binary_bytes; ++i) {
    entry.binary[i] = static_cast<std::byte>((static_cast<std::size_t>(seed) * 131 + i * 7) % 251);
  }
  return entry;
}

bool same_entry(const detail::Entry& a, const detail::Entry& b) {
  const detail::EntryMeta& x = a.meta;
  const detail::EntryMeta& y = b.meta;
  return a.key == b.key && x.spec == y.spec && x.target == y.target && x.compiler == y.compiler &&
         x.lowered_name == y.lowered_name && x.compile_ms == y.compile_ms &&
         x.registers == y.registers && x.spill_bytes == y.spill_bytes &&
         x.shared_bytes == y.shared_bytes && x.stack_bytes == y.stack_bytes && x.log == y.log &&
         a.binary == b.binary;
}

void check_same_entry(const detail::Entry& actual, const detail::Entry& expected) {
  CHECK(actual.key.hex() == expected.key.hex());
  CHECK(actual.meta.spec == expected.meta.spec);
  CHECK(actual.meta.target == expected.meta.target);
  CHECK(actual.meta.compiler == expected.meta.compiler);
  CHECK(actual.meta.lowered_name == expected.meta.lowered_name);
  CHECK(actual.meta.compile_ms == expected.meta.compile_ms);
  CHECK(actual.meta.registers == expected.meta.registers);
  CHECK(actual.meta.spill_bytes == expected.meta.spill_bytes);
  CHECK(actual.meta.shared_bytes == expected.meta.shared_bytes);
  CHECK(actual.meta.stack_bytes == expected.meta.stack_bytes);
  CHECK(actual.meta.log == expected.meta.log);
  CHECK(actual.binary == expected.binary);
}

fs::path entry_path(const fs::path& root, const detail::Key& key) {
  const std::string hex = key.hex();
  return root / fmt::format("v{}", detail::kCacheFormatVersion) / hex.substr(0, 2) /
         (hex + ".kbin");
}

namespace {

template <class T>
void put_le(std::string& bytes, std::size_t at, T value) {
  for (std::size_t i = 0; i < sizeof(T); ++i)
    bytes.at(at + i) = static_cast<char>(value >> (8 * i));
}

template <class T>
T get_le(const std::string& bytes, std::size_t at) {
  T value = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i) {
    value |=
        static_cast<T>(static_cast<T>(static_cast<unsigned char>(bytes.at(at + i))) << (8 * i));
  }
  return value;
}

}  // namespace

void put_u32(std::string& bytes, std::size_t at, std::uint32_t value) {
  put_le(bytes, at, value);
}
void put_u64(std::string& bytes, std::size_t at, std::uint64_t value) {
  put_le(bytes, at, value);
}
std::uint32_t get_u32(const std::string& bytes, std::size_t at) {
  return get_le<std::uint32_t>(bytes, at);
}
std::uint64_t get_u64(const std::string& bytes, std::size_t at) {
  return get_le<std::uint64_t>(bytes, at);
}

std::string read_meta(const fs::path& path) {
  const std::string bytes = read_file(path);
  return bytes.substr(kHeaderBytes, get_u64(bytes, kMetaBytesAt));
}

void rewrite_meta(const fs::path& path, const std::string& meta) {
  const std::string old = read_file(path);
  const std::string binary = old.substr(kHeaderBytes + get_u64(old, kMetaBytesAt));
  const std::string payload = meta + binary;
  std::string bytes = old.substr(0, kHeaderBytes) + payload;
  put_u64(bytes, kPayloadBytesAt, payload.size());
  put_u64(bytes, kChecksumAt, XXH3_64bits(payload.data(), payload.size()));
  put_u64(bytes, kMetaBytesAt, meta.size());
  write_file(path, bytes);
}

std::int64_t mtime_ns(const fs::path& path) {
  struct stat info {};
  if (::lstat(path.c_str(), &info) != 0) throw std::runtime_error("cannot stat " + path.string());
  return std::int64_t{info.st_mtim.tv_sec} * 1'000'000'000 + info.st_mtim.tv_nsec;
}

void set_mtime(const fs::path& path, std::int64_t seconds) {
  const timespec times[2] = {{seconds, 0}, {seconds, 0}};
  if (::utimensat(AT_FDCWD, path.c_str(), times, AT_SYMLINK_NOFOLLOW) != 0) {
    throw std::runtime_error("cannot set the mtime of " + path.string());
  }
}

std::vector<fs::path> files_under(const fs::path& dir, std::string_view suffix) {
  std::vector<fs::path> files;
  for (const auto& item : fs::recursive_directory_iterator(dir)) {
    if (!item.is_directory() || item.is_symlink()) {
      if (item.path().string().ends_with(suffix)) files.push_back(item.path());
    }
  }
  return files;
}

std::string make_foreign(const fs::path& path) {
  constexpr uid_t kOtherUser = 65534;
  if (::chmod(path.c_str(), 0777) != 0) throw std::runtime_error("cannot chmod " + path.string());
  if (::geteuid() != 0) return path.string() + " is writable by group and others";
  if (::lchown(path.c_str(), kOtherUser, kOtherUser) != 0) {
    throw std::runtime_error("cannot give " + path.string() + " away");
  }
  return path.string() + " belongs to uid 65534";
}

CapturedStderr::CapturedStderr() : file_(std::tmpfile()), saved_(::dup(2)) {
  if (file_ == nullptr || saved_ < 0) throw std::runtime_error("cannot capture stderr");
  std::fflush(stderr);
  ::dup2(::fileno(file_), 2);
  if (!detail::log_enabled(LogLevel::warn)) {
    detail::set_log_level(LogLevel::warn);
    lowered_level_ = true;
  }
}

CapturedStderr::~CapturedStderr() {
  if (lowered_level_) detail::set_log_level(LogLevel::error);
  std::fflush(stderr);
  ::dup2(saved_, 2);
  ::close(saved_);
  std::fclose(file_);
}

std::string CapturedStderr::text() const {
  std::fflush(stderr);
  std::string text;
  char buffer[4096];
  for (off_t offset = 0;;) {
    const ssize_t got = ::pread(::fileno(file_), buffer, sizeof(buffer), offset);
    if (got <= 0) break;
    text.append(buffer, static_cast<std::size_t>(got));
    offset += got;
  }
  return text;
}

std::size_t count_of(const std::string& text, std::string_view needle) {
  std::size_t count = 0;
  for (std::size_t at = text.find(needle); at != std::string::npos;
       at = text.find(needle, at + needle.size())) {
    ++count;
  }
  return count;
}

}  // namespace kiln::test
