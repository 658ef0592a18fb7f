// SPDX-License-Identifier: Apache-2.0
// LazyCompiler: a Compiler that answers make_unit from the compiler fact memo and loads the real
// compiler's library only when it must.
#pragma once

#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "backend/backend.hpp"
#include "backend/compiler_library.hpp"
#include "backend/compiler_memo.hpp"

namespace kiln::detail {

// NOTE: loading NVRTC costs 7-16 ms, several times a disk-cache hit, and a hit never runs the
// compiler; only computing its key asks the compiler anything. So the answers are kept as the
// memo compilers/<vendor>.json (a MemoStore: the runtime's disk cache) and trusted while the
// library they came from is unchanged (compiler_memo.hpp). A stale memo cannot make a wrong binary:
// anything compiled is keyed with the real compiler's answers (Runtime's compile path), so an
// out-of-date identity only finds entries that compiler version really built.
class LazyCompiler final : public Compiler {
 public:
  // Reads the memo from `memos`, which must outlive it. One that is absent, corrupt or out of
  // date is ignored; the library is then loaded at the first question and the memo rewritten.
  LazyCompiler(CompilerLibrary library, MemoStore& memos);

  Vendor vendor() const override { return library_.vendor; }
  std::string identity() const override;
  std::vector<std::string> canonical_options(const Target& target) const override;
  bool accepts(const Target& target) const override;
  // Loads the compiler: only the message refusing a target asks.
  std::vector<Target> targets() const override;
  CompileResult compile(const CompileRequest& request) const override;

  // The real compiler, loaded at the first call; a failure to load it is remembered and
  // rethrown. Loading it asks again everything the memo says, and rewrites the memo where the
  // answers differ, so from then on this object answers exactly as the real compiler does.
  const Compiler& real() const;

 private:
  TargetFacts target_facts(const Target& target) const;
  void open_locked() const;
  void save_locked() const;

  CompilerLibrary library_;
  MemoStore& memos_;
  std::string name_;  // the memo's, in memos_
  LoaderSignature loader_;

  mutable std::mutex mutex_;
  mutable std::optional<CompilerMemo> memo_;  // all that is known, from the note or the compiler
  mutable std::unique_ptr<Compiler> real_;
  mutable std::exception_ptr open_error_;
};

}  // namespace kiln::detail
