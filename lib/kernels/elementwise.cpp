// SPDX-License-Identifier: Apache-2.0
// kiln::unary's description and the specs made from it.
#include "kernels/elementwise.hpp"

#include "kiln/params/elementwise.h"

namespace kiln {
namespace detail {
namespace {

std::string_view unary_op_name(std::int64_t op) {
  return to_string(static_cast<UnaryOp>(op));
}

// The constants the template reads (kernels_src/elementwise/unary.cuh).
constexpr ConstantSchema kUnaryConstants[] = {
    {"block_size", ConstantKind::integer},
    {"dtype", ConstantKind::dtype},
    {"items_per_thread", ConstantKind::integer},
    {"op", ConstantKind::integer, unary_op::count, unary_op_name}};

}  // namespace

const UnaryDescription kUnaryKernel{
    .schema = {"elementwise/unary.cuh", "kiln::unary", "kiln::UnaryParams", kUnaryConstants,
               no_shared_memory},
    .threads = [](const UnaryConfig& c) { return c.block_size; }};

}  // namespace detail

KernelSpec unary_spec(UnaryOp op, DType dtype, const UnaryConfig& config) {
  KernelSpec spec = detail::spec_of(detail::kUnaryKernel.schema);
  spec.set("block_size", config.block_size)
      .set("items_per_thread", config.items_per_thread)
      .set("op", static_cast<int>(op))
      .set("dtype", dtype);
  return spec;
}

}  // namespace kiln
