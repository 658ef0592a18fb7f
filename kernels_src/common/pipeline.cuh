// SPDX-License-Identifier: Apache-2.0
// A ring of shared-memory slots between a producer and its consumers on Hopper's mbarriers
// (sm_90a): per slot a full barrier (the slot's data has landed) and an empty one (every consumer
// is done with it), and each side's position in it.
//
// A PipelineState is one side's position in the ring: its count-th use of it, which is slot
// count % Stages and completes phase (count / Stages) & 1 of that slot's barriers. The tma
// kernel's producer keeps one and moves it on (its consumers count their blocks themselves, by
// the same rule, in a loop ptxas schedules best as it stands): a count, since a kernel's positions
// are often a tile's first one plus a block offset (after), and the slot, carried by advance so
// that stepping on costs no division. The barriers live in shared memory (a `__shared__` Pipeline,
// alone or in a struct of the kernel's), initialized by one thread before a CTA barrier.
#pragma once

#include "common/tma.cuh"

namespace kiln::tma {

template <int Stages>
struct PipelineState {
  int count = 0;
  int index = 0;  // count % Stages, carried along so that a slot's address is at hand early

  __device__ __forceinline__ int slot() const { return index; }
  __device__ __forceinline__ unsigned phase() const {
    return static_cast<unsigned>(count / Stages) & 1;
  }
  // Whether this use of the slot is its first, so nobody has a use to hand back yet.
  __device__ __forceinline__ bool first_lap() const { return count < Stages; }
  __device__ __forceinline__ void advance() {
    ++count;
    index = index + 1 == Stages ? 0 : index + 1;
  }
  // The position `uses` further on.
  __device__ __forceinline__ PipelineState after(int uses) const {
    return {count + uses, (count + uses) % Stages};
  }
};

// Stages mbarriers taken in turn, one per use: the one a PipelineState names.
template <int Stages>
struct BarrierRing {
  unsigned long long barrier[Stages];

  __device__ __forceinline__ void init(unsigned arrivals) {
#pragma unroll
    for (int s = 0; s < Stages; ++s) tma::init(&barrier[s], arrivals);
  }
  __device__ __forceinline__ unsigned long long* at(PipelineState<Stages> state) {
    return &barrier[state.slot()];
  }
  // Waits until the use `state` has completed.
  __device__ __forceinline__ void wait(PipelineState<Stages> state) {
    tma::wait(at(state), state.phase());
  }
  __device__ __forceinline__ void arrive(PipelineState<Stages> state) {
    tma::arrive(at(state));
  }
  // An arrival that also announces `bytes` of TMA transactions to `state`'s barrier, which the
  // loads that fill the slot name (at) and complete.
  __device__ __forceinline__ void arrive_expect_tx(PipelineState<Stages> state, unsigned bytes) {
    tma::arrive_expect_tx(at(state), bytes);
  }
};

template <int Stages>
struct Pipeline {
  BarrierRing<Stages> full;   // the producer's arrivals and transactions: the slot holds data
  BarrierRing<Stages> empty;  // the consumers' arrivals: they are done with it

  // `producers` and `consumers` arrivals complete a phase of full and of empty.
  __device__ __forceinline__ void init(unsigned producers, unsigned consumers) {
    full.init(producers);
    empty.init(consumers);
  }

  // The producer, before filling `state`'s slot: waits until the consumers have emptied it of
  // its use a lap earlier (none on the first lap), whose phase is the other parity.
  __device__ __forceinline__ void acquire(PipelineState<Stages> state) {
    if (!state.first_lap()) tma::wait(empty.at(state), state.phase() ^ 1);
  }
};

}  // namespace kiln::tma
