// SPDX-License-Identifier: Apache-2.0
// The CUDA driver API, opened with dlopen: devices, module loading and kernel launches.
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "backend/backend.hpp"
#include "backend/dynlib.hpp"
#include "core/log.hpp"
#include "kiln/error.hpp"

namespace kiln::detail {

namespace {

// Declared here rather than taken from cuda.h, so kiln builds without the toolkit. Where the ABI
// has versions these are the _v2 entry points cuda.h maps the plain names to.
using CUresult = int;
using CUdevice = int;
using CUcontext = struct CUctx_st*;
using CUmodule = struct CUmod_st*;
using CUfunction = struct CUfunc_st*;
using CUstream = struct CUstream_st*;
using CUdeviceptr = unsigned long long;

constexpr CUresult CUDA_SUCCESS = 0;
constexpr CUresult CUDA_ERROR_STUB_LIBRARY = 34;
constexpr CUresult CUDA_ERROR_NO_DEVICE = 100;
constexpr int CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 1;
constexpr int CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16;
constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75;
constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76;
constexpr int CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97;
constexpr int CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES = 1;
constexpr int CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8;
constexpr int CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6;
constexpr int CU_STREAM_CAPTURE_STATUS_NONE = 0;
// cuTensorMapEncodeTiled's enumerations, as cuda.h numbers them.
constexpr int CU_TENSOR_MAP_DATA_TYPE_UINT8 = 0;
constexpr int CU_TENSOR_MAP_DATA_TYPE_FLOAT16 = 6;
constexpr int CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 = 9;
constexpr int CU_TENSOR_MAP_INTERLEAVE_NONE = 0;
constexpr int CU_TENSOR_MAP_SWIZZLE_64B = 2;
constexpr int CU_TENSOR_MAP_SWIZZLE_128B = 3;
constexpr int CU_TENSOR_MAP_L2_PROMOTION_L2_256B = 3;
constexpr int CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE = 0;

// cuLaunchKernelEx's configuration, laid out as cuda.h has it: a 64-byte, 8-aligned value union
// after a 4-byte id and 4 bytes of padding. Only the attribute kiln sets is named.
union CUlaunchAttributeValue {
  alignas(8) char pad[64];
  int programmaticStreamSerializationAllowed;
};
struct CUlaunchAttribute {
  int id;
  char pad[4];
  CUlaunchAttributeValue value;
};
static_assert(sizeof(CUlaunchAttributeValue) == 64 && alignof(CUlaunchAttributeValue) == 8);
static_assert(sizeof(CUlaunchAttribute) == 72 && offsetof(CUlaunchAttribute, value) == 8);
struct CUlaunchConfig {
  unsigned gridDimX, gridDimY, gridDimZ;
  unsigned blockDimX, blockDimY, blockDimZ;
  unsigned sharedMemBytes;
  CUstream hStream;
  CUlaunchAttribute* attrs;
  unsigned numAttrs;
};
static_assert(sizeof(CUlaunchConfig) == 56 && offsetof(CUlaunchConfig, hStream) == 32 &&
              offsetof(CUlaunchConfig, attrs) == 40 && offsetof(CUlaunchConfig, numAttrs) == 48);

// Dynamic shared memory a launch may use before the function has to opt in to more.
constexpr std::uint32_t kDefaultSharedLimit = 48 * 1024;

struct CudaApi {
  explicit CudaApi(DynLib library) : lib(std::move(library)) {
    lib.bind(cuInit, "cuInit");
    lib.bind(cuDriverGetVersion, "cuDriverGetVersion");
    lib.bind(cuDeviceGetCount, "cuDeviceGetCount");
    lib.bind(cuDeviceGet, "cuDeviceGet");
    lib.bind(cuDeviceGetName, "cuDeviceGetName");
    lib.bind(cuDeviceTotalMem, "cuDeviceTotalMem_v2");
    lib.bind(cuDeviceGetAttribute, "cuDeviceGetAttribute");
    lib.bind(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    lib.bind(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2");
    lib.bind(cuCtxGetCurrent, "cuCtxGetCurrent");
    lib.bind(cuCtxSetCurrent, "cuCtxSetCurrent");
    lib.bind(cuModuleLoadData, "cuModuleLoadData");
    lib.bind(cuModuleUnload, "cuModuleUnload");
    lib.bind(cuModuleGetFunction, "cuModuleGetFunction");
    lib.bind(cuFuncGetAttribute, "cuFuncGetAttribute");
    lib.bind(cuFuncSetAttribute, "cuFuncSetAttribute");
    lib.bind(cuLaunchKernel, "cuLaunchKernel");
    lib.bind_optional(cuLaunchKernelEx, "cuLaunchKernelEx");  // CUDA 11.8
    lib.bind_optional(cuMemAllocAsync, "cuMemAllocAsync");    // CUDA 11.2
    lib.bind_optional(cuMemFreeAsync, "cuMemFreeAsync");
    lib.bind(cuMemFree, "cuMemFree_v2");
    lib.bind(cuMemsetD8Async, "cuMemsetD8Async");
    lib.bind(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2");
    lib.bind(cuStreamIsCapturing, "cuStreamIsCapturing");
    lib.bind_optional(cuStreamGetId, "cuStreamGetId");  // CUDA 12.0
    lib.bind(cuStreamSynchronize, "cuStreamSynchronize");
    lib.bind_optional(cuTensorMapEncodeTiled, "cuTensorMapEncodeTiled");  // CUDA 12.0
    lib.bind(cuGetErrorName, "cuGetErrorName");
    lib.bind(cuGetErrorString, "cuGetErrorString");
  }

  DynLib lib;
  CUresult (*cuInit)(unsigned flags) = nullptr;
  CUresult (*cuDriverGetVersion)(int*) = nullptr;
  CUresult (*cuDeviceGetCount)(int*) = nullptr;
  CUresult (*cuDeviceGet)(CUdevice*, int) = nullptr;
  CUresult (*cuDeviceGetName)(char*, int, CUdevice) = nullptr;
  CUresult (*cuDeviceTotalMem)(std::size_t*, CUdevice) = nullptr;
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice) = nullptr;
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*cuDevicePrimaryCtxRelease)(CUdevice) = nullptr;
  CUresult (*cuCtxGetCurrent)(CUcontext*) = nullptr;
  CUresult (*cuCtxSetCurrent)(CUcontext) = nullptr;
  CUresult (*cuModuleLoadData)(CUmodule*, const void*) = nullptr;
  CUresult (*cuModuleUnload)(CUmodule) = nullptr;
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*cuFuncGetAttribute)(int*, int, CUfunction) = nullptr;
  CUresult (*cuFuncSetAttribute)(CUfunction, int, int) = nullptr;
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned shared_bytes, CUstream, void** params,
                             void** extra) = nullptr;
  CUresult (*cuLaunchKernelEx)(const CUlaunchConfig*, CUfunction, void** params,
                               void** extra) = nullptr;
  CUresult (*cuMemAllocAsync)(CUdeviceptr*, std::size_t, CUstream) = nullptr;
  CUresult (*cuMemFreeAsync)(CUdeviceptr, CUstream) = nullptr;
  CUresult (*cuMemFree)(CUdeviceptr) = nullptr;
  CUresult (*cuMemsetD8Async)(CUdeviceptr, unsigned char, std::size_t, CUstream) = nullptr;
  CUresult (*cuMemcpyDtoHAsync)(void*, CUdeviceptr, std::size_t, CUstream) = nullptr;
  CUresult (*cuStreamIsCapturing)(CUstream, int* status) = nullptr;
  CUresult (*cuStreamGetId)(CUstream, unsigned long long*) = nullptr;
  CUresult (*cuStreamSynchronize)(CUstream) = nullptr;
  CUresult (*cuTensorMapEncodeTiled)(void* map, int dtype, unsigned rank, void* address,
                                     const std::uint64_t* dims, const std::uint64_t* strides,
                                     const std::uint32_t* box, const std::uint32_t* element_strides,
                                     int interleave, int swizzle, int l2_promotion,
                                     int oob_fill) = nullptr;
  CUresult (*cuGetErrorName)(CUresult, const char**) = nullptr;
  CUresult (*cuGetErrorString)(CUresult, const char**) = nullptr;

