// SPDX-License-Identifier: Apache-2.0
// The HIP module API, opened with dlopen: devices, code object loading and kernel launches.
// NOTE: no AMD GPU was at hand when this was written; it is compile-tested only.
#include <array>
#include <cstring>
#include <memory>
#include <optional>
#include <utility>

#include "backend/backend.hpp"
#include "backend/dynlib.hpp"
#include "backend/rocm.hpp"
#include "kiln/error.hpp"

namespace kiln::detail {

namespace {

// Declared here rather than taken from hip_runtime_api.h, so kiln builds without ROCm.
using hipError_t = int;
using hipModule_t = struct ihipModule_t*;
using hipFunction_t = struct ihipModuleSymbol_t*;
using hipStream_t = struct ihipStream_t*;

constexpr hipError_t hipSuccess = 0;
constexpr hipError_t hipErrorNoDevice = 100;
// hipDeviceAttribute_t as ROCm 5 and 6 number it.
constexpr int hipDeviceAttributeMaxThreadsPerBlock = 56;
constexpr int hipDeviceAttributeMultiprocessorCount = 63;
constexpr int hipDeviceAttributeMaxSharedMemoryPerBlock = 74;

// hipDeviceProp_t as ROCm 5 lays it out, which ROCm 6 keeps behind the unversioned
// hipGetDeviceProperties symbol. Only gcnArchName ("gfx90a:sramecc+:xnack-") is read, from a
// buffer far larger than any version of the struct, and only if it looks like a gfx name.
constexpr std::size_t kGcnArchNameOffset = 396;
constexpr std::size_t kGcnArchNameSize = 256;
constexpr std::size_t kPropertiesBufferSize = 8192;

struct HipApi {
  explicit HipApi(DynLib library) : lib(std::move(library)) {
    lib.bind(hipInit, "hipInit");
    lib.bind(hipDriverGetVersion, "hipDriverGetVersion");
    lib.bind(hipGetDeviceCount, "hipGetDeviceCount");
    lib.bind(hipDeviceGetName, "hipDeviceGetName");
    lib.bind(hipDeviceTotalMem, "hipDeviceTotalMem");
    lib.bind(hipDeviceGetAttribute, "hipDeviceGetAttribute");
    lib.bind_optional(hipGetDeviceProperties, "hipGetDeviceProperties");
    lib.bind(hipGetDevice, "hipGetDevice");
    lib.bind(hipSetDevice, "hipSetDevice");
    lib.bind(hipModuleLoadData, "hipModuleLoadData");
    lib.bind(hipModuleUnload, "hipModuleUnload");
    lib.bind(hipModuleGetFunction, "hipModuleGetFunction");
    lib.bind(hipModuleLaunchKernel, "hipModuleLaunchKernel");
    lib.bind_optional(hipMallocAsync, "hipMallocAsync");  // ROCm 5.2
    lib.bind_optional(hipFreeAsync, "hipFreeAsync");
    lib.bind(hipFree, "hipFree");
    lib.bind(hipMemsetAsync, "hipMemsetAsync");
    lib.bind(hipMemcpyDtoHAsync, "hipMemcpyDtoHAsync");
    lib.bind_optional(hipStreamIsCapturing, "hipStreamIsCapturing");  // no graphs without it
    lib.bind(hipStreamSynchronize, "hipStreamSynchronize");
    lib.bind(hipGetErrorName, "hipGetErrorName");
    lib.bind(hipGetErrorString, "hipGetErrorString");
  }

  DynLib lib;
  hipError_t (*hipInit)(unsigned flags) = nullptr;
  hipError_t (*hipDriverGetVersion)(int*) = nullptr;
  hipError_t (*hipGetDeviceCount)(int*) = nullptr;
  hipError_t (*hipDeviceGetName)(char*, int, int) = nullptr;
  hipError_t (*hipDeviceTotalMem)(std::size_t*, int) = nullptr;
  hipError_t (*hipDeviceGetAttribute)(int*, int, int) = nullptr;
  hipError_t (*hipGetDeviceProperties)(void*, int) = nullptr;  // optional: see gfx_target()
  hipError_t (*hipGetDevice)(int*) = nullptr;
  hipError_t (*hipSetDevice)(int) = nullptr;
  hipError_t (*hipModuleLoadData)(hipModule_t*, const void*) = nullptr;
  hipError_t (*hipModuleUnload)(hipModule_t) = nullptr;
  hipError_t (*hipModuleGetFunction)(hipFunction_t*, hipModule_t, const char*) = nullptr;
  hipError_t (*hipModuleLaunchKernel)(hipFunction_t, unsigned, unsigned, unsigned, unsigned,
                                      unsigned, unsigned, unsigned shared_bytes, hipStream_t,
                                      void** params, void** extra) = nullptr;
  hipError_t (*hipMallocAsync)(void**, std::size_t, hipStream_t) = nullptr;
  hipError_t (*hipFreeAsync)(void*, hipStream_t) = nullptr;
  hipError_t (*hipFree)(void*) = nullptr;
  hipError_t (*hipMemsetAsync)(void*, int, std::size_t, hipStream_t) = nullptr;
  hipError_t (*hipMemcpyDtoHAsync)(void*, void*, std::size_t, hipStream_t) = nullptr;
  hipError_t (*hipStreamIsCapturing)(hipStream_t, int* status) = nullptr;
  hipError_t (*hipStreamSynchronize)(hipStream_t) = nullptr;
  const char* (*hipGetErrorName)(hipError_t) = nullptr;
  const char* (*hipGetErrorString)(hipError_t) = nullptr;

