// SPDX-License-Identifier: Apache-2.0
// LazyCompiler: the compiler's answers from the fact memo; its library loaded only when needed.
#include "backend/lazy_compiler.hpp"

#include <fmt/format.h>

#include <utility>

#include "core/log.hpp"

namespace kiln::detail {

LazyCompiler::LazyCompiler(CompilerLibrary library, MemoStore& memos)
    : library_(std::move(library)),
      memos_(memos),
      name_(fmt::format("compilers/{}.json", to_string(library_.vendor))),
      loader_(loader_signature(library_.candidates)) {
  const std::optional<std::string> text = memos_.read(name_);
  if (!text) return;
  std::optional<CompilerMemo> memo = parse_memo(*text);
  if (memo && memo_is_current(*memo, loader_)) {
    memo_ = std::move(memo);
  } else {
    log(LogLevel::debug, "compiler memo {} is {}; {} will be loaded and the memo rewritten", name_,
        memo ? "out of date" : "unreadable", library_.what);
  }
}

std::string LazyCompiler::identity() const {
  std::lock_guard lock(mutex_);
  if (!memo_) open_locked();
  return memo_->identity;
}

std::vector<std::string> LazyCompiler::canonical_options(const Target& target) const {
  return target_facts(target).options;
}

bool LazyCompiler::accepts(const Target& target) const {
  return target_facts(target).accepted;
}

std::vector<Target> LazyCompiler::targets() const {
  return real().targets();
}

CompileResult LazyCompiler::compile(const CompileRequest& request) const {
  return real().compile(request);
}

const Compiler& LazyCompiler::real() const {
  std::lock_guard lock(mutex_);
  open_locked();
  return *real_;
}

TargetFacts LazyCompiler::target_facts(const Target& target) const {
  const std::string name = target.name();
  std::lock_guard lock(mutex_);
  if (memo_) {
    if (const auto known = memo_->targets.find(name); known != memo_->targets.end()) {
      return known->second;
    }
  }
  open_locked();
  TargetFacts facts = facts_for(*real_, target);
  memo_->targets.emplace(name, facts);
  save_locked();
  return facts;
}

void LazyCompiler::open_locked() const {
  if (real_) return;
  if (open_error_) std::rethrow_exception(open_error_);
  OpenedCompiler opened;
  try {
    opened = open_compiler(library_);
  } catch (...) {
    open_error_ = std::current_exception();
    throw;
  }
  real_ = std::move(opened.compiler);
  CompilerMemo fresh{loader_, stamp_of(opened.file).value_or(FileStamp{}), real_->identity(), {}};
  if (!memo_) {
    // NOTE: saved with the first target's answers, which make_unit asks next: one write, not two.
    memo_ = std::move(fresh);
    return;
  }
  for (const auto& [target, facts] : memo_->targets) {
    // NOTE: a name that is no target (a memo from another build) is dropped, never asked.
    if (const std::optional<Target> parsed = Target::parse(target)) {
      fresh.targets.emplace(target, facts_for(*real_, *parsed));
    }
  }
  if (fresh == *memo_) return;
  log(LogLevel::info, "compiler memo {} said {}, but {} is {}; rewriting it", name_,
      memo_->identity, opened.file.string(), fresh.identity);
  memo_ = std::move(fresh);
  save_locked();
}

void LazyCompiler::save_locked() const {
  // NOTE: without the file the loader opened, a memo could never be shown current again.
  if (!memo_->library.file.empty()) memos_.write(name_, print_memo(*memo_));
}

}  // namespace kiln::detail
