// Reading a user's text file with bounds, and echoing a user's text without control characters.
#include "jit/user_text.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "kiln/error.hpp"

namespace kiln::detail {
namespace {

std::string_view kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

class ClosedOnExit {
 public:
  explicit ClosedOnExit(int fd) : fd_(fd) {}
  ~ClosedOnExit() { ::close(fd_); }
  ClosedOnExit(const ClosedOnExit&) = delete;
  ClosedOnExit& operator=(const ClosedOnExit&) = delete;

 private:
  int fd_;
};

}  // namespace

std::optional<std::string> read_user_file(const std::filesystem::path& path, std::string_view what,
                                          std::size_t max_bytes) {
  const std::string name = printable(path.string());
  const auto cannot_read = [&](int error) {
    return Error(ErrorCategory::not_found,
                 fmt::format("cannot read the {} {}: {}", what, name, std::strerror(error)));
  };
  // NOTE: O_NONBLOCK so that opening a FIFO returns at once (fstat then refuses it) instead of
  // waiting for a writer that may never come.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return std::nullopt;
    throw cannot_read(errno);
  }
  const ClosedOnExit closed(fd);
  struct stat info {};
  if (::fstat(fd, &info) != 0) throw cannot_read(errno);
  if (!S_ISREG(info.st_mode)) {
    throw Error(ErrorCategory::invalid_argument,
                fmt::format("the {} {} is {}: kiln reads only regular files; name the file itself",
                            what, name, kind_of(info.st_mode)));
  }
  const auto too_large = [&] {
    return Error(ErrorCategory::invalid_argument,
                 fmt::format("the {} {} is larger than the {} MiB kiln reads of one: is it the "
                             "file you meant?",
                             what, name, max_bytes >> 20));
  };
  if (static_cast<std::uint64_t>(info.st_size) > max_bytes) throw too_large();
  // NOTE: read to the end rather than trust st_size, which is 0 for /proc files and stale for
  // a file still being written; the limit bounds it either way.
  std::string text;
  char buffer[1 << 16];
  while (true) {
    const ssize_t got = ::read(fd, buffer, sizeof buffer);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw cannot_read(errno);
    if (got == 0) return text;
    if (text.size() + static_cast<std::size_t>(got) > max_bytes) throw too_large();
    text.append(buffer, static_cast<std::size_t>(got));
  }
}

std::string printable(std::string_view text) {
  std::string shown;
  shown.reserve(text.size());
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if ((byte < 0x20 && c != '\t') || byte == 0x7f) {
      shown += fmt::format("\\x{:02x}", byte);
    } else {
      shown += c;
    }
  }
  return shown;
}

}  // namespace kiln::detail
