// SPDX-License-Identifier: Apache-2.0
// KernelSpec: setters, the canonical one-line form and its parser.
#include "kiln/spec.hpp"

#include <algorithm>
#include <charconv>

#include <fmt/format.h>
#include <fmt/ranges.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "core/user_text.hpp"
#include "kiln/error.hpp"

namespace kiln {
namespace {

constexpr DType kAllDTypes[] = {DType::f16, DType::bf16, DType::f32,  DType::f64,
                                DType::i32, DType::i64,  DType::e4m3, DType::e5m2};

KernelSpec& set_constant(KernelSpec& spec, std::string name,
                         std::variant<std::int64_t, bool, DType> value) {
  auto it = std::find_if(spec.constants.begin(), spec.constants.end(),
                         [&](const Constant& c) { return c.name == name; });
  if (it != spec.constants.end()) {
    it->value = value;
  } else {
    spec.constants.push_back({std::move(name), value});
  }
  return spec;
}

std::string value_text(const Constant& constant) {
  if (const auto* b = std::get_if<bool>(&constant.value)) return *b ? "true" : "false";
  if (const auto* d = std::get_if<DType>(&constant.value)) return std::string(to_string(*d));
  return std::to_string(std::get<std::int64_t>(constant.value));
}

[[noreturn]] void bad_spec(std::string_view text, std::string_view why) {
  throw Error(ErrorCategory::invalid_argument,
              fmt::format("cannot parse kernel spec '{}': {}; expected the form "
                          "'source.cuh:ns::entry<name=value,...>(ns::Params) [options] @target'",
                          detail::printable(text), why));
}

std::variant<std::int64_t, bool, DType> parse_value(std::string_view text, std::string_view value) {
  if (value == "true") return true;
  if (value == "false") return false;
  for (DType d : kAllDTypes) {
    if (value == to_string(d)) return d;
  }
  std::int64_t number = 0;
  auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), number);
  if (ec != std::errc() || ptr != value.data() + value.size()) {
    bad_spec(text, fmt::format("value '{}' is not an integer, true, false or a dtype", value));
  }
  return number;
}

// The user variant that `named` (" {variant NAME HASH}") names, from `variants`, into `spec`.
void set_variant(KernelSpec& spec, std::string_view text, std::string_view named,
                 std::span<const Variant> variants) {
  std::string_view fields = named.substr(std::string_view(" {variant ").size());
  const std::size_t space = fields.find(' ');
  if (space == std::string_view::npos || !fields.ends_with('}')) {
    bad_spec(text, "'{variant' must be followed by NAME HASH and '}'");
  }
  const std::string_view name = fields.substr(0, space);
  const std::string_view hash = fields.substr(space + 1, fields.size() - space - 2);
  if (variants.empty()) {
    throw Error(
        ErrorCategory::unsupported,
        fmt::format("kernel spec '{}' names the user variant {}, whose code a spec line "
                    "does not carry: in a manifest, declare it before the spec with a "
                    "line `variant {} FILE` (the file holding its code); from code, make "
                    "its specs with the kiln::Variant (AttentionProblem::variant, "
                    "DecodeProblem::variant)",
                    detail::printable(text), detail::printable(name), detail::printable(name)));
  }
  std::vector<std::string> seen;
  for (const Variant& variant : variants) {
    if (variant.name != name) continue;
    const std::string code_hash = variant_hash(variant.code);
    if (code_hash == hash) {
      spec.variant_name = variant.name;
      spec.variant_code = variant.code;
      return;
    }
    seen.push_back(code_hash);
  }
  throw Error(
      ErrorCategory::not_found,
      seen.empty()
          ? fmt::format("kernel spec '{}' names the user variant {}, which is not "
                        "declared: add a line `variant {} FILE` before it",
                        detail::printable(text), detail::printable(name), detail::printable(name))
          : fmt::format("kernel spec '{}' names the user variant {} with code hash {}, but "
                        "the code declared for {} hashes to {}: the code changed since the "
                        "spec was made; declare the code it was made with, or make the "
                        "spec again",
                        detail::printable(text), detail::printable(name), detail::printable(hash),
                        detail::printable(name), fmt::join(seen, " and ")));
}

}  // namespace

std::string_view to_string(DType dtype) noexcept {
  switch (dtype) {
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::e4m3: return "e4m3";
    case DType::e5m2: return "e5m2";
  }
  return "?";
}

std::size_t size_of(DType dtype) noexcept {
  switch (dtype) {
    case DType::e4m3:
    case DType::e5m2: return 1;
    case DType::f16:
    case DType::bf16: return 2;
    case DType::f32:
    case DType::i32: return 4;
    case DType::f64:
    case DType::i64: return 8;
  }
  return 0;
}

KernelSpec& KernelSpec::set(std::string name, std::int64_t value) {
  return set_constant(*this, std::move(name), value);
}
KernelSpec& KernelSpec::set(std::string name, bool value) {
  return set_constant(*this, std::move(name), value);
}
KernelSpec& KernelSpec::set(std::string name, DType value) {
  return set_constant(*this, std::move(name), value);
}

