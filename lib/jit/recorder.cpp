// SPDX-License-Identifier: Apache-2.0
// Recorder: KILN_RECORD's manifest of the specs a run asks for, written as they are asked for.
#include "jit/recorder.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string_view>
#include <utility>

#include "cache/file_io.hpp"
#include "cache/trust.hpp"
#include "core/log.hpp"
#include "core/user_text.hpp"
#include "kiln/spec.hpp"

namespace kiln::detail {
namespace {

namespace fs = std::filesystem;

// The record and its variant code, as cache entries are: readable by all, writable by their
// owner only, since `kiln warm` compiles what they hold.
constexpr mode_t kRecordMode = 0644;
constexpr mode_t kVariantsDirMode = 0755;
// The most characters of a variant's name that go into its code file's name: with the code's
// hash and a temp file's suffix, far below the 255 bytes a file name may have. The hash keeps
// the names apart (one code under two long names is one file, rightly).
constexpr std::size_t kMaxNameInFile = 64;
constexpr Guarded kRecordGuarded{"the spec record",
                                 "plant variant code there that `kiln warm` compiles",
                                 "rewrite the specs `kiln warm` compiles"};
constexpr const char* kNotRegular = "it is not a regular file";

// Why a record named `name` could not be read back by `kiln warm`, or empty: its `variant`
// lines name files below it, and a manifest line's text ends at '#' or a line break and loses
// its leading blanks.
std::string unreadable_name(std::string_view name) {
  if (name.find_first_of("#\n\r") == std::string_view::npos && !name.starts_with(' ') &&
      !name.starts_with('\t')) {
    return {};
  }
  return "its file name holds '#', a line break or a leading blank, which `kiln warm` cannot "
         "read in the record's `variant` lines: name a file without them";
}

// Appends `lines` to the record `path`, named in the open directory `dir`, with one write() on
// an O_APPEND descriptor, so that lines from concurrent threads and processes never interleave.
// Writes only to a regular file that this user or root owns and no one else may write: never
// through a link, never waiting on a FIFO. Returns why not, or empty.
std::string append_lines(int dir, const fs::path& path, std::string_view lines) {
  // NOTE: O_NONBLOCK makes the open of a FIFO with no reader fail (ENXIO) rather than wait.
  const Fd file(::openat(dir, path.filename().c_str(),
                         O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC,
                         kRecordMode));
  if (!file.ok()) return file.error() == ENXIO ? kNotRegular : describe(file.error());
  struct stat info {};
  if (::fstat(file.get(), &info) != 0) return describe(errno);
  if (!S_ISREG(info.st_mode)) return kNotRegular;
  if (std::string why = untrusted_path(path, info, ::geteuid(), TrustPlace::file, kRecordGuarded);
      !why.empty()) {
    return why;
  }
  const ssize_t wrote = ::write(file.get(), lines.data(), lines.size());
  if (wrote < 0) return describe(errno);
  return static_cast<std::size_t>(wrote) == lines.size() ? std::string() : describe(ENOSPC);
}

// Writes `code` to the file `name` in the directory `variants` of the open directory `dir`
// (at `dir_path`), published whole. Returns why not, or empty.
std::string write_variant(int dir, const fs::path& dir_path, const std::string& variants,
                          const std::string& name, std::string_view code) {
  const CheckedDir opened =
      open_checked_subdir(dir, dir_path, variants, kVariantsDirMode, kRecordGuarded);
  if (!opened.untrusted.empty()) return opened.untrusted;
  const int error = opened.fd.ok() ? publish(opened.fd.get(), name, kRecordMode,
                                             [&](int fd) { return write_all(fd, code); })
                                   : opened.fd.error();
  if (error == 0) return {};
  return fmt::format("its variant code cannot be written in {} ({})",
                     (dir_path / variants).string(), describe(error));
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
  if (const std::string why = write(unit); !why.empty()) {
    // NOTE: printable, as the path may hold any byte.
    warn_once("record " + manifest_->string(),
              printable(fmt::format("cannot record specs in {}: {}; calls go on, unrecorded "
                                    "(point KILN_RECORD at a regular file of yours in a "
                                    "directory you can write)",
                                    manifest_->string(), why)));
  }
}

std::string Recorder::write(const Unit& unit) {
  const std::string name = manifest_->filename().string();
  if (std::string why = unreadable_name(name); !why.empty()) return why;
  const fs::path dir_path = manifest_->has_parent_path() ? manifest_->parent_path() : ".";
  const CheckedDir dir = open_checked_parent(dir_path, kRecordGuarded);
  if (!dir.untrusted.empty()) return dir.untrusted;
  if (!dir.fd.ok()) {
    return fmt::format("{} cannot be opened ({})", dir_path.string(), describe(dir.fd.error()));
  }
  std::string lines;
  std::string declared;
  const KernelSpec& kernel = unit.kernel;
  if (!kernel.variant_code.empty()) {
    const std::string variants = name + ".variants";
    const std::string file =
        fmt::format("{}-{}.cuh", std::string_view(kernel.variant_name).substr(0, kMaxNameInFile),
                    variant_hash(kernel.variant_code));
    std::string path = variants + '/' + file;
    // NOTE: a spec whose code could not be written is left out, so that the record still warms.
    if (!recorded_.contains(path)) {
      std::string why = write_variant(dir.fd.get(), dir_path, variants, file, kernel.variant_code);
      if (!why.empty()) return why;
      lines = fmt::format("variant {} {}\n", kernel.variant_name, path);
      declared = std::move(path);
    }
  }
  lines += unit.spec + '\n';
  if (std::string why = append_lines(dir.fd.get(), *manifest_, lines); !why.empty()) return why;
  if (!declared.empty()) recorded_.insert(std::move(declared));
  return {};
}

}  // namespace kiln::detail
