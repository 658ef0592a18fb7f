// SPDX-License-Identifier: Apache-2.0
// The CUDA compiler: NVRTC, opened with dlopen, building cubins for one sm_ target at a time.
#include <algorithm>
#include <array>
#include <filesystem>
#include <utility>

#include "backend/backend.hpp"
#include "backend/compiler_library.hpp"
#include "backend/dynlib.hpp"
#include "backend/resource_usage.hpp"
#include "backend/rtc.hpp"

namespace kiln::detail {

namespace {

// Where cuda_fp16.h and friends live, so kernels can include them; empty when nowhere.
std::filesystem::path find_toolkit_include(const std::filesystem::path& nvrtc_file) {
  const std::array<std::filesystem::path, 4> dirs = {
      env_path("CUDA_HOME", "include"),
      env_path("CUDA_PATH", "include"),
      nvrtc_file.empty() ? std::filesystem::path() : nvrtc_file.parent_path() / "../include",
      "/usr/local/cuda/include",
  };
  for (const std::filesystem::path& dir : dirs) {
    std::error_code ec;
    if (!dir.empty() && std::filesystem::exists(dir / "cuda_fp16.h", ec)) {
      return dir.lexically_normal();
    }
  }
  return {};
}

class Nvrtc final : public Compiler {
 public:
  explicit Nvrtc(DynLib lib)
      : lib_(std::move(lib)),
        api_(RtcApi::load(lib_, "nvrtc", "GetCUBIN", "GetPTX")),
        identity_(rtc_identity(api_)),
        targets_(supported_targets()),
        include_dir_(find_toolkit_include(lib_.file())) {}

  Vendor vendor() const override { return Vendor::nvidia; }
  std::string identity() const override { return identity_; }

  std::vector<std::string> canonical_options(const Target& target) const override {
    return {"--gpu-architecture=" + target.name(), "-std=c++17"};
  }

  bool accepts(const Target& target) const override {
    return std::find(targets_.begin(), targets_.end(), target) != targets_.end();
  }
  std::vector<Target> targets() const override { return targets_; }

  CompileResult compile(const CompileRequest& request) const override {
    std::vector<std::string> options = request.options;
    // NOTE: when no toolkit headers are found the compile still runs: kernels that include
    // none succeed, and the others fail with a log naming the missing header.
    if (!include_dir_.empty()) options.push_back("-I" + include_dir_.string());
    options.push_back("-Xptxas=-v");
    CompileResult result = compile_with(api_, request, options);
    if (result.ok) result.usage = parse_ptxas_usage(result.log, result.lowered_name);
    return result;
  }

 private:
  // sm_<arch> for every arch NVRTC lists, and sm_<arch>a, the arch-specific one, from Hopper on.
  std::vector<Target> supported_targets() const {
    using Query = int (*)(int*);
    const auto count_archs = lib_.symbol<Query>("nvrtcGetNumSupportedArchs");
    const auto list_archs = lib_.symbol<Query>("nvrtcGetSupportedArchs");
    int count = 0;
    std::vector<int> archs;
    if (count_archs(&count) == 0 && count > 0) {
      archs.resize(static_cast<std::size_t>(count));
      if (list_archs(archs.data()) != 0) archs.clear();
    }
    std::vector<Target> targets;
    for (const int arch : archs) {
      targets.emplace_back("sm_" + std::to_string(arch));
      if (arch >= 90) targets.emplace_back("sm_" + std::to_string(arch) + "a");
    }
    return targets;
  }

  DynLib lib_;
  RtcApi api_;
  std::string identity_;
  std::vector<Target> targets_;
  std::filesystem::path include_dir_;
};

}  // namespace

CompilerLibrary nvrtc_library() {
  constexpr std::array<std::string_view, 3> names = {"libnvrtc.so.13", "libnvrtc.so.12",
                                                     "libnvrtc.so"};
  const std::array<std::filesystem::path, 2> user_dirs = {env_path("CUDA_HOME", "lib64"),
                                                          env_path("CUDA_PATH", "lib64")};
  const std::array<std::filesystem::path, 1> default_dirs = {"/usr/local/cuda/lib64"};
  return {Vendor::nvidia, "NVRTC", library_candidates(names, user_dirs, default_dirs),
          "install the CUDA toolkit's NVRTC (libnvrtc) or set CUDA_HOME to the toolkit's directory",
          [](DynLib lib) -> std::unique_ptr<Compiler> {
            return std::make_unique<Nvrtc>(std::move(lib));
          }};
}

std::unique_ptr<Compiler> open_nvrtc() {
  return open_compiler(nvrtc_library()).compiler;
}

}  // namespace kiln::detail
