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
  StubCompiler(std::string vendor, std::string identity)
      : vendor_(std::move(vendor)), identity_(std::move(identity)) {}

  std::string_view vendor() const override { return vendor_; }
  std::string identity() const override { return identity_; }
  std::vector<std::string> canonical_options(std::string_view target) const override {
    return {"--arch=" + std::string(target)};
  }
  bool accepts(std::string_view target) const override {
    return target == "sm_80" || target == "sm_90a";
  }
  std::vector<std::string> targets() const override { return {"sm_80", "sm_90a"}; }
  detail::CompileResult compile(const detail::CompileRequest&) const override { return {}; }

 private:
  std::string vendor_;
  std::string identity_;
};

}  // namespace kiln::test