  // Throws kiln::Error (driver) naming `call`, the error and, when given, what it was doing.
  void check(hipError_t result, std::string_view call, std::string_view doing = {}) const {
    if (result == hipSuccess) return;
    std::string message = std::string(call) + " failed with " + hipGetErrorName(result) + " (" +
                          hipGetErrorString(result) + ")";
    if (!doing.empty()) message += " " + std::string(doing);
    throw Error(ErrorCategory::driver, message);
  }

  // hipModuleLoadData and launches act on the calling thread's current device.
  void use_device(int ordinal) const {
    int current = -1;
    check(hipGetDevice(&current), "hipGetDevice");
    if (current != ordinal) check(hipSetDevice(ordinal), "hipSetDevice");
  }

  // Empty when the runtime does not say, so the caller must name a target itself.
  std::string gfx_target(int ordinal) const {
    if (hipGetDeviceProperties == nullptr) return {};
    auto properties = std::make_unique<char[]>(kPropertiesBufferSize);
    if (hipGetDeviceProperties(properties.get(), ordinal) != hipSuccess) return {};
    const char* arch = properties.get() + kGcnArchNameOffset;
    std::string_view name(arch, strnlen(arch, kGcnArchNameSize));
    name = name.substr(0, name.find(':'));  // drop target features: sramecc+, xnack-
    return is_gfx_target(name) ? std::string(name) : std::string();
  }
};

// NOTE: unlike CUDA, AMD GPUs need no opt-in for large dynamic shared memory (LDS), and
// hipFuncSetAttribute takes a host stub rather than a module function; a launch above the
// device's LDS limit fails in hipModuleLaunchKernel and is reported from there.
class HipFunction final : public Function {
 public:
  HipFunction(std::shared_ptr<const HipApi> api, int ordinal)
      : api_(std::move(api)), ordinal_(ordinal) {}

  // NOTE: errors are ignored here: at process exit the runtime may already have shut down.
  ~HipFunction() override {
    if (module_ != nullptr) api_->hipModuleUnload(module_);
  }

  HipFunction(const HipFunction&) = delete;
  HipFunction& operator=(const HipFunction&) = delete;

  void load(std::span<const std::byte> binary, const std::string& lowered_name) {
    const std::string doing = "loading " + lowered_name + " on HIP device " +
                              std::to_string(ordinal_) + " (a bad binary or a wrong target)";
    api_->use_device(ordinal_);
    api_->check(api_->hipModuleLoadData(&module_, binary.data()), "hipModuleLoadData", doing);
    api_->check(api_->hipModuleGetFunction(&function_, module_, lowered_name.c_str()),
                "hipModuleGetFunction", doing);
  }

  void launch(const LaunchConfig& config, const void* params) override {
    api_->use_device(ordinal_);
    std::array<void*, 1> args = {const_cast<void*>(params)};
    api_->check(api_->hipModuleLaunchKernel(
                    function_, config.grid.x, config.grid.y, config.grid.z, config.block.x,
                    config.block.y, config.block.z, config.shared_bytes,
                    static_cast<hipStream_t>(config.stream), args.data(), nullptr),
                "hipModuleLaunchKernel");
  }

 private:
  std::shared_ptr<const HipApi> api_;
  int ordinal_;
  hipModule_t module_ = nullptr;
  hipFunction_t function_ = nullptr;
};

class HipDriver final : public Driver {
 public:
  explicit HipDriver(std::shared_ptr<const HipApi> api) : api_(std::move(api)) {
    // NOTE: with no GPU, hipInit fails with an error that varies by release (ROCm 5.2 says
    // hipErrorInvalidDevice); hipGetDeviceCount says hipErrorNoDevice in every one.
    const hipError_t init = api_->hipInit(0);
    const hipError_t counted = api_->hipGetDeviceCount(&count_);
    if (counted == hipErrorNoDevice) {
      count_ = 0;
      return;
    }
    api_->check(init, "hipInit");
    api_->check(counted, "hipGetDeviceCount");
  }

  Vendor vendor() const override { return Vendor::amd; }

  std::string version() const override {
    int encoded = 0;
    api_->check(api_->hipDriverGetVersion(&encoded), "hipDriverGetVersion");
    return "hip driver " + hip_version_text(encoded);
  }

  int device_count() const override { return count_; }

