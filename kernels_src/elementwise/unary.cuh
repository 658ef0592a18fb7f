// SPDX-License-Identifier: Apache-2.0
// Elementwise unary ops: y = op(x), one element per item, any size; the op is a constant.
#pragma once

#include "common/prelude.cuh"
#include "kiln/params/elementwise.h"

namespace kiln {

template <int Op, class C>
__device__ __forceinline__ C apply_unary(C x) {
  static_assert(Op >= 0 && Op < unary_op::count, "op must be one of kiln::unary_op.");
  if constexpr (Op == unary_op::neg) return -x;
  if constexpr (Op == unary_op::abs) return fabs(x);
  if constexpr (Op == unary_op::exp) return exp(x);
  if constexpr (Op == unary_op::log) return log(x);
  if constexpr (Op == unary_op::sin) return sin(x);
  if constexpr (Op == unary_op::cos) return cos(x);
  if constexpr (Op == unary_op::tanh) return tanh(x);
  if constexpr (Op == unary_op::sigmoid) return C(1) / (C(1) + exp(-x));
  if constexpr (Op == unary_op::relu) return x > C(0) ? x : C(0);
  if constexpr (Op == unary_op::gelu)
    return C(0.5) * x * (C(1) + erf(x * C(0.70710678118654752440)));
  if constexpr (Op == unary_op::silu) return x / (C(1) + exp(-x));
  if constexpr (Op == unary_op::sqrt) return sqrt(x);
}

template <class T>
__device__ __forceinline__ T store_as(compute_t<T> y) {
  if constexpr (is_same<T, double>::value) {
    return y;
  } else {
    return from_float<T>(y);
  }
}

// Spec: block_size (threads), items_per_thread, op (kiln::unary_op), dtype.
// Item i of a block is element block * block_size * items_per_thread + i * block_size + thread,
// so each thread's loads are coalesced across the block for every i.
template <class Spec>
__global__ void __launch_bounds__(Spec::block_size) unary(const KILN_GRID_CONSTANT UnaryParams p) {
  static_assert(
      Spec::block_size > 0 && Spec::block_size <= 1024 && Spec::block_size % KILN_WARP_SIZE == 0,
      "block_size must be a multiple of the warp size, at most 1024.");
  static_assert(Spec::items_per_thread >= 1 && Spec::items_per_thread <= 16,
                "items_per_thread must be between 1 and 16.");
  using T = typename Spec::dtype;
  using C = compute_t<T>;
  const T* in = static_cast<const T*>(p.in);
  T* out = static_cast<T*>(p.out);
  const long long first =
      static_cast<long long>(blockIdx.x) * Spec::block_size * Spec::items_per_thread + threadIdx.x;
#pragma unroll
  for (int i = 0; i < Spec::items_per_thread; ++i) {
    const long long index = first + static_cast<long long>(i) * Spec::block_size;
    if (index < p.n) out[index] = store_as<T>(apply_unary<Spec::op, C>(to_float(in[index])));
  }
}

}  // namespace kiln
