// SPDX-License-Identifier: Apache-2.0
// The backward kernels' descriptions, choose()'s configs, and the specs and launch plans made
// from them.
#include "kernels/attention_backward.hpp"

#include <algorithm>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "kernels/attention.hpp"
#include "kiln/error.hpp"
#include "kiln/params/attention_backward.h"

namespace kiln {
namespace detail {
namespace {

constexpr ConstantSchema kDotConstants[] = {{"dtype_out", ConstantKind::dtype},
                                            {"head_dim_v", ConstantKind::integer},
                                            {"varlen", ConstantKind::boolean}};
constexpr ConstantSchema kDbiasConstants[] = {{"dtype_q", ConstantKind::dtype}};

// The portable forward kernel's constants and `more`, sorted by name.
std::vector<ConstantSchema> portable_constants_and(std::initializer_list<ConstantSchema> more) {
  std::vector<ConstantSchema> c(attention_portable_constants().begin(),
                                attention_portable_constants().end());
  c.insert(c.end(), more);
  std::sort(c.begin(), c.end(),
            [](const ConstantSchema& a, const ConstantSchema& b) { return a.name < b.name; });
  return c;
}

// The dk/dv kernels' constants: the portable forward kernel's, and has_dbias (whether they
// write the bias's gradient: a spec of its own, so that the kernels without it stay as they
// were, in registers and speed).
std::span<const ConstantSchema> dkdv_constants() {
  static const std::vector<ConstantSchema> constants =
      portable_constants_and({{"has_dbias", ConstantKind::boolean}});
  return constants;
}

// The wgmma dk/dv kernel's, and deterministic (whether its dq additions take a fixed order).
std::span<const ConstantSchema> wgmma_dkdv_constants() {
  static const std::vector<ConstantSchema> constants = portable_constants_and(
      {{"has_dbias", ConstantKind::boolean}, {"deterministic", ConstantKind::boolean}});
  return constants;
}

// The forward's portable config of the same sizes, whose spec constants the portable backward
// kernels share.
AttentionConfig forward_config(const AttentionBackwardConfig& c) {
  return {.block_m = c.block_m,
          .block_n = c.block_n,
          .warps = c.warps,
          .kernel = AttentionKernel::portable};
}

// A spec that arrives as text, parsed into the typed problem and config its kernel's shared
// memory is computed from; `deterministic` where its kernel takes that constant (the wgmma dk/dv
// kernel's).
struct ParsedSpec {
  AttentionBackwardProblem problem;
  AttentionBackwardConfig config;
};
ParsedSpec parse(const KernelSpec& spec, bool takes_deterministic) {
  return {
      .problem = {.forward = {.dtype_q = dtype_constant(spec, "dtype_q"),
                              .dtype_kv = dtype_constant(spec, "dtype_kv"),
                              .dtype_out = dtype_constant(spec, "dtype_out"),
                              .head_dim = static_cast<int>(integer_constant(spec, "head_dim")),
                              .head_dim_v = static_cast<int>(integer_constant(spec, "head_dim_v"))},
                  .deterministic = takes_deterministic && boolean_constant(spec, "deterministic")},
      .config = {.block_m = static_cast<int>(integer_constant(spec, "block_m")),
                 .block_n = static_cast<int>(integer_constant(spec, "block_n")),
                 .warps = static_cast<int>(integer_constant(spec, "warps"))}};
}

long long portable_dkdv_bytes(const AttentionBackwardProblem& b, const AttentionBackwardConfig& c) {
  const AttentionProblem& p = b.forward;
  return attention_backward_dkdv_portable_smem_bytes(
      p.head_dim, p.head_dim_v, c.block_m, element_bytes(p.dtype_q), element_bytes(p.dtype_out));
}

long long portable_dq_bytes(const AttentionBackwardProblem& b, const AttentionBackwardConfig& c) {
  const AttentionProblem& p = b.forward;
  return attention_forward_portable_smem_bytes(p.head_dim, p.head_dim_v, c.block_n,
                                               element_bytes(p.dtype_kv));
}

// The mma kernels' operands have one dtype (the forward's operand table), q's.
long long mma_dkdv_bytes(const AttentionBackwardProblem& b, const AttentionBackwardConfig& c) {
  const AttentionProblem& p = b.forward;
  return attention_backward_mma_smem_bytes(p.head_dim, p.head_dim_v, c.block_m, c.block_n, c.warps,
                                           element_bytes(p.dtype_q), 2);
}

long long mma_dq_bytes(const AttentionBackwardProblem& b, const AttentionBackwardConfig& c) {
  const AttentionProblem& p = b.forward;
  return attention_backward_mma_smem_bytes(p.head_dim, p.head_dim_v, c.block_m, c.block_n, c.warps,
                                           element_bytes(p.dtype_q), 0);
}

long long wgmma_dkdv_bytes(const AttentionBackwardProblem& b, const AttentionBackwardConfig& c) {
  const AttentionProblem& p = b.forward;
  return attention_backward_wgmma_smem_bytes(p.head_dim, p.head_dim_v, c.block_m, c.block_n,
                                             c.warps, b.deterministic);
}

long long no_dynamic_shared(const AttentionBackwardProblem&, const AttentionBackwardConfig&) {
  return 0;
}

// A kernel's shared memory for a spec that arrives as text.
template <long long (*Bytes)(const AttentionBackwardProblem&, const AttentionBackwardConfig&),
          bool TakesDeterministic = false>
long long spec_bytes(const KernelSpec& spec) {
  const ParsedSpec s = parse(spec, TakesDeterministic);
  return Bytes(s.problem, s.config);
}

int warps_threads(const AttentionBackwardConfig& c) {
  return c.warps * 32;
}

// The consumer warps and the producer warpgroup.
int wgmma_threads(const AttentionBackwardConfig& c) {
  return c.warps * 32 + 128;
}

constexpr const char* kParams = "kiln::AttentionBackwardParams";
constexpr const char* kPortableSource = "attention/backward/backward_portable.cuh";
constexpr const char* kMmaSource = "attention/backward/backward_mma.cuh";
constexpr const char* kWgmmaSource = "attention/backward/backward_wgmma.cuh";

// Both kernels of each take the portable forward kernel's constants, the dk/dv kernels has_dbias
// too.
const AttentionBackwardDescription kDescriptions[] = {
    {.kernel = AttentionBackwardKernel::portable,
     .name = "portable",
     .targets = AttentionTargets::any,
     .dkdv = {kPortableSource, "kiln::attention_backward_dkdv_portable", kParams, dkdv_constants(),
              spec_bytes<portable_dkdv_bytes>, attention_operand_dtypes()},
     .dq = {kPortableSource, "kiln::attention_backward_dq_portable", kParams,
            attention_portable_constants(), spec_bytes<portable_dq_bytes>,
            attention_operand_dtypes()},
     .threads = warps_threads,
     .dq_rows = [](const AttentionBackwardConfig& c) { return c.block_m; },
     .dkdv_shared_bytes = portable_dkdv_bytes,
     .dq_shared_bytes = portable_dq_bytes},
    {.kernel = AttentionBackwardKernel::mma,
     .name = "mma",
     .targets = AttentionTargets::sm80,
     .dkdv = {kMmaSource, "kiln::attention_backward_dkdv_mma", kParams, dkdv_constants(),
              spec_bytes<mma_dkdv_bytes>, attention_operand_dtypes()},
     .dq = {kMmaSource, "kiln::attention_backward_dq_mma", kParams, attention_portable_constants(),
            spec_bytes<mma_dq_bytes>, attention_operand_dtypes()},
     .threads = warps_threads,
     .dq_rows = [](const AttentionBackwardConfig& c) { return c.block_n; },
     .dkdv_shared_bytes = mma_dkdv_bytes,
     .dq_shared_bytes = mma_dq_bytes},
    // Its dq kernel converts the fp32 accumulators the dk/dv kernel adds to.
    {.kernel = AttentionBackwardKernel::wgmma,
     .name = "wgmma",
     .targets = AttentionTargets::sm90a,
     .dkdv = {kWgmmaSource, "kiln::attention_backward_dkdv_wgmma", kParams, wgmma_dkdv_constants(),
              spec_bytes<wgmma_dkdv_bytes, true>, attention_operand_dtypes()},
     .dq = {kWgmmaSource, "kiln::attention_backward_dq_wgmma", kParams,
            attention_portable_constants(), no_shared_memory, attention_operand_dtypes()},
     .threads = wgmma_threads,
     .dq_rows = [](const AttentionBackwardConfig& c) { return c.block_m; },
     .dkdv_shared_bytes = wgmma_dkdv_bytes,
     .dq_shared_bytes = no_dynamic_shared},
};

// The most block_m and block_n of a config, and its most warps (a CTA of 1024 threads).
constexpr int kMaxBlock = 1024;
constexpr int kMaxWarps = 32;

// With dsinks the row dots take the call's variant, only to refuse a sink hook (dot.cuh).
KernelSpec dot_spec(const AttentionBackwardProblem& problem) {
  KernelSpec spec = spec_of(kBackwardDotKernel.schema);
  spec.set("dtype_out", problem.forward.dtype_out)
      .set("head_dim_v", problem.forward.head_dim_v)
      .set("varlen", problem.forward.varlen);
  if (problem.dsinks) set_variant(spec, problem.forward.variant);
  return spec;
}

// --- Tuning tables ---------------------------------------------------------------------------
//
// NOTE: the tables change speed only, never results; tests/ops/choose_pins.txt pins what
// choose() gives. Not yet timed on a GPU: FlashAttention-2's sm80 tiles where they fit. Each
// mma kernel's CTA holds block_n rows and streams block_m through two slots; 8 warps on 128 rows
// (one warp a 16-row group) up to head dim 128, and at 256 on 64 rows, two warps a group each
// taking half of the head dims (dK and dV in 128 registers a thread, not 256).

// A row: the config for problems whose wider head dim is at most `widest`.
struct BackwardTuning {
  int widest;
  AttentionBackwardConfig config;
};

constexpr AttentionBackwardKernel kMma = AttentionBackwardKernel::mma;

// Targets with at least 163 KiB of shared memory a CTA (sm_80, sm_87, sm_90, sm_100): 73 KiB at
// 64, 137 KiB at 128 and 132.5 KiB at 256 (attention_backward_mma_smem_bytes, dk/dv).
constexpr BackwardTuning kMmaLarge[] = {
    {64, {.block_m = 64, .block_n = 128, .warps = 8, .kernel = kMma}},
    {128, {.block_m = 64, .block_n = 128, .warps = 8, .kernel = kMma}},
    {256, {.block_m = 32, .block_n = 64, .warps = 8, .kernel = kMma}},
};
// The others (sm_86, sm_89, sm_120: 99 KiB): 73 KiB at 64, 68.5 KiB at 128, 66 KiB at 256.
constexpr BackwardTuning kMmaSmall[] = {
    {64, {.block_m = 64, .block_n = 128, .warps = 8, .kernel = kMma}},
    {128, {.block_m = 32, .block_n = 64, .warps = 4, .kernel = kMma}},
    {256, {.block_m = 16, .block_n = 32, .warps = 4, .kernel = kMma}},
};
constexpr int kLargeSharedBytes = 163 * 1024;

// sm_90a, by q's and k's head dim (dQ's columns; not the wider one) up to 128:
// - Up to 64 (both head dims), kWgmmaTall: two warpgroups of 64 keys over 128 query rows a step,
//   each taking 64 of them and all 64 of dQ's columns. Its 64 scores a thread of S^T and dP^T
//   each spill 108-236 bytes (NVRTC 13.0; the most without a mask, with varlen), yet it ran
//   1.00-1.15 times as fast as kWgmmaNarrow, and deterministic calls 1.2-1.5 times (run 57).
// - kWgmmaNarrow, one warpgroup of 64 keys over 64 rows (two CTAs an SM), takes the rest up to 64:
//   softcap (712-792 bytes of spills in the first) and user variants (a logit's derivative);
//   ALiBi and a bias, which spill as much as plain calls alone but up to 2052 bytes with the
//   other features, and are not timed there yet; and a head_dim_v past 64, with which the first
//   needs more than 227 KB. (Two warpgroups over 64 rows would split dQ's 64 columns below the
//   swizzle width.)
// - Up to 128, kWgmmaPair: two warpgroups of 64 keys over 64 rows a step, splitting dQ's
//   columns (one warpgroup would hold all 128 of them: 64 more registers).
// - Above 128 (either head dim), kWgmmaWide: two warpgroups over 64 keys that split the head dims.
// Timed on an H200: bench/RESULTS.md.
constexpr AttentionBackwardKernel kWgmma = AttentionBackwardKernel::wgmma;
constexpr AttentionBackwardConfig kWgmmaTall{
    .block_m = 128, .block_n = 128, .warps = 8, .kernel = kWgmma};
constexpr AttentionBackwardConfig kWgmmaNarrow{
    .block_m = 64, .block_n = 64, .warps = 4, .kernel = kWgmma};
constexpr AttentionBackwardConfig kWgmmaPair{
    .block_m = 64, .block_n = 128, .warps = 8, .kernel = kWgmma};
constexpr AttentionBackwardConfig kWgmmaWide{
    .block_m = 64, .block_n = 64, .warps = 8, .kernel = kWgmma};
// A warpgroup holds dK and dV for up to 128 head dims (BackwardWgmmaTraits).
constexpr int kWgmmaWarpgroupHeadDim = 128;

// Every head dim kiln compiles has a row, whose tiles fit the shared memory of its targets.
template <std::size_t N>
constexpr bool fits_every_head_dim(const BackwardTuning (&rows)[N], long long shared_bytes) {
  int previous = 0;
  for (const BackwardTuning& row : rows) {
    const AttentionBackwardConfig& c = row.config;
    // dk/dv's tiles are the larger, by the streamed rows' LSE and D.
    if (row.widest <= previous ||
        attention_backward_mma_smem_bytes(row.widest, row.widest, c.block_m, c.block_n, c.warps, 2,
                                          2) > shared_bytes) {
      return false;
    }
    previous = row.widest;
  }
  return previous == kMaxHeadDim;
}
static_assert(fits_every_head_dim(kMmaLarge, kLargeSharedBytes) &&
                  fits_every_head_dim(kMmaSmall, 99 * 1024),
              "Each mma tuning table has a row for every head dim kiln compiles, whose tiles fit "
              "its targets' shared memory.");

std::span<const BackwardTuning> mma_table(const Target& target) {
  if (target.max_shared_bytes_per_block() >= kLargeSharedBytes) return kMmaLarge;
  return kMmaSmall;
}

}  // namespace

const FixedKernel kBackwardDotKernel{
    .schema = {"attention/backward/dot.cuh", "kiln::attention_backward_dot", kParams, kDotConstants,
               no_shared_memory},
    .threads = kAttentionBackwardDotThreads};
const FixedKernel kBackwardSinksKernel{.schema = {"attention/backward/dot.cuh",
                                                  "kiln::attention_backward_sinks",
                                                  kParams,
                                                  {},
                                                  no_shared_memory},
                                       .threads = kAttentionBackwardSinksThreads};
const FixedKernel kBackwardDbiasKernel{
    .schema = {"attention/backward/dbias.cuh", "kiln::attention_backward_dbias", kParams,
               kDbiasConstants, no_shared_memory},
    .threads = kAttentionBackwardDbiasThreads};

const AttentionBackwardDescription& describe(AttentionBackwardKernel kernel) {
  for (const AttentionBackwardDescription& d : kDescriptions) {
    if (d.kernel == kernel) return d;
  }
  invalid(
      fmt::format("config.kernel is {}, which is no AttentionBackwardKernel: use mma or portable",
                  static_cast<int>(kernel)));
}

std::vector<const KernelSchema*> attention_backward_schemas() {
  std::vector<const KernelSchema*> schemas{&kBackwardDotKernel.schema, &kBackwardSinksKernel.schema,
                                           &kBackwardDbiasKernel.schema};
  for (const AttentionBackwardDescription& d : kDescriptions) {
    schemas.push_back(&d.dkdv);
    schemas.push_back(&d.dq);
  }
  return schemas;
}

namespace {

// A config's tile rules, whatever the target.
void check_tiles(const AttentionBackwardConfig& config) {
  const auto in = [](int value, int most) { return value >= 1 && value <= most; };
  if (!in(config.block_m, kMaxBlock) || !in(config.block_n, kMaxBlock) ||
      !in(config.warps, kMaxWarps)) {
    invalid(fmt::format(
        "backward config (block_m {}, block_n {}, warps {}) has a value out of range: block_m "
        "and block_n must be from 1 to {}, warps from 1 to {} (a CTA has at most {} threads)",
        config.block_m, config.block_n, config.warps, kMaxBlock, kMaxWarps, kMaxWarps * 32));
  }
  if (config.kernel == AttentionBackwardKernel::wgmma) {
    // BackwardWgmmaTraits asserts these too: a warpgroup per 64 keys (or two over 64 keys that
    // split the head dims), 64-row wgmma tiles.
    if ((config.block_n != 64 && config.block_n != 128) ||
        (config.warps != config.block_n / 16 && (config.warps != 8 || config.block_n != 64)) ||
        (config.block_m != 64 && config.block_m != 128) || config.block_m > config.block_n) {
      invalid(fmt::format(
          "wgmma backward config (block_m {}, block_n {}, warps {}) breaks the kernel's tile "
          "rules: block_n must be 64 or 128 with warps = block_n / 16 (or warps 8 over block_n "
          "64, which split the head dims), and block_m 64 or 128, at most block_n (e.g. block_m "
          "64, block_n 128, warps 8)",
          config.block_m, config.block_n, config.warps));
    }
    return;
  }
  if (config.kernel != AttentionBackwardKernel::mma) return;
  // The mma kernel's tile rules (BackwardMmaTraits asserts them too): each warp's row group
  // holds 16 key rows, a row group's warps split the head dim, and each streamed query row's
  // LSE and D are loaded by one thread.
  const int groups = config.block_n / 16;
  if (config.block_n % 16 != 0 || config.block_n > 256 || config.warps > 16 ||
      config.warps % groups != 0 || config.block_m % 16 != 0 ||
      config.block_m > config.warps * 32) {
    invalid(fmt::format(
        "mma backward config (block_m {}, block_n {}, warps {}) breaks the kernel's tile rules: "
        "block_n must be a multiple of 16 up to 256, warps a multiple of block_n / 16 up to 16, "
        "and block_m a multiple of 16 up to warps * 32 (e.g. block_m 64, block_n 64, warps 8)",
        config.block_m, config.block_n, config.warps));
  }
}

}  // namespace

void check_config(const AttentionBackwardConfig& config, const Target& target) {
  require_target(target, config.kernel);
  check_tiles(config);
}

void require_target(const Target& target, AttentionBackwardKernel kernel) {
  const AttentionBackwardDescription& d = describe(kernel);
  require_target(target, AttentionKernel::portable);  // a target attention runs on at all
  if (target.amd() && d.targets != AttentionTargets::any) {
    unsupported(fmt::format(
        "the {} backward kernel uses NVIDIA instructions and cannot run on {}: use a portable "
        "config (AttentionBackwardKernel::portable), as choose() gives AMD targets",
        d.name, target.name()));
  }
  if (d.targets == AttentionTargets::sm90a && !is_sm90a(target)) {
    unsupported(fmt::format(
        "the {} backward kernel runs on sm_90a (H100, H200) only; the target is {}: use the mma "
        "kernel (AttentionBackwardKernel::mma)",
        d.name, target.name()));
  }
}

AttentionBackwardPlan attention_backward_plan(const AttentionBackwardProblem& problem,
                                              const AttentionBackwardConfig& config) {
  const AttentionBackwardDescription& d = describe(config.kernel);
  check_tiles(config);
  if (config.kernel == AttentionBackwardKernel::wgmma) {
    const AttentionProblem& f = problem.forward;
    const int split =
        static_cast<int>(attention_backward_wgmma_column_groups(config.block_n, config.warps));
    if (std::max(f.head_dim, f.head_dim_v) > kWgmmaWarpgroupHeadDim * split) {
      unsupported(fmt::format(
          "wgmma backward config (block_m {}, block_n {}, warps {}) takes head dims up to {}, "
          "not {} and {}: {}",
          config.block_m, config.block_n, config.warps, kWgmmaWarpgroupHeadDim * split, f.head_dim,
          f.head_dim_v,
          split == 1 ? "use warps 8 over block_n 64 (block_m 64), which split the head dims, as "
                       "choose() does"
                     : "kiln compiles head dims up to 256"));
    }
    if (attention_backward_wgmma_dq_cols(f.head_dim, config.block_m, config.block_n, config.warps) %
            64 !=
        0) {
      unsupported(fmt::format(
          "wgmma backward config (block_m {}, block_n {}, warps {}) splits head dim {}'s dQ "
          "columns between its warpgroups below 64, the swizzle width: use block_m 128, or "
          "block_n 64 with warps 4",
          config.block_m, config.block_n, config.warps, f.head_dim));
    }
  }
  const int threads = d.threads(config);
  AttentionBackwardPlan plan{
      .dot = {.spec = dot_spec(problem), .threads = kBackwardDotKernel.threads},
      .sinks = std::nullopt,
      .dkdv = {.spec = attention_family_spec(d.dkdv, problem.forward, forward_config(config)),
               .threads = threads,
               .shared_bytes = d.dkdv_shared_bytes(problem, config)},
      .dq = {.spec = attention_family_spec(d.dq, problem.forward, forward_config(config)),
             .threads = threads,
             .shared_bytes = d.dq_shared_bytes(problem, config)},
      .dq_rows = d.dq_rows(config),
      .dbias = std::nullopt};
  plan.dkdv.spec.set("has_dbias", problem.dbias);
  if (config.kernel == AttentionBackwardKernel::wgmma) {
    plan.dkdv.spec.set("deterministic", problem.deterministic);
  }
  if (problem.dsinks) {
    plan.sinks = LaunchPlan{.spec = spec_of(kBackwardSinksKernel.schema),
                            .threads = kBackwardSinksKernel.threads};
  }
  if (problem.dbias) {
    plan.dbias = LaunchPlan{.spec = spec_of(kBackwardDbiasKernel.schema),
                            .threads = kBackwardDbiasKernel.threads};
    plan.dbias->spec.set("dtype_q", problem.forward.dtype_q);
  }
  return plan;
}

void require_fits(const AttentionBackwardPlan& plan, const AttentionBackwardConfig& config,
                  const DeviceInfo& device) {
  for (const LaunchPlan* launch : {&plan.dkdv, &plan.dq}) {
    if (const auto exceeded = exceeded_limit(*launch, device)) {
      unsupported(fmt::format(
          "backward config (kernel {}, block_m {}, block_n {}, warps {}) needs {}: pass a config "
          "with a smaller block_m or block_n, or fewer warps (or choose()'s config, where this "
          "one is not)",
          describe(config.kernel).name, config.block_m, config.block_n, config.warps, *exceeded));
    }
  }
}

AttentionBackwardConfig mma_config(const AttentionBackwardProblem& problem, const Target& target) {
  const int widest = std::max(problem.forward.head_dim, problem.forward.head_dim_v);
  for (const BackwardTuning& row : mma_table(target)) {
    if (widest <= row.widest) return row.config;
  }
  // NOTE: only a head dim past kMaxHeadDim gets here, which no call validates; its compile
  // refuses it.
  return mma_table(target).back().config;
}

}  // namespace detail

AttentionBackwardConfig choose(const AttentionBackwardProblem& problem, const Target& target) {
  if (target.amd()) {
    detail::require_target(target, AttentionBackwardKernel::portable);
    return {};
  }
  detail::require_target(target, AttentionBackwardKernel::mma);
  const int widest = std::max(problem.forward.head_dim, problem.forward.head_dim_v);
  // NOTE: deterministic calls take the wgmma kernels too (H200): at head dim 64 their turns cost
  // 0.99-1.28 times the default's time (run 61b; the mma kernels 1.83-2.37, run 54b); at 256
  // 1.00-1.32, where the default has a second slot that the turns' staging block leaves no room
  // for (the mma kernels 1.7-1.9 times the old default's, run 55).
  if (detail::is_sm90a(target)) {
    if (widest > detail::kWgmmaWarpgroupHeadDim) return detail::kWgmmaWide;
    const AttentionProblem& f = problem.forward;
    if (f.head_dim > 64) return detail::kWgmmaPair;
    const bool plain = !f.softcap && !f.alibi && !f.bias && f.variant == nullptr;
    return plain && widest <= 64 ? detail::kWgmmaTall : detail::kWgmmaNarrow;
  }
  return detail::mma_config(problem, target);
}

std::vector<KernelSpec> attention_backward_specs(const AttentionBackwardProblem& problem,
                                                 const AttentionBackwardConfig& config) {
  const detail::AttentionBackwardPlan plan = detail::attention_backward_plan(problem, config);
  std::vector<KernelSpec> specs{plan.dot.spec};
  if (plan.sinks) specs.push_back(plan.sinks->spec);
  specs.push_back(plan.dkdv.spec);
  specs.push_back(plan.dq.spec);
  if (plan.dbias) specs.push_back(plan.dbias->spec);
  return specs;
}

std::vector<KernelSpec> attention_backward_default_specs(const Target& target) {
  std::vector<KernelSpec> specs;
  if (!detail::attention_runs_on(target)) return specs;
  for (const detail::OperandDTypes& dtypes : detail::attention_operand_dtypes()) {
    for (int dim : {64, 128, 256}) {
      for (bool band : {false, true}) {
        for (bool deterministic : {false, true}) {
          const AttentionBackwardProblem problem{.forward = {.dtype_q = dtypes.q,
                                                             .dtype_kv = dtypes.kv,
                                                             .dtype_out = dtypes.out,
                                                             .head_dim = dim,
                                                             .head_dim_v = dim,
                                                             .band = band},
                                                 .deterministic = deterministic,
                                                 .dsinks = true};  // its kernel too
          for (KernelSpec& spec : attention_backward_specs(problem, choose(problem, target))) {
            if (std::find(specs.begin(), specs.end(), spec) == specs.end()) {
              specs.push_back(std::move(spec));
            }
          }
        }
      }
    }
  }
  return specs;
}

}  // namespace kiln
