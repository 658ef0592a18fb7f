// SPDX-License-Identifier: Apache-2.0
// DiskMemos: the compilers' fact memos kept as notes of the disk cache.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "backend/compiler_memo.hpp"
#include "cache/disk.hpp"

namespace kiln::detail {

// NOTE: the backend owns MemoStore and the runtime joins it to the cache here, so that neither
// backend/ nor cache/ includes the other. A memory-only cache keeps no memo.
class DiskMemos final : public MemoStore {
 public:
  explicit DiskMemos(DiskCache& disk) : disk_(disk) {}  // `disk` must outlive it

  std::optional<std::string> read(std::string_view name) const override {
    return disk_.read_note(name);
  }
  void write(std::string_view name, std::string_view text) override {
    disk_.write_note(name, text);
  }

 private:
  DiskCache& disk_;
};

}  // namespace kiln::detail