  DeviceInfo device(int ordinal) const override {
    check_ordinal(ordinal);
    DeviceInfo info;
    info.ordinal = ordinal;
    std::array<char, 256> name{};
    api_->check(api_->hipDeviceGetName(name.data(), static_cast<int>(name.size()), ordinal),
                "hipDeviceGetName");
    info.name = name.data();
    std::size_t memory = 0;
    api_->check(api_->hipDeviceTotalMem(&memory, ordinal), "hipDeviceTotalMem");
    info.memory_bytes = memory;
    api_->check(api_->hipDeviceGetAttribute(&info.multiprocessors,
                                            hipDeviceAttributeMultiprocessorCount, ordinal),
                "hipDeviceGetAttribute(MultiprocessorCount)");
    // NOTE: a runtime that does not know an attribute leaves its limit unknown (0), unchecked.
    // AMD GPUs need no opt-in for their whole LDS, so the plain maximum is the one to check.
    api_->hipDeviceGetAttribute(&info.max_threads_per_block, hipDeviceAttributeMaxThreadsPerBlock,
                                ordinal);
    api_->hipDeviceGetAttribute(&info.max_shared_bytes_per_block,
                                hipDeviceAttributeMaxSharedMemoryPerBlock, ordinal);
    info.target = api_->gfx_target(ordinal);
    return info;
  }

  std::unique_ptr<Function> load(int ordinal, std::span<const std::byte> binary,
                                 const std::string& lowered_name) override {
    check_ordinal(ordinal);
    auto function = std::make_unique<HipFunction>(api_, ordinal);
    function->load(binary, lowered_name);
    return function;
  }

  void* allocate_async(int ordinal, std::size_t bytes, void* stream) override {
    api_->lib.require_bound(api_->hipMallocAsync, "hipMallocAsync");
    check_ordinal(ordinal);
    api_->use_device(ordinal);
    void* pointer = nullptr;
    api_->check(
        api_->hipMallocAsync(&pointer, bytes, static_cast<hipStream_t>(stream)), "hipMallocAsync",
        "allocating " + std::to_string(bytes) + " bytes on HIP device " + std::to_string(ordinal));
    return pointer;
  }

  void free_async(int ordinal, void* pointer, void* stream) override {
    api_->lib.require_bound(api_->hipFreeAsync, "hipFreeAsync");
    check_ordinal(ordinal);
    api_->use_device(ordinal);
    api_->check(api_->hipFreeAsync(pointer, static_cast<hipStream_t>(stream)), "hipFreeAsync");
  }

  void free(int ordinal, void* pointer) override {
    check_ordinal(ordinal);
    api_->use_device(ordinal);
    api_->check(api_->hipFree(pointer), "hipFree");
  }

  void zero_async(int ordinal, void* pointer, std::size_t bytes, void* stream) override {
    check_ordinal(ordinal);
    api_->use_device(ordinal);
    api_->check(api_->hipMemsetAsync(pointer, 0, bytes, static_cast<hipStream_t>(stream)),
                "hipMemsetAsync");
  }

  bool is_capturing(int ordinal, void* stream) override {
    if (api_->hipStreamIsCapturing == nullptr) return false;
    check_ordinal(ordinal);
    api_->use_device(ordinal);
    int status = 0;  // hipStreamCaptureStatusNone
    api_->check(api_->hipStreamIsCapturing(static_cast<hipStream_t>(stream), &status),
                "hipStreamIsCapturing");
    return status != 0;
  }

  std::optional<std::uint64_t> stream_id(int, void*) override { return std::nullopt; }

  void copy_to_host(int ordinal, void* host, const void* device_pointer, std::size_t bytes,
                    void* stream) override {
    check_ordinal(ordinal);
    api_->use_device(ordinal);
    // NOTE: hipMemcpyDtoHAsync takes a non-const source (hipDeviceptr_t is void*).
    void* source = const_cast<void*>(device_pointer);
    const auto hip_stream = static_cast<hipStream_t>(stream);
    api_->check(api_->hipMemcpyDtoHAsync(host, source, bytes, hip_stream), "hipMemcpyDtoHAsync",
                copying_to_host("HIP", ordinal, bytes));
    api_->check(api_->hipStreamSynchronize(hip_stream), "hipStreamSynchronize");
  }

 private:
  void check_ordinal(int ordinal) const {
    if (ordinal < 0 || ordinal >= count_) {
      throw Error(ErrorCategory::not_found,
                  "HIP device " + std::to_string(ordinal) + " not found (" +
                      std::to_string(count_) + " visible): choose an ordinal below " +
                      std::to_string(count_) + " or check HIP_VISIBLE_DEVICES");
    }
  }

  std::shared_ptr<const HipApi> api_;
  int count_ = 0;
};

}  // namespace

std::unique_ptr<Driver> open_hip_driver() {
  constexpr std::array<std::string_view, 4> names = {"libamdhip64.so.7", "libamdhip64.so.6",
                                                     "libamdhip64.so.5", "libamdhip64.so"};
  auto api = std::make_shared<const HipApi>(
      DynLib::open("the HIP runtime", rocm_library_candidates(names), kRocmFix));
  return std::make_unique<HipDriver>(std::move(api));
}

}  // namespace kiln::detail
