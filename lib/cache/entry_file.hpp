// SPDX-License-Identifier: Apache-2.0
// The bytes of one cache entry file: a fixed little-endian header, metadata JSON, the binary.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "cache/disk.hpp"
#include "cache/key.hpp"

namespace kiln::detail {

// An entry file, all integers little-endian and written byte by byte (no struct images):
//
//   offset  size  field
//        0     8  magic "KILNBIN\0"
//        8     4  format version (kCacheFormatVersion)
//       12     4  header size (kEntryHeaderSize)
//       16    16  key echo: the key the entry was stored under
//       32     8  payload length: metadata + binary
//       40     8  payload checksum: XXH3-64 of the payload
//       48     8  metadata length
//       56        payload: EntryMeta as a JSON object, then the binary
inline constexpr std::size_t kEntryHeaderSize = 56;

// What reading one entry file found: the entry, an I/O error, or why the bytes are not an entry.
struct EntryRead {
  std::optional<Entry> entry;
  int error = 0;        // errno of a failed call; the file may be fine
  std::string problem;  // the file is readable but holds no valid entry for the key
  // The file may not be trusted (cache/trust.hpp), so it was not read: why, naming the fix.
  std::string untrusted;
};

// Writes `entry` to `fd` from its current offset. Returns 0 or the errno of the failed write.
int write_entry(int fd, const Entry& entry);

// Reads the entry for `key` from the open file `fd`, verifying every field of the header, the
// file's length, the checksum and the metadata, which must describe one kernel consistently (a
// canonical spec naming the target recorded) and, given `spec`, be that spec's. Never trusts a
// length before checking it against the file's size, so no content can make it allocate more
// than the file holds.
EntryRead read_entry(int fd, const Key& key, std::optional<std::string_view> spec);

}  // namespace kiln::detail
