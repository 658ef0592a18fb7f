// SPDX-License-Identifier: Apache-2.0
// The elementwise family's kernel as the host describes it: kiln::unary's spec schema, and its
// CTA from the typed config. unary_spec() and the launch (ops/elementwise.cpp) read it.
#pragma once

#include "kernels/kernel.hpp"
#include "kiln/elementwise.hpp"

namespace kiln::detail {

struct UnaryDescription {
  KernelSchema schema;
  int (*threads)(const UnaryConfig& config);  // per CTA; no dynamic shared memory
};
extern const UnaryDescription kUnaryKernel;

}  // namespace kiln::detail
