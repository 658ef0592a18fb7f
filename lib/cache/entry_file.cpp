// SPDX-License-Identifier: Apache-2.0
// Encoding and verification of one cache entry file (layout in entry_file.hpp).
#include "cache/entry_file.hpp"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "cache/file_io.hpp"
#include "kiln/error.hpp"
#include "kiln/spec.hpp"

namespace kiln::detail {
namespace {

using json = nlohmann::json;
using HeaderBytes = std::array<std::byte, kEntryHeaderSize>;

constexpr std::string_view kMagic{"KILNBIN\0", 8};
constexpr std::size_t kVersionAt = 8;
constexpr std::size_t kHeaderSizeAt = 12;
constexpr std::size_t kKeyAt = 16;
constexpr std::size_t kPayloadBytesAt = 32;
constexpr std::size_t kChecksumAt = 40;
constexpr std::size_t kMetaBytesAt = 48;

template <class T>
void put_le(HeaderBytes& header, std::size_t at, T value) {
  for (std::size_t i = 0; i < sizeof(T); ++i) {
    header[at + i] = static_cast<std::byte>(value >> (8 * i));
  }
}

template <class T>
T get_le(const HeaderBytes& header, std::size_t at) {
  T value = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i) {
    value |= static_cast<T>(std::to_integer<T>(header[at + i]) << (8 * i));
  }
  return value;
}

// The metadata fields by type. Encoding and decoding both walk these tables, so the two cannot
// disagree about a field's name.
constexpr std::pair<const char*, std::string EntryMeta::*> kStringFields[] = {
    {"spec", &EntryMeta::spec},         {"target", &EntryMeta::target},
    {"compiler", &EntryMeta::compiler}, {"lowered_name", &EntryMeta::lowered_name},
    {"log", &EntryMeta::log},
};
constexpr std::pair<const char*, int EntryMeta::*> kIntFields[] = {
    {"registers", &EntryMeta::registers},
    {"spill_bytes", &EntryMeta::spill_bytes},
    {"shared_bytes", &EntryMeta::shared_bytes},
    {"stack_bytes", &EntryMeta::stack_bytes},
};
constexpr const char* kCompileMsField = "compile_ms";

std::string encode_meta(const EntryMeta& meta) {
  json object = json::object();
  for (const auto& [name, member] : kStringFields) object[name] = meta.*member;
  for (const auto& [name, member] : kIntFields) object[name] = meta.*member;
  // NOTE: JSON has no NaN or infinity; such a timing would make the entry unreadable.
  object[kCompileMsField] = std::isfinite(meta.compile_ms) ? meta.compile_ms : 0.0;
  // NOTE: compiler logs may hold bytes that are not UTF-8; replace them rather than throw.
  return object.dump(-1, ' ', false, json::error_handler_t::replace);
}

// Each reader refuses a missing field and a value of another type or out of range, rather than
// converting it (a double out of int's range would be undefined behaviour to convert).
bool read_field(const json& object, const char* name, std::string& out) {
  const auto it = object.find(name);
  if (it == object.end() || !it->is_string()) return false;
  out = it->get<std::string>();
  return true;
}

bool read_field(const json& object, const char* name, int& out) {
  const auto it = object.find(name);
  if (it == object.end()) return false;
  if (it->is_number_unsigned()) {
    const auto value = it->get<std::uint64_t>();
    if (value > static_cast<std::uint64_t>(INT_MAX)) return false;
    out = static_cast<int>(value);
    return true;
  }
  if (!it->is_number_integer()) return false;
  const auto value = it->get<std::int64_t>();
  if (value < INT_MIN || value > INT_MAX) return false;
  out = static_cast<int>(value);
  return true;
}

bool read_field(const json& object, const char* name, double& out) {
  const auto it = object.find(name);
  if (it == object.end() || !it->is_number()) return false;
  out = it->get<double>();
  return true;
}

std::optional<EntryMeta> decode_meta(std::string_view text, std::string& problem) {
  const json object = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!object.is_object()) {
    problem = "the metadata is not a JSON object";
    return std::nullopt;
  }
  EntryMeta meta;
  const auto missing = [&](const char* name) {
    problem = fmt::format("metadata field '{}' is missing or has the wrong type or range", name);
    return std::nullopt;
  };
  for (const auto& [name, member] : kStringFields) {
    if (!read_field(object, name, meta.*member)) return missing(name);
  }
  for (const auto& [name, member] : kIntFields) {
    if (!read_field(object, name, meta.*member)) return missing(name);
  }
  if (!read_field(object, kCompileMsField, meta.compile_ms)) return missing(kCompileMsField);
  return meta;
}

