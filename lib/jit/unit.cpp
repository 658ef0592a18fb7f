// SPDX-License-Identifier: Apache-2.0
// Spec -> generated unit -> key.
#include "jit/unit.hpp"

#include <algorithm>
#include <cctype>
#include <cstring>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cache/disk.hpp"
#include "core/user_text.hpp"
#include "kiln/error.hpp"

namespace kiln::detail {
namespace {

bool is_qualified_identifier(std::string_view name) {
  while (true) {
    const std::size_t sep = name.find("::");
    if (!is_identifier(name.substr(0, sep))) return false;
    if (sep == std::string_view::npos) return true;
    name.remove_prefix(sep + 2);
  }
}

[[noreturn]] void bad(const KernelSpec& spec, const std::string& why) {
  throw Error(ErrorCategory::invalid_argument,
              fmt::format("kernel spec {} is invalid: {}", printable(to_string(spec)), why));
}

bool is_digits(std::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return std::isdigit(static_cast<unsigned char>(c));
  });
}

// The options a spec may add: those that only change how the unit is compiled. Any other could
// name a file for the compiler to read (--include-path, --pre-include, -I, -include), which
// the key would not cover and whose bytes would show in the log.
constexpr std::string_view kAllowedOptions =
    "-DNAME, -DNAME=VALUE, -UNAME, --use_fast_math, -ffast-math, -lineinfo, "
    "--generate-line-info, --extra-device-vectorization, --maxrregcount=N, -O0 to -O3, "
    "--ftz=, --prec-div=, --prec-sqrt=, --fmad= (each true or false)";

bool is_allowed_option(std::string_view option) {
  constexpr std::string_view kFlags[] = {"--use_fast_math",
                                         "-use_fast_math",
                                         "-ffast-math",
                                         "-lineinfo",
                                         "--generate-line-info",
                                         "--extra-device-vectorization",
                                         "-extra-device-vectorization",
                                         "-O0",
                                         "-O1",
                                         "-O2",
                                         "-O3"};
  constexpr std::string_view kSwitches[] = {"--ftz=", "--prec-div=", "--prec-sqrt=", "--fmad="};
  if (std::find(std::begin(kFlags), std::end(kFlags), option) != std::end(kFlags)) return true;
  for (std::string_view prefix : kSwitches) {
    if (option.starts_with(prefix)) {
      const std::string_view value = option.substr(prefix.size());
      return value == "true" || value == "false";
    }
  }
  for (std::string_view prefix : {"--maxrregcount=", "-maxrregcount="}) {
    if (option.starts_with(prefix)) return is_digits(option.substr(prefix.size()));
  }
  if (option.starts_with("-U")) return is_identifier(option.substr(2));
  if (option.starts_with("-D")) {
    const std::string_view definition = option.substr(2);
    const std::size_t eq = definition.find('=');
    const std::string_view value =
        eq == std::string_view::npos ? std::string_view() : definition.substr(eq + 1);
    return is_identifier(definition.substr(0, eq)) &&
           std::all_of(value.begin(), value.end(),
                       [](char c) { return std::isgraph(static_cast<unsigned char>(c)); });
  }
  return false;
}

// Whether a variant may #define or #undef `name`: not if the kernels compiled after it could
// use it, as a keyword (static_assert, sizeof), a name reserved to the implementation
// (__syncthreads, _X) or one of kiln's (kiln_spec, KILN_...).
bool is_variants_own(std::string_view name) {
  // C++20's keywords and alternative tokens, `defined`, and the identifiers with a special
  // meaning (final, override, import, module), each between spaces.
  constexpr std::string_view kKeywords =
      " alignas alignof and and_eq asm auto bitand bitor bool break case catch char"
      " char8_t char16_t char32_t class compl concept const consteval constexpr constinit"
      " const_cast continue co_await co_return co_yield decltype default defined delete do"
      " double dynamic_cast else enum explicit export extern false final float for friend"
      " goto if import inline int long module mutable namespace new noexcept not not_eq"
      " nullptr operator or or_eq override private protected public register"
      " reinterpret_cast requires return short signed sizeof static static_assert"
      " static_cast struct switch template this thread_local throw true try typedef typeid"
      " typename union unsigned using virtual void volatile wchar_t while xor xor_eq ";
  const bool reserved =
      name.starts_with("__") ||
      (name.size() > 1 && name[0] == '_' && std::isupper(static_cast<unsigned char>(name[1])) != 0);
  std::string prefix(name.substr(0, 4));
  for (char& c : prefix) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return !reserved && prefix != "kiln" &&
         kKeywords.find(fmt::format(" {} ", name)) == std::string_view::npos;
}

