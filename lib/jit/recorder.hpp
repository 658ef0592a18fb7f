// SPDX-License-Identifier: Apache-2.0
// Recorder: the specs a run asks for, appended to the manifest KILN_RECORD names.
#pragma once

#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_set>

#include "jit/unit.hpp"

namespace kiln::detail {

class Recorder {
 public:
  // Records nothing when `manifest` is nullopt.
  explicit Recorder(std::optional<std::filesystem::path> manifest);
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  // Appends `unit`'s canonical spec the first time it is asked for, whether or not it then loads
  // (so that a run refused under KILN_JIT=strict still names what to warm). A user variant's code
  // goes beside the manifest, in <manifest>.variants/NAME-HASH.cuh (NAME cut to 64 characters),
  // declared by a `variant NAME FILE` line before the first spec that names it, so that `kiln
  // warm` builds the manifest as it is. Writes only where no other user could rewrite or replace
  // what it writes (the rules of cache/trust.hpp), never through a link, never waiting on a
  // FIFO, and no record that `kiln warm` could not read back. A failure is one warning:
  // recording never fails a call.
  void record(const Unit& unit);

 private:
  // Appends `unit`'s spec and, where new, its variant's declaration. Returns why not, or empty.
  std::string write(const Unit& unit);

  std::optional<std::filesystem::path> manifest_;
  std::mutex mutex_;
  // Canonical specs (target included), and the variant code files written beside the manifest.
  std::unordered_set<std::string> recorded_;
};

}  // namespace kiln::detail
