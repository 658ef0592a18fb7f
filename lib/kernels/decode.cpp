// SPDX-License-Identifier: Apache-2.0
// The decode kernels' descriptions, choose()'s tuning, and the specs and launch plans made from
// them.
#include "kernels/decode.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include <fmt/format.h>

#include "core/checked_math.hpp"
#include "kiln/error.hpp"
#include "kiln/params/decode.h"

namespace kiln {
namespace detail {
namespace {

// --- Descriptions ----------------------------------------------------------------------------

constexpr ConstantKind kInt = ConstantKind::integer;
constexpr ConstantKind kBool = ConstantKind::boolean;
constexpr ConstantKind kDType = ConstantKind::dtype;

// The operand dtypes (q, the cache, out) the decode kernels take, one row a combination. The
// attention kernel's mma multiplies operands of one type: an fp8 cache is converted to q's as
// it is read (sm_89 and newer). The append kernel takes q's and the cache's: k_new and v_new are
// the cache's dtype, or with an fp8 cache q's, quantized into it.
constexpr std::span<const OperandDTypes> kOperandDTypes = kWideningOperandDTypes;

// The constants each kernel's template reads (kernels_src/attention/decode).
constexpr ConstantSchema kAppendConstants[] = {
    {"dtype_kv", kDType}, {"dtype_q", kDType}, {"head_dim", kInt},       {"head_dim_v", kInt},
    {"paged", kBool},     {"rotary", kBool},   {"token_descales", kBool}};
constexpr ConstantSchema kAttentionConstants[] = {
    {"band", kBool},           {"block_n", kInt},    {"dtype_kv", kDType},   {"dtype_out", kDType},
    {"dtype_q", kDType},       {"has_alibi", kBool}, {"has_softcap", kBool}, {"head_dim", kInt},
    {"head_dim_v", kInt},      {"m_tiles", kInt},    {"paged", kBool},       {"stages", kInt},
    {"token_descales", kBool}, {"warps", kInt}};
constexpr ConstantSchema kMergeConstants[] = {
    {"dtype_in", kDType}, {"dtype_out", kDType}, {"head_dim", kInt}};

// A spec that arrives as text, parsed once into the typed problem and config that its kernel's
// shared memory is computed from.
template <DecodeKernel kernel>
long long spec_shared_bytes(const KernelSpec& spec) {
  const auto constant = [&](std::string_view name) {
    return static_cast<int>(integer_constant(spec, name));
  };
  const DecodeProblem problem{.dtype_q = dtype_constant(spec, "dtype_q"),
                              .dtype_kv = dtype_constant(spec, "dtype_kv"),
                              .dtype_out = dtype_constant(spec, "dtype_out"),
                              .head_dim = constant("head_dim"),
                              .head_dim_v = constant("head_dim_v"),
                              .token_descales = boolean_constant(spec, "token_descales")};
  const DecodeConfig config{.block_n = constant("block_n"),
                            .warps = constant("warps"),
                            .stages = constant("stages"),
                            .m_tiles = constant("m_tiles"),
                            .kernel = kernel};
  return describe(kernel).shared_bytes(problem, config);
}

constexpr DecodeDescription kDescriptions[] = {
    {.kernel = DecodeKernel::mma,
     .name = "mma",
     .schema = {"attention/decode/attention.cuh", "kiln::attention_decode", "kiln::DecodeParams",
                kAttentionConstants, spec_shared_bytes<DecodeKernel::mma>, kOperandDTypes},
     .threads = [](const DecodeConfig& c) { return c.warps * 32; },
     .shared_bytes =
         [](const DecodeProblem& p, const DecodeConfig& c) {
           return attention_decode_smem_bytes(p.head_dim, p.head_dim_v, c.m_tiles, c.block_n,
                                              c.warps, c.stages, element_bytes(p.dtype_q),
                                              element_bytes(p.dtype_kv), p.token_descales);
         }},
};

static_assert(std::size(kDescriptions) == 1 && kDescriptions[0].kernel == DecodeKernel::mma,
              "kDescriptions lists every DecodeKernel once, in the enum's order.");

// --- Tuning ----------------------------------------------------------------------------------
//
// NOTE: the tuning changes speed only, never results: every config gives results within the
// same tolerance. tests/ops/choose_pins.txt pins what choose() gives.

// Measured on an H200; every NVIDIA target takes it, fitted to its shared memory per CTA.
struct DecodeTuning {
  int block_n;  // keys per warp and step
  // Warps per CTA; fewer only where two stages of them do not fit the target at all (head dim
  // 256 on sm_86, sm_89 and sm_120: 136 KiB against 99), since these are what was measured: the
  // stages give way first. Neither is tuned on those targets.
  int warps;
  int min_stages, max_stages;  // cp.async slots per warp: as many as fit smem_per_cta
  // Shared memory one CTA aims to stay under, so that two fit an SM of sm_90 (227 KiB); choose()
  // takes the target's limit where that is less.
  long long smem_per_cta;
  // The heuristic gives each split at least this many keys: a CTA's fixed costs (Q, the first
  // tiles' latency, the warp merge) need that much streaming to hide. Measured on an H200 at
  // 1 x 32768 (8 kv heads): 16 splits of 2048 keys ran at 3.0 TB/s, 33 splits at 2.7.
  long long min_split_keys;
};
constexpr DecodeTuning kTuning{.block_n = 16,
                               .warps = 4,
                               .min_stages = 2,
                               .max_stages = 4,
                               .smem_per_cta = 112 * 1024,
                               .min_split_keys = 2048};
// An fp8 cache: tiles of as many bytes as the 16-bit ones, twice the keys. Measured on an H200
// (bench/tune_decode.cpp, run 38: 32q/8kv, d128, contiguous): 32 keys and 2 stages ran 64 x
// 16384 in 0.503 ms, 16 keys and 4 stages in 0.594, and it was within 3% of the fastest config
// on every row.
constexpr DecodeTuning kFp8Tuning{.block_n = 32,
                                  .warps = 4,
                                  .min_stages = 2,
                                  .max_stages = 2,
                                  .smem_per_cta = kTuning.smem_per_cta,
                                  .min_split_keys = kTuning.min_split_keys};
constexpr bool valid_tuning(const DecodeTuning& t) {
  return t.block_n % 16 == 0 && t.warps >= 1 && t.min_stages >= 2 && t.min_stages <= t.max_stages;
}
static_assert(valid_tuning(kTuning) && valid_tuning(kFp8Tuning),
              "The decode tuning is a config the kernel takes: block_n a multiple of 16, a warp "
              "or more, two stages or more.");

const DecodeTuning& tuning_for(DType cache) {
  return is_fp8(cache) ? kFp8Tuning : kTuning;
}

// The multiprocessors decode_default_specs() plans for, per target, where no device says: a
// part of the target, or of the nearest older one listed. They steer only num_splits, which no
// spec holds, so any count gives the same specs.
struct WarmupPart {
  int arch;  // NVIDIA sm_XX
  int multiprocessors;
  std::string_view part;
};
constexpr WarmupPart kWarmupParts[] = {
    {80, 108, "A100"}, {86, 84, "A40"}, {89, 142, "L40S"}, {90, 132, "H100 SXM"}};
static_assert(kWarmupParts[0].arch == 80,
              "Every target decode runs on (sm_80 and newer) has a warm-up part.");

int warmup_multiprocessors(const Target& target) {
  int multiprocessors = kWarmupParts[0].multiprocessors;
  for (const WarmupPart& part : kWarmupParts) {
    if (part.arch <= target.arch()) multiprocessors = part.multiprocessors;
  }
  return multiprocessors;
}

long long smem_bytes(const DecodeProblem& problem, const DecodeConfig& c) {
  return describe(c.kernel).shared_bytes(problem, c);
}

// The fewest splits whose grid fills `slots` CTA places within 95% of the best any split
// count achieves: a partial last wave leaves places empty, and an SM running more CTAs than
// the others finishes last.
int split_heuristic(long long ctas, long long slots, int max_splits) {
  if (ctas >= slots * 4 / 5) return 1;
  auto efficiency = [&](int splits) {
    const double waves = static_cast<double>(ctas * splits) / static_cast<double>(slots);
    return waves / std::ceil(waves);
  };
  double best = 0;
  for (int s = 1; s <= max_splits; ++s) best = std::max(best, efficiency(s));
  for (int s = 1; s <= max_splits; ++s) {
    if (efficiency(s) >= 0.95 * best) return s;
  }
  return 1;
}

}  // namespace

const FixedKernel kDecodeAppendKernel{
    .schema = {"attention/decode/append.cuh", "kiln::decode_append", "kiln::DecodeParams",
               kAppendConstants, no_shared_memory, kOperandDTypes},
    .threads = kDecodeAppendThreads};
const FixedKernel kMergeStatesKernel{
    .schema = {"attention/decode/merge.cuh", "kiln::merge_states_kernel", "kiln::MergeParams",
               kMergeConstants, no_shared_memory},
    .threads = kMergeThreads};

const DecodeDescription& describe(DecodeKernel kernel) {
  for (const DecodeDescription& d : kDescriptions) {
    if (d.kernel == kernel) return d;
  }
  invalid(fmt::format("config.kernel is {}, which is no DecodeKernel: use mma",
                      static_cast<int>(kernel)));
}

std::span<const DecodeDescription> decode_descriptions() {
  return kDescriptions;
}

std::span<const OperandDTypes> decode_operand_dtypes() {
  return kOperandDTypes;
}

void require_target(const Target& target) {
  if (target.amd()) {
    unsupported(
        fmt::format("decode attention on {} is not supported yet: its kernel uses NVIDIA "
                    "tensor-core instructions; AMD support is planned",
                    target.name()));
  }
  if (!is_sm80_or_newer(target)) {
    unsupported(fmt::format(
        "decode attention needs an sm_80 or newer GPU (bf16 tensor cores); the target is {}",
        target.name()));
  }
}

void check_cache_dtype(const DecodeProblem& problem) {
  if (!is_fp8(problem.dtype_kv)) {
    if (problem.token_descales) {
      invalid(
          fmt::format("token_descales with a {} KV cache: descales per token are an fp8 "
                      "cache's; set token_descales only with dtype_kv e4m3 or e5m2",
                      to_string(problem.dtype_kv)));
    }
    return;
  }
  require_fp8_kv(problem.dtype_kv, problem.head_dim, problem.head_dim_v, nullptr, "KV cache");
}

void require_cache_dtype(const DecodeProblem& problem, const Target& target) {
  if (!is_fp8(problem.dtype_kv)) return;
  require_fp8_kv(problem.dtype_kv, problem.head_dim, problem.head_dim_v, &target, "KV cache");
}

void check_config(const DecodeConfig& c) {
  describe(c.kernel);
  if (c.num_splits < 1 || c.num_splits > kMaxDecodeSplits) {
    invalid(fmt::format("config.num_splits is {}: use 1 (one pass) to {}", c.num_splits,
                        kMaxDecodeSplits));
  }
  if (c.block_n < 16 || c.block_n > 128 || c.block_n % 16 != 0) {
    invalid(fmt::format("config.block_n is {}: use a multiple of 16 from 16 to 128", c.block_n));
  }
  if (c.warps < 1 || c.warps > 16) {
    invalid(fmt::format("config.warps is {}: use 1 to 16", c.warps));
  }
  if (c.stages < 2 || c.stages > 8) {
    invalid(fmt::format("config.stages is {}: use 2 to 8", c.stages));
  }
  if (c.m_tiles != 1 && c.m_tiles != 2 && c.m_tiles != 4) {
    invalid(fmt::format("config.m_tiles is {}: use 1, 2 or 4", c.m_tiles));
  }
}

int decode_m_tiles(int rows_per_kv_head, int head_dim_v) {
  // Output accumulators a thread holds: m_tiles * round_up(head_dim_v, 16) / 2; at most 128.
  const int most = head_dim_v <= 64 ? 4 : head_dim_v <= 128 ? 2 : 1;
  return std::min(most, rows_per_kv_head <= 16 ? 1 : rows_per_kv_head <= 32 ? 2 : 4);
}

std::int64_t decode_row_blocks(const DecodeProblem& problem, const DecodeConfig& config) {
  return ceil_div(std::max(problem.rows_per_kv_head, 0), 16 * config.m_tiles);
}

KernelSpec decode_append_spec(const DecodeProblem& problem) {
  KernelSpec spec = spec_of(kDecodeAppendKernel.schema);
  spec.set("dtype_q", problem.dtype_q)
      .set("dtype_kv", problem.dtype_kv)
      .set("head_dim", problem.head_dim)
      .set("head_dim_v", problem.head_dim_v)
      .set("paged", problem.paged)
      .set("rotary", problem.rotary)
      .set("token_descales", problem.token_descales);
  return spec;
}

KernelSpec decode_attention_spec(const DecodeProblem& problem, const DecodeConfig& config) {
  KernelSpec spec = spec_of(describe(config.kernel).schema);
  spec.set("dtype_q", problem.dtype_q)
      .set("dtype_kv", problem.dtype_kv)
      .set("dtype_out", problem.dtype_out)
      .set("head_dim", problem.head_dim)
      .set("head_dim_v", problem.head_dim_v)
      .set("m_tiles", config.m_tiles)
      .set("block_n", config.block_n)
      .set("warps", config.warps)
      .set("stages", config.stages)
      .set("paged", problem.paged)
      .set("token_descales", problem.token_descales)
      .set("band", problem.band)
      .set("has_softcap", problem.softcap)
      .set("has_alibi", problem.alibi);
  set_variant(spec, problem.variant);
  return spec;
}

KernelSpec merge_spec(DType in, DType out, int head_dim) {
  KernelSpec spec = spec_of(kMergeStatesKernel.schema);
  spec.set("dtype_in", in).set("dtype_out", out).set("head_dim", head_dim);
  return spec;
}

LaunchPlan decode_append_plan(const DecodeProblem& problem) {
  return {.spec = decode_append_spec(problem), .threads = kDecodeAppendKernel.threads};
}

LaunchPlan decode_attention_plan(const DecodeProblem& problem, const DecodeConfig& config) {
  const DecodeDescription& d = describe(config.kernel);
  return {.spec = decode_attention_spec(problem, config),
          .threads = d.threads(config),
          .shared_bytes = d.shared_bytes(problem, config)};
}

LaunchPlan merge_plan(DType in, DType out, int head_dim) {
  return {.spec = merge_spec(in, out, head_dim), .threads = kMergeStatesKernel.threads};
}

DecodePlan decode_plan(const DecodeProblem& problem, const DecodeConfig& config) {
  DecodePlan plan{.attention = decode_attention_plan(problem, config)};
  if (problem.append) plan.append = decode_append_plan(problem);
  return plan;
}

void require_fits(const DecodePlan& plan, const DecodeConfig& config, const Target* planned,
                  const DeviceInfo& device) {
  for (const LaunchPlan* kernel : {plan.append ? &*plan.append : nullptr, &plan.attention}) {
    if (!kernel) continue;
    const std::optional<std::string> exceeded = exceeded_limit(*kernel, device);
    if (!exceeded) continue;
    const std::string fix =
        planned ? fmt::format(
                      "choose() planned it for the target {}, whose CTAs may take {} "
                      "bytes; run with the device's own target ({})",
                      planned->name(), planned->max_shared_bytes_per_block(), device.target)
                : std::string(
                      "pass a config with fewer warps or stages or a smaller block_n "
                      "(or choose()'s config)");
    throw Error(
        ErrorCategory::unsupported,
        fmt::format("decode config (block_n {}, warps {}, stages {}, m_tiles {}) needs {}: "
                    "{}",
                    config.block_n, config.warps, config.stages, config.m_tiles, *exceeded, fix));
  }
}

}  // namespace detail

DecodeConfig choose(const DecodeProblem& problem, const Target& target, int multiprocessors) {
  const detail::DecodeTuning& t = detail::tuning_for(problem.dtype_kv);
  DecodeConfig c{.block_n = t.block_n,
                 .warps = t.warps,
                 .stages = t.min_stages,
                 .m_tiles = detail::decode_m_tiles(problem.rows_per_kv_head, problem.head_dim_v)};
  const long long limit = target.max_shared_bytes_per_block();
  while (c.warps > 1 && detail::smem_bytes(problem, c) > limit) --c.warps;
  // As many cp.async slots per warp as fit the tuning's budget and the target.
  const long long budget = std::min(t.smem_per_cta, limit);
  while (c.stages < t.max_stages) {
    DecodeConfig deeper = c;
    ++deeper.stages;
    if (detail::smem_bytes(problem, deeper) > budget) break;
    c = deeper;
  }
  const long long step = static_cast<long long>(c.warps) * c.block_n;
  const long long keys = std::max(problem.capacity, 0LL);
  const int max_splits = static_cast<int>(
      std::clamp<long long>(detail::ceil_div(keys, step), 1, detail::kMaxDecodeSplits));
  if (problem.requested_splits > 0) {
    c.num_splits = std::min(problem.requested_splits, max_splits);
    return c;
  }
  // NOTE: callers may pass any ints: a negative count counts as none, and a CTA count beyond
  // int64 saturates (so many CTAs need no splits).
  const std::int64_t groups =
      std::int64_t{std::max(problem.batch, 0)} * std::max(problem.heads_kv, 0);
  const std::int64_t ctas = detail::checked_mul(groups, detail::decode_row_blocks(problem, c))
                                .value_or(std::numeric_limits<std::int64_t>::max());
  const int worthwhile = static_cast<int>(
      std::clamp<long long>(detail::ceil_div(keys, t.min_split_keys), 1, max_splits));
  // One CTA per SM, though two fit: measured on an H200 (32q/8kv, d128), 8 x 8192 ran at 3.60
  // TB/s with 2 splits (128 CTAs) against 3.52 with 4, and 1 x 32768 at 2.92 with 16 splits
  // against 2.76 with 28.
  c.num_splits = detail::split_heuristic(ctas, std::max(1, multiprocessors), worthwhile);
  return c;
}

std::vector<KernelSpec> decode_specs(const DecodeProblem& problem, const DecodeConfig& config) {
  detail::check_cache_dtype(problem);
  std::vector<KernelSpec> specs;
  const detail::DecodePlan plan = detail::decode_plan(problem, config);
  if (plan.append) specs.push_back(plan.append->spec);
  specs.push_back(plan.attention.spec);
  return specs;
}

std::vector<KernelSpec> decode_default_specs(const Target& target) {
  std::vector<KernelSpec> specs;
  if (!detail::is_sm80_or_newer(target)) return specs;
  // A long cache on few sequences, so that the config is the split one.
  constexpr int kBatch = 1, kHeadsKv = 8, kRows = 4;
  constexpr long long kCapacity = 32768;
  const int multiprocessors = detail::warmup_multiprocessors(target);
  for (const detail::OperandDTypes& dtypes : detail::warmed_widening_dtypes(target)) {
    for (int dim : {64, 128}) {
      // An fp8 cache with FlashAttention-3's descales and without, and with descales per token.
      for (bool token_descales : {false, true}) {
        if (token_descales && !is_fp8(dtypes.kv)) continue;
        for (bool paged : {false, true}) {
          const DecodeProblem problem{.dtype_q = dtypes.q,
                                      .dtype_kv = dtypes.kv,
                                      .dtype_out = dtypes.out,
                                      .head_dim = dim,
                                      .head_dim_v = dim,
                                      .rows_per_kv_head = kRows,
                                      .paged = paged,
                                      .token_descales = token_descales,
                                      .batch = kBatch,
                                      .heads_kv = kHeadsKv,
                                      .capacity = kCapacity};
          for (KernelSpec& spec : decode_specs(problem, choose(problem, target, multiprocessors))) {
            specs.push_back(std::move(spec));
          }
        }
      }
      // merge_states over the outputs of two such calls (the fp8 rows' are the 16-bit ones').
      if (!is_fp8(dtypes.kv)) specs.push_back(detail::merge_spec(dtypes.out, dtypes.out, dim));
    }
  }
  return specs;
}

}  // namespace kiln
