// SPDX-License-Identifier: Apache-2.0
// Resource usage read from ptxas and AMDGPU compiler logs.
#include "backend/resource_usage.hpp"

#include <charconv>
#include <string>

namespace kiln::detail {

namespace {

constexpr std::string_view::size_type npos = std::string_view::npos;

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

int to_int(std::string_view digits) {
  int value = -1;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  return error == std::errc() && end == digits.data() + digits.size() ? value : -1;
}

// The number written just before `suffix`, as in "22" of "Used 22 registers".
int number_before(std::string_view text, std::string_view suffix) {
  const auto at = text.find(suffix);
  if (at == npos) return -1;
  auto begin = at;
  while (begin > 0 && is_digit(text[begin - 1])) --begin;
  return begin == at ? -1 : to_int(text.substr(begin, at - begin));
}

// The number written just after `prefix`, as in "9" of "VGPRs: 9".
int number_after(std::string_view text, std::string_view prefix) {
  const auto at = text.find(prefix);
  if (at == npos) return -1;
  const auto begin = at + prefix.size();
  auto end = begin;
  while (end < text.size() && is_digit(text[end])) ++end;
  return end == begin ? -1 : to_int(text.substr(begin, end - begin));
}

// What the log says about one entry: from `marker` followed by `name` and `name_end` to the next
// `marker`. The first entry when `name` is not there; the whole log when no entry is.
std::string_view entry_section(std::string_view log, std::string_view marker, std::string_view name,
                               std::string_view name_end) {
  auto begin = name.empty()
                   ? npos
                   : log.find(std::string(marker) + std::string(name) + std::string(name_end));
  if (begin == npos) begin = log.find(marker);
  if (begin == npos) return log;
  const auto end = log.find(marker, begin + marker.size());
  return log.substr(begin, end == npos ? npos : end - begin);
}

int sum_or_absent(int a, int b) {
  return a < 0 || b < 0 ? -1 : a + b;
}

}  // namespace

ResourceUsage parse_ptxas_usage(std::string_view log, std::string_view lowered_name) {
  const std::string_view entry =
      entry_section(log, "Compiling entry function '", lowered_name, "'");
  ResourceUsage usage;
  usage.registers = number_before(entry, " registers");
  usage.stack_bytes = number_before(entry, " bytes stack frame");
  usage.spill_bytes = sum_or_absent(number_before(entry, " bytes spill stores"),
                                    number_before(entry, " bytes spill loads"));
  // NOTE: the "Used N registers" line lists smem only when the kernel has some.
  const int smem = number_before(entry, " bytes smem");
  usage.shared_bytes = smem >= 0 ? smem : (usage.registers >= 0 ? 0 : -1);
  return usage;
}

ResourceUsage parse_amdgpu_usage(std::string_view log, std::string_view lowered_name) {
  const std::string_view entry = entry_section(log, "Function Name: ", lowered_name, " ");
  ResourceUsage usage;
  usage.registers = number_after(entry, "VGPRs: ");
  const int spilled_vgprs = number_after(entry, "VGPRs Spill: ");
  usage.spill_bytes = spilled_vgprs >= 0 ? 4 * spilled_vgprs : -1;
  usage.shared_bytes = number_after(entry, "LDS Size [bytes/block]: ");
  usage.stack_bytes = number_after(entry, "ScratchSize [bytes/lane]: ");
  return usage;
}

}  // namespace kiln::detail
