// SPDX-License-Identifier: Apache-2.0
// Helpers shared by the tests.
#include "support.hpp"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "kiln/runtime.hpp"

namespace kiln::test {

std::optional<std::string> gpu_unavailable_reason() {
  static const std::optional<std::string> reason = []() -> std::optional<std::string> {
    try {
      const RuntimeInfo info = Runtime().info();
      for (const BackendInfo& backend : info.backends) {
        if (backend.name == info.backend && backend.driver_found && !backend.devices.empty()) {
          return std::nullopt;
        }
      }
      std::string why;
      for (const BackendInfo& backend : info.backends) {
        why += backend.name + ": " + (backend.driver_found ? "no device" : backend.driver) + "; ";
      }
      return why.empty() ? std::string("no backend") : why;
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
  }();
  return reason;
}

std::optional<std::string> hiprtc_unavailable_reason() {
  static const std::optional<std::string> reason = []() -> std::optional<std::string> {
    try {
      for (const BackendInfo& backend : Runtime().info().backends) {
        if (backend.name == "hip") {
          if (backend.compiler_found) return std::nullopt;
          return backend.compiler;
        }
      }
      return std::string("kiln has no hip backend");
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
  }();
  return reason;
}

bool env_is(const char* name, std::string_view value) {
  const char* set = std::getenv(name);
  return set != nullptr && value == set;
}

TempDir::TempDir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "kiln-test-XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ec;
  // Tests make directories unwritable on purpose; give write access back before removing.
  for (auto it = std::filesystem::recursive_directory_iterator(path_, ec);
       it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_directory(ec) && !it->is_symlink(ec)) {
      std::filesystem::permissions(it->path(), std::filesystem::perms::owner_all,
                                   std::filesystem::perm_options::add, ec);
    }
  }
  std::filesystem::permissions(path_, std::filesystem::perms::owner_all,
                               std::filesystem::perm_options::add, ec);
  std::filesystem::remove_all(path_, ec);
}

ScopedEnv::ScopedEnv(const char* name, const char* value) : name_(name) {
  if (const char* old = std::getenv(name)) old_ = old;
  if (value) {
    setenv(name, value, 1);
  } else {
    unsetenv(name);
  }
}

ScopedEnv::~ScopedEnv() {
  if (old_) {
    setenv(name_.c_str(), old_->c_str(), 1);
  } else {
    unsetenv(name_.c_str());
  }
}

kiln::Options isolated_options(const std::filesystem::path& cache, std::string target) {
  kiln::Options options;
  options.cache_dir = cache;
  if (!target.empty()) options.target = std::move(target);
  options.kernels_dir = std::filesystem::path(KILN_SOURCE_DIR) / "kernels_src";
  options.cache_ro_dirs = std::vector<std::filesystem::path>{};
  options.jit = kiln::JitMode::on;
  return options;
}

bool contains(std::string_view text, std::string_view part) {
  return text.find(part) != std::string_view::npos;
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void write_file(const std::filesystem::path& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << content;
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

}  // namespace kiln::test
