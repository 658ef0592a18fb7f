// SPDX-License-Identifier: Apache-2.0
// The built `kiln` run as a subprocess, for the tests of the command.
#include "cli/run_kiln.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>

#include <chrono>
#include <csignal>
#include <thread>

#include <catch2/catch.hpp>

#include "support.hpp"

extern char** environ;

namespace kiln::test {
namespace {

namespace fs = std::filesystem;

// Longer than any command here takes, even building kernels under the sanitizers.
constexpr std::chrono::seconds kTimeout{300};

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> result;
  for (std::string& s : strings) result.push_back(s.data());
  result.push_back(nullptr);
  return result;
}

// `kiln args` as run_kiln() runs it, with stderr opened from `err` (O_RDWR: a terminal's
// device, or O_WRONLY | O_CREAT | O_TRUNC: a file).
Result spawn_kiln(const fs::path& scratch, const fs::path& cache,
                  const std::vector<std::string>& args, const std::vector<std::string>& settings,
                  const fs::path& err, int err_flags) {
  std::vector<std::string> env{"KILN_CACHE_DIR=" + cache.string()};
  env.insert(env.end(), settings.begin(), settings.end());
  for (char** variable = environ; *variable != nullptr; ++variable) {
    if (!std::string_view(*variable).starts_with("KILN_")) env.emplace_back(*variable);
  }
  std::vector<std::string> argv{KILN_CLI_PATH};
  argv.insert(argv.end(), args.begin(), args.end());

  const fs::path out = scratch / "stdout.txt";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, 2, err.c_str(), err_flags, 0644);
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, argv[0].c_str(), &actions, nullptr, pointers(argv).data(),
                                  pointers(env).data());
  posix_spawn_file_actions_destroy(&actions);
  REQUIRE(spawned == 0);
  // NOTE: polled, so that a kiln that hangs fails its test instead of stalling the suite; an
  // abort or a kill shows as code -1 and fails the CHECK below.
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + kTimeout;
  pid_t waited = 0;
  while ((waited = waitpid(pid, &status, WNOHANG)) == 0 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const bool hung = waited == 0;
  if (hung) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
  }
  Result result;
  result.code = WIFEXITED(status) && !hung ? WEXITSTATUS(status) : -1;
  result.out = read_file(out);
  CHECK_FALSE(hung);
  CHECK_FALSE(WIFSIGNALED(status));
  CHECK(result.code >= 0);
  return result;
}

}  // namespace

Result run_kiln(const fs::path& scratch, const fs::path& cache,
                const std::vector<std::string>& args, const std::vector<std::string>& settings) {
  const fs::path err = scratch / "stderr.txt";
  Result result = spawn_kiln(scratch, cache, args, settings, err, O_WRONLY | O_CREAT | O_TRUNC);
  result.err = read_file(err);
  INFO("kiln stdout:\n" << result.out << "\nkiln stderr:\n" << result.err);
  return result;
}

Result run_kiln_on_terminal(const fs::path& scratch, const fs::path& cache,
                            const std::vector<std::string>& args,
                            const std::vector<std::string>& settings) {
  const int terminal = ::posix_openpt(O_RDWR | O_NOCTTY);
  REQUIRE(terminal >= 0);
  REQUIRE(::grantpt(terminal) == 0);
  REQUIRE(::unlockpt(terminal) == 0);
  ::fcntl(terminal, F_SETFD, FD_CLOEXEC);
  // Wide enough for a progress line whole.
  const winsize size{.ws_row = 50, .ws_col = 250, .ws_xpixel = 0, .ws_ypixel = 0};
  REQUIRE(::ioctl(terminal, TIOCSWINSZ, &size) == 0);
  const fs::path device = ::ptsname(terminal);
  // NOTE: kiln's progress is short; the terminal holds it until it is read after kiln exits.
  Result result = spawn_kiln(scratch, cache, args, settings, device, O_RDWR | O_NOCTTY);
  ::fcntl(terminal, F_SETFL, O_NONBLOCK);
  char buffer[4096];
  ssize_t got = 0;
  while ((got = ::read(terminal, buffer, sizeof buffer)) > 0) {
    result.err.append(buffer, static_cast<std::size_t>(got));
  }
  ::close(terminal);
  return result;
}

}  // namespace kiln::test
