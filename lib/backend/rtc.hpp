// SPDX-License-Identifier: Apache-2.0
// The run-time compile sequence NVRTC and hipRTC share: their C APIs match entry for entry.
#pragma once

#include <cstddef>
#include <span>
#include <string>

#include "backend/backend.hpp"
#include "backend/dynlib.hpp"

namespace kiln::detail {

// Declared here rather than taken from nvrtc.h or hiprtc.h, so kiln builds without either
// toolkit. Both program types are opaque pointers and both result types are int enums whose
// values agree (0 success, 5 invalid option, 6 compilation error).
struct RtcApi {
  using Program = struct RtcProgram*;
  using Result = int;

  std::string prefix;              // "nvrtc" or "hiprtc": every entry point's name starts with it
  std::string code_entry;          // "GetCUBIN", "GetCode"
  std::string intermediate_entry;  // "GetPTX"; empty where there is none
  Result (*create_program)(Program*, const char* source, const char* name, int header_count,
                           const char* const* headers, const char* const* include_names);
  Result (*destroy_program)(Program*);
  Result (*add_name_expression)(Program, const char*);
  Result (*compile_program)(Program, int option_count, const char* const* options);
  Result (*get_program_log_size)(Program, std::size_t*);
  Result (*get_program_log)(Program, char*);
  Result (*get_lowered_name)(Program, const char* name_expression, const char** lowered);
  Result (*get_code_size)(Program, std::size_t*);
  Result (*get_code)(Program, char*);
  Result (*get_intermediate_size)(Program, std::size_t*);
  Result (*get_intermediate)(Program, char*);
  const char* (*get_error_string)(Result);
  Result (*version)(int* major, int* minor);

  // Resolves `<prefix>CreateProgram` and the rest, `<prefix><code_entry>[Size]` for the binary
  // and, unless it is empty, `<prefix><intermediate_entry>[Size]`.
  static RtcApi load(const DynLib& lib, std::string prefix, std::string code_entry,
                     std::string intermediate_entry);
};

// "<prefix> <major>.<minor>", e.g. "nvrtc 13.0".
std::string rtc_identity(const RtcApi& api);

// Compiles `request` with `options` (its canonical options plus any that only locate headers).
// A rejected unit comes back with ok == false and the log; kiln::Error (compile) means the
// compiler itself failed. Fills everything but `usage`.
CompileResult compile_with(const RtcApi& api, const CompileRequest& request,
                           std::span<const std::string> options);

}  // namespace kiln::detail