// The variant's code as kiln hands it to the compiler: a C string, whose macros leave the
// kernels' names alone.
void check_variant_code(const KernelSpec& spec) {
  require_no_nul(spec.variant_code, fmt::format("variant {}'s code", printable(spec.variant_name)));
  for (const MacroDirective& macro : macro_directives(spec.variant_code)) {
    if (is_variants_own(macro.name)) continue;
    bad(spec, fmt::format("variant {}'s line {} #{}s {}, which the kernels compiled after it "
                          "may use: a variant may #define or #undef only names of its own, not "
                          "a keyword, a name reserved to the implementation (__x, _X) or one of "
                          "kiln's (kiln..., KILN...); rename the macro, or write a constexpr "
                          "value or an inline function",
                          printable(spec.variant_name), macro.line, macro.directive,
                          printable(macro.name)));
  }
}

void validate(const KernelSpec& spec, const Target& target, const Compiler& compiler) {
  if (!is_qualified_identifier(spec.entry)) {
    bad(spec, fmt::format("entry '{}' must be a qualified name such as kiln::unary",
                          printable(spec.entry)));
  }
  for (std::size_t i = 0; i < spec.constants.size(); ++i) {
    const std::string& name = spec.constants[i].name;
    if (!is_identifier(name)) {
      bad(spec, fmt::format("constant name '{}' must be a C++ identifier", printable(name)));
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (spec.constants[j].name == name)
        bad(spec, fmt::format("constant '{}' is set twice", printable(name)));
    }
  }
  check_schema(spec);
  if (!spec.variant_code.empty()) {
    if (!is_identifier(spec.variant_name)) {
      bad(spec,
          fmt::format("variant name '{}' must be a C++ identifier", printable(spec.variant_name)));
    }
    check_variant_code(spec);
    const std::vector<std::string_view> takes_variants = variant_params();
    if (std::find(takes_variants.begin(), takes_variants.end(), spec.params) ==
        takes_variants.end()) {
      bad(spec, fmt::format("a variant is for attention kernels, whose Params are {}; {} holds no "
                            "score",
                            fmt::join(takes_variants, ", "), printable(spec.params)));
    }
  }
  for (const std::string& option : spec.options) {
    if (!is_allowed_option(option)) {
      bad(spec, fmt::format("option '{}' is not allowed: a spec may add only options that change "
                            "code generation: {}",
                            printable(option), kAllowedOptions));
    }
  }
  if (!compiler.accepts(target)) {
    std::vector<std::string> names;
    for (const Target& accepted : compiler.targets()) names.push_back(accepted.name());
    throw Error(ErrorCategory::unsupported,
                fmt::format("target '{}' is not one {} can build for: use one of {}", target.name(),
                            compiler.identity(), fmt::join(names, " ")));
  }
}

std::string_view device_type(DType dtype) {
  switch (dtype) {
    case DType::f16: return "kiln::f16";
    case DType::bf16: return "kiln::bf16";
    case DType::f32: return "float";
    case DType::f64: return "double";
    case DType::i32: return "int";
    case DType::i64: return "long long";
    case DType::e4m3: return "kiln::e4m3";
    case DType::e5m2: return "kiln::e5m2";
  }
  return "void";
}

