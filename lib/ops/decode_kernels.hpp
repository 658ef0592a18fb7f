// SPDX-License-Identifier: Apache-2.0
// The decode family's launch sequences: append and split-KV attention, and merge_states. Their
// kernels' descriptions and plans are in kernels/decode.hpp, validation in decode.cpp; everything
// here assumes validated inputs.
#pragma once

#include "kernels/decode.hpp"
#include "kiln/decode.hpp"
#include "kiln/params/decode.h"
#include "ops/launch_plan.hpp"

namespace kiln::detail {

// Runs a validated decode call whose `plan` fits the device: fetches its kernels, then the
// append kernel when problem.append (which also writes the rotated q into scratch when
// problem.rotary), then attention_decode, whose splits merge their partial states into p.out and
// p.maybe_lse themselves. Scratch comes from detail::allocate_async on `stream` and goes back the
// same way. p.num_splits, partial_out, partial_lse, split_flags, split_tag and maybe_q_rotated
// are filled in here.
void launch_decode(Runtime& runtime, const DecodeProblem& problem, const DecodeConfig& config,
                   const DecodePlan& plan, DecodeParams p, void* stream);

// Runs merge_states_kernel over a validated MergeParams for `call`; `in` is the dtype of the
// states' v.
void launch_merge(Runtime& runtime, CallName call, DType in, DType out, int head_dim,
                  const MergeParams& p, void* stream);

}  // namespace kiln::detail