// Why `meta` does not describe one kernel consistently, or empty: its spec must be canonical (as
// kiln::to_string prints it) and name the target recorded beside it. Messages never quote the
// file's text, which may hold anything.
std::string inconsistency(const EntryMeta& meta) {
  // NOTE: a user variant's line names its code by a hash, which no parse can check: only its
  // target suffix is. The key still covers the code, so such an entry is found only by it.
  if (meta.spec.find(" {variant ") != std::string::npos) {
    return meta.spec.ends_with(" @" + meta.target)
               ? std::string()
               : "its recorded spec is for another target than recorded";
  }
  KernelSpec spec;
  try {
    spec = parse_spec(meta.spec);
  } catch (const Error&) {
    return "its recorded spec is not a kernel spec";
  }
  if (to_string(spec) != meta.spec) return "its recorded spec is not in canonical form";
  if (spec.target != meta.target) return "its recorded spec is for another target than recorded";
  return {};
}

std::uint64_t payload_checksum(std::string_view meta, std::span<const std::byte> binary) {
  // NOTE: a stack state needs no XXH3_INITSTATE when the first reset is the unseeded one.
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  XXH3_64bits_update(&state, meta.data(), meta.size());
  XXH3_64bits_update(&state, binary.data(), binary.size());
  return XXH3_64bits_digest(&state);
}

HeaderBytes encode_header(const Key& key, std::string_view meta,
                          std::span<const std::byte> binary) {
  HeaderBytes header{};
  for (std::size_t i = 0; i < kMagic.size(); ++i) header[i] = static_cast<std::byte>(kMagic[i]);
  put_le<std::uint32_t>(header, kVersionAt, kCacheFormatVersion);
  put_le<std::uint32_t>(header, kHeaderSizeAt, kEntryHeaderSize);
  for (std::size_t i = 0; i < key.bytes.size(); ++i) {
    header[kKeyAt + i] = static_cast<std::byte>(key.bytes[i]);
  }
  put_le<std::uint64_t>(header, kPayloadBytesAt, meta.size() + binary.size());
  put_le<std::uint64_t>(header, kChecksumAt, payload_checksum(meta, binary));
  put_le<std::uint64_t>(header, kMetaBytesAt, meta.size());
  return header;
}

// What a verified header promises about the rest of the file.
struct PayloadLayout {
  std::uint64_t meta_bytes = 0;
  std::uint64_t binary_bytes = 0;
  std::uint64_t checksum = 0;
};

// The payload layout `header` declares for `key`'s entry in a file of `file_bytes` bytes, or
// nullopt with `problem` saying which field is wrong.
std::optional<PayloadLayout> check_header(const HeaderBytes& header, const Key& key,
                                          std::uint64_t file_bytes, std::string& problem) {
  for (std::size_t i = 0; i < kMagic.size(); ++i) {
    if (header[i] != static_cast<std::byte>(kMagic[i])) {
      problem = "it is not a kiln cache entry (wrong magic bytes)";
      return std::nullopt;
    }
  }
  if (const auto version = get_le<std::uint32_t>(header, kVersionAt);
      version != kCacheFormatVersion) {
    problem = fmt::format("it has cache format version {}, this build reads version {}", version,
                          kCacheFormatVersion);
    return std::nullopt;
  }
  if (const auto size = get_le<std::uint32_t>(header, kHeaderSizeAt); size != kEntryHeaderSize) {
    problem = fmt::format("its header size is {}, expected {}", size, kEntryHeaderSize);
    return std::nullopt;
  }
  Key echo;
  for (std::size_t i = 0; i < echo.bytes.size(); ++i) {
    echo.bytes[i] = std::to_integer<std::uint8_t>(header[kKeyAt + i]);
  }
  if (echo != key) {
    problem = fmt::format("it holds the entry of key {}, not {} (copied or renamed)", echo.hex(),
                          key.hex());
    return std::nullopt;
  }
  const auto payload_bytes = get_le<std::uint64_t>(header, kPayloadBytesAt);
  if (payload_bytes != file_bytes - kEntryHeaderSize) {
    problem = fmt::format("it has {} payload bytes, the header declares {} (truncated or appended)",
                          file_bytes - kEntryHeaderSize, payload_bytes);
    return std::nullopt;
  }
  const auto meta_bytes = get_le<std::uint64_t>(header, kMetaBytesAt);
  if (meta_bytes > payload_bytes) {
    problem = fmt::format("its metadata length {} exceeds its payload length {}", meta_bytes,
                          payload_bytes);
    return std::nullopt;
  }
  return PayloadLayout{meta_bytes, payload_bytes - meta_bytes,
                       get_le<std::uint64_t>(header, kChecksumAt)};
}

