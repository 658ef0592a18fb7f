// SPDX-License-Identifier: Apache-2.0
// The attention family's launch plan: (problem, config) -> spec, threads and shared memory.
#pragma once

#include "kiln/attention.hpp"
#include "ops/launch_plan.hpp"

namespace kiln::detail {

// The launch of `config` for `problem`: attention_spec's kernel, with the threads and dynamic
// shared memory that kernel declares. The grid depends on the sizes of the call (row blocks,
// heads, batch), so the launch makes it.
LaunchPlan attention_plan(const AttentionProblem& problem, const AttentionConfig& config);

}  // namespace kiln::detail
