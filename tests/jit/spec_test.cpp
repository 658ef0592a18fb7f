// SPDX-License-Identifier: Apache-2.0
// KernelSpec's canonical form, its parser and the generated unit.
#include <catch2/catch.hpp>

#include "jit/unit.hpp"
#include "kiln/error.hpp"
#include "kiln/spec.hpp"

#include <optional>
#include <span>
#include <string>
#include <vector>

namespace {

kiln::KernelSpec sample() {
  kiln::KernelSpec spec{
      .source = "elementwise/unary.cuh", .entry = "kiln::unary", .params = "kiln::UnaryParams"};
  spec.set("op", 4).set("dtype", kiln::DType::bf16).set("block_size", 256).set("fast", true);
  return spec;
}

// sample()'s canonical line with `suffix` after its Params.
std::string sample_text_with(std::string_view suffix) {
  return kiln::to_string(sample()) + std::string(suffix);
}

}  // namespace

TEST_CASE("to_string sorts constants and prints every field", "[jit][spec]") {
  kiln::KernelSpec spec = sample();
  spec.options = {"-DA=1", "-DB"};
  spec.target = "sm_90a";
  CHECK(kiln::to_string(spec) ==
        "elementwise/unary.cuh:kiln::unary<block_size=256,dtype=bf16,fast=true,op=4>"
        "(kiln::UnaryParams) [-DA=1 -DB] @sm_90a");
}

TEST_CASE("the order constants are set in does not change the canonical form", "[jit][spec]") {
  kiln::KernelSpec a = sample();
  kiln::KernelSpec b{.source = a.source, .entry = a.entry, .params = a.params};
  b.set("fast", true).set("block_size", 256).set("dtype", kiln::DType::bf16).set("op", 4);
  CHECK(kiln::to_string(a) == kiln::to_string(b));
}

TEST_CASE("set replaces a constant of the same name", "[jit][spec]") {
  kiln::KernelSpec spec = sample();
  spec.set("op", 7);
  CHECK(spec.constants.size() == 4);
  CHECK(kiln::to_string(spec).find("op=7") != std::string::npos);
}

TEST_CASE("hash_value is equal for equal specs and tells each field apart", "[jit][spec]") {
  const kiln::KernelSpec spec = sample();
  CHECK(kiln::hash_value(spec) == kiln::hash_value(sample()));
  CHECK(std::hash<kiln::KernelSpec>{}(spec) == kiln::hash_value(spec));
  // A change in any one field changes the hash (for these values; a hash may collide, and the
  // runtime's map compares specs on a match).
  std::vector<kiln::KernelSpec> changed(7, spec);
  changed[0].source = "elementwise/unary2.cuh";
  changed[1].entry = "kiln::binary";
  changed[2].params = "kiln::BinaryParams";
  changed[3].set("op", 5);
  changed[4].set("fast", false);
  changed[5].options.push_back("-DX=1");
  changed[6].target = "sm_90a";
  for (const kiln::KernelSpec& other : changed) {
    INFO(kiln::to_string(other));
    CHECK(kiln::hash_value(other) != kiln::hash_value(spec));
  }
}

TEST_CASE("parse_spec reads what to_string prints", "[jit][spec]") {
  kiln::KernelSpec spec = sample();
  spec.set("neg", -12);
  for (const auto& [options, target] :
       std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{}, ""}, {{"-DX"}, ""}, {{}, "gfx90a"}, {{"-DX", "-DY=2"}, "sm_80"}}) {
    spec.options = options;
    spec.target = target;
    const std::string text = kiln::to_string(spec);
    const kiln::KernelSpec parsed = kiln::parse_spec(text);
    CHECK(kiln::to_string(parsed) == text);
    CHECK(parsed.target == target);
    CHECK(parsed.options == options);
  }
}

