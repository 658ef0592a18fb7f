// SPDX-License-Identifier: Apache-2.0
// kiln::Error and its categories.
#include "kiln/error.hpp"

#include <utility>

namespace kiln {

std::string_view to_string(ErrorCategory category) noexcept {
  switch (category) {
    case ErrorCategory::invalid_argument: return "invalid argument";
    case ErrorCategory::unsupported: return "unsupported";
    case ErrorCategory::compile: return "compile";
    case ErrorCategory::driver: return "driver";
    case ErrorCategory::cache: return "cache";
    case ErrorCategory::not_found: return "not found";
  }
  return "unknown";
}

Error::Error(ErrorCategory category, const std::string& message)
    : std::runtime_error(message), category_(category) {}

namespace {

std::string describe(const CompileFailure& f) {
  std::string text = "kiln: compiling " + f.spec + " failed (key " + f.key + ")\n";
  text += "options: " + f.options + "\n";
  if (!f.source_path.empty()) text += "generated source: " + f.source_path + "\n";
  text += "compiler log:\n" + f.log;
  return text;
}

}  // namespace

CompileError::CompileError(CompileFailure failure)
    : Error(ErrorCategory::compile, describe(failure)), failure_(std::move(failure)) {}

}  // namespace kiln
