// Params of the elementwise family: compiled into the host library and injected into each JIT
// compile as "kiln/params/elementwise.h", so host and kernel always agree on the layout.
#pragma once

namespace kiln {

// The op of a unary kernel, a compile-time constant ("op") of its spec.
enum UnaryOp : int {
  unary_neg = 0,
  unary_abs = 1,
  unary_exp = 2,
  unary_log = 3,
  unary_sin = 4,
  unary_cos = 5,
  unary_tanh = 6,
  unary_sigmoid = 7,
  unary_relu = 8,
  unary_gelu = 9,  // exact: x * Phi(x), through erf
  unary_silu = 10,
  unary_sqrt = 11,
  unary_op_count = 12,
};

struct UnaryParams {
  const void* in;
  void* out;
  long long n;  // elements
};

}  // namespace kiln
