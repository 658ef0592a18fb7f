// SPDX-License-Identifier: Apache-2.0
// The tally of the disk cache's use: "<event> <ms>" lines in <root>/v<format>/stats.log.
#include "cache/stats.hpp"

#include <fmt/format.h>

#include <array>
#include <charconv>
#include <string_view>

namespace kiln::detail {
namespace {

constexpr std::string_view kNote = "stats.log";
// NOTE: longer than any line tally() writes: a tally with no room for one more is full (at
// kMaxNoteBytes, some 60,000 events).
constexpr std::size_t kMaxLineBytes = 32;

constexpr std::array<std::string_view, 3> kEventWords = {"hit", "compiled", "failed"};

}  // namespace

void tally(DiskCache& cache, CacheEvent event, double ms) {
  cache.append_note(kNote,
                    fmt::format("{} {:.1f}\n", kEventWords[static_cast<std::size_t>(event)], ms));
}

CacheTally read_tally(const DiskCache& cache) {
  CacheTally tally;
  const std::optional<std::string> text = cache.read_note(kNote);
  if (!text) return tally;
  tally.full = text->size() + kMaxLineBytes > kMaxNoteBytes;
  std::string_view rest = *text;
  while (!rest.empty()) {
    const std::size_t end = std::min(rest.find('\n'), rest.size());
    const std::string_view line = rest.substr(0, end);
    rest.remove_prefix(std::min(end + 1, rest.size()));
    const std::size_t space = line.find(' ');
    double ms = 0;
    const char* const last = line.data() + line.size();
    if (space == std::string_view::npos ||
        std::from_chars(line.data() + space + 1, last, ms).ptr != last) {
      continue;
    }
    const std::string_view word = line.substr(0, space);
    if (word == kEventWords[0]) {
      ++tally.disk_hits;
      tally.saved_ms += ms;
    } else if (word == kEventWords[1] || word == kEventWords[2]) {
      ++(word == kEventWords[1] ? tally.compiles : tally.compile_failures);
      tally.compile_ms += ms;
    }
  }
  return tally;
}

void reset_tally(DiskCache& cache) {
  cache.write_note(kNote, "");
}

}  // namespace kiln::detail