  // Throws kiln::Error (driver) naming `call`, the error and, when given, what it was doing.
  void check(CUresult result, std::string_view call, std::string_view doing = {}) const {
    if (result == CUDA_SUCCESS) return;
    std::string message = failure(result, call);
    if (!doing.empty()) message += " " + std::string(doing);
    throw Error(ErrorCategory::driver, message);
  }

  // "<call> failed with <name> (<description>)".
  std::string failure(CUresult result, std::string_view call) const {
    const char* name = "unknown CUresult";
    const char* text = "";
    cuGetErrorName(result, &name);
    cuGetErrorString(result, &text);
    return std::string(call) + " failed with " + name + " (" + text + ")";
  }

  int attribute(int which, CUdevice device) const {
    int value = 0;
    check(cuDeviceGetAttribute(&value, which, device), "cuDeviceGetAttribute");
    return value;
  }

  // Launches and memory calls act on the calling thread's current context.
  void make_current(CUcontext context) const {
    CUcontext current = nullptr;
    check(cuCtxGetCurrent(&current), "cuCtxGetCurrent");
    if (current != context) check(cuCtxSetCurrent(context), "cuCtxSetCurrent");
  }
};

class CudaFunction final : public Function {
 public:
  // Holds the device's primary context for as long as the function lives.
  CudaFunction(std::shared_ptr<const CudaApi> api, CUdevice device)
      : api_(std::move(api)),
        device_(device),
        shared_optin_(
            api_->attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, device)),
        can_overlap_(api_->cuLaunchKernelEx != nullptr &&
                     api_->attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device) >= 9) {
    api_->check(api_->cuDevicePrimaryCtxRetain(&context_, device_), "cuDevicePrimaryCtxRetain");
  }

  // NOTE: errors are ignored here: at process exit the driver may already have shut down. The
  // module is unloaded in its own context, and the thread's context is put back afterwards.
  ~CudaFunction() override {
    CUcontext previous = nullptr;
    if (module_ != nullptr && api_->cuCtxGetCurrent(&previous) == CUDA_SUCCESS &&
        api_->cuCtxSetCurrent(context_) == CUDA_SUCCESS) {
      api_->cuModuleUnload(module_);
      api_->cuCtxSetCurrent(previous);
    }
    api_->cuDevicePrimaryCtxRelease(device_);
  }

  CudaFunction(const CudaFunction&) = delete;
  CudaFunction& operator=(const CudaFunction&) = delete;

  void load(std::span<const std::byte> binary, const std::string& lowered_name) {
    const std::string doing = "loading " + lowered_name + " on CUDA device " +
                              std::to_string(device_) + " (a bad binary or a wrong target)";
    api_->check(api_->cuCtxSetCurrent(context_), "cuCtxSetCurrent", doing);
    api_->check(api_->cuModuleLoadData(&module_, binary.data()), "cuModuleLoadData", doing);
    api_->check(api_->cuModuleGetFunction(&function_, module_, lowered_name.c_str()),
                "cuModuleGetFunction", doing);
  }

  void launch(const LaunchConfig& config, const void* params) override {
    api_->make_current(context_);
    if (config.shared_bytes > shared_limit_.load(std::memory_order_acquire)) {
      raise_shared_limit(config.shared_bytes);
    }
    std::array<void*, 1> args = {const_cast<void*>(params)};
    if (config.overlap_previous && can_overlap_.load(std::memory_order_relaxed)) {
      CUlaunchAttribute overlap{};
      overlap.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
      overlap.value.programmaticStreamSerializationAllowed = 1;
      const CUlaunchConfig ex{.gridDimX = config.grid.x,
                              .gridDimY = config.grid.y,
                              .gridDimZ = config.grid.z,
                              .blockDimX = config.block.x,
                              .blockDimY = config.block.y,
                              .blockDimZ = config.block.z,
                              .sharedMemBytes = config.shared_bytes,
                              .hStream = static_cast<CUstream>(config.stream),
                              .attrs = &overlap,
                              .numAttrs = 1};
      if (api_->cuLaunchKernelEx(&ex, function_, args.data(), nullptr) == CUDA_SUCCESS) return;
      // The overlap only saves time: a driver that refuses it gets plain launches from now on,
      // and a failure that is not about the overlap fails the plain launch too, which reports it.
      can_overlap_.store(false, std::memory_order_relaxed);
      log(LogLevel::debug,
          "cuLaunchKernelEx refused programmatic dependent launch: plain launches");
    }
    api_->check(
        api_->cuLaunchKernel(function_, config.grid.x, config.grid.y, config.grid.z, config.block.x,
                             config.block.y, config.block.z, config.shared_bytes,
                             static_cast<CUstream>(config.stream), args.data(), nullptr),
        "cuLaunchKernel");
  }

 private:
  // NOTE: the lock is taken only on the rare launch that needs more than any before it; it keeps
  // two raises from landing out of order, so the attribute never drops below shared_limit_.
  void raise_shared_limit(std::uint32_t bytes) {
    const std::lock_guard lock(raise_mutex_);
    if (bytes <= shared_limit_.load(std::memory_order_relaxed)) return;
    int static_bytes = 0;
    api_->check(
        api_->cuFuncGetAttribute(&static_bytes, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, function_),
        "cuFuncGetAttribute");
    if (static_cast<std::int64_t>(bytes) + static_bytes > shared_optin_) {
      throw Error(ErrorCategory::invalid_argument,
                  "launch asks for " + std::to_string(bytes) + " bytes of dynamic shared memory" +
                      " on top of " + std::to_string(static_bytes) + " static, above the " +
                      std::to_string(shared_optin_) + " bytes per block CUDA device " +
                      std::to_string(device_) + " allows: choose a smaller tile");
    }
    api_->check(api_->cuFuncSetAttribute(function_, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                         static_cast<int>(bytes)),
                "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
    shared_limit_.store(bytes, std::memory_order_release);
  }

  std::shared_ptr<const CudaApi> api_;
  CUdevice device_;
  int shared_optin_;
  // Programmatic dependent launch: sm_90+, a driver with cuLaunchKernelEx, none refused yet.
  std::atomic<bool> can_overlap_;
  CUcontext context_ = nullptr;
  CUmodule module_ = nullptr;
  CUfunction function_ = nullptr;
  std::atomic<std::uint32_t> shared_limit_{kDefaultSharedLimit};
  std::mutex raise_mutex_;
};

