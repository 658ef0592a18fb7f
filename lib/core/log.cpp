// SPDX-License-Identifier: Apache-2.0
// Logging to stderr, with a process-wide level and once-only warnings.
#include "core/log.hpp"

#include <atomic>
#include <cstdio>
#include <mutex>
#include <set>
#include <string>

namespace kiln::detail {
namespace {

std::atomic<LogLevel> g_level{LogLevel::warn};

std::string_view level_name(LogLevel level) {
  switch (level) {
    case LogLevel::error: return "error";
    case LogLevel::warn: return "warn";
    case LogLevel::info: return "info";
    case LogLevel::debug: return "debug";
  }
  return "?";
}

void write_line(std::string_view tag, std::string_view message) {
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  std::fprintf(stderr, "kiln %.*s: %.*s\n", static_cast<int>(tag.size()), tag.data(),
               static_cast<int>(message.size()), message.data());
}

}  // namespace

void set_log_level(LogLevel level) noexcept {
  g_level.store(level, std::memory_order_relaxed);
}

bool log_enabled(LogLevel level) noexcept {
  return static_cast<int>(level) <= static_cast<int>(g_level.load(std::memory_order_relaxed));
}

void log_line(LogLevel level, std::string_view message) {
  write_line(level_name(level), message);
}

void note(std::string_view message) {
  if (log_enabled(LogLevel::warn)) write_line("note", message);
}

void warn_once(std::string_view topic, std::string_view message) {
  static std::mutex mutex;
  static std::set<std::string, std::less<>> seen;
  {
    std::lock_guard lock(mutex);
    if (!seen.emplace(topic).second) return;
  }
  if (log_enabled(LogLevel::warn)) log_line(LogLevel::warn, message);
}

}  // namespace kiln::detail
