// The HIP compiler: hipRTC, opened with dlopen, building code objects for one gfx target.
#include <array>
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

class Hiprtc final : public Compiler {
 public:
  explicit Hiprtc(DynLib lib)
      : lib_(std::move(lib)),
        api_(RtcApi::load(lib_, "hiprtc", "GetCode", "")),
        identity_(identity_of(lib_, api_)) {}

  std::string_view vendor() const override { return "hip"; }
  std::string identity() const override { return identity_; }

  std::vector<std::string> canonical_options(std::string_view target) const override {
    return {"--offload-arch=" + std::string(target), "-O3", "-std=c++17"};
  }

  // NOTE: hipRTC cannot list its targets, so any well-formed gfx name is let through; one the
  // compiler does not know fails in compile() with a log that says so.
  bool accepts(std::string_view target) const override { return is_gfx_target(target); }

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
};

}  // namespace

CompilerLibrary hiprtc_library() {
  // ROCm 6 moved hipRTC out of libamdhip64 into libhiprtc.
  constexpr std::array<std::string_view, 5> names = {
      "libhiprtc.so.7", "libhiprtc.so.6", "libhiprtc.so", "libamdhip64.so.5", "libamdhip64.so"};
  return {"hip", "hipRTC", rocm_library_candidates(names), std::string(kRocmFix),
          [](DynLib lib) -> std::unique_ptr<Compiler> {
            return std::make_unique<Hiprtc>(std::move(lib));
          }};
}

std::unique_ptr<Compiler> open_hiprtc() {
  return open_compiler(hiprtc_library()).compiler;
}

}  // namespace kiln::detail
