// SPDX-License-Identifier: Apache-2.0
// How long something took, for logs and stats.
#pragma once

#include <chrono>

namespace kiln::detail {

using Clock = std::chrono::steady_clock;

// Milliseconds since `start`.
inline double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

}  // namespace kiln::detail
