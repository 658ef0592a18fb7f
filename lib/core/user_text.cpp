// SPDX-License-Identifier: Apache-2.0
// Reading a user's text file with bounds, and echoing a user's text without control characters.
#include "core/user_text.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
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

// The length of the well-formed UTF-8 character that starts `text` (1 for ASCII), or 0 when
// its first byte does not start one.
std::size_t utf8_length(std::string_view text) {
  const auto at = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = at(0);
  if (lead < 0x80) return 1;
  const std::size_t length = lead >= 0xc2 && lead <= 0xdf   ? 2
                             : lead >= 0xe0 && lead <= 0xef ? 3
                             : lead >= 0xf0 && lead <= 0xf4 ? 4
                                                            : 0;
  if (length == 0 || text.size() < length) return 0;
  for (std::size_t k = 1; k < length; ++k) {
    if ((at(k) & 0xc0) != 0x80) return 0;
  }
  // Overlong forms, surrogates and code points past U+10FFFF.
  if ((lead == 0xe0 && at(1) < 0xa0) || (lead == 0xed && at(1) > 0x9f) ||
      (lead == 0xf0 && at(1) < 0x90) || (lead == 0xf4 && at(1) > 0x8f)) {
    return 0;
  }
  return length;
}

bool is_continuation_byte(char c) {
  return (static_cast<unsigned char>(c) & 0xc0) == 0x80;
}

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

std::string escaped(std::string_view text) {
  std::string shown;
  shown.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    const auto byte = static_cast<unsigned char>(text[i]);
    const std::size_t length = utf8_length(text.substr(i));
    // NOTE: C1 controls (0x80-0x9f; 0x9b is CSI) act on terminals that read bytes as Latin-1,
    // and as U+0080-U+009F (0xc2 0x80-0x9f) on UTF-8 ones; other multibyte characters are kept.
    const bool c1 = length == 0   ? byte >= 0x80 && byte <= 0x9f
                    : length == 2 ? byte == 0xc2 && static_cast<unsigned char>(text[i + 1]) <= 0x9f
                                  : false;
    const std::size_t taken = std::max<std::size_t>(length, 1);  // an ill-formed byte alone
    if ((byte < 0x20 && byte != '\t') || byte == 0x7f || c1) {
      for (const char c : text.substr(i, taken)) {
        shown += fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
      }
    } else {
      shown += text.substr(i, taken);
    }
    i += taken;
  }
  return shown;
}

std::string printable(std::string_view text) {
  if (text.size() <= kMaxEchoBytes) return escaped(text);
  // The ends are kept, where a spec's name and a path's file are; each cut between characters.
  std::size_t head = kMaxEchoBytes / 2;
  while (head > 0 && is_continuation_byte(text[head])) --head;
  std::size_t tail = text.size() - kMaxEchoBytes / 2;
  while (tail < text.size() && is_continuation_byte(text[tail])) ++tail;
  return fmt::format("{}[... {} bytes not shown ...]{}", escaped(text.substr(0, head)), tail - head,
                     escaped(text.substr(tail)));
}

void require_no_nul(std::string_view text, std::string_view what) {
  const std::size_t nul = text.find('\0');
  if (nul == std::string_view::npos) return;
  const std::size_t line_start = text.rfind('\n', nul) + 1;  // 0 when there is none
  throw Error(ErrorCategory::invalid_argument,
              fmt::format("{} holds a NUL byte at line {}, column {}: the compiler would take the "
                          "code to end there; remove it",
                          what, std::count(text.begin(), text.begin() + nul, '\n') + 1,
                          nul - line_start + 1));
}

bool is_safe_relative(std::string_view path) {
  if (path.empty() || path.front() == '/') return false;
  const std::filesystem::path p(path);
  return std::none_of(p.begin(), p.end(), [](const auto& part) { return part == ".."; });
}

bool is_within(const std::filesystem::path& path, const std::filesystem::path& dir) {
  return std::mismatch(dir.begin(), dir.end(), path.begin(), path.end()).first == dir.end();
}

bool is_identifier(std::string_view name) {
  if (name.empty() || std::isdigit(static_cast<unsigned char>(name.front()))) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

}  // namespace kiln::detail
