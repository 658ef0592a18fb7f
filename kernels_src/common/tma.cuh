// SPDX-License-Identifier: Apache-2.0
// PTX wrappers for Hopper's asynchronous data movement (sm_90a): shared-memory mbarriers, TMA
// tensor loads (cp.async.bulk.tensor) that signal them, bulk stores and reductions, register
// reallocation between warpgroups (setmaxnreg) and named barriers, the pieces of a warp-specialized
// kernel.
//
// A tensor map (CUtensorMap, 128 opaque bytes made on the host by cuTensorMapEncodeTiled) must
// live in kernel parameter space (__grid_constant__) or global memory; kiln's are in the Params.
#pragma once

#include "common/mma.cuh"

namespace kiln::tma {

using mma::smem_address;

// An mbarrier whose phase completes after `count` arrivals (and every byte of transactions
// announced by arrive_expect_tx).
__device__ __forceinline__ void init(unsigned long long* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(bar)), "r"(count)
               : "memory");
}

// Makes mbarrier inits visible to the async proxy (TMA) and other threads; follow it with a
// CTA barrier.
__device__ __forceinline__ void fence_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// One arrival that also announces `bytes` of TMA transactions the phase must wait for.
__device__ __forceinline__ void arrive_expect_tx(unsigned long long* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_address(bar)),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void arrive(unsigned long long* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_address(bar)) : "memory");
}

// Waits until the phase of parity `phase` (0 or 1) has completed.
__device__ __forceinline__ void wait(unsigned long long* bar, unsigned phase) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "wait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n}\n" ::"r"(smem_address(bar)),
      "r"(phase)
      : "memory");
}

// Starts a TMA load of the box at coordinates (c0, c1, c2, c3) of the 4-d tensor `map` into
// shared memory at `destination`; its bytes count toward `bar`'s transactions. Elements outside
// the tensor read as zeros.
__device__ __forceinline__ void load_4d(void* destination, const void* map, unsigned long long* bar,
                                        int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(smem_address(destination)),
      "l"(reinterpret_cast<unsigned long long>(map)), "r"(smem_address(bar)), "r"(c0), "r"(c1),
      "r"(c2), "r"(c3)
      : "memory");
}

// Pulls a tensor map's descriptor into the TMA unit's cache ahead of its first use.
__device__ __forceinline__ void prefetch_map(const void* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<unsigned long long>(map))
               : "memory");
}

// Starts copying `bytes` (a multiple of 16) from shared address `source` to `destination` in
// global memory, both 16-byte aligned, in this thread's current bulk group; the copy reads shared
// memory through the async proxy, so writes to it must be fenced first (fence_shared_for_async).
__device__ __forceinline__ void store_bulk(void* destination, unsigned source, unsigned bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(destination),
               "r"(source), "r"(bytes)
               : "memory");
}
// Starts adding `bytes` (a multiple of 16) of fp32 values from shared address `source` to those
// at `destination` in global memory, both 16-byte aligned, each element atomically, in this
// thread's current bulk group; fence the shared writes first, as for store_bulk.
__device__ __forceinline__ void reduce_add_bulk(float* destination, unsigned source,
                                                unsigned bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(
                   destination),
               "r"(source), "r"(bytes)
               : "memory");
}
// Adds x and y to the pair of fp32 values at `destination` (8-byte aligned) in global memory,
// each atomically, without waiting (sm_90's vector red).
__device__ __forceinline__ void reduce_add_pair(float* destination, float x, float y) {
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(destination), "f"(x), "f"(y)
               : "memory");
}
__device__ __forceinline__ void commit_bulk() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// Waits until this thread's bulk groups but the Pending newest are done reading shared memory
// (wait_bulk_read), or done (wait_bulk).
template <int Pending>
__device__ __forceinline__ void wait_bulk_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(Pending) : "memory");
}
template <int Pending>
__device__ __forceinline__ void wait_bulk() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(Pending) : "memory");
}

// Orders this thread's global memory accesses through the async proxy (bulk copies and
// reductions, once waited for) and through the generic proxy (loads, stores, atomics) both ways:
// a release after it publishes the first; an acquire before it is seen by the first after it.
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

// A global int read with acquire semantics at GPU scope, and an addition to one with release
// semantics: a flag between CTAs.
__device__ __forceinline__ int load_acquire(const int* at) {
  int value;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(value) : "l"(at) : "memory");
  return value;
}
__device__ __forceinline__ void add_release(int* at, int value) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(at), "r"(value) : "memory");
}

// Gives this warpgroup's registers back to the CTA's pool, or takes more from it: every warp of
// the warpgroup runs the same one, and the counts of all warpgroups must fit the register file.
template <int Registers>
__device__ __forceinline__ void release_registers() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Registers));
}
template <int Registers>
__device__ __forceinline__ void claim_registers() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Registers));
}

// Barrier `id` (1 to 15; __syncthreads is 0) among `threads` threads, whole warps.
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace kiln::tma
