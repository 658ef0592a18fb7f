// SPDX-License-Identifier: Apache-2.0
// DynLib: dlopen with a list of candidates, and symbol lookup that names what is missing.
#include "backend/dynlib.hpp"

#include <dlfcn.h>
#include <link.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdlib>
#include <utility>

#include "kiln/error.hpp"

namespace kiln::detail {

namespace {

std::filesystem::path loaded_file(void* handle) {
  link_map* map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) != 0 || map == nullptr || map->l_name == nullptr) {
    return {};
  }
  std::error_code ec;
  std::filesystem::path file = std::filesystem::canonical(map->l_name, ec);
  return ec ? std::filesystem::path(map->l_name) : file;
}

}  // namespace

DynLib DynLib::open(std::string_view what, std::span<const std::string> candidates,
                    std::string_view fix) {
  // NOTE: a candidate that exists but fails to load (wrong architecture, a missing dependency)
  // is the one error worth showing; "no such file" for every other candidate is noise.
  std::string load_errors;
  for (const std::string& candidate : candidates) {
    // NOTE: RTLD_NODELETE keeps a library mapped until exit, whatever dlclose says: these GPU
    // stacks set up global state that does not survive an unload and a reload (comgr registers
    // its options with LLVM, and loading it again, as hipRTC does to compile, aborts with
    // "Option 'disassemble' registered more than once"), and what they allocate once (NVRTC's
    // exception pool) stays reachable instead of leaking at every unload.
    if (void* handle = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE)) {
      return DynLib(handle, std::string(what), std::string(fix));
    }
    const char* error = dlerror();
    if (error != nullptr &&
        std::string_view(error).find("No such file") == std::string_view::npos) {
      load_errors += "; ";
      load_errors += error;
    }
  }
  throw Error(ErrorCategory::not_found, std::string(what) + " not found (tried " +
                                            fmt::format("{}", fmt::join(candidates, ", ")) +
                                            load_errors + "): " + std::string(fix));
}

DynLib::DynLib(void* handle, std::string what, std::string fix)
    : handle_(handle), what_(std::move(what)), fix_(std::move(fix)), file_(loaded_file(handle)) {}

DynLib::DynLib(DynLib&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)),
      what_(std::move(other.what_)),
      fix_(std::move(other.fix_)),
      file_(std::move(other.file_)) {}

DynLib& DynLib::operator=(DynLib&& other) noexcept {
  if (this != &other) {
    if (handle_ != nullptr) dlclose(handle_);
    handle_ = std::exchange(other.handle_, nullptr);
    what_ = std::move(other.what_);
    fix_ = std::move(other.fix_);
    file_ = std::move(other.file_);
  }
  return *this;
}

DynLib::~DynLib() {
  if (handle_ != nullptr) dlclose(handle_);
}

// NOTE: a moved-from DynLib must not fall through to dlsym(nullptr), which is RTLD_DEFAULT.
void* DynLib::find(const char* name) const noexcept {
  return handle_ != nullptr ? dlsym(handle_, name) : nullptr;
}

void* DynLib::require(const char* name) const {
  if (void* address = find(name)) return address;
  throw Error(ErrorCategory::not_found, std::string(name) + " not found in " + file_.string() +
                                            " (" + what_ +
                                            " is too old or not the real one): " + fix_);
}

std::vector<std::string> library_candidates(std::span<const std::string_view> names,
                                            std::span<const std::filesystem::path> user_dirs,
                                            std::span<const std::filesystem::path> default_dirs) {
  std::vector<std::string> candidates;
  const auto add_in = [&](std::span<const std::filesystem::path> dirs) {
    for (const std::filesystem::path& dir : dirs) {
      if (dir.empty()) continue;
      for (std::string_view name : names) candidates.push_back((dir / name).string());
    }
  };
  add_in(user_dirs);
  for (std::string_view name : names) candidates.emplace_back(name);
  add_in(default_dirs);
  return candidates;
}

std::filesystem::path env_path(const char* name, std::string_view child) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return {};
  return std::filesystem::path(value) / child;
}

}  // namespace kiln::detail
