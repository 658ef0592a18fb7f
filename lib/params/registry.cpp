// SPDX-License-Identifier: Apache-2.0
// The table of Params structs and of kiln's kernels, read from the families' descriptions
// (lib/kernels); a new kernel family adds its Params and its descriptions here.
#include "params/registry.hpp"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/user_text.hpp"
#include "kernels/attention.hpp"
#include "kernels/attention_backward.hpp"
#include "kernels/decode.hpp"
#include "kernels/elementwise.hpp"
#include "kiln/error.hpp"
#include "kiln/params/attention.h"
#include "kiln/params/attention_backward.h"
#include "kiln/params/decode.h"
#include "kiln/params/elementwise.h"
#include "kiln/params/score.h"

namespace kiln::detail {
namespace {

constexpr ParamsLayout kLayouts[] = {
    {"kiln::UnaryParams", "kiln/params/elementwise.h", sizeof(UnaryParams), alignof(UnaryParams),
     false},
    {"kiln::AttentionParams", "kiln/params/attention.h", sizeof(AttentionParams),
     alignof(AttentionParams), true},
    {"kiln::AttentionTmaParams", "kiln/params/attention.h", sizeof(AttentionTmaParams),
     alignof(AttentionTmaParams), true},
    {"kiln::AttentionBackwardParams", "kiln/params/attention_backward.h",
     sizeof(AttentionBackwardParams), alignof(AttentionBackwardParams), true},
    {"kiln::DecodeParams", "kiln/params/decode.h", sizeof(DecodeParams), alignof(DecodeParams),
     true},
    {"kiln::MergeParams", "kiln/params/decode.h", sizeof(MergeParams), alignof(MergeParams), false},
    // Held by AttentionParams and DecodeParams, taken alone by no kernel of kiln's; a kernel of
    // the caller's own may take it.
    {"kiln::ScoreParams", "kiln/params/score.h", sizeof(ScoreParams), alignof(ScoreParams), false},
};

// Every one of kiln's kernels, in the families' order.
const std::vector<const KernelSchema*>& kernels() {
  static const std::vector<const KernelSchema*> all = [] {
    std::vector<const KernelSchema*> list{&kUnaryKernel.schema};
    for (const AttentionDescription& d : attention_descriptions()) list.push_back(&d.schema);
    for (const KernelSchema* schema : attention_backward_schemas()) list.push_back(schema);
    list.push_back(&kDecodeAppendKernel.schema);
    for (const DecodeDescription& d : decode_descriptions()) list.push_back(&d.schema);
    list.push_back(&kMergeStatesKernel.schema);
    return list;
  }();
  return all;
}

std::string_view kind_name(ConstantKind kind) {
  switch (kind) {
    case ConstantKind::integer: return "an integer";
    case ConstantKind::boolean: return "true or false";
    case ConstantKind::dtype: return "a dtype (f16, bf16, f32, f64, i32 or i64)";
  }
  return "?";
}

bool has_kind(const Constant& constant, ConstantKind kind) {
  switch (kind) {
    case ConstantKind::integer: return std::holds_alternative<std::int64_t>(constant.value);
    case ConstantKind::boolean: return std::holds_alternative<bool>(constant.value);
    case ConstantKind::dtype: return std::holds_alternative<DType>(constant.value);
  }
  return false;
}

[[noreturn]] void bad(const KernelSpec& spec, const std::string& why) {
  throw Error(ErrorCategory::invalid_argument,
              fmt::format("kernel spec {} is invalid: {}", printable(to_string(spec)), why));
}

// Why the value of `constant`, of the kind `wanted` asks, is out of its range; empty when it is
// in range or `wanted` gives none.
std::string out_of_range(const Constant& constant, const ConstantSchema& wanted) {
  if (wanted.values == 0) return {};
  const std::int64_t value = std::get<std::int64_t>(constant.value);
  if (value >= 0 && value < wanted.values) return {};
  std::vector<std::string> allowed;
  for (std::int64_t v = 0; v < wanted.values; ++v) {
    allowed.push_back(fmt::format("{} ({})", v, wanted.value_name(v)));
  }
  return fmt::format("constant {} is {}: it must be one of {}", wanted.name, value,
                     fmt::join(allowed, ", "));
}

// Why the operand dtypes of `spec` (dtype_q, dtype_kv and dtype_out, those `kernel` takes; the
// spec has every one) are no row of the kernel's table; empty when they are one.
std::string operand_dtypes_problem(const KernelSpec& spec, const KernelSchema& kernel) {
  if (kernel.operand_dtypes.empty()) return {};
  const auto named = [&](std::string_view constant) {
    return NamedDType{constant, dtype_constant(spec, constant)};
  };
  std::vector<NamedDType> kv;
  if (takes(kernel, "dtype_kv")) kv.push_back(named("dtype_kv"));
  std::optional<NamedDType> out;
  if (takes(kernel, "dtype_out")) out = named("dtype_out");
  const std::optional<Error> error =
      operand_dtypes_error(kernel.entry, kernel.operand_dtypes, named("dtype_q"), kv, out);
  return error ? std::string(error->what()) : std::string();
}

// "block_size (an integer), dtype (a dtype ...)": what a kernel takes, for the fix.
std::string signature(const KernelSchema& kernel) {
  std::vector<std::string> names;
  for (const ConstantSchema& c : kernel.constants) names.push_back(std::string(c.name));
  return fmt::format("{} takes exactly the constants {}", kernel.entry, fmt::join(names, ", "));
}

}  // namespace

const ParamsLayout& params_layout(std::string_view type) {
  for (const ParamsLayout& layout : kLayouts) {
    if (layout.type == type) return layout;
  }
  std::string known;
  for (const ParamsLayout& layout : kLayouts) known += fmt::format(" {}", layout.type);
  throw Error(ErrorCategory::invalid_argument,
              fmt::format("kernel spec names Params type '{}', which libkiln does not define; "
                          "known types:{}",
                          type, known));
}

std::vector<std::string_view> variant_params() {
  std::vector<std::string_view> types;
  for (const ParamsLayout& layout : kLayouts) {
    if (layout.holds_score) types.push_back(layout.type);
  }
  return types;
}

const KernelSchema* kernel_schema(std::string_view entry) {
  for (const KernelSchema* kernel : kernels()) {
    if (kernel->entry == entry) return kernel;
  }
  return nullptr;
}

void check_schema(const KernelSpec& spec) {
  const KernelSchema* kernel = kernel_schema(spec.entry);
  if (!kernel) {
    // NOTE: kiln's namespace holds only kiln's kernels, so a name there that is none of them is
    // a typo, which would otherwise surface as a compile error about the name expression.
    if (!spec.entry.starts_with("kiln::")) return;
    std::vector<std::string_view> entries;
    for (const KernelSchema* k : kernels()) entries.push_back(k->entry);
    bad(spec, fmt::format("kiln has no kernel '{}': use one of {}, or a namespace of your own for "
                          "a kernel of your own",
                          printable(spec.entry), fmt::join(entries, ", ")));
  }
  if (spec.params != kernel->params) {
    bad(spec, fmt::format("{} takes {}, not '{}'", kernel->entry, kernel->params,
                          printable(spec.params)));
  }
  std::vector<std::string> problems;
  std::vector<std::string_view> missing;
  for (const ConstantSchema& wanted : kernel->constants) {
    const auto it = std::find_if(spec.constants.begin(), spec.constants.end(),
                                 [&](const Constant& c) { return c.name == wanted.name; });
    if (it == spec.constants.end()) {
      missing.push_back(wanted.name);
    } else if (!has_kind(*it, wanted.kind)) {
      problems.push_back(
          fmt::format("constant {} must be {}", wanted.name, kind_name(wanted.kind)));
    } else if (std::string why = out_of_range(*it, wanted); !why.empty()) {
      problems.push_back(std::move(why));
    }
  }
  if (!missing.empty()) {
    problems.insert(problems.begin(),
                    fmt::format("it lacks the constants {}", fmt::join(missing, ", ")));
  }
  std::vector<std::string> unknown;
  for (const Constant& c : spec.constants) {
    if (std::none_of(kernel->constants.begin(), kernel->constants.end(),
                     [&](const ConstantSchema& s) { return s.name == c.name; })) {
      unknown.push_back(printable(c.name));
    }
  }
  if (!unknown.empty()) {
    problems.push_back(
        fmt::format("{} does not take the constants {}", kernel->entry, fmt::join(unknown, ", ")));
  }
  if (!problems.empty()) {
    bad(spec, fmt::format("{}; {}", fmt::join(problems, "; "), signature(*kernel)));
  }
  // NOTE: a spec of operand dtypes the kernel's family does not take would fail its compile
  // (HeadTraits' static_assert) with a less direct message, after the compile's cost.
  if (std::string why = operand_dtypes_problem(spec, *kernel); !why.empty()) bad(spec, why);
}

std::string_view value_name(std::string_view entry, std::string_view constant, std::int64_t value) {
  const KernelSchema* kernel = kernel_schema(entry);
  if (!kernel) return {};
  for (const ConstantSchema& c : kernel->constants) {
    if (c.name == constant && c.values > 0 && value >= 0 && value < c.values) {
      return c.value_name(value);
    }
  }
  return {};
}

std::optional<long long> dynamic_shared_bytes(const KernelSpec& spec) {
  const KernelSchema* kernel = kernel_schema(spec.entry);
  if (!kernel) return std::nullopt;
  return kernel->shared_bytes(spec);
}

}  // namespace kiln::detail
