// SPDX-License-Identifier: Apache-2.0
// Text a user hands kiln (kernel sources, manifests, specs): read with bounds, echoed safely.
#pragma once

#include <cstddef>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

namespace kiln::detail {

// The most kiln reads of one kernel source or manifest: far above any real one, low enough that
// a file that never ends (a link to /dev/zero, a growing log) fails fast and names itself.
inline constexpr std::size_t kMaxUserFileBytes = std::size_t{16} << 20;

// The contents of the regular file at `path`, described in errors as `what` ("kernel source",
// "manifest"); nullopt when it does not exist. Throws kiln::Error naming the file for anything
// that is not a regular file (a directory, a FIFO, a device), one larger than `max_bytes`, and
// any other failure to read it. Never blocks on a FIFO.
std::optional<std::string> read_user_file(const std::filesystem::path& path, std::string_view what,
                                          std::size_t max_bytes = kMaxUserFileBytes);

// `text` with every control character (but tab) written as \xNN, so that a message echoing a
// user's text cannot move the cursor, clear the screen or retitle the terminal. For messages,
// whose user text printable() has bounded already; printable() for the user's text itself.
std::string escaped(std::string_view text);

// The most of a user's text that printable() echoes: a message quoting a 15 MB manifest line
// names it by its ends.
inline constexpr std::size_t kMaxEchoBytes = 1024;

// escaped(text), and when `text` is longer than kMaxEchoBytes, only its first and last
// kMaxEchoBytes / 2 bytes, around a note of how many are left out.
std::string printable(std::string_view text);

// Throws kiln::Error (invalid_argument) naming `what` and the line and column of the first NUL
// byte of `text`, when it holds one: the compilers take code as a C string, which ends there.
void require_no_nul(std::string_view text, std::string_view what);

// Whether `path` is relative and has no `..`, so that it names a file below the directory it is
// taken from (symbolic links aside).
bool is_safe_relative(std::string_view path);

// Whether `path` is `dir` or below it; both canonical.
bool is_within(const std::filesystem::path& path, const std::filesystem::path& dir);

// Whether `name` is a C++ identifier: a letter or '_', then letters, digits and '_'.
bool is_identifier(std::string_view name);

}  // namespace kiln::detail
