// SPDX-License-Identifier: Apache-2.0
// The disk cache's use across processes, for `kiln cache stats`: a tally of one line per disk
// hit, compile and failed compile, appended by every runtime beside the entries.
#pragma once

#include <cstdint>

#include "cache/disk.hpp"

namespace kiln::detail {

enum class CacheEvent { disk_hit, compiled, compile_failed };

// Adds one event to the tally of `cache`'s writable tier: best-effort, never waits for another
// process and never fails the call (DiskCache::append_note). `ms`: the compile's time; for a
// disk hit, the time the entry's compile took, which the hit saved.
void tally(DiskCache& cache, CacheEvent event, double ms);

struct CacheTally {
  std::uint64_t disk_hits = 0;
  std::uint64_t compiles = 0;
  std::uint64_t compile_failures = 0;
  double saved_ms = 0;    // the compile time of the entries hit
  double compile_ms = 0;  // of compiles, failed ones included
  bool full = false;      // the tally reached its size limit and counts no more
};

// The tally since it was started or last reset; lines that are no event (a torn write on a
// network file system) are skipped.
CacheTally read_tally(const DiskCache& cache);
// Starts the tally again from zero.
void reset_tally(DiskCache& cache);

}  // namespace kiln::detail
