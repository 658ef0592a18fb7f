// SPDX-License-Identifier: Apache-2.0
// The compiler fact memo: what make_unit asks a compiler, kept between processes so that a key
// can be computed without loading the compiler's library.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backend/backend.hpp"

namespace kiln::detail {

// A file as stat sees it: enough to notice that it was replaced or rewritten.
struct FileStamp {
  std::string file;
  std::uint64_t size = 0;
  std::int64_t mtime_ns = 0;

  friend bool operator==(const FileStamp&, const FileStamp&) = default;
};

// nullopt when `path` cannot be stat'ed.
std::optional<FileStamp> stamp_of(const std::filesystem::path& path);

// What decides which file the loader opens for a compiler library, read without loading it.
struct LoaderSignature {
  // NOTE: canonical options come from kiln's code, not from the library; a new kiln must not
  // serve an old kiln's options.
  std::string kiln;
  std::vector<std::string> candidates;  // CUDA_HOME, CUDA_PATH, ROCM_PATH are in these
  std::string ld_library_path;
  FileStamp ld_cache;  // /etc/ld.so.cache, which ldconfig rewrites; empty where there is none

  friend bool operator==(const LoaderSignature&, const LoaderSignature&) = default;
};

// The signature for a library looked for as `candidates`, in this process's environment.
LoaderSignature loader_signature(std::span<const std::string> candidates);

// A compiler's answers for one target.
struct TargetFacts {
  bool accepted = false;             // accepts(target)
  std::vector<std::string> options;  // canonical_options(target)

  friend bool operator==(const TargetFacts&, const TargetFacts&) = default;
};

TargetFacts facts_for(const Compiler& compiler, const Target& target);

struct CompilerMemo {
  LoaderSignature loader;
  FileStamp library;     // the file the loader opened
  std::string identity;  // identity()
  std::map<std::string, TargetFacts, std::less<>> targets;

  friend bool operator==(const CompilerMemo&, const CompilerMemo&) = default;
};

// As a small JSON object.
std::string print_memo(const CompilerMemo& memo);

// nullopt for anything that is not a memo print_memo wrote (never throws): a corrupt memo is
// rewritten, never trusted.
std::optional<CompilerMemo> parse_memo(std::string_view text);

// Whether `memo` still describes the library the loader would open: the signature is `loader`,
// and the file the memo recorded is still there with its size and modification time.
bool memo_is_current(const CompilerMemo& memo, const LoaderSignature& loader);

// Where memos are kept between processes, by name ("compilers/cuda.json"): the runtime keeps
// them as notes of its disk cache (runtime/disk_memos.hpp). Best-effort both ways, never
// throwing: a memo that cannot be read is nullopt and asked of the compiler again; one that
// cannot be written is lost.
class MemoStore {
 public:
  virtual ~MemoStore() = default;
  virtual std::optional<std::string> read(std::string_view name) const = 0;
  virtual void write(std::string_view name, std::string_view text) = 0;
};

}  // namespace kiln::detail
