// SPDX-License-Identifier: Apache-2.0
// Logging to stderr at the level KILN_LOG (or Options::log_level) sets.
#pragma once

#include <fmt/format.h>

#include <string_view>

#include "kiln/runtime.hpp"

namespace kiln::detail {

void set_log_level(LogLevel level) noexcept;
bool log_enabled(LogLevel level) noexcept;
void log_line(LogLevel level, std::string_view message);

template <class... Args>
void log(LogLevel level, fmt::format_string<Args...> format, Args&&... args) {
  if (log_enabled(level)) log_line(level, fmt::format(format, std::forward<Args>(args)...));
}

// A line for whoever runs the process that reports no fault (a compile inside a call, which
// would otherwise look like a hang): shown wherever warnings are, the default, tagged "note".
void note(std::string_view message);

// Logs a warning the first time `topic` is seen in this process, and never again.
void warn_once(std::string_view topic, std::string_view message);

}  // namespace kiln::detail
