// SPDX-License-Identifier: Apache-2.0
// kiln::Error: the one exception type the library throws, with a category.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace kiln {

enum class ErrorCategory {
  invalid_argument,  // the caller passed a value kiln cannot accept
  unsupported,       // valid, but this build, backend or device cannot do it
  compile,           // the JIT compiler rejected a generated unit
  driver,            // the CUDA driver or HIP runtime failed
  cache,             // the disk cache could not be used as asked
  not_found,         // a library, file, kernel source or device is missing
};

std::string_view to_string(ErrorCategory category) noexcept;

class Error : public std::runtime_error {
 public:
  Error(ErrorCategory category, const std::string& message);
  ErrorCategory category() const noexcept { return category_; }

 private:
  ErrorCategory category_;
};

// A compile failure keeps everything needed to reproduce it outside kiln.
struct CompileFailure {
  std::string log;          // the compiler's full log
  std::string spec;         // canonical form of the KernelSpec
  std::string options;      // the compiler options, space separated
  std::string key;          // the cache key, 32 hex digits
  std::string source_path;  // where the generated unit was dumped (empty if it could not be)
};

class CompileError : public Error {
 public:
  explicit CompileError(CompileFailure failure);
  const CompileFailure& failure() const noexcept { return failure_; }

 private:
  CompileFailure failure_;
};

}  // namespace kiln
