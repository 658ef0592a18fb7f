// SPDX-License-Identifier: Apache-2.0
// Elementwise unary ops, y = op(x): the smallest kernel family, proving the JIT pipeline.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "kiln/runtime.hpp"
#include "kiln/spec.hpp"

namespace kiln {

enum class UnaryOp { neg, abs, exp, log, sin, cos, tanh, sigmoid, relu, gelu, silu, sqrt };

std::string_view to_string(UnaryOp op) noexcept;

// What was asked: `n` elements of `dtype` (f16, bf16, f32 or f64) in device memory. `in` and
// `out` may be the same buffer.
struct UnaryArgs {
  UnaryOp op = UnaryOp::neg;
  DType dtype = DType::f32;
  const void* in = nullptr;
  void* out = nullptr;
  std::int64_t n = 0;
  void* stream = nullptr;  // CUstream or hipStream_t; null: the default stream
};

// How it runs. Every config gives bit-identical results.
struct UnaryConfig {
  int block_size = 256;      // threads: a multiple of the warp size (64 on AMD), at most 1024
  int items_per_thread = 4;  // 1 to 16
};

UnaryConfig choose(const UnaryArgs& args);
KernelSpec unary_spec(UnaryOp op, DType dtype, const UnaryConfig& config);

void unary(const UnaryArgs& args, Runtime& runtime = default_runtime());
void unary(const UnaryArgs& args, const UnaryConfig& config, Runtime& runtime = default_runtime());

// The specs `kiln warm` compiles by default for this family: every op and dtype at the config
// choose() picks.
std::vector<KernelSpec> unary_default_specs();

}  // namespace kiln
