// SPDX-License-Identifier: Apache-2.0
// kiln::Target: a GPU architecture kiln compiles for, parsed once from its name ("sm_90a",
// "gfx90a") wherever a name comes in.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace kiln {

enum class Vendor { nvidia, amd };

// The backend that builds and runs a vendor's targets: "cuda" or "hip".
std::string_view to_string(Vendor vendor) noexcept;
// The vendor whose backend `name` names ("cuda", "hip"); nullopt for any other name.
std::optional<Vendor> parse_backend(std::string_view name) noexcept;

class Target {
 public:
  // Parses "sm_<arch>" with an optional "a" (sm_80, sm_90a, sm_100a) or "gfx<hex arch>"
  // (gfx90a, gfx1100). Throws kiln::Error (invalid_argument) naming `name`, and the target it
  // probably means when one is near ("sm90": sm_90 or sm_90a). Not explicit, so that the
  // functions taking a Target take its name too.
  Target(std::string_view name);
  Target(const char* name) : Target(std::string_view(name)) {}
  Target(const std::string& name) : Target(std::string_view(name)) {}

  // The target `name` names; nullopt where the constructor throws.
  static std::optional<Target> parse(std::string_view name);

  Vendor vendor() const { return vendor_; }
  // NVIDIA: 10 * major + minor of the compute capability (sm_90a: 90); AMD: the gfx number,
  // whose digits are hexadecimal (gfx90a: 0x90a, gfx1100: 0x1100).
  int arch() const { return arch_; }
  // NVIDIA's arch-specific targets (sm_90a): features that do not carry forward, such as
  // Hopper's wgmma and TMA multicast.
  bool arch_specific() const { return arch_specific_; }
  bool nvidia() const { return vendor_ == Vendor::nvidia; }
  bool amd() const { return vendor_ == Vendor::amd; }

  // The most dynamic shared memory one CTA may take on this architecture, in bytes: CUDA's
  // opt-in maximum (what DeviceInfo::max_shared_bytes_per_block reads from a device of it), AMD's
  // LDS per workgroup. From the vendors' tables, so that what is planned without a device (kiln
  // warm) is what a device of the target runs; an architecture the table does not know gets the
  // least of the sm_80 and newer ones (99 KiB).
  int max_shared_bytes_per_block() const;

  std::string name() const;                                        // as parsed: "sm_90a"
  std::string_view backend() const { return to_string(vendor_); }  // "cuda" or "hip"

  friend bool operator==(const Target&, const Target&) = default;

 private:
  Target(Vendor vendor, int arch, bool arch_specific)
      : vendor_(vendor), arch_(arch), arch_specific_(arch_specific) {}

  Vendor vendor_;
  int arch_;
  bool arch_specific_;
};

}  // namespace kiln
