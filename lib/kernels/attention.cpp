// SPDX-License-Identifier: Apache-2.0
// The forward kernels' descriptions, the tuning tables choose() reads, and the specs and launch
// plans made from them.
#include "kernels/attention.hpp"

#include <algorithm>
#include <array>

#include <fmt/format.h>

#include "kiln/error.hpp"
#include "kiln/params/attention.h"

namespace kiln {
namespace detail {
namespace {

// The most block_m, block_n and stages of a given AttentionConfig, and its most warps.
constexpr int kMaxConfigValue = 1024;
constexpr int kMaxWarps = 32;

// --- Descriptions ----------------------------------------------------------------------------

constexpr ConstantKind kInt = ConstantKind::integer;
constexpr ConstantKind kBool = ConstantKind::boolean;
constexpr ConstantKind kDType = ConstantKind::dtype;

// The operand dtypes (q, k and v, out) every forward kernel takes, and the backward's, one row a
// combination; the default warm set compiles each.
constexpr OperandDTypes kOperandDTypes[] = {
    {DType::bf16, DType::bf16, DType::bf16},
    {DType::f16, DType::f16, DType::f16},
};
// The mma kernel's: those, and fp8 k and v under a 16-bit q, widened to q's type as they are read
// (sm_89 and newer). The default warm set compiles e4m3's.
constexpr std::span<const OperandDTypes> kWideningDTypes = kWideningOperandDTypes;
// The tma kernel's: the mma kernel's (it widens fp8 k and v in shared memory, but K under a bf16 q
// over e4m3, which it splits: attention_tma_qk_bytes), and the all-fp8
// forward's e4m3 q, k and v with a 16-bit out (sm_90a). The default warm set compiles bf16 out's.
constexpr OperandDTypes kTmaDTypes[] = {
    {DType::bf16, DType::bf16, DType::bf16}, {DType::f16, DType::f16, DType::f16},
    {DType::bf16, DType::e4m3, DType::bf16}, {DType::f16, DType::e4m3, DType::f16},
    {DType::bf16, DType::e5m2, DType::bf16}, {DType::f16, DType::e5m2, DType::f16},
    {DType::e4m3, DType::e4m3, DType::bf16}, {DType::e4m3, DType::e4m3, DType::f16},
};
static_assert(std::equal(std::begin(kWideningOperandDTypes), std::end(kWideningOperandDTypes),
                         std::begin(kTmaDTypes),
                         [](const OperandDTypes& a, const OperandDTypes& b) {
                           return a.q == b.q && a.kv == b.kv && a.out == b.out;
                         }),
              "kTmaDTypes begins with the widening kernels' rows.");

// The constants each kernel's template reads (kernels_src/attention/prefill).
constexpr ConstantSchema kMmaConstants[] = {
    {"band", kBool},        {"block_m", kInt},   {"block_n", kInt},    {"dtype_kv", kDType},
    {"dtype_out", kDType},  {"dtype_q", kDType}, {"has_alibi", kBool}, {"has_bias", kBool},
    {"has_softcap", kBool}, {"head_dim", kInt},  {"head_dim_v", kInt}, {"stages", kInt},
    {"varlen", kBool},      {"warps", kInt}};
// wgmma and tma: a warpgroup per 64 rows, so no warps.
constexpr ConstantSchema kWarpgroupConstants[] = {
    {"band", kBool},        {"block_m", kInt},   {"block_n", kInt},    {"dtype_kv", kDType},
    {"dtype_out", kDType},  {"dtype_q", kDType}, {"has_alibi", kBool}, {"has_bias", kBool},
    {"has_softcap", kBool}, {"head_dim", kInt},  {"head_dim_v", kInt}, {"stages", kInt},
    {"varlen", kBool}};
// portable: one K/V slot, so no stages.
constexpr ConstantSchema kPortableConstants[] = {
    {"band", kBool},        {"block_m", kInt},   {"block_n", kInt},    {"dtype_kv", kDType},
    {"dtype_out", kDType},  {"dtype_q", kDType}, {"has_alibi", kBool}, {"has_bias", kBool},
    {"has_softcap", kBool}, {"head_dim", kInt},  {"head_dim_v", kInt}, {"varlen", kBool},
    {"warps", kInt}};

int warps_threads(const AttentionConfig& c) {
  return c.warps * 32;
}

// A spec that arrives as text, parsed once into the typed problem and config that its kernel's
// shared memory is computed from.
template <AttentionKernel kernel>
long long spec_shared_bytes(const KernelSpec& spec) {
  const AttentionDescription& d = describe(kernel);
  const AttentionProblem problem{
      .dtype_q = dtype_constant(spec, "dtype_q"),
      .dtype_kv = dtype_constant(spec, "dtype_kv"),
      .dtype_out = dtype_constant(spec, "dtype_out"),
      .head_dim = static_cast<int>(integer_constant(spec, "head_dim")),
      .head_dim_v = static_cast<int>(integer_constant(spec, "head_dim_v"))};
  AttentionConfig config{.block_m = static_cast<int>(integer_constant(spec, "block_m")),
                         .block_n = static_cast<int>(integer_constant(spec, "block_n")),
                         .kernel = kernel};
  if (takes(d.schema, "warps")) config.warps = static_cast<int>(integer_constant(spec, "warps"));
  if (takes(d.schema, "stages")) config.stages = static_cast<int>(integer_constant(spec, "stages"));
  return d.shared_bytes(problem, config);
}

constexpr AttentionDescription kDescriptions[] = {
    {.kernel = AttentionKernel::mma,
     .name = "mma",
     .schema = {"attention/prefill/forward.cuh", "kiln::attention_forward", "kiln::AttentionParams",
                kMmaConstants, spec_shared_bytes<AttentionKernel::mma>, kWideningDTypes},
     .targets = AttentionTargets::sm80,
     .threads = warps_threads,
     .shared_bytes =
         [](const AttentionProblem& p, const AttentionConfig& c) {
           return attention_forward_smem_bytes(
               p.head_dim, p.head_dim_v, c.block_m, c.block_n, c.stages, element_bytes(p.dtype_q),
               element_bytes(p.dtype_kv), element_bytes(p.dtype_out));
         }},
    {.kernel = AttentionKernel::wgmma,
     .name = "wgmma",
     .schema = {"attention/prefill/forward_wgmma.cuh", "kiln::attention_forward_wgmma",
                "kiln::AttentionParams", kWarpgroupConstants,
                spec_shared_bytes<AttentionKernel::wgmma>, kOperandDTypes},
     .targets = AttentionTargets::sm90a,
     .threads = [](const AttentionConfig& c) { return c.block_m * 2; },  // a warpgroup per 64 rows
     .shared_bytes =
         [](const AttentionProblem& p, const AttentionConfig& c) {
           return attention_forward_wgmma_smem_bytes(
               p.head_dim, p.head_dim_v, c.block_m, c.block_n, c.stages, element_bytes(p.dtype_q),
               element_bytes(p.dtype_kv), element_bytes(p.dtype_out));
         }},
    {.kernel = AttentionKernel::tma,
     .name = "tma",
     .schema = {"attention/prefill/forward_tma.cuh", "kiln::attention_forward_tma",
                "kiln::AttentionTmaParams", kWarpgroupConstants,
                spec_shared_bytes<AttentionKernel::tma>, kTmaDTypes},
     .targets = AttentionTargets::sm90a,
     // wgmma's warpgroups and the producer's
     .threads = [](const AttentionConfig& c) { return c.block_m * 2 + 128; },
     .shared_bytes =
         [](const AttentionProblem& p, const AttentionConfig& c) {
           return attention_forward_tma_smem_bytes(
               p.head_dim, p.head_dim_v, c.block_m, c.block_n, c.stages, element_bytes(p.dtype_q),
               attention_tma_qk_bytes(p.dtype_q, p.dtype_kv), element_bytes(p.dtype_kv),
               element_bytes(p.dtype_out));
         }},
    {.kernel = AttentionKernel::portable,
     .name = "portable",
     .schema = {"attention/prefill/forward_portable.cuh", "kiln::attention_forward_portable",
                "kiln::AttentionParams", kPortableConstants,
                spec_shared_bytes<AttentionKernel::portable>, kOperandDTypes},
     .targets = AttentionTargets::any,
     .threads = warps_threads,
     .shared_bytes =
         [](const AttentionProblem& p, const AttentionConfig& c) {
           return attention_forward_portable_smem_bytes(p.head_dim, p.head_dim_v, c.block_n,
                                                        element_bytes(p.dtype_kv));
         }},
};

static_assert(std::size(kDescriptions) == 4 && kDescriptions[0].kernel == AttentionKernel::mma &&
                  kDescriptions[1].kernel == AttentionKernel::wgmma &&
                  kDescriptions[2].kernel == AttentionKernel::tma &&
                  kDescriptions[3].kernel == AttentionKernel::portable,
              "kDescriptions lists every AttentionKernel once, in the enum's order.");

// AMD targets attention runs on: gfx9 (GCN and CDNA), whose wavefronts have the 64 lanes that
// kernels_src/common/vendor.cuh assumes for every AMD target.
bool amd_target_supported(const Target& target) {
  return target.arch() >= 0x900 && target.arch() <= 0x9ff;  // gfx9xx
}

// Hopper's arch-specific target, the one with wgmma (the wgmma and tma kernels).

// --- Tuning tables ---------------------------------------------------------------------------
//
// NOTE: the tables change speed only, never results: every config gives results within the same
// tolerance. choose() takes the first row that matches the problem; tests/ops/choose_pins.txt
// pins what it gives.

enum class Match { no, yes, any };

constexpr bool matches(Match m, bool value) {
  return m == Match::any || (m == Match::yes) == value;
}

// A row: the config for problems whose wider head dim (of head_dim and head_dim_v) is at most
// `widest`, with a mask or without (`band`), on fewer or more keys than kLongSeqlenK
// (`long_keys`).
struct AttentionTuning {
  int widest;
  Match band;
  Match long_keys;
  AttentionConfig config;
};

// Whether a table has a row for every problem: every head dim kiln compiles, masked or not, with
// short or long keys.
template <std::size_t N>
constexpr bool covers_every_problem(const AttentionTuning (&rows)[N]) {
  for (int dim = 8; dim <= kMaxHeadDim; dim += 8) {
    for (const bool band : {false, true}) {
      for (const bool long_keys : {false, true}) {
        bool found = false;
        for (const AttentionTuning& row : rows) {
          found = found || (dim <= row.widest && matches(row.band, band) &&
                            matches(row.long_keys, long_keys));
        }
        if (!found) return false;
      }
    }
  }
  return true;
}

// AMD gfx9: the portable kernel, not tuned on AMD hardware: CTAs of 256 threads (4 wavefronts)
// with 4, 8 or 16 lanes on each query row, so that every lane holds at most 2 chunks (16
// columns) of q and of the output. 32 keys a step: with 64, hipRTC gave head dim 128 417 VGPRs
// on gfx90a (260 with 32).
constexpr AttentionKernel kPortable = AttentionKernel::portable;
constexpr AttentionTuning kGfx9[] = {
    {64, Match::any, Match::any, {.block_m = 64, .block_n = 32, .warps = 8, .kernel = kPortable}},
    {128, Match::any, Match::any, {.block_m = 32, .block_n = 32, .warps = 8, .kernel = kPortable}},
    {256, Match::any, Match::any, {.block_m = 16, .block_n = 32, .warps = 8, .kernel = kPortable}},
};

// sm_90a, both head dims 64 or more (kTmaMinHeadDim): the tma kernel. Measured on an H100
// (bench/RESULTS.md, runs 13 to 16; kiln_bench_tune times the candidates): it runs 0.71-1.18x
// cuDNN where the wgmma kernel ran 0.65-0.79x (head dims 128 and 256) and mma 0.65-0.71x (64);
// at 80 and 96, padded to 128, it still beats the mma kernel. Below 64 the padding would double
// the work: mma. At 64 three consumer warpgroups (192 rows) share each K/V tile without a mask
// (15-20% faster than two); with one, two warpgroups, and 192 keys a step from kLongSeqlenK keys
// (2-6% faster there, 6-10% slower at 1024); 192 x 192 spills. From 65 to 128 two warpgroups,
// and 176 keys a step from kLongSeqlenK (2-5% faster there; 10-19% slower at 512 and 1024 with a
// mask); a third stage or warpgroup gained nothing, and a single stage lost 10-30%. 192 KiB of
// smem at 256 holds only 64 keys a step (one stage of 64 or 128 keys lost 30-70%). Inputs TMA
// cannot tile (a stride of 0) run the wgmma kernel on the same tiles (without_tma()).
constexpr int kTmaMinHeadDim = 64;
constexpr AttentionKernel kTma = AttentionKernel::tma;
constexpr AttentionTuning kSm90a[] = {
    {64, Match::no, Match::any, {.block_m = 192, .block_n = 128, .stages = 3, .kernel = kTma}},
    {64, Match::yes, Match::no, {.block_m = 128, .block_n = 128, .stages = 2, .kernel = kTma}},
    {64, Match::yes, Match::yes, {.block_m = 128, .block_n = 192, .stages = 2, .kernel = kTma}},
    {128, Match::any, Match::no, {.block_m = 128, .block_n = 128, .stages = 2, .kernel = kTma}},
    {128, Match::any, Match::yes, {.block_m = 128, .block_n = 176, .stages = 2, .kernel = kTma}},
    {256, Match::any, Match::any, {.block_m = 128, .block_n = 64, .stages = 2, .kernel = kTma}},
};

// Every other sm_80+ target, and sm_90a below kTmaMinHeadDim: the mma kernel, tuned on an H200;
// every sm_80+ part fits these, sm_86/89's 99 KiB included. Up to 256, 64 x 64 fits 2 CTAs per
// SM; 128 x 64 with 8 warps and 2 stages fits one and ran ~5% slower.
constexpr AttentionTuning kSm80[] = {
    {64, Match::yes, Match::any, {.block_m = 128, .block_n = 128, .warps = 4, .stages = 2}},
    {64, Match::no, Match::any, {.block_m = 128, .block_n = 64, .warps = 4, .stages = 2}},
    {128, Match::any, Match::any, {.block_m = 128, .block_n = 64, .warps = 4, .stages = 1}},
    {256, Match::any, Match::any, {.block_m = 64, .block_n = 64, .warps = 4, .stages = 1}},
};

// fp8 k and v on sm_89 and newer but sm_90a's tma head dims (and there, inputs TMA cannot tile):
// the mma kernel, measured on an H200 with kiln_bench_tune's e4m3
// sweep (bench/RESULTS.md, run 45). Up to 64, kSm80's unmasked tiles (a third stage gained under
// 1%). To 96, one stage of 64 keys: 10% faster than 32 keys in 2 stages, 20-35% than 8 warps.
// To 128, 32 keys in 2 stages: 10-30% faster than any other candidate (the 64-key tiles spill or
// fall to 8 warps). At 256, 32 keys in 2 stages: 2-12% faster masked, within 2% of the best
// (128 x 64 of 8 warps) without a mask.
constexpr AttentionTuning kFp8[] = {
    {64, Match::any, Match::any, {.block_m = 128, .block_n = 64, .warps = 4, .stages = 2}},
    {96, Match::any, Match::any, {.block_m = 128, .block_n = 64, .warps = 4, .stages = 1}},
    {128, Match::any, Match::any, {.block_m = 128, .block_n = 32, .warps = 4, .stages = 2}},
    {256, Match::any, Match::any, {.block_m = 64, .block_n = 32, .warps = 4, .stages = 2}},
};

// fp8 k and v on sm_90a, both head dims 64 or more: the tma kernel, widening V (and K, but under
// a bf16 q over e4m3, which it splits: attention_tma_qk_bytes) into its slots, on kSm90a's tiles
// where their staging entries fit beside them (at d128, 2 x 128 keys: 176 keys leave no room for
// them under an f16 q). A split q's tiles were measured (kiln_bench_tune e4m3, bench/RESULTS.md
// run 67e): these are the fastest but at head dims to 64 with a mask from kLongSeqlenK keys, where
// 192 x 128 in 3 stages ran 8-16% faster, and spills 112 bytes (loop invariants) with a mask: kept
// out until it does not. FIXME(tuning): f16's tiles are kSm90a's measurements, not fp8's.
constexpr AttentionTuning kFp8Sm90a[] = {
    {64, Match::no, Match::any, {.block_m = 192, .block_n = 128, .stages = 3, .kernel = kTma}},
    {64, Match::yes, Match::no, {.block_m = 128, .block_n = 128, .stages = 2, .kernel = kTma}},
    {64, Match::yes, Match::yes, {.block_m = 128, .block_n = 192, .stages = 2, .kernel = kTma}},
    {128, Match::any, Match::any, {.block_m = 128, .block_n = 128, .stages = 2, .kernel = kTma}},
    {256, Match::any, Match::any, {.block_m = 128, .block_n = 64, .stages = 2, .kernel = kTma}},
};

// fp8 q, k and v (sm_90a only): the tma kernel's fp8 products (wgmma's fp8 operands are K-major:
// V is transposed into its slots in 128-key chunks). Up to head dim 128, 256 keys a block, each
// block's P V after its softmax (split_pv): 8-14% faster than 128 keys with P V under the next
// block's scores, whose accumulator beside o, s and P leaves no room for more keys (run 66a; 3
// stages 4% faster at head dims to 64 without a mask, even with one). Past 128, 128 keys, P V 128
// columns at a time.
constexpr AttentionTuning kFp8QSm90a[] = {
    {64, Match::any, Match::any, {.block_m = 128, .block_n = 256, .stages = 3, .kernel = kTma}},
    {128, Match::any, Match::any, {.block_m = 128, .block_n = 256, .stages = 2, .kernel = kTma}},
    {256, Match::any, Match::any, {.block_m = 128, .block_n = 128, .stages = 2, .kernel = kTma}},
};

// The same with softcap, ALiBi or a user variant, whose logits take registers that 256 keys'
// scores leave too few of (at head dim 128, 52-308 bytes of spills): 128 keys.
constexpr AttentionTuning kFp8QSm90aLogitHooks[] = {
    {256, Match::any, Match::any, {.block_m = 128, .block_n = 128, .stages = 2, .kernel = kTma}},
};

static_assert(covers_every_problem(kGfx9) && covers_every_problem(kSm90a) &&
                  covers_every_problem(kSm80) && covers_every_problem(kFp8) &&
                  covers_every_problem(kFp8Sm90a) && covers_every_problem(kFp8QSm90a) &&
                  covers_every_problem(kFp8QSm90aLogitHooks),
              "Each tuning table has a row for every head dim kiln compiles, masked or not, with "
              "short or long keys.");

// The table of `target` for `problem`: one of the above.
std::span<const AttentionTuning> table_of(const AttentionProblem& problem, const Target& target) {
  if (target.amd()) return kGfx9;
  if (is_fp8(problem.dtype_q)) {  // require_kv_dtype: sm_90a
    const bool hooks = problem.softcap || problem.alibi || problem.variant != nullptr;
    return hooks ? std::span<const AttentionTuning>(kFp8QSm90aLogitHooks) : kFp8QSm90a;
  }
  const bool tma =
      is_sm90a(target) && std::min(problem.head_dim, problem.head_dim_v) >= kTmaMinHeadDim;
  if (is_fp8(problem.dtype_kv)) {
    if (tma) return kFp8Sm90a;
    return kFp8;
  }
  if (tma) return kSm90a;
  return kSm80;
}

// The config of `table`'s first row that `problem` matches.
AttentionConfig row_of(std::span<const AttentionTuning> table, const AttentionProblem& problem) {
  const int widest = std::max(problem.head_dim, problem.head_dim_v);
  const bool long_keys = problem.seqlen_k >= kLongSeqlenK;
  for (const AttentionTuning& row : table) {
    if (widest <= row.widest && matches(row.band, problem.band) &&
        matches(row.long_keys, long_keys)) {
      return row.config;
    }
  }
  // NOTE: only a head dim past kMaxHeadDim gets here, which no call validates; its compile
  // refuses it.
  return table.back().config;
}

}  // namespace

long long attention_tma_qk_bytes(DType q, DType kv) {
  return attention_forward_tma_qk_size(element_bytes(q), q == DType::bf16, kv == DType::e4m3);
}

bool is_sm90a(const Target& target) {
  return target.nvidia() && target.arch() == 90 && target.arch_specific();
}

const AttentionDescription& describe(AttentionKernel kernel) {
  for (const AttentionDescription& d : kDescriptions) {
    if (d.kernel == kernel) return d;
  }
  invalid(
      fmt::format("config.kernel is {}, which is no AttentionKernel: use mma, wgmma, tma or "
                  "portable",
                  static_cast<int>(kernel)));
}

std::span<const AttentionDescription> attention_descriptions() {
  return kDescriptions;
}

std::span<const OperandDTypes> attention_operand_dtypes() {
  return kOperandDTypes;
}

std::span<const OperandDTypes> attention_forward_operand_dtypes() {
  return kTmaDTypes;
}

std::span<const ConstantSchema> attention_portable_constants() {
  return kPortableConstants;
}

bool attention_runs_on(const Target& target) {
  return target.amd() ? amd_target_supported(target) : is_sm80_or_newer(target);
}

void require_target(const Target& target, AttentionKernel kernel) {
  const AttentionDescription& d = describe(kernel);
  if (target.amd()) {
    if (!amd_target_supported(target)) {
      unsupported(
          fmt::format("attention on {} is not supported: on AMD it runs on gfx9 targets "
                      "(wave64, such as gfx90a) that the loaded hipRTC can build",
                      target.name()));
    }
    if (d.targets != AttentionTargets::any) {
      unsupported(
          fmt::format("the {} attention kernel uses NVIDIA instructions and cannot run on {}: "
                      "use a portable config (AttentionKernel::portable), as choose() gives AMD "
                      "targets",
                      d.name, target.name()));
    }
    return;
  }
  if (!is_sm80_or_newer(target)) {
    unsupported(
        fmt::format("attention needs an sm_80 or newer GPU (bf16 tensor cores) or an AMD gfx9 "
                    "one; the target is {}",
                    target.name()));
  }
  if (d.targets == AttentionTargets::sm90a && !is_sm90a(target)) {
    unsupported(fmt::format(
        "the {} attention kernel runs on sm_90a (H100, H200) only; the target is {}: use "
        "the mma kernel (AttentionKernel::mma)",
        d.name, target.name()));
  }
}

void require_kv_dtype(const AttentionProblem& problem, AttentionKernel kernel,
                      const Target& target) {
  if (is_fp8(problem.dtype_q)) {
    if (!is_sm90a(target)) {
      unsupported(fmt::format(
          "an {} q (the all-fp8 forward) runs on sm_90a (H100, H200) only; the target is {}: "
          "pass q in bf16 or fp16 there (fp8 k and v stay fp8 under it)",
          to_string(problem.dtype_q), target.name()));
    }
    if (kernel != AttentionKernel::tma) {
      unsupported(
          fmt::format("an {} q runs on the tma attention kernel only, not the {} one: use "
                      "AttentionKernel::tma, or choose()'s config",
                      to_string(problem.dtype_q), describe(kernel).name));
    }
    require_fp8_kv(problem.dtype_kv, problem.head_dim, problem.head_dim_v, &target, "K/V");
    return;
  }
  if (!is_fp8(problem.dtype_kv)) return;
  require_fp8_kv(problem.dtype_kv, problem.head_dim, problem.head_dim_v, &target, "K/V");
  if (kernel != AttentionKernel::mma && kernel != AttentionKernel::tma) {
    unsupported(
        fmt::format("{} k and v run on the mma and tma attention kernels only, not the {} one: "
                    "use AttentionKernel::mma (or tma on sm_90a), or choose()'s config",
                    to_string(problem.dtype_kv), describe(kernel).name));
  }
}

void check_config(const AttentionConfig& config, const Target& target) {
  require_target(target, config.kernel);
  // NOTE: the upper bounds keep the launch's thread count and shared memory, products of these,
  // from overflowing; no kernel takes more.
  const auto in = [](int value, int most) { return value >= 1 && value <= most; };
  if (!in(config.block_m, kMaxConfigValue) || !in(config.block_n, kMaxConfigValue) ||
      !in(config.warps, kMaxWarps) || !in(config.stages, kMaxConfigValue)) {
    invalid(fmt::format(
        "config (block_m {}, block_n {}, warps {}, stages {}) has a value out of range: "
        "block_m, block_n and stages must be from 1 to {}, warps from 1 to {} (a CTA has at "
        "most {} threads)",
        config.block_m, config.block_n, config.warps, config.stages, kMaxConfigValue, kMaxWarps,
        kMaxWarps * 32));
  }
}

void require_fp8_q_tiles(const AttentionProblem& problem, const AttentionConfig& config) {
  if (!is_fp8(problem.dtype_q) || config.kernel != AttentionKernel::tma) return;
  const bool keys = config.block_n == 128 || (config.block_n == 256 && problem.head_dim_v <= 128);
  if (config.block_m != 128 || !keys) {
    unsupported(fmt::format(
        "an {} q's tma config (block_m {}, block_n {}) has tiles the all-fp8 forward cannot take: "
        "it needs block_m 128 and block_n 128, or 256 up to head_dim_v 128 (here {}): pass "
        "such a config, or choose()'s",
        to_string(problem.dtype_q), config.block_m, config.block_n, problem.head_dim_v));
  }
}

AttentionConfig without_tma(const AttentionProblem& problem, const AttentionConfig& config) {
  if (is_fp8(problem.dtype_kv)) return row_of(kFp8, problem);  // wgmma reads no fp8
  AttentionConfig c = config;
  c.kernel = AttentionKernel::wgmma;
  if (c.block_n == 176) c.block_n = 128;  // 176 keys a step is the tma kernel's alone
  return c;
}

LaunchPlan attention_plan(const AttentionProblem& problem, const AttentionConfig& config) {
  const AttentionDescription& d = describe(config.kernel);
  return {.spec = attention_spec(problem, config),
          .threads = d.threads(config),
          .shared_bytes = d.shared_bytes(problem, config)};
}

void require_fits(const LaunchPlan& plan, const AttentionConfig& config, const DeviceInfo& device) {
  if (const auto exceeded = exceeded_limit(plan, device)) {
    unsupported(fmt::format(
        "attention config (kernel {}, block_m {}, block_n {}, warps {}, stages {}) needs {}: "
        "pass a config with a smaller block_m or block_n, or fewer stages or warps (or "
        "choose()'s config, where this one is not)",
        describe(config.kernel).name, config.block_m, config.block_n, config.warps, config.stages,
        *exceeded));
  }
}

}  // namespace detail

AttentionConfig choose(const AttentionProblem& problem, const Target& target) {
  detail::require_target(target, target.amd() ? AttentionKernel::portable : AttentionKernel::mma);
  detail::require_kv_dtype(
      problem, is_fp8(problem.dtype_q) ? AttentionKernel::tma : AttentionKernel::mma, target);
  return detail::row_of(detail::table_of(problem, target), problem);
}

KernelSpec attention_spec(const AttentionProblem& problem, const AttentionConfig& config) {
  return detail::attention_family_spec(detail::describe(config.kernel).schema, problem, config);
}

KernelSpec detail::attention_family_spec(const KernelSchema& schema,
                                         const AttentionProblem& problem,
                                         const AttentionConfig& config) {
  KernelSpec spec = detail::spec_of(schema);
  spec.set("dtype_q", problem.dtype_q)
      .set("dtype_kv", problem.dtype_kv)
      .set("dtype_out", problem.dtype_out)
      .set("head_dim", problem.head_dim)
      .set("head_dim_v", problem.head_dim_v)
      .set("block_m", config.block_m)
      .set("block_n", config.block_n);
  if (detail::takes(schema, "warps")) spec.set("warps", config.warps);
  if (detail::takes(schema, "stages")) spec.set("stages", config.stages);
  spec.set("band", problem.band)
      .set("varlen", problem.varlen)
      .set("has_softcap", problem.softcap)
      .set("has_alibi", problem.alibi)
      .set("has_bias", problem.bias);
  detail::set_variant(spec, problem.variant);
  return spec;
}

std::vector<KernelSpec> attention_default_specs(const Target& target) {
  std::vector<KernelSpec> specs;
  if (!detail::attention_runs_on(target)) return specs;
  std::vector<detail::OperandDTypes> rows = detail::warmed_widening_dtypes(target);
  if (detail::is_sm90a(target)) rows.push_back({DType::e4m3, DType::e4m3, DType::bf16});
  for (const detail::OperandDTypes& dtypes : rows) {
    for (int dim : {64, 128, 256}) {
      for (bool band : {false, true}) {
        for (long long seqlen_k : {0LL, kLongSeqlenK}) {
          const AttentionProblem problem{.dtype_q = dtypes.q,
                                         .dtype_kv = dtypes.kv,
                                         .dtype_out = dtypes.out,
                                         .head_dim = dim,
                                         .head_dim_v = dim,
                                         .band = band,
                                         .seqlen_k = seqlen_k};
          const KernelSpec spec = attention_spec(problem, choose(problem, target));
          if (std::find(specs.begin(), specs.end(), spec) == specs.end()) specs.push_back(spec);
        }
      }
    }
  }
  return specs;
}

}  // namespace kiln