void hash_field(XXH3_state_t* state, std::string_view field) {
  const std::uint64_t length = field.size();
  XXH3_128bits_update(state, &length, sizeof length);
  XXH3_128bits_update(state, field.data(), field.size());
}

}  // namespace

std::string render_source(const KernelSpec& spec, const ParamsLayout& params) {
  std::string text = fmt::format("// Generated by kiln for {}\n", to_string(spec));
  text += fmt::format("#include \"{}\"\n", params.header);
  const bool has_variant = !spec.variant_code.empty();
  if (has_variant) {
    // NOTE: the variant's lines are numbered as in its own code, under its own name, so that a
    // compile error in it points at the user's line. What follows is renumbered as the unit's.
    const auto unit_line = [&text] { return std::count(text.begin(), text.end(), '\n') + 1; };
    text += fmt::format("#line 1 \"variant {}\"\n{}\n", spec.variant_name, spec.variant_code);
    text += fmt::format("#line {} \"kiln generated unit\"\n", unit_line() + 1);
  }
  text += fmt::format("#include \"{}\"\n\nstruct kiln_spec {{\n", spec.source);
  text += fmt::format("  static constexpr bool has_variant = {};\n", has_variant);
  if (has_variant) text += "  using variant = kiln_variant;\n";
  std::vector<const Constant*> sorted;
  for (const Constant& c : spec.constants) sorted.push_back(&c);
  std::sort(sorted.begin(), sorted.end(),
            [](const Constant* a, const Constant* b) { return a->name < b->name; });
  for (const Constant* c : sorted) {
    if (const auto* b = std::get_if<bool>(&c->value)) {
      text += fmt::format("  static constexpr bool {} = {};\n", c->name, *b ? "true" : "false");
    } else if (const auto* d = std::get_if<DType>(&c->value)) {
      text += fmt::format("  using {} = {};\n", c->name, device_type(*d));
    } else {
      text += fmt::format("  static constexpr long long {} = {}LL;\n", c->name,
                          std::get<std::int64_t>(c->value));
    }
  }
  text += "};\n\n";
  text += fmt::format(
      "static_assert(sizeof({0}) == {1} && alignof({0}) == {2}, \"{0} in this compile differs "
      "from libkiln's ({1} bytes, aligned to {2}): take it from {3} and do not redefine it.\");\n",
      params.type, params.size, params.alignment, params.header);
  return text;
}

Key compute_key(const Unit& unit) {
  XXH3_state_t state;
  XXH3_128bits_reset(&state);
  hash_field(&state, "kiln cache key");
  hash_field(&state, std::to_string(kCacheFormatVersion));
  hash_field(&state, unit.compiler);
  hash_field(&state, unit.target.name());
  for (const std::string& option : unit.options) hash_field(&state, option);
  hash_field(&state, unit.name_expression);
  hash_field(&state, unit.source);
  for (const Header& header : unit.headers) {
    hash_field(&state, header.name);
    hash_field(&state, header.content);
  }
  const XXH128_hash_t hash = XXH3_128bits_digest(&state);
  XXH128_canonical_t canonical;
  XXH128_canonicalFromHash(&canonical, hash);
  Key key;
  std::memcpy(key.bytes.data(), canonical.digest, key.bytes.size());
  return key;
}

Unit make_unit(KernelSpec spec, const Target& target, const SourceTree& sources,
               const Compiler& compiler) {
  spec.target = target.name();
  validate(spec, target, compiler);
  Unit unit{.kernel = std::move(spec), .target = target};
  const KernelSpec& kernel = unit.kernel;
  unit.params = &params_layout(kernel.params);
  unit.spec = to_string(kernel);
  unit.compiler = compiler.identity();
  unit.source = render_source(kernel, *unit.params);
  unit.headers = sources.closure(unit.source, kernel.source);
  unit.options = compiler.canonical_options(target);
  unit.options.insert(unit.options.end(), kernel.options.begin(), kernel.options.end());
  unit.name_expression = kernel.entry + "<kiln_spec>";
  unit.key = compute_key(unit);
  return unit;
}

}  // namespace kiln::detail
