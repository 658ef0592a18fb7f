// SPDX-License-Identifier: Apache-2.0
// The score model on the host: from the ScoreOptions every attention family takes to the
// ScoreParams its kernels read.
#pragma once

#include <cstdint>

#include "kernels/kernel.hpp"
#include "kiln/params/score.h"
#include "kiln/score.hpp"
#include "kiln/spec.hpp"

namespace kiln::detail {

// Whether the options mask with a band: causal or a window.
bool has_band(const ScoreOptions& o);

// Checks `o` for a call of `batch` sequences of `heads` query heads of `head_dim` on `device`
// (kiln::Error naming the option, its value and the fix), and returns it as the kernels read it:
// the default scale 1 / sqrt(head_dim), causal as window_right 0, the slopes' batch stride.
ScoreParams score_params(const ScoreOptions& o, std::int64_t batch, std::int64_t heads,
                         std::int64_t head_dim, int device);

}  // namespace kiln::detail
