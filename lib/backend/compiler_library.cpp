// SPDX-License-Identifier: Apache-2.0
// Opening a run-time compiler's library, counted.
#include "backend/compiler_library.hpp"

#include <atomic>
#include <utility>

namespace kiln::detail {

namespace {

std::atomic<std::uint64_t> opens{0};

}  // namespace

CompilerLibrary compiler_library(Vendor vendor) {
  return vendor == Vendor::amd ? hiprtc_library() : nvrtc_library();
}

OpenedCompiler open_compiler(const CompilerLibrary& library) {
  DynLib lib = DynLib::open(library.what, library.candidates, library.fix);
  opens.fetch_add(1, std::memory_order_relaxed);
  std::filesystem::path file = lib.file();
  return {library.make(std::move(lib)), std::move(file)};
}

std::uint64_t compiler_library_opens() noexcept {
  return opens.load(std::memory_order_relaxed);
}

}  // namespace kiln::detail
