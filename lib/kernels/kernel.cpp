// SPDX-License-Identifier: Apache-2.0
// What every kernel's description shares: specs from a schema, and constants read back from one.
#include "kernels/kernel.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kiln/error.hpp"

namespace kiln::detail {
namespace {

const Constant& constant(const KernelSpec& spec, std::string_view name) {
  return *std::find_if(spec.constants.begin(), spec.constants.end(),
                       [&](const Constant& c) { return c.name == name; });
}

}  // namespace

void invalid(const std::string& message) {
  throw Error(ErrorCategory::invalid_argument, message);
}

void unsupported(const std::string& message) {
  throw Error(ErrorCategory::unsupported, message);
}

bool is_sm80_or_newer(const Target& target) {
  return target.nvidia() && target.arch() >= 80;
}

void set_variant(KernelSpec& spec, const Variant* variant) {
  if (variant == nullptr) return;
  spec.variant_name = variant->name;
  spec.variant_code = variant->code;
}
KernelSpec spec_of(const KernelSchema& schema) {
  return {.source = std::string(schema.source),
          .entry = std::string(schema.entry),
          .params = std::string(schema.params)};
}

bool takes(const KernelSchema& schema, std::string_view name) {
  return std::any_of(schema.constants.begin(), schema.constants.end(),
                     [&](const ConstantSchema& c) { return c.name == name; });
}

long long integer_constant(const KernelSpec& spec, std::string_view name) {
  return std::get<std::int64_t>(constant(spec, name).value);
}

DType dtype_constant(const KernelSpec& spec, std::string_view name) {
  return std::get<DType>(constant(spec, name).value);
}

bool boolean_constant(const KernelSpec& spec, std::string_view name) {
  return std::get<bool>(constant(spec, name).value);
}

long long element_bytes(DType dtype) {
  return static_cast<long long>(size_of(dtype));
}

std::optional<Error> operand_dtypes_error(std::string_view what,
                                          std::span<const OperandDTypes> rows, NamedDType q,
                                          std::span<const NamedDType> kv,
                                          std::optional<NamedDType> out) {
  std::vector<std::string_view> q_dtypes;
  std::vector<std::string> listed;
  for (const OperandDTypes& row : rows) {
    if (std::find(q_dtypes.begin(), q_dtypes.end(), to_string(row.q)) == q_dtypes.end()) {
      q_dtypes.push_back(to_string(row.q));
    }
    listed.push_back(
        fmt::format("({}, {}, {})", to_string(row.q), to_string(row.kv), to_string(row.out)));
  }
  // The first row that `takes`, if any.
  const auto find = [&](auto&& takes) { return std::find_if(rows.begin(), rows.end(), takes); };
  const auto with_q = [&](const OperandDTypes& row) { return row.q == q.dtype; };
  if (find(with_q) == rows.end()) {
    return Error(ErrorCategory::unsupported,
                 fmt::format("{} has dtype {}: {} takes {}", q.name, to_string(q.dtype), what,
                             fmt::join(q_dtypes, " or ")));
  }
  // `operand`, whose dtype does not go with `other`'s, needs `fit`.
  const auto refusal = [&](const NamedDType& operand, const NamedDType& other, DType fit) {
    return Error(
        ErrorCategory::invalid_argument,
        fmt::format("{} has dtype {} but {} has dtype {}: {} takes (q, k and v, out) in "
                    "the dtypes {}, so {} needs {}",
                    operand.name, to_string(operand.dtype), other.name, to_string(other.dtype),
                    what, fmt::join(listed, " or "), operand.name, to_string(fit)));
  };
  for (const NamedDType& t : kv) {
    if (find([&](const OperandDTypes& row) { return with_q(row) && row.kv == t.dtype; }) ==
        rows.end()) {
      return refusal(t, q, find(with_q)->kv);
    }
    if (t.dtype != kv.front().dtype) return refusal(t, kv.front(), kv.front().dtype);
  }
  if (!out) return std::nullopt;
  const auto with_q_kv = [&](const OperandDTypes& row) {
    return with_q(row) && (kv.empty() || row.kv == kv.front().dtype);
  };
  if (find([&](const OperandDTypes& row) { return with_q_kv(row) && row.out == out->dtype; }) ==
      rows.end()) {
    return refusal(*out, q, find(with_q_kv)->out);
  }
  return std::nullopt;
}

bool reads_fp8(const Target& target) {
  return target.nvidia() && target.arch() >= 89;
}

std::vector<OperandDTypes> warmed_widening_dtypes(const Target& target) {
  std::vector<OperandDTypes> rows;
  for (const OperandDTypes& row : kWideningOperandDTypes) {
    if (row.kv == DType::e5m2 || (is_fp8(row.kv) && !reads_fp8(target))) continue;
    rows.push_back(row);
  }
  return rows;
}

void require_fp8_kv(DType kv, int head_dim, int head_dim_v, const Target* target,
                    std::string_view what) {
  if (target != nullptr && !reads_fp8(*target)) {
    unsupported(
        fmt::format("an {} {} needs an sm_89 or newer GPU (its fp8 conversions); the target is {}: "
                    "keep the {} in q's dtype there",
                    to_string(kv), what, target->name(), what));
  }
  if (head_dim % 16 != 0 || head_dim_v % 16 != 0) {
    unsupported(fmt::format(
        "head_dim {} and head_dim_v {} with an {} {}: fp8 head dims must be multiples of 16 "
        "(16-byte copies of whole elements); pad the head dims with zeros",
        head_dim, head_dim_v, to_string(kv), what));
  }
}

long long no_shared_memory(const KernelSpec&) {
  return 0;
}

void require_launch_registers(const KernelInfo& info, int least, std::string_view instead) {
  if (info.registers < 0 || info.registers >= least) return;
  unsupported(fmt::format(
      "kernel {} was built ({}) with {} registers a thread, but its warpgroups' register split "
      "(setmaxnreg) claims {} a thread: it would wait forever; use {} with this compiler, or the "
      "CUDA toolkit's NVRTC kiln is tested with (13.0)",
      info.spec, info.compiler, info.registers, least, instead));
}

std::optional<std::string> exceeded_limit(const LaunchPlan& plan, const DeviceInfo& device) {
  const auto over = [](long long needed, int limit) { return limit > 0 && needed > limit; };
  if (over(plan.threads, device.max_threads_per_block)) {
    return fmt::format("{} threads per CTA, but device {} ({}) runs at most {}", plan.threads,
                       device.ordinal, device.name, device.max_threads_per_block);
  }
  if (over(plan.shared_bytes, device.max_shared_bytes_per_block)) {
    return fmt::format(
        "{} bytes of dynamic shared memory per CTA, but device {} ({}) allows at most {}",
        plan.shared_bytes, device.ordinal, device.name, device.max_shared_bytes_per_block);
  }
  return std::nullopt;
}

}  // namespace kiln::detail
