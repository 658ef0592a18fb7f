// SPDX-License-Identifier: Apache-2.0
// Device memory for the [gpu] tests, through the CUDA runtime, every call checked.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace kiln::test {

inline void cuda_check(cudaError_t status, const char* call) {
  if (status != cudaSuccess) {
    throw std::runtime_error(std::string(call) + " failed: " + cudaGetErrorName(status) + ": " +
                             cudaGetErrorString(status));
  }
}
#define KILN_CUDA_CHECK(call) ::kiln::test::cuda_check((call), #call)

// Synchronises and checks both the launch error and any asynchronous fault.
inline void sync_and_check() {
  KILN_CUDA_CHECK(cudaGetLastError());
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
}

// What DeviceBuffer::poison() leaves in 16- and 32-bit elements: NaN.
constexpr std::uint16_t kPoison16 = 0xffff;
constexpr std::uint32_t kPoison32 = 0xffffffff;

class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
    if (bytes_) KILN_CUDA_CHECK(cudaMalloc(&data_, bytes_));
  }
  ~DeviceBuffer() {
    if (data_) cudaFree(data_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return data_; }
  std::size_t bytes() const { return bytes_; }

  template <class T>
  void upload(const std::vector<T>& host) {
    if (host.size() * sizeof(T) != bytes_) throw std::runtime_error("upload size mismatch");
    if (bytes_) KILN_CUDA_CHECK(cudaMemcpy(data_, host.data(), bytes_, cudaMemcpyHostToDevice));
  }
  template <class T>
  std::vector<T> download() const {
    std::vector<T> host(bytes_ / sizeof(T));
    if (bytes_) KILN_CUDA_CHECK(cudaMemcpy(host.data(), data_, bytes_, cudaMemcpyDeviceToHost));
    return host;
  }
  // Fills with a byte pattern no kernel writes by accident (0xFF: NaN in every float format).
  void poison() {
    if (bytes_) KILN_CUDA_CHECK(cudaMemset(data_, 0xFF, bytes_));
  }

 private:
  void* data_ = nullptr;
  std::size_t bytes_;
};

// A device copy of `host`.
template <class T>
std::unique_ptr<DeviceBuffer> upload(const std::vector<T>& host) {
  auto buffer = std::make_unique<DeviceBuffer>(host.size() * sizeof(T));
  buffer->upload(host);
  return buffer;
}

// A stream, graph and graph instance destroyed with the object.
struct GraphOnStream {
  cudaStream_t stream = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  GraphOnStream() { KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)); }
  ~GraphOnStream() {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
  GraphOnStream(const GraphOnStream&) = delete;
  GraphOnStream& operator=(const GraphOnStream&) = delete;

  // Captures what `work` queues on the stream and instantiates it; a capture that fails is
  // ended before the error goes on, so the stream stays usable.
  void capture(const std::function<void()>& work) {
    KILN_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    try {
      work();
    } catch (...) {
      cudaStreamEndCapture(stream, &graph);
      cudaGetLastError();
      throw;
    }
    KILN_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    KILN_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  }
};

}  // namespace kiln::test
