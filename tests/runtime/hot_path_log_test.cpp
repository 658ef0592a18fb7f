// SPDX-License-Identifier: Apache-2.0
// A compile inside a call (Runtime::kernel) is one line at the default log level, with the spec
// and its time; memory and disk hits and warm-up's compiles stay quiet.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "cache/entries.hpp"
#include "core/log.hpp"
#include "kiln/elementwise.hpp"
#include "kiln/runtime.hpp"
#include "support.hpp"

namespace {

using kiln::test::CapturedStderr;
using kiln::test::contains;
using kiln::test::count_of;

kiln::KernelSpec unary(kiln::UnaryOp op) {
  return kiln::unary_spec(op, kiln::DType::f32, {128, 2});
}

}  // namespace

TEST_CASE("a note shows at the default level, warn, and not below it", "[runtime]") {
  CapturedStderr captured;  // at warn
  kiln::detail::note("compiled it");
  kiln::detail::set_log_level(kiln::LogLevel::error);
  kiln::detail::note("hidden");
  kiln::detail::set_log_level(kiln::LogLevel::warn);
  CHECK(captured.text() == "kiln note: compiled it\n");
}

TEST_CASE(
    "a compile on the hot path is one line at the default level, and hits and warm-up are quiet",
    "[gpu][runtime]") {
  KILN_REQUIRE_GPU();
  kiln::test::TempDir dir;
  kiln::Options options = kiln::test::isolated_options(dir.path());
  options.log_level = kiln::LogLevel::warn;
  CapturedStderr captured;
  {
    kiln::Runtime rt(options);
    kiln::KernelSpec spec = unary(kiln::UnaryOp::sqrt);
    rt.kernel(spec);
    REQUIRE(rt.stats().compiles == 1);
    rt.kernel(spec);  // a memory hit
    spec.target = rt.target().name();
    const std::string text = captured.text();
    INFO(text);
    CHECK(count_of(text, "kiln note: compiled ") == 1);
    CHECK(contains(text, kiln::to_string(spec) + " in "));
    CHECK(contains(text, " ms, inside the call that first needed it"));
  }
  kiln::Runtime fresh(options);
  fresh.kernel(unary(kiln::UnaryOp::sqrt));  // a disk hit
  const std::vector<kiln::KernelSpec> warm = {unary(kiln::UnaryOp::silu)};
  CHECK(fresh.warmup(warm).count(kiln::WarmupStatus::compiled) == 1);
  CHECK(fresh.stats().compiles == 1);
  fresh.kernel(warm[0]);  // loaded by the warm-up
  INFO(captured.text());
  CHECK(count_of(captured.text(), "\n") == 1);  // the first compile's note, and nothing else
}
