// Runs test code in several processes at once, as several users of one cache or file would.
#pragma once

#include <functional>

namespace kiln::test {

// Forks `count` processes that each run `body` with their index (0 .. count - 1) and exit with
// its result (an exception is a failure), runs them at once, and checks that each returned 0.
void in_processes(int count, const std::function<bool(int index)>& body);

}  // namespace kiln::test
