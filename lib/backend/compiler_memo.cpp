// SPDX-License-Identifier: Apache-2.0
// The compiler fact memo: its JSON form and the checks that decide whether it can be trusted.
#include "backend/compiler_memo.hpp"

#include <sys/stat.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

namespace kiln::detail {

using json = nlohmann::json;

// NOTE: in kiln::detail itself, not an unnamed namespace, so that nlohmann's lookup of to_json
// and from_json by argument finds them.
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(FileStamp, file, size, mtime_ns)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(LoaderSignature, kiln, candidates, ld_library_path, ld_cache)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(TargetFacts, accepted, options)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(CompilerMemo, loader, library, identity, targets)

namespace {

// Bumped when the JSON's shape or the meaning of an answer changes; a memo of another format is
// ignored and rewritten. 2: hipRTC accepts only the targets comgr lists (1 took any gfx name).
constexpr int kMemoFormat = 2;

}  // namespace

std::optional<FileStamp> stamp_of(const std::filesystem::path& path) {
  struct stat info {};
  if (path.empty() || ::stat(path.c_str(), &info) != 0) return std::nullopt;
  return FileStamp{path.string(), static_cast<std::uint64_t>(info.st_size),
                   std::int64_t{info.st_mtim.tv_sec} * 1'000'000'000 + info.st_mtim.tv_nsec};
}

LoaderSignature loader_signature(std::span<const std::string> candidates) {
  const char* ld_library_path = std::getenv("LD_LIBRARY_PATH");
  return {KILN_VERSION,
          {candidates.begin(), candidates.end()},
          ld_library_path != nullptr ? ld_library_path : "",
          stamp_of("/etc/ld.so.cache").value_or(FileStamp{})};
}

TargetFacts facts_for(const Compiler& compiler, const Target& target) {
  return {compiler.accepts(target), compiler.canonical_options(target)};
}

std::string print_memo(const CompilerMemo& memo) {
  json object = memo;
  object["memo"] = kMemoFormat;
  return object.dump(2) + "\n";
}

std::optional<CompilerMemo> parse_memo(std::string_view text) {
  const json object = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!object.is_object() || object.value("memo", json()) != kMemoFormat) return std::nullopt;
  try {
    return object.get<CompilerMemo>();
  } catch (const json::exception&) {
    return std::nullopt;  // a field missing or of the wrong type
  }
}

bool memo_is_current(const CompilerMemo& memo, const LoaderSignature& loader) {
  return memo.loader == loader && stamp_of(memo.library.file) == memo.library;
}

}  // namespace kiln::detail