std::string to_string(const KernelSpec& spec) {
  std::vector<const Constant*> sorted;
  sorted.reserve(spec.constants.size());
  for (const Constant& c : spec.constants) sorted.push_back(&c);
  std::sort(sorted.begin(), sorted.end(),
            [](const Constant* a, const Constant* b) { return a->name < b->name; });
  std::string text = spec.source + ":" + spec.entry + "<";
  for (std::size_t i = 0; i < sorted.size(); ++i) {
    if (i) text += ',';
    text += sorted[i]->name + "=" + value_text(*sorted[i]);
  }
  text += ">(" + spec.params + ")";
  if (!spec.variant_code.empty()) {
    text += fmt::format(" {{variant {} {}}}", spec.variant_name, variant_hash(spec.variant_code));
  }
  if (!spec.options.empty()) {
    text += " [";
    for (std::size_t i = 0; i < spec.options.size(); ++i) {
      if (i) text += ' ';
      text += spec.options[i];
    }
    text += "]";
  }
  if (!spec.target.empty()) text += " @" + spec.target;
  return text;
}

std::size_t hash_value(const KernelSpec& spec) noexcept {
  std::size_t h = 0;
  // boost's hash_combine step: order matters, so "ab","c" and "a","bc" differ by position.
  const auto mix = [&h](std::size_t value) {
    h ^= value + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  };
  const std::hash<std::string_view> text;
  for (std::string_view field :
       {std::string_view(spec.source), std::string_view(spec.entry), std::string_view(spec.params),
        std::string_view(spec.target), std::string_view(spec.variant_name),
        std::string_view(spec.variant_code)}) {
    mix(text(field));
  }
  for (const Constant& c : spec.constants) {
    mix(text(c.name));
    mix(c.value.index());
    std::visit([&](auto value) { mix(static_cast<std::size_t>(value)); }, c.value);
  }
  for (const std::string& option : spec.options) mix(text(option));
  return h;
}

std::string variant_hash(std::string_view code) {
  return fmt::format("{:016x}", XXH3_64bits(code.data(), code.size()));
}

KernelSpec parse_spec(std::string_view text, std::span<const Variant> variants) {
  // NOTE: no field of a spec has a use for one, and a spec is echoed in messages and reports.
  if (const auto control =
          std::find_if(text.begin(), text.end(),
                       [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; });
      control != text.end()) {
    bad_spec(text, fmt::format("it holds the control character {} at offset {}",
                               detail::printable(std::string_view(&*control, 1)),
                               control - text.begin()));
  }
  KernelSpec spec;
  std::string_view rest = text;
  while (!rest.empty() && rest.back() == ' ') rest.remove_suffix(1);
  if (const std::size_t at = rest.rfind(" @"); at != std::string_view::npos) {
    spec.target = std::string(rest.substr(at + 2));
    rest = rest.substr(0, at);
    if (spec.target.empty() || spec.target.find(' ') != std::string::npos) {
      bad_spec(text, fmt::format("target '{}' after ' @' must be one word, such as sm_90a",
                                 detail::printable(spec.target)));
    }
  }
  if (!rest.empty() && rest.back() == ']') {
    const std::size_t open = rest.rfind(" [");
    if (open == std::string_view::npos) bad_spec(text, "']' without ' ['");
    std::string_view options = rest.substr(open + 2, rest.size() - open - 3);
    rest = rest.substr(0, open);
    while (!options.empty()) {
      const std::size_t space = std::min(options.find(' '), options.size());
      if (space > 0) spec.options.emplace_back(options.substr(0, space));
      options.remove_prefix(std::min(space + 1, options.size()));
    }
  }
  if (const std::size_t at = rest.find(" {variant "); at != std::string_view::npos) {
    set_variant(spec, text, rest.substr(at), variants);
    rest = rest.substr(0, at);
  }
  // NOTE: spaces only separate the options and the target, so no other part may hold one: the
  // canonical form must parse back to the same spec.
  if (rest.find(' ') != std::string_view::npos) {
    bad_spec(text, "a space outside the options; only ' [options]' and ' @target' follow ')'");
  }
  const std::size_t colon = rest.find(':');
  const std::size_t open = rest.find('<');
  const std::size_t close = rest.rfind(">(");
  if (colon == std::string_view::npos || open == std::string_view::npos ||
      close == std::string_view::npos || open < colon || close < open || rest.back() != ')') {
    bad_spec(text, "missing ':', '<', '>(' or the closing ')'");
  }
  spec.source = std::string(rest.substr(0, colon));
  spec.entry = std::string(rest.substr(colon + 1, open - colon - 1));
  spec.params = std::string(rest.substr(close + 2, rest.size() - close - 3));
  std::string_view constants = rest.substr(open + 1, close - open - 1);
  while (!constants.empty()) {
    const std::size_t comma = std::min(constants.find(','), constants.size());
    const std::string_view item = constants.substr(0, comma);
    const std::size_t eq = item.find('=');
    if (eq == std::string_view::npos || eq == 0) {
      bad_spec(text, fmt::format("constant '{}' is not name=value", item));
    }
    const std::string name(item.substr(0, eq));
    if (std::any_of(spec.constants.begin(), spec.constants.end(),
                    [&](const Constant& c) { return c.name == name; })) {
      bad_spec(text, fmt::format("constant '{}' appears twice", name));
    }
    spec.constants.push_back({name, parse_value(text, item.substr(eq + 1))});
    constants.remove_prefix(std::min(comma + 1, constants.size()));
  }
  return spec;
}

}  // namespace kiln