class CudaDriver final : public Driver {
 public:
  explicit CudaDriver(std::shared_ptr<const CudaApi> api) : api_(std::move(api)) {
    const CUresult init = api_->cuInit(0);
    if (init == CUDA_ERROR_NO_DEVICE) return;
    if (init == CUDA_ERROR_STUB_LIBRARY) {
      throw Error(ErrorCategory::not_found,
                  api_->lib.file().string() + " is the CUDA toolkit's stub, not the driver: " +
                      "install the NVIDIA driver or take the stubs directory off the library path");
    }
    api_->check(init, "cuInit");
    api_->check(api_->cuDeviceGetCount(&count_), "cuDeviceGetCount");
  }

  // NOTE: errors are ignored here: at process exit the driver may already have shut down.
  ~CudaDriver() override {
    for (const auto& [ordinal, retained] : retained_) {
      api_->cuDevicePrimaryCtxRelease(retained.first);
    }
  }

  CudaDriver(const CudaDriver&) = delete;
  CudaDriver& operator=(const CudaDriver&) = delete;

  Vendor vendor() const override { return Vendor::nvidia; }

  std::string version() const override {
    int encoded = 0;  // 1000 * major + 10 * minor
    api_->check(api_->cuDriverGetVersion(&encoded), "cuDriverGetVersion");
    return "cuda driver " + std::to_string(encoded / 1000) + "." +
           std::to_string(encoded % 1000 / 10);
  }

