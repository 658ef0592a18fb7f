// SPDX-License-Identifier: Apache-2.0
// The built `kiln` run as a subprocess, for the tests of the command.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace kiln::test {

struct Result {
  int code = -1;  // the exit status; -1 when kiln did not exit by itself
  std::string out;
  std::string err;
};

// Runs the built `kiln` with `args`, KILN_CACHE_DIR set to `cache`, the NAME=value settings of
// `env` and no other KILN_* variable of the calling environment; its output goes through files
// in `scratch`. A kiln that hangs, aborts or is killed fails the calling test.
Result run_kiln(const std::filesystem::path& scratch, const std::filesystem::path& cache,
                const std::vector<std::string>& args, const std::vector<std::string>& env = {});

// run_kiln with stderr a terminal (a pseudo-terminal, whose output is `err`), as a user sees it.
Result run_kiln_on_terminal(const std::filesystem::path& scratch,
                            const std::filesystem::path& cache,
                            const std::vector<std::string>& args,
                            const std::vector<std::string>& env = {});

}  // namespace kiln::test
