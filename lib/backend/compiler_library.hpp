// SPDX-License-Identifier: Apache-2.0
// CompilerLibrary: the shared library a run-time compiler lives in, where it is looked for, and
// opening it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "backend/backend.hpp"
#include "backend/dynlib.hpp"

namespace kiln::detail {

struct CompilerLibrary {
  Vendor vendor = Vendor::nvidia;
  std::string what;                     // "NVRTC", "hipRTC": named in errors
  std::vector<std::string> candidates;  // tried in this order; they decide which file loads
  std::string fix;                      // how to point kiln at the library when none loads
  std::unique_ptr<Compiler> (*make)(DynLib lib) = nullptr;
};

// Where each compiler is looked for, as the environment (CUDA_HOME, CUDA_PATH, ROCM_PATH) says
// now.
CompilerLibrary nvrtc_library();
CompilerLibrary hiprtc_library();
CompilerLibrary compiler_library(Vendor vendor);

struct OpenedCompiler {
  std::unique_ptr<Compiler> compiler;
  std::filesystem::path file;  // the file the loader opened, links resolved
};

// Loads the first candidate that loads (DynLib::open's errors) and builds the compiler over it.
OpenedCompiler open_compiler(const CompilerLibrary& library);

// How many compiler libraries this process has loaded: one costs 7-16 ms for NVRTC, so tests
// check that the compiler fact memo (lib/backend/lazy_compiler.hpp) saves it.
std::uint64_t compiler_library_opens() noexcept;

}  // namespace kiln::detail