  int device_count() const override { return count_; }

  DeviceInfo device(int ordinal) const override {
    const CUdevice device = get(ordinal);
    DeviceInfo info;
    info.ordinal = ordinal;
    std::array<char, 256> name{};
    api_->check(api_->cuDeviceGetName(name.data(), static_cast<int>(name.size()), device),
                "cuDeviceGetName");
    info.name = name.data();
    std::size_t memory = 0;
    api_->check(api_->cuDeviceTotalMem(&memory, device), "cuDeviceTotalMem_v2");
    info.memory_bytes = memory;
    info.multiprocessors = api_->attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device);
    info.max_threads_per_block = api_->attribute(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, device);
    info.max_shared_bytes_per_block =
        api_->attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, device);
    const int major = api_->attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device);
    const int minor = api_->attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device);
    // Arch-specific features (wgmma, setmaxnreg) need the "a" target from Hopper on.
    info.target = "sm_" + std::to_string(major) + std::to_string(minor) + (major >= 9 ? "a" : "");
    return info;
  }

  std::unique_ptr<Function> load(int ordinal, std::span<const std::byte> binary,
                                 const std::string& lowered_name) override {
    auto function = std::make_unique<CudaFunction>(api_, get(ordinal));
    function->load(binary, lowered_name);
    return function;
  }

  void* allocate_async(int ordinal, std::size_t bytes, void* stream) override {
    api_->lib.require_bound(api_->cuMemAllocAsync, "cuMemAllocAsync");
    use_primary_context(ordinal);
    CUdeviceptr pointer = 0;
    api_->check(
        api_->cuMemAllocAsync(&pointer, bytes, static_cast<CUstream>(stream)), "cuMemAllocAsync",
        "allocating " + std::to_string(bytes) + " bytes on CUDA device " + std::to_string(ordinal));
    return reinterpret_cast<void*>(pointer);
  }

  void free_async(int ordinal, void* pointer, void* stream) override {
    api_->lib.require_bound(api_->cuMemFreeAsync, "cuMemFreeAsync");
    use_primary_context(ordinal);
    api_->check(
        api_->cuMemFreeAsync(reinterpret_cast<CUdeviceptr>(pointer), static_cast<CUstream>(stream)),
        "cuMemFreeAsync");
  }

  void free(int ordinal, void* pointer) override {
    use_primary_context(ordinal);
    api_->check(api_->cuMemFree(reinterpret_cast<CUdeviceptr>(pointer)), "cuMemFree_v2");
  }

  void zero_async(int ordinal, void* pointer, std::size_t bytes, void* stream) override {
    use_primary_context(ordinal);
    api_->check(api_->cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(pointer), 0, bytes,
                                      static_cast<CUstream>(stream)),
                "cuMemsetD8Async");
  }

  void encode_tensor_map(void* map, const TensorMapLayout& layout) override {
    if (api_->cuTensorMapEncodeTiled == nullptr) Driver::encode_tensor_map(map, layout);
    int dtype = CU_TENSOR_MAP_DATA_TYPE_UINT8;  // fp8: TMA moves bytes
    if (layout.dtype == DType::f16) {
      dtype = CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    } else if (layout.dtype == DType::bf16) {
      dtype = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    } else if (!is_fp8(layout.dtype)) {
      throw Error(ErrorCategory::unsupported,
                  "kiln makes TMA descriptors of f16, bf16 and fp8 tensors only, not " +
                      std::string(to_string(layout.dtype)));
    }
    // A box row swizzled by its own bytes: 128 (64 16-bit columns) or 64 (64 fp8 ones).
    const std::uint64_t row_bytes = layout.box[0] * size_of(layout.dtype);
    if (row_bytes != 64 && row_bytes != 128) {
      throw Error(ErrorCategory::unsupported, "a TMA box row of " + std::to_string(row_bytes) +
                                                  " bytes: kiln swizzles rows of 64 or 128 bytes");
    }
    const std::uint32_t element_strides[TensorMapLayout::max_rank] = {1, 1, 1, 1, 1};
    const CUresult result = api_->cuTensorMapEncodeTiled(
        map, dtype, static_cast<unsigned>(layout.rank), const_cast<void*>(layout.data), layout.dims,
        layout.byte_strides, layout.box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
        row_bytes == 64 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_128B,
        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (result != CUDA_SUCCESS) {
      throw Error(ErrorCategory::unsupported,
                  api_->failure(result, "cuTensorMapEncodeTiled") +
                      ": TMA cannot tile this tensor (a dim or stride out of its range)");
    }
  }

  bool is_capturing(int ordinal, void* stream) override {
    use_primary_context(ordinal);
    int status = CU_STREAM_CAPTURE_STATUS_NONE;
    api_->check(api_->cuStreamIsCapturing(static_cast<CUstream>(stream), &status),
                "cuStreamIsCapturing");
    return status != CU_STREAM_CAPTURE_STATUS_NONE;
  }

  std::optional<std::uint64_t> stream_id(int ordinal, void* stream) override {
    if (api_->cuStreamGetId == nullptr) return std::nullopt;
    use_primary_context(ordinal);
    unsigned long long id = 0;
    api_->check(api_->cuStreamGetId(static_cast<CUstream>(stream), &id), "cuStreamGetId");
    return id;
  }

  void copy_to_host(int ordinal, void* host, const void* device_pointer, std::size_t bytes,
                    void* stream) override {
    use_primary_context(ordinal);
    const auto source = reinterpret_cast<CUdeviceptr>(device_pointer);
    const auto cu_stream = static_cast<CUstream>(stream);
    api_->check(api_->cuMemcpyDtoHAsync(host, source, bytes, cu_stream), "cuMemcpyDtoHAsync_v2",
                copying_to_host("CUDA", ordinal, bytes));
    api_->check(api_->cuStreamSynchronize(cu_stream), "cuStreamSynchronize");
  }

 private:
  // Makes the primary context of `ordinal` current, retaining it on first use for the driver's
  // life, as kernels loaded there hold it for theirs.
  void use_primary_context(int ordinal) {
    const CUdevice device = get(ordinal);
    CUcontext context = nullptr;
    {
      const std::lock_guard lock(retained_mutex_);
      auto it = retained_.find(ordinal);
      if (it == retained_.end()) {
        api_->check(api_->cuDevicePrimaryCtxRetain(&context, device), "cuDevicePrimaryCtxRetain");
        it = retained_.emplace(ordinal, std::pair{device, context}).first;
      }
      context = it->second.second;
    }
    api_->make_current(context);
  }

  CUdevice get(int ordinal) const {
    if (ordinal < 0 || ordinal >= count_) {
      throw Error(ErrorCategory::not_found,
                  "CUDA device " + std::to_string(ordinal) + " not found (" +
                      std::to_string(count_) + " visible): choose an ordinal below " +
                      std::to_string(count_) + " or check CUDA_VISIBLE_DEVICES");
    }
    CUdevice device = 0;
    api_->check(api_->cuDeviceGet(&device, ordinal), "cuDeviceGet");
    return device;
  }

  std::shared_ptr<const CudaApi> api_;
  int count_ = 0;
  std::mutex retained_mutex_;
  std::map<int, std::pair<CUdevice, CUcontext>> retained_;  // ordinal -> its primary context
};

}  // namespace

std::unique_ptr<Driver> open_cuda_driver() {
  const std::array<std::string, 1> candidates = {"libcuda.so.1"};
  auto api = std::make_shared<const CudaApi>(
      DynLib::open("the CUDA driver (libcuda.so.1)", candidates,
                   "install the NVIDIA driver; libcuda comes with it, not with the toolkit"));
  return std::make_unique<CudaDriver>(std::move(api));
}

}  // namespace kiln::detail
