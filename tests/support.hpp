// SPDX-License-Identifier: Apache-2.0
// Helpers shared by the tests: scratch directories, GPU detection, environment overrides.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "kiln/runtime.hpp"

namespace kiln::test {

// Why the [gpu] tests cannot run here, or nullopt when a device is usable.
std::optional<std::string> gpu_unavailable_reason();

// Skips the current test case (with a printed reason) when no GPU is usable.
#define KILN_REQUIRE_GPU()                                            \
  do {                                                                \
    if (auto kiln_reason_ = ::kiln::test::gpu_unavailable_reason()) { \
      WARN("skipped: needs a GPU: " << *kiln_reason_);                \
      return;                                                         \
    }                                                                 \
  } while (false)

// Why the tests that compile for AMD targets cannot run here (no hipRTC), or nullopt when they can.
std::optional<std::string> hiprtc_unavailable_reason();

// Skips the current test case (with a printed reason) where hipRTC is missing: scripts/deps.sh
// installs it only with KILN_WITH_HIP=1. Under KILN_WITH_HIP=1 (CI) a missing hipRTC fails the
// test instead, so that the AMD tests cannot skip unseen where they are meant to run.
#define KILN_REQUIRE_HIPRTC()                                                                     \
  do {                                                                                            \
    if (auto kiln_reason_ = ::kiln::test::hiprtc_unavailable_reason()) {                          \
      if (::kiln::test::env_is("KILN_WITH_HIP", "1")) FAIL("KILN_WITH_HIP=1: " << *kiln_reason_); \
      WARN("skipped: needs hipRTC (KILN_WITH_HIP=1 bash scripts/deps.sh installs it): "           \
           << *kiln_reason_);                                                                     \
      return;                                                                                     \
    }                                                                                             \
  } while (false)

// Whether the environment variable `name` is set to `value`.
bool env_is(const char* name, std::string_view value);

// A fresh directory, removed with everything in it when the object goes.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// Sets an environment variable for the life of the object, then restores it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value);  // value nullptr: unset
  ~ScopedEnv();
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

// Options that isolate a test's runtime from the machine: its own cache (no read-only tiers), the
// source tree's kernels, compiling allowed, and `target` (empty: the device's).
kiln::Options isolated_options(const std::filesystem::path& cache, std::string target = {});

// Whether `part` occurs in `text`, for checking what messages say.
bool contains(std::string_view text, std::string_view part);

std::string read_file(const std::filesystem::path& path);
void write_file(const std::filesystem::path& path, const std::string& content);

}  // namespace kiln::test
