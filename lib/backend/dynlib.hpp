// SPDX-License-Identifier: Apache-2.0
// DynLib: a shared library opened with dlopen, so kiln runs on machines without a GPU stack.
#pragma once

#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::detail {

class DynLib {
 public:
  // Opens the first of `candidates` (bare names go through the loader's search path) that
  // loads. Throws kiln::Error (not_found) naming `what`, every candidate tried and `fix`.
  static DynLib open(std::string_view what, std::span<const std::string> candidates,
                     std::string_view fix);

  DynLib(DynLib&& other) noexcept;
  DynLib& operator=(DynLib&& other) noexcept;
  DynLib(const DynLib&) = delete;
  DynLib& operator=(const DynLib&) = delete;
  ~DynLib();

  // The file that was loaded, with symbolic links resolved.
  const std::filesystem::path& file() const { return file_; }

  // nullptr when the library lacks `name`.
  void* find(const char* name) const noexcept;

  // Throws kiln::Error (not_found) naming the library and the symbol when it is missing.
  template <class Fn>
  Fn symbol(const char* name) const {
    return reinterpret_cast<Fn>(require(name));
  }

  // Points `slot` at symbol `name`, or throws as symbol() does.
  template <class Fn>
  void bind(Fn& slot, const char* name) const {
    slot = symbol<Fn>(name);
  }

  // Points `slot` at symbol `name`, or at nullptr when the library lacks it: for entry points
  // newer than the oldest version kiln runs with. Check with require_bound() before a call.
  template <class Fn>
  void bind_optional(Fn& slot, const char* name) const noexcept {
    slot = reinterpret_cast<Fn>(find(name));
  }

  // Throws as symbol() does when bind_optional() found no `name` for `slot`.
  template <class Fn>
  void require_bound(Fn slot, const char* name) const {
    if (slot == nullptr) require(name);
  }

 private:
  DynLib(void* handle, std::string what, std::string fix);
  void* require(const char* name) const;

  void* handle_ = nullptr;
  std::string what_;
  std::string fix_;
  std::filesystem::path file_;
};

// The order in which a library is looked for: `names` inside each of `user_dirs` (set through
// the environment, so they must win), then bare (the loader's search path), then inside each of
// `default_dirs`. Empty directories are skipped.
std::vector<std::string> library_candidates(std::span<const std::string_view> names,
                                            std::span<const std::filesystem::path> user_dirs,
                                            std::span<const std::filesystem::path> default_dirs);

// `child` inside the directory environment variable `name` holds; empty when it is unset or empty.
std::filesystem::path env_path(const char* name, std::string_view child);

}  // namespace kiln::detail
