// SPDX-License-Identifier: Apache-2.0
// What only the ops ask of a Runtime's device: stream-ordered scratch memory, zeros kept per
// stream, TMA descriptors, and host copies for the debug checks. Not public API: a user launches
// through the ops or Kernel::launch, and passes memory of their own.
#pragma once

#include <cstddef>
#include <memory>

#include "backend/backend.hpp"
#include "kiln/runtime.hpp"
#include "kiln/spec.hpp"

namespace kiln::detail {

// Stream-ordered device memory on runtime.device() (cuMemAllocAsync / hipMallocAsync): ops take
// scratch from here, so a call never waits for the host and can be captured in a CUDA graph.
// 0 bytes gives nullptr, and freeing nullptr does nothing.
void* allocate_async(Runtime& runtime, std::size_t bytes, void* stream);
void free_async(Runtime& runtime, void* pointer, void* stream);
// Queues a fill of `bytes` of device memory with zeros on `stream`.
void zero_async(Runtime& runtime, void* pointer, std::size_t bytes, void* stream);
// At least `bytes` of device memory private to `stream`, which the runtime keeps from call to
// call: zero when first handed out, and the work queued with it must leave it zero. Hold the
// result until that work is queued. Null while `stream` captures a graph (a replay may run on
// any stream, beside this one), when the driver cannot tell streams apart (CUDA before 12.0,
// HIP), or beyond the 64 streams that keep memory: then take allocate_async and zero_async.
std::shared_ptr<void> stream_zeros(Runtime& runtime, std::size_t bytes, void* stream);
// Writes the TMA descriptor of `layout` (cuTensorMapEncodeTiled) into the 128 bytes at `map`,
// 64-byte aligned. Throws kiln::Error (unsupported) when the driver has no TMA or refuses the
// layout, naming it.
void encode_tensor_map(Runtime& runtime, void* map, const TensorMapLayout& layout);
// Copies device memory to the host once the work queued on `stream` is done (it synchronizes
// the stream): for the debug checks only.
void copy_to_host(Runtime& runtime, void* host, const void* device_pointer, std::size_t bytes,
                  void* stream);
// Throws kiln::Error (invalid_argument) as Runtime::kernel would load `spec`, where the runtime
// has a device whose target is not the one `spec` compiles for (a spec's target, or
// Options::target / KILN_TARGET, naming another): so that is_supported() refuses what the call
// would. Nothing without a device.
void require_loadable(Runtime& runtime, const KernelSpec& spec);
// Whether the ops run their costly host checks: Options::debug / KILN_DEBUG.
bool debug(const Runtime& runtime);

}  // namespace kiln::detail