TEST_CASE("parse_spec takes a variant's code from the variants it is given, by name and hash",
          "[jit][spec][variant]") {
  const kiln::Variant shift{.name = "shift", .code = "struct kiln_variant {};"};
  const kiln::Variant other{.name = "shift", .code = "struct kiln_variant { };"};
  kiln::KernelSpec spec = sample();
  spec.variant_name = shift.name;
  spec.variant_code = shift.code;
  spec.options = {"-DX"};
  spec.target = "sm_90a";
  const std::string text = kiln::to_string(spec);
  CHECK_THAT(text,
             Catch::Contains(" {variant shift " + kiln::variant_hash(shift.code) + "} [-DX]"));
  // Of two variants of one name, the one whose code hashes as printed.
  const std::vector<kiln::Variant> both{other, shift};
  const kiln::KernelSpec parsed = kiln::parse_spec(text, both);
  CHECK(kiln::to_string(parsed) == text);
  CHECK(parsed.variant_name == "shift");
  CHECK(parsed.variant_code == shift.code);

  const auto category = [&](std::span<const kiln::Variant> variants) {
    try {
      kiln::parse_spec(text, variants);
    } catch (const kiln::Error& e) {
      return std::optional(e.category());
    }
    return std::optional<kiln::ErrorCategory>();
  };
  CHECK(category({}) == kiln::ErrorCategory::unsupported);
  CHECK_THROWS_WITH(kiln::parse_spec(text), Catch::Contains("a line `variant shift FILE`"));
  CHECK(category(std::span(&other, 1)) == kiln::ErrorCategory::not_found);
  CHECK_THROWS_WITH(
      kiln::parse_spec(text, std::span(&other, 1)),
      Catch::Contains("the code declared for shift hashes to " + kiln::variant_hash(other.code)));
  const kiln::Variant unrelated{.name = "alibi", .code = shift.code};
  CHECK_THROWS_WITH(kiln::parse_spec(text, std::span(&unrelated, 1)),
                    Catch::Contains("the user variant shift, which is not declared"));
  CHECK_THROWS_WITH(kiln::parse_spec(sample_text_with(" {variant shift}"), both),
                    Catch::Contains("'{variant' must be followed by NAME HASH and '}'"));
}

TEST_CASE("parse_spec names what is wrong", "[jit][spec]") {
  const auto message = [](std::string_view text) {
    try {
      kiln::parse_spec(text);
    } catch (const kiln::Error& e) {
      CHECK(e.category() == kiln::ErrorCategory::invalid_argument);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(message("a.cuh:f<x=1"), Catch::Contains("missing"));
  CHECK_THAT(message("a.cuh:f<x=one>(P)"), Catch::Contains("value 'one'"));
  CHECK_THAT(message("a.cuh:f<x=1,x=2>(P)"), Catch::Contains("'x' appears twice"));
  CHECK_THAT(message("a.cuh:f<x>(P)"), Catch::Contains("not name=value"));
  // A spec is echoed in messages and reports, so it cannot drive the terminal.
  const std::string escaped = message("a.cuh:f\x1b]0;title\x07<x=1>(P)");
  CHECK_THAT(escaped, Catch::Contains("'a.cuh:f\\x1b]0;title\\x07<x=1>(P)'"));
  CHECK_THAT(escaped, Catch::Contains("control character \\x1b at offset 7"));
  CHECK(escaped.find('\x1b') == std::string::npos);
}

TEST_CASE("the generated unit includes the source, defines kiln_spec and checks the layout",
          "[jit][spec]") {
  kiln::KernelSpec spec = sample();
  spec.set("dtype32", kiln::DType::f32).set("count", std::int64_t{1} << 40);
  const auto& layout = kiln::detail::params_layout(spec.params);
  const std::string source = kiln::detail::render_source(spec, layout);
  CHECK_THAT(source, Catch::Contains("#include \"kiln/params/elementwise.h\""));
  CHECK_THAT(source, Catch::Contains("#include \"elementwise/unary.cuh\""));
  CHECK_THAT(source, Catch::Contains("static constexpr long long block_size = 256LL;"));
  CHECK_THAT(source, Catch::Contains("static constexpr long long count = 1099511627776LL;"));
  CHECK_THAT(source, Catch::Contains("static constexpr bool fast = true;"));
  CHECK_THAT(source, Catch::Contains("using dtype = kiln::bf16;"));
  CHECK_THAT(source, Catch::Contains("using dtype32 = float;"));
  CHECK_THAT(
      source,
      Catch::Contains("static_assert(sizeof(kiln::UnaryParams) == " + std::to_string(layout.size) +
                      " && alignof(kiln::UnaryParams) == " + std::to_string(layout.alignment)));
}

TEST_CASE("an unknown Params type is refused with the known ones listed", "[jit][spec]") {
  try {
    kiln::detail::params_layout("kiln::NoSuchParams");
    FAIL("no error");
  } catch (const kiln::Error& e) {
    CHECK_THAT(e.what(),
               Catch::Contains("kiln::NoSuchParams") && Catch::Contains("kiln::UnaryParams"));
  }
}