// Reads up to `out.size()` bytes at `offset`, stopping early only at the end of the file.
// Returns the count read, or -1 with errno set.
ssize_t read_at(int fd, std::span<std::byte> out, std::uint64_t offset) {
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t got =
        ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return -1;
    if (got == 0) break;
    done += static_cast<std::size_t>(got);
  }
  return static_cast<ssize_t>(done);
}

EntryRead failed(int error) {
  return EntryRead{std::nullopt, error, {}, {}};
}
EntryRead invalid(std::string problem) {
  return EntryRead{std::nullopt, 0, std::move(problem), {}};
}

}  // namespace

int write_entry(int fd, const Entry& entry) {
  const std::string meta = encode_meta(entry.meta);
  const HeaderBytes header = encode_header(entry.key, meta, entry.binary);
  for (const std::span<const std::byte> piece :
       {std::span<const std::byte>(header), std::as_bytes(std::span(meta)),
        std::span<const std::byte>(entry.binary)}) {
    if (const int error = write_all(fd, piece)) return error;
  }
  return 0;
}

EntryRead read_entry(int fd, const Key& key, std::optional<std::string_view> spec) {
  struct stat info {};
  if (::fstat(fd, &info) != 0) return failed(errno);
  if (!S_ISREG(info.st_mode)) return invalid("it is not a regular file");
  const auto file_bytes = static_cast<std::uint64_t>(info.st_size);
  if (file_bytes < kEntryHeaderSize) {
    return invalid(fmt::format("it is truncated: {} bytes, shorter than the {}-byte header",
                               file_bytes, kEntryHeaderSize));
  }

  HeaderBytes header{};
  const ssize_t header_read = read_at(fd, header, 0);
  if (header_read < 0) return failed(errno);
  if (static_cast<std::size_t>(header_read) < header.size()) {
    return invalid("it was truncated while being read");
  }
  std::string problem;
  const std::optional<PayloadLayout> layout = check_header(header, key, file_bytes, problem);
  if (!layout) return invalid(std::move(problem));

  std::string meta(layout->meta_bytes, '\0');
  std::vector<std::byte> binary(layout->binary_bytes);
  const ssize_t meta_read = read_at(fd, std::as_writable_bytes(std::span(meta)), kEntryHeaderSize);
  if (meta_read < 0) return failed(errno);
  const ssize_t binary_read = read_at(fd, binary, kEntryHeaderSize + layout->meta_bytes);
  if (binary_read < 0) return failed(errno);
  if (static_cast<std::size_t>(meta_read) != meta.size() ||
      static_cast<std::size_t>(binary_read) != binary.size()) {
    return invalid("it was truncated while being read");
  }
  if (payload_checksum(meta, binary) != layout->checksum) {
    return invalid("its payload checksum does not match (the file is corrupted)");
  }
  std::optional<EntryMeta> decoded = decode_meta(meta, problem);
  if (!decoded) return invalid(std::move(problem));
  if (problem = inconsistency(*decoded); !problem.empty()) return invalid(std::move(problem));
  if (spec && decoded->spec != *spec) {
    return invalid("it was compiled from another spec than the one asked for (copied or renamed)");
  }
  return EntryRead{Entry{key, std::move(*decoded), std::move(binary)}, 0, {}, {}};
}

}  // namespace kiln::detail
