// SPDX-License-Identifier: Apache-2.0
// Formatting shared by the `kiln` subcommands: sizes, durations and tables.
#include <fmt/format.h>

#include <algorithm>
#include <array>

#include "cli/commands.hpp"

namespace kiln::cli {

std::string human_bytes(std::uint64_t bytes) {
  constexpr std::array<const char*, 5> kUnits = {"B", "KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return fmt::format("{} B", bytes);
  auto value = static_cast<double>(bytes);
  std::size_t unit = 0;
  while (value >= 1024 && unit + 1 < kUnits.size()) {
    value /= 1024;
    ++unit;
  }
  return fmt::format("{:.1f} {}", value, kUnits[unit]);
}

std::string human_ms(double ms) {
  if (ms < 10'000) return fmt::format("{:.0f} ms", ms);
  return fmt::format("{:.1f} s", ms / 1000);
}

void print_table(std::FILE* out, const std::vector<std::string>& header,
                 const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::size_t> widths(header.size());
  for (std::size_t c = 0; c < header.size(); ++c) widths[c] = header[c].size();
  for (const auto& row : rows) {
    for (std::size_t c = 0; c < widths.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  }
  const auto print_row = [&](const std::vector<std::string>& row) {
    std::string line;
    for (std::size_t c = 0; c + 1 < widths.size(); ++c) {
      line += fmt::format("{:<{}}  ", row[c], widths[c]);
    }
    fmt::print(out, "{}\n", line + row.back());
  };
  print_row(header);
  for (const auto& row : rows) print_row(row);
}

}  // namespace kiln::cli
