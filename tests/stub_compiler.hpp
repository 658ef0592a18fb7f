// SPDX-License-Identifier: Apache-2.0
// A compiler that compiles nothing, for tests that need only what it says of itself: its vendor,
// identity and options (cache keys) and the targets it accepts (the compiler memo).
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backend/backend.hpp"

namespace kiln::test {

class StubCompiler final : public detail::Compiler {
 public:
  StubCompiler(Vendor vendor, std::string identity)
      : vendor_(vendor), identity_(std::move(identity)) {}

  Vendor vendor() const override { return vendor_; }
  std::string identity() const override { return identity_; }
  std::vector<std::string> canonical_options(const Target& target) const override {
    return {"--arch=" + target.name()};
  }
  bool accepts(const Target& target) const override {
    return target == "sm_80" || target == "sm_90a";
  }
  std::vector<Target> targets() const override { return {"sm_80", "sm_90a"}; }
  detail::CompileResult compile(const detail::CompileRequest&) const override { return {}; }

 private:
  Vendor vendor_;
  std::string identity_;
};

}  // namespace kiln::test
