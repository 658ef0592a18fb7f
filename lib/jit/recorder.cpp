// Recorder: KILN_RECORD's manifest of the specs a run asks for, written as they are asked for.
#include "jit/recorder.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string_view>
#include <system_error>
#include <utility>

#include "kiln/spec.hpp"
#include "log.hpp"

namespace kiln::detail {
namespace {

// Appends `line` and a newline to the file at `path` with one write() on an O_APPEND descriptor,
// so that lines from concurrent threads and processes never interleave. A new file is 0644, as
// cache entries are: readable by all, writable by its owner only, since `kiln warm` compiles
// what it lists. A failure is one warning per file: recording never fails a call.
void append_line(const std::filesystem::path& path, std::string_view line) {
  const std::string text = std::string(line) + '\n';
  int error = 0;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    error = errno;
  } else {
    const ssize_t wrote = ::write(fd, text.data(), text.size());
    if (wrote < 0) error = errno;
    if (wrote >= 0 && static_cast<std::size_t>(wrote) != text.size()) error = ENOSPC;
    ::close(fd);
  }
  if (error != 0) {
    warn_once("record " + path.string(),
              fmt::format("cannot append to the spec record {}: {}; calls go on "
                          "unrecorded (point KILN_RECORD at a file you can write)",
                          path.string(), std::strerror(error)));
  }
}

// Writes `text` to `path` (its directory created) through a temp file renamed over it, so that a
// reader never sees half of it; failures warn once, as append_line's.
void write_record_file(const std::filesystem::path& path, std::string_view text) {
  std::error_code ec;
  std::filesystem::create_directories(path.parent_path(), ec);
  const std::filesystem::path temp = path.string() + fmt::format(".{}.tmp", ::getpid());
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    out << text;
    out.close();
    if (!out) ec = std::make_error_code(std::errc::io_error);
  }
  if (!ec) std::filesystem::rename(temp, path, ec);
  if (ec) {
    std::filesystem::remove(temp);
    warn_once("record " + path.string(),
              fmt::format("cannot write the variant code {} beside the spec record: {}; "
                          "its specs are recorded but will not warm (point KILN_RECORD at "
                          "a file in a directory you can write)",
                          path.string(), ec.message()));
  }
}

}  // namespace

Recorder::Recorder(std::optional<std::filesystem::path> manifest)
    : manifest_(std::move(manifest)) {}

void Recorder::record(const Unit& unit) {
  if (!manifest_) return;
  // NOTE: one lock over the writes too: a variant's declaration must precede every spec line
  // that names it. Each spec is recorded once, so this is off the hot path.
  std::lock_guard lock(mutex_);
  if (!recorded_.insert(unit.spec).second) return;
  const KernelSpec& kernel = unit.kernel;
  if (!kernel.variant_code.empty()) {
    const std::string file = fmt::format("{}.variants/{}-{}.cuh", manifest_->filename().string(),
                                         kernel.variant_name, variant_hash(kernel.variant_code));
    if (recorded_.insert(file).second) {
      write_record_file(manifest_->parent_path() / file, kernel.variant_code);
      append_line(*manifest_, fmt::format("variant {} {}", kernel.variant_name, file));
    }
  }
  append_line(*manifest_, unit.spec);
}

}  // namespace kiln::detail
