// SPDX-License-Identifier: Apache-2.0
// Elementwise unary ops: args -> choose -> spec -> launch.
#include "kiln/elementwise.hpp"

#include <fmt/format.h>

#include "core/checked_math.hpp"
#include "kernels/elementwise.hpp"
#include "kiln/error.hpp"
#include "kiln/params/elementwise.h"
#include "ops/launch_plan.hpp"

namespace kiln {
namespace {

constexpr UnaryOp kOps[] = {UnaryOp::neg,  UnaryOp::abs,  UnaryOp::exp,  UnaryOp::log,
                            UnaryOp::sin,  UnaryOp::cos,  UnaryOp::tanh, UnaryOp::sigmoid,
                            UnaryOp::relu, UnaryOp::gelu, UnaryOp::silu, UnaryOp::sqrt};
constexpr DType kDTypes[] = {DType::f16, DType::bf16, DType::f32, DType::f64};

// The device enum (kiln/params/elementwise.h) is what the kernel sees; keep the two in step.
static_assert(static_cast<int>(UnaryOp::sqrt) == unary_op::sqrt &&
                  static_cast<int>(UnaryOp::gelu) == unary_op::gelu &&
                  sizeof(kOps) / sizeof(kOps[0]) == unary_op::count,
              "kiln::UnaryOp and the kernel's op numbers must agree.");

void validate(const UnaryArgs& args, const UnaryConfig& config) {
  const int op = static_cast<int>(args.op);
  if (op < 0 || op >= unary_op::count) {
    throw Error(
        ErrorCategory::invalid_argument,
        fmt::format("unary op is {}: expected a kiln::UnaryOp (0 to {})", op, unary_op::count - 1));
  }
  if (std::find(std::begin(kDTypes), std::end(kDTypes), args.dtype) == std::end(kDTypes)) {
    throw Error(ErrorCategory::unsupported,
                fmt::format("unary {} on dtype {}: only f16, bf16, f32 and f64 are supported",
                            to_string(args.op), to_string(args.dtype)));
  }
  if (args.n < 0) {
    throw Error(ErrorCategory::invalid_argument,
                fmt::format("unary n is {}: the element count cannot be negative", args.n));
  }
  if (args.n > 0 && (args.in == nullptr || args.out == nullptr)) {
    throw Error(ErrorCategory::invalid_argument,
                fmt::format("unary {} of {} elements got a null {} pointer", to_string(args.op),
                            args.n, args.in == nullptr ? "in" : "out"));
  }
  if (config.block_size < 64 || config.block_size > 1024 || config.block_size % 64 != 0) {
    throw Error(ErrorCategory::invalid_argument,
                fmt::format("UnaryConfig::block_size is {}: use a multiple of 64 from 64 to 1024",
                            config.block_size));
  }
  if (config.items_per_thread < 1 || config.items_per_thread > 16) {
    throw Error(
        ErrorCategory::invalid_argument,
        fmt::format("UnaryConfig::items_per_thread is {}: use 1 to 16", config.items_per_thread));
  }
}

}  // namespace

std::string_view to_string(UnaryOp op) noexcept {
  switch (op) {
    case UnaryOp::neg: return "neg";
    case UnaryOp::abs: return "abs";
    case UnaryOp::exp: return "exp";
    case UnaryOp::log: return "log";
    case UnaryOp::sin: return "sin";
    case UnaryOp::cos: return "cos";
    case UnaryOp::tanh: return "tanh";
    case UnaryOp::sigmoid: return "sigmoid";
    case UnaryOp::relu: return "relu";
    case UnaryOp::gelu: return "gelu";
    case UnaryOp::silu: return "silu";
    case UnaryOp::sqrt: return "sqrt";
  }
  return "?";
}

UnaryConfig choose(const UnaryArgs& args) {
  // 16 bytes in flight per thread per item group keeps HBM busy; f64 needs fewer items.
  return {256, size_of(args.dtype) >= 8 ? 2 : 4};
}

void unary(const UnaryArgs& args, Runtime& runtime) {
  unary(args, choose(args), runtime);
}

void unary(const UnaryArgs& args, const UnaryConfig& config, Runtime& runtime) {
  validate(args, config);
  if (args.n == 0) return;
  const KernelSpec spec = unary_spec(args.op, args.dtype, config);
  detail::require_gpu(runtime, {"kiln::unary", "kiln::unary"}, &spec);
  const Kernel kernel = runtime.kernel(spec, args.stream);
  const std::int64_t per_block = std::int64_t{config.block_size} * config.items_per_thread;
  const std::int64_t blocks = detail::ceil_div(args.n, per_block);
  if (blocks > 0x7fffffff) {
    throw Error(ErrorCategory::unsupported,
                fmt::format("unary of {} elements needs {} blocks, over the grid limit of 2^31-1: "
                            "raise items_per_thread or split the call",
                            args.n, blocks));
  }
  const UnaryParams params{args.in, args.out, args.n};
  kernel.launch({.grid = {static_cast<std::uint32_t>(blocks)},
                 .block = {static_cast<std::uint32_t>(detail::kUnaryKernel.threads(config))},
                 .stream = args.stream},
                params);
}

std::vector<KernelSpec> unary_default_specs() {
  std::vector<KernelSpec> specs;
  for (UnaryOp op : kOps) {
    for (DType dtype : kDTypes)
      specs.push_back(unary_spec(op, dtype, choose({.op = op, .dtype = dtype})));
  }
  return specs;
}

}  // namespace kiln
