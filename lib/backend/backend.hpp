// SPDX-License-Identifier: Apache-2.0
// The two halves of a GPU stack that kiln needs: a run-time compiler and a driver that loads
// and launches. CUDA (NVRTC + driver API) and HIP (hipRTC + module API) implement them; both
// are opened with dlopen, so the library works on machines that have neither.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/runtime.hpp"
#include "kiln/target.hpp"

namespace kiln::detail {

struct Header {
  std::string name;  // as written in #include "..."
  std::string content;
};

struct CompileRequest {
  std::string name;    // file name for diagnostics, e.g. "kiln_<key>.cu"
  std::string source;  // the generated unit
  std::vector<Header> headers;
  std::vector<std::string> options;  // canonical options (these go into the key)
  std::string name_expression;       // e.g. "kiln::unary<kiln_spec>", lowered after compile
};

struct ResourceUsage {
  int registers = -1;
  int spill_bytes = -1;
  int shared_bytes = -1;
  int stack_bytes = -1;
};

struct CompileResult {
  bool ok = false;
  std::string log;
  std::vector<std::byte> binary;  // cubin or code object
  std::string intermediate;       // PTX (CUDA) where available, for dumps; may be empty
  std::string lowered_name;
  ResourceUsage usage;
  double ms = 0;
};

class Compiler {
 public:
  virtual ~Compiler() = default;
  virtual Vendor vendor() const = 0;
  // Name and version, e.g. "nvrtc 13.0": part of every key.
  virtual std::string identity() const = 0;
  // Options that change code generation for `target`; part of the key. Options that only say
  // where to find toolkit headers are added inside compile() and are not part of the key.
  virtual std::vector<std::string> canonical_options(const Target& target) const = 0;
  // Whether this compiler can build for `target`: one of targets().
  virtual bool accepts(const Target& target) const = 0;
  // Every target it builds for, for the message that refuses another.
  virtual std::vector<Target> targets() const = 0;
  // A failed compile is returned with ok == false and the log; Error is for a broken compiler.
  virtual CompileResult compile(const CompileRequest& request) const = 0;
};

// A tiled view of device memory for Hopper's tensor memory accelerator (TMA), which kernels read
// through a 128-byte descriptor (CUtensorMap) made by the driver. Dims are innermost first;
// dims[0] is contiguous. Elements outside the dims read as zeros. Boxes land swizzled by their
// rows' bytes, which must be 128 (as wgmma reads 16-bit tiles) or 64 (fp8 staging).
struct TensorMapLayout {
  static constexpr int max_rank = 5;
  const void* data = nullptr;  // 16-byte aligned
  DType dtype = DType::bf16;
  int rank = 0;
  std::uint64_t dims[max_rank] = {};
  std::uint64_t byte_strides[max_rank - 1] = {};  // of dims 1 .. rank - 1; multiples of 16
  std::uint32_t box[max_rank] = {};               // the tile one load moves, in elements
};

// One function of a loaded module, ready to launch.
class Function {
 public:
  virtual ~Function() = default;
  // `params` points at the kernel's single by-value argument.
  virtual void launch(const LaunchConfig& config, const void* params) = 0;
};

class Driver {
 public:
  virtual ~Driver() = default;
  virtual Vendor vendor() const = 0;
  virtual std::string version() const = 0;  // "cuda driver 13.0"
  virtual int device_count() const = 0;
  virtual DeviceInfo device(int ordinal) const = 0;
  // Loads `binary` on `ordinal` and finds `lowered_name` in it. Throws kiln::Error (driver) if
  // the binary cannot be loaded: the runtime treats that as a bad cache entry.
  virtual std::unique_ptr<Function> load(int ordinal, std::span<const std::byte> binary,
                                         const std::string& lowered_name) = 0;
  // Stream-ordered device memory on `ordinal` (cuMemAllocAsync, hipMallocAsync), so a call that
  // takes scratch can be captured in a CUDA graph. Each throws kiln::Error (driver) naming the
  // failed call, or (not_found) when the installed driver predates the entry point.
  virtual void* allocate_async(int ordinal, std::size_t bytes, void* stream) = 0;
  virtual void free_async(int ordinal, void* pointer, void* stream) = 0;
  // Gives device memory back outside any stream's order (cuMemFree): the work that used it must
  // be done.
  virtual void free(int ordinal, void* pointer) = 0;
  // Queues a fill of `bytes` of device memory with zeros on `stream`.
  virtual void zero_async(int ordinal, void* pointer, std::size_t bytes, void* stream) = 0;
  // Whether `stream` is capturing a graph, during which loading a module is illegal.
  virtual bool is_capturing(int ordinal, void* stream) = 0;
  // A number that names `stream` and no other stream of the process, ever (cuStreamGetId; each
  // thread's per-thread default stream is a stream of its own); nullopt when the driver has no
  // such number (CUDA before 12.0, HIP).
  virtual std::optional<std::uint64_t> stream_id(int ordinal, void* stream) = 0;
  // Writes the TMA descriptor of `layout` into the 128 bytes at `map`; kiln::Error
  // (unsupported) where the driver has none (HIP, CUDA before 12.0) or refuses the layout.
  virtual void encode_tensor_map(void* map, const TensorMapLayout& layout);
  // Queues a copy of `bytes` from device memory to `host` on `stream` and waits for the stream.
  virtual void copy_to_host(int ordinal, void* host, const void* device_pointer, std::size_t bytes,
                            void* stream) = 0;
};

// Each throws kiln::Error (not_found) naming the library it looked for and how to point kiln at
// it when the piece is missing. The runtime reaches the compilers through LazyCompiler
// (lazy_compiler.hpp), which loads them only to compile.
std::unique_ptr<Compiler> open_nvrtc();
std::unique_ptr<Compiler> open_hiprtc();
std::unique_ptr<Driver> open_cuda_driver();
std::unique_ptr<Driver> open_hip_driver();

// What a failed device-to-host copy was doing, for its error message.
std::string copying_to_host(std::string_view device, int ordinal, std::size_t bytes);

}  // namespace kiln::detail
