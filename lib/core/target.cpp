// SPDX-License-Identifier: Apache-2.0
// kiln::Target: the one place target names are read.
#include "kiln/target.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <optional>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/user_text.hpp"
#include "kiln/error.hpp"

namespace kiln {
namespace {

// `text` as a number in `base`, all of it; nullopt for none, a leading zero or an overflow.
std::optional<int> whole_number(std::string_view text, int base) {
  int value = 0;
  if (text.empty() || text.front() == '0') return std::nullopt;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value, base);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

bool is_lower_hex(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
}

// The targets a mistyped one probably meant: "sm_90 or sm_90a" for sm90 or SM-90, "gfx90a" for
// GFX90A; empty when nothing is near.
std::string meant_target(std::string_view name) {
  std::string word;
  for (char c : name) {
    if (std::isalnum(static_cast<unsigned char>(c))) {
      word += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    }
  }
  std::vector<std::string> candidates;
  if (word.starts_with("gfx")) {
    candidates.push_back(word);
  } else {
    for (std::string_view prefix : {"sm", "compute"}) {
      if (word.starts_with(prefix)) word.erase(0, prefix.size());
    }
    candidates.push_back("sm_" + word);  // sm90a
    // NOTE: the "a" targets (sm_90a and later) hold the features that do not carry forward.
    const std::optional<Target> plain = Target::parse(candidates.back());
    if (plain && !plain->arch_specific() && plain->arch() >= 90) {
      candidates.push_back("sm_" + word + "a");
    }
  }
  std::erase_if(candidates,
                [&](const std::string& c) { return c == name || !Target::parse(c).has_value(); });
  return fmt::format("{}", fmt::join(candidates, " or "));
}

}  // namespace

std::optional<Target> Target::parse(std::string_view name) {
  if (name.starts_with("sm_")) {
    std::string_view digits = name.substr(3);
    const bool specific = digits.ends_with('a');
    if (specific) digits.remove_suffix(1);
    // NOTE: every compute capability has a major and a minor digit (sm_80, sm_100).
    const bool decimal =
        std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
    const auto arch = decimal && digits.size() >= 2 ? whole_number(digits, 10) : std::nullopt;
    if (!arch) return std::nullopt;
    return Target(Vendor::nvidia, *arch, specific);
  }
  if (name.starts_with("gfx")) {
    // LLVM's AMDGPU processors: gfx, a major version, then a minor and a stepping digit, both
    // hexadecimal (gfx90a, gfx942, gfx1100).
    const std::string_view digits = name.substr(3);
    if (digits.size() < 3 || digits.size() > 4 ||
        !std::all_of(digits.begin(), digits.end(), is_lower_hex)) {
      return std::nullopt;
    }
    const auto arch = whole_number(digits, 16);
    if (!arch) return std::nullopt;
    return Target(Vendor::amd, *arch, false);
  }
  return std::nullopt;
}

namespace {

Target named(std::string_view name) {
  std::optional<Target> parsed = Target::parse(name);
  if (!parsed) {
    const std::string meant = meant_target(name);
    throw Error(
        ErrorCategory::invalid_argument,
        fmt::format("target '{}' names no GPU architecture (CUDA targets are sm_XY, "
                    "such as sm_80 or sm_90a, HIP ones gfxN, such as gfx90a){}",
                    detail::printable(name), meant.empty() ? "" : "; did you mean " + meant + "?"));
  }
  return *parsed;
}

}  // namespace

Target::Target(std::string_view name) : Target(named(name)) {}

namespace {

struct SharedLimit {
  int arch;
  int kib;
};

// CUDA's opt-in maximum of shared memory per CTA by compute capability, in KiB (the CUDA C++
// Programming Guide's technical specifications per compute capability).
constexpr SharedLimit kNvidiaSharedKiB[] = {{70, 96},   {72, 96},   {75, 64},  {80, 163},
                                            {86, 99},   {87, 163},  {89, 99},  {90, 227},
                                            {100, 227}, {103, 227}, {120, 99}, {121, 99}};
// NOTE: the least of sm_80 and newer, so that a plan for an architecture newer than the table
// runs there, only perhaps slower than one made for it.
constexpr int kUnknownNvidiaSharedKiB = 99;

}  // namespace

int Target::max_shared_bytes_per_block() const {
  if (amd()) return (arch_ == 0x950 ? 160 : 64) * 1024;  // MI355X's LDS is 160 KiB
  for (const SharedLimit& limit : kNvidiaSharedKiB) {
    if (limit.arch == arch_) return limit.kib * 1024;
  }
  return kUnknownNvidiaSharedKiB * 1024;
}

std::string Target::name() const {
  if (amd()) return fmt::format("gfx{:x}", arch_);
  return fmt::format("sm_{}{}", arch_, arch_specific_ ? "a" : "");
}

std::string_view to_string(Vendor vendor) noexcept {
  return vendor == Vendor::amd ? "hip" : "cuda";
}

std::optional<Vendor> parse_backend(std::string_view name) noexcept {
  for (const Vendor vendor : {Vendor::nvidia, Vendor::amd}) {
    if (name == to_string(vendor)) return vendor;
  }
  return std::nullopt;
}

}  // namespace kiln
