// SPDX-License-Identifier: Apache-2.0
// Runs test code in several processes at once, as several users of one cache or file would.
#pragma once

#include <chrono>
#include <functional>

namespace kiln::test {

// Forks `count` processes that each run `body` with their index (0 .. count - 1) and exit with
// its result (an exception is a failure), runs them at once, and checks that each returned 0.
void in_processes(int count, const std::function<bool(int index)>& body);

// Runs `body` in a forked process and waits at most `limit` for it: whether it returned true. A
// process still running then (one that hangs) is killed, and counts as false.
bool in_process_within(std::chrono::milliseconds limit, const std::function<bool()>& body);

}  // namespace kiln::test
