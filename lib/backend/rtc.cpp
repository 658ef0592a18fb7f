// SPDX-License-Identifier: Apache-2.0
// The run-time compile sequence NVRTC and hipRTC share.
#include "backend/rtc.hpp"

#include <utility>
#include <vector>

#include "core/elapsed.hpp"
#include "kiln/error.hpp"

namespace kiln::detail {

namespace {

constexpr RtcApi::Result kSuccess = 0;
constexpr RtcApi::Result kInvalidOption = 5;
constexpr RtcApi::Result kCompilationError = 6;

void check(const RtcApi& api, RtcApi::Result result, std::string_view entry) {
  if (result == kSuccess) return;
  throw Error(ErrorCategory::compile,
              api.prefix + std::string(entry) + " failed with " + api.get_error_string(result) +
                  ": the compiler itself failed, not the kernel; check its installation (" +
                  rtc_identity(api) + ")");
}

// Owns one program, so it is destroyed on every path out of a compile.
class OwnedProgram {
 public:
  OwnedProgram(const RtcApi& api, const CompileRequest& request) : api_(api) {
    std::vector<const char*> contents;
    std::vector<const char*> names;
    for (const Header& header : request.headers) {
      contents.push_back(header.content.c_str());
      names.push_back(header.name.c_str());
    }
    check(api_,
          api_.create_program(&program_, request.source.c_str(), request.name.c_str(),
                              static_cast<int>(request.headers.size()), contents.data(),
                              names.data()),
          "CreateProgram");
  }
  ~OwnedProgram() { api_.destroy_program(&program_); }
  OwnedProgram(const OwnedProgram&) = delete;
  OwnedProgram& operator=(const OwnedProgram&) = delete;

  RtcApi::Program get() const { return program_; }

 private:
  const RtcApi& api_;
  RtcApi::Program program_ = nullptr;
};

template <class Bytes>
Bytes fetch(const RtcApi& api, RtcApi::Program program,
            RtcApi::Result (*get_size)(RtcApi::Program, std::size_t*),
            RtcApi::Result (*get)(RtcApi::Program, char*), std::string_view entry) {
  std::size_t size = 0;
  check(api, get_size(program, &size), std::string(entry) + "Size");
  Bytes bytes(size, typename Bytes::value_type{});
  if (size > 0) check(api, get(program, reinterpret_cast<char*>(bytes.data())), entry);
  return bytes;
}

// Logs and PTX come back with their terminating NUL counted in the size.
std::string fetch_text(const RtcApi& api, RtcApi::Program program,
                       RtcApi::Result (*get_size)(RtcApi::Program, std::size_t*),
                       RtcApi::Result (*get)(RtcApi::Program, char*), std::string_view entry) {
  std::string text = fetch<std::string>(api, program, get_size, get, entry);
  while (!text.empty() && text.back() == '\0') text.pop_back();
  return text;
}

}  // namespace

RtcApi RtcApi::load(const DynLib& lib, std::string prefix, std::string code_entry,
                    std::string intermediate_entry) {
  RtcApi api{};
  api.prefix = std::move(prefix);
  api.code_entry = std::move(code_entry);
  api.intermediate_entry = std::move(intermediate_entry);
  const auto resolve = [&](auto& slot, const std::string& entry) {
    lib.bind(slot, (api.prefix + entry).c_str());
  };
  resolve(api.create_program, "CreateProgram");
  resolve(api.destroy_program, "DestroyProgram");
  resolve(api.add_name_expression, "AddNameExpression");
  resolve(api.compile_program, "CompileProgram");
  resolve(api.get_program_log_size, "GetProgramLogSize");
  resolve(api.get_program_log, "GetProgramLog");
  resolve(api.get_lowered_name, "GetLoweredName");
  resolve(api.get_code_size, api.code_entry + "Size");
  resolve(api.get_code, api.code_entry);
  if (!api.intermediate_entry.empty()) {
    resolve(api.get_intermediate_size, api.intermediate_entry + "Size");
    resolve(api.get_intermediate, api.intermediate_entry);
  }
  resolve(api.get_error_string, "GetErrorString");
  resolve(api.version, "Version");
  return api;
}

std::string rtc_identity(const RtcApi& api) {
  int major = 0;
  int minor = 0;
  if (api.version(&major, &minor) != kSuccess) major = minor = -1;
  return api.prefix + " " + std::to_string(major) + "." + std::to_string(minor);
}

CompileResult compile_with(const RtcApi& api, const CompileRequest& request,
                           std::span<const std::string> options) {
  const auto start = Clock::now();
  CompileResult result;
  OwnedProgram program(api, request);
  if (!request.name_expression.empty()) {
    check(api, api.add_name_expression(program.get(), request.name_expression.c_str()),
          "AddNameExpression");
  }

  std::vector<const char*> option_pointers;
  for (const std::string& option : options) option_pointers.push_back(option.c_str());
  const RtcApi::Result compiled = api.compile_program(
      program.get(), static_cast<int>(option_pointers.size()), option_pointers.data());
  // NOTE: a bad option is reported like a bad kernel: the log says which, and the caller's
  // CompileError then carries both the log and the options.
  if (compiled != kCompilationError && compiled != kInvalidOption) {
    check(api, compiled, "CompileProgram");
  }
  result.ok = compiled == kSuccess;
  result.log = fetch_text(api, program.get(), api.get_program_log_size, api.get_program_log,
                          "GetProgramLog");

  if (result.ok) {
    if (!request.name_expression.empty()) {
      const char* lowered = nullptr;
      check(api, api.get_lowered_name(program.get(), request.name_expression.c_str(), &lowered),
            "GetLoweredName");
      if (lowered == nullptr) {
        throw Error(ErrorCategory::compile, api.prefix + "GetLoweredName gave no name for " +
                                                request.name_expression + " (" + rtc_identity(api) +
                                                ")");
      }
      result.lowered_name = lowered;
    }
    result.binary = fetch<std::vector<std::byte>>(api, program.get(), api.get_code_size,
                                                  api.get_code, api.code_entry);
    if (api.get_intermediate != nullptr) {
      result.intermediate = fetch_text(api, program.get(), api.get_intermediate_size,
                                       api.get_intermediate, api.intermediate_entry);
    }
  }
  result.ms = ms_since(start);
  return result;
}

}  // namespace kiln::detail
