// SPDX-License-Identifier: Apache-2.0
// The HIP compiler: hipRTC, opened with dlopen, building code objects for one gfx target.
#include <algorithm>
#include <array>
#include <filesystem>
#include <mutex>
#include <utility>

#include "backend/backend.hpp"
#include "backend/compiler_library.hpp"
#include "backend/dynlib.hpp"
#include "backend/resource_usage.hpp"
#include "backend/rocm.hpp"
#include "backend/rtc.hpp"

namespace kiln::detail {

namespace {

// The targets the code object manager beside `hiprtc_file` builds for. hipRTC hands every
// compile to comgr, and comgr of ROCm 5.2 frees a bad pointer (SIGABRT, "munmap_chunk():
// invalid pointer") when asked for an ISA it lacks, such as gfx942 or gfx1100: a target must be
// refused before hipRTC sees it. comgr names ISAs "amdgcn-amd-amdhsa--gfx90a", some with
// feature suffixes (":xnack-"), which kiln's targets do not take.
std::vector<Target> comgr_targets(const std::filesystem::path& hiprtc_file) {
  // NOTE: the one beside hipRTC first, which is the one it loads (ROCm 6 links it, with its
  // directory as RUNPATH); then the loader's path, where ROCm 5's HIP dlopens it from.
  constexpr std::array<std::string_view, 2> names = {"libamd_comgr.so.3", "libamd_comgr.so.2"};
  const std::array<std::filesystem::path, 1> beside = {hiprtc_file.parent_path()};
  const DynLib comgr =
      DynLib::open("comgr (hipRTC's code object manager)", library_candidates(names, beside, {}),
                   "install ROCm's libamd_comgr beside hipRTC, which cannot compile without it");
  using Count = int (*)(std::size_t*);
  using Name = int (*)(std::size_t, const char**);
  const auto isa_count = comgr.symbol<Count>("amd_comgr_get_isa_count");
  const auto isa_name = comgr.symbol<Name>("amd_comgr_get_isa_name");
  std::size_t count = 0;
  std::vector<Target> targets;
  if (isa_count(&count) != 0) return targets;
  for (std::size_t i = 0; i < count; ++i) {
    const char* name = nullptr;
    if (isa_name(i, &name) != 0 || name == nullptr) continue;
    std::string_view isa = name;
    const std::size_t processor = isa.rfind("--");
    if (processor == std::string_view::npos) continue;
    isa.remove_prefix(processor + 2);
    const std::optional<Target> target = Target::parse(isa.substr(0, isa.find(':')));
    if (target && target->amd() &&
        std::find(targets.begin(), targets.end(), *target) == targets.end()) {
      targets.push_back(*target);
    }
  }
  return targets;
}

class Hiprtc final : public Compiler {
 public:
  explicit Hiprtc(DynLib lib)
      : lib_(std::move(lib)),
        api_(RtcApi::load(lib_, "hiprtc", "GetCode", "")),
        identity_(identity_of(lib_, api_)),
        targets_(comgr_targets(lib_.file())) {}

  Vendor vendor() const override { return Vendor::amd; }
  std::string identity() const override { return identity_; }

  std::vector<std::string> canonical_options(const Target& target) const override {
    return {"--offload-arch=" + target.name(), "-O3", "-std=c++17"};
  }

  bool accepts(const Target& target) const override {
    return std::find(targets_.begin(), targets_.end(), target) != targets_.end();
  }
  std::vector<Target> targets() const override { return targets_; }

  CompileResult compile(const CompileRequest& request) const override {
    std::vector<std::string> options = request.options;
    // NOTE: compilers that do not know this remark warn and carry on; usage then stays -1.
    options.push_back("-Rpass-analysis=kernel-resource-usage");
    // NOTE: hipRTC of ROCm 5.2 crashes when two threads compile at once (seen in
    // hiprtcAddNameExpression racing LLVM's target initialisation), so compiles take turns.
    static std::mutex one_at_a_time;
    std::unique_lock lock(one_at_a_time);
    CompileResult result = compile_with(api_, request, options);
    lock.unlock();
    if (result.ok) result.usage = parse_amdgpu_usage(result.log, result.lowered_name);
    return result;
  }

 private:
  // NOTE: hipRTC 5.x reports version 9.0 whatever the release, so the HIP runtime's version is
  // added where the same library has it: a new ROCm must not reuse the old one's cache entries.
  static std::string identity_of(const DynLib& lib, const RtcApi& api) {
    std::string identity = rtc_identity(api);
    using RuntimeVersion = int (*)(int*);
    int version = 0;
    if (const auto runtime_version =
            reinterpret_cast<RuntimeVersion>(lib.find("hipRuntimeGetVersion"));
        runtime_version != nullptr && runtime_version(&version) == 0) {
      identity += " (hip " + hip_version_text(version) + ")";
    }
    return identity;
  }

  DynLib lib_;
  RtcApi api_;
  std::string identity_;
  std::vector<Target> targets_;
};

}  // namespace

CompilerLibrary hiprtc_library() {
  // ROCm 6 moved hipRTC out of libamdhip64 into libhiprtc.
  constexpr std::array<std::string_view, 5> names = {
      "libhiprtc.so.7", "libhiprtc.so.6", "libhiprtc.so", "libamdhip64.so.5", "libamdhip64.so"};
  return {Vendor::amd, "hipRTC", rocm_library_candidates(names), std::string(kRocmFix),
          [](DynLib lib) -> std::unique_ptr<Compiler> {
            return std::make_unique<Hiprtc>(std::move(lib));
          }};
}

std::unique_ptr<Compiler> open_hiprtc() {
  return open_compiler(hiprtc_library()).compiler;
}

}  // namespace kiln::detail
