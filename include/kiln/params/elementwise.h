// SPDX-License-Identifier: Apache-2.0
// Params of the elementwise family: public (a Kernel of the family launches with them), compiled
// into the host library and injected into each JIT compile as "kiln/params/elementwise.h", so
// host and kernel always agree on the layout.
#pragma once

namespace kiln {

// The op of a unary kernel, a compile-time constant ("op") of its spec.
namespace unary_op {
enum : int {
  neg = 0,
  abs = 1,
  exp = 2,
  log = 3,
  sin = 4,
  cos = 5,
  tanh = 6,
  sigmoid = 7,
  relu = 8,
  gelu = 9,  // exact: x * Phi(x), through erf
  silu = 10,
  sqrt = 11,
  count = 12,
};
}  // namespace unary_op

struct UnaryParams {
  const void* in;
  void* out;
  long long n;  // elements
};

}  // namespace kiln
