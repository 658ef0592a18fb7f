// SPDX-License-Identifier: Apache-2.0
// Small compile-time helpers for kernels; device code only, no host or standard headers.
#pragma once

#include "common/vendor.cuh"

namespace kiln {

template <class A, class B>
struct is_same {
  static constexpr bool value = false;
};
template <class A>
struct is_same<A, A> {
  static constexpr bool value = true;
};

template <bool C, class T, class F>
struct conditional {
  using type = T;
};
template <class T, class F>
struct conditional<false, T, F> {
  using type = F;
};

// The type arithmetic happens in: double for f64 data, float for everything else.
template <class T>
using compute_t = typename conditional<is_same<T, double>::value, double, float>::type;

}  // namespace kiln
