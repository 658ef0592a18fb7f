// SPDX-License-Identifier: Apache-2.0
// The decode family's kernels: config choice, specs and the launch sequence.
#include "ops/decode_kernels.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>

#include <fmt/format.h>

#include "checked_math.hpp"
#include "kiln/error.hpp"
#include "ops/score.hpp"
#include "ops/tensor_checks.hpp"

namespace kiln {
namespace {

// The heuristic gives each split at least this many keys: a CTA's fixed costs (Q, the first
// tiles' latency, the warp merge) need that much streaming to hide. Measured on an H200 at
// 1 x 32768 (8 kv heads): 16 splits of 2048 keys ran at 3.0 TB/s, 33 splits at 2.7.
constexpr long long kMinSplitKeys = 2048;
// Shared memory one CTA aims to stay under, so that two fit an SM of sm_90 (227 KiB); choose()
// takes the target's limit where that is less.
constexpr long long kSmemPerCta = 112 * 1024;

using detail::ceil_div;

long long smem_bytes(const DecodeProblem& problem, const DecodeConfig& c) {
  return attention_decode_smem_bytes(problem.head_dim, problem.head_dim_v, c.m_tiles, c.block_n,
                                     c.warps, c.stages);
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

DecodeConfig choose(const DecodeProblem& problem, const Target& target, int multiprocessors) {
  DecodeConfig c;
  c.m_tiles = detail::decode_m_tiles(problem.rows_per_kv_head, problem.head_dim_v);
  c.stages = 2;
  // NOTE: fewer warps only where two stages of four do not fit the target at all (head dim 256
  // on sm_86, sm_89 and sm_120: 136 KiB against 99), since four warps are what was measured (on
  // an H200): the stages give way first. Neither is tuned on those targets.
  const long long limit = target.max_shared_bytes_per_block();
  while (c.warps > 1 && smem_bytes(problem, c) > limit) --c.warps;
  // As many cp.async slots per warp as fit kSmemPerCta and the target, 2 to 4.
  const long long budget = std::min(kSmemPerCta, limit);
  while (c.stages < 4) {
    DecodeConfig deeper = c;
    ++deeper.stages;
    if (smem_bytes(problem, deeper) > budget) break;
    c = deeper;
  }
  const long long step = static_cast<long long>(c.warps) * c.block_n;
  const long long keys = std::max(problem.capacity, 0LL);
  const int max_splits =
      static_cast<int>(std::clamp<long long>(ceil_div(keys, step), 1, detail::kMaxDecodeSplits));
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
  const int worthwhile =
      static_cast<int>(std::clamp<long long>(ceil_div(keys, kMinSplitKeys), 1, max_splits));
  // One CTA per SM, though two fit: measured on an H200 (32q/8kv, d128), 8 x 8192 ran at 3.60
  // TB/s with 2 splits (128 CTAs) against 3.52 with 4, and 1 x 32768 at 2.92 with 16 splits
  // against 2.76 with 28.
  c.num_splits = split_heuristic(ctas, std::max(1, multiprocessors), worthwhile);
  return c;
}

std::vector<KernelSpec> decode_specs(const DecodeProblem& problem, const DecodeConfig& config) {
  std::vector<KernelSpec> specs;
  if (problem.append) specs.push_back(detail::decode_append_spec(problem));
  specs.push_back(detail::decode_attention_spec(problem, config));
  return specs;
}

std::vector<KernelSpec> decode_default_specs(const Target& target) {
  std::vector<KernelSpec> specs;
  if (!detail::is_sm80_or_newer(target)) return specs;
  // A long cache on few sequences, so that the config is the split one. The SM count steers
  // only the splits, which no spec holds.
  constexpr int kBatch = 1, kHeadsKv = 8, kRows = 4, kSms = 132;
  constexpr long long kCapacity = 32768;
  for (DType dtype : {DType::bf16, DType::f16}) {
    for (int dim : {64, 128}) {
      for (bool paged : {false, true}) {
        const DecodeProblem problem{.dtype = dtype,
                                    .head_dim = dim,
                                    .head_dim_v = dim,
                                    .rows_per_kv_head = kRows,
                                    .paged = paged,
                                    .batch = kBatch,
                                    .heads_kv = kHeadsKv,
                                    .capacity = kCapacity};
        for (KernelSpec& spec : decode_specs(problem, choose(problem, target, kSms))) {
          specs.push_back(std::move(spec));
        }
      }
      // merge_states over the outputs of two such calls.
      specs.push_back(detail::merge_spec(dtype, dtype, dim));
    }
  }
  return specs;
}

namespace detail {
namespace {

// Device scratch of one call, handed back on the stream however the call ends.
// NOTE: the next call's kernels may be scheduled while this call's kernel still uses the
// scratch that the stream-ordered allocator hands them again; that is safe only because every
// kernel launched with overlap_previous touches no global memory before wait_for_previous_grid.
class Scratch {
 public:
  Scratch(Runtime& runtime, std::size_t bytes, void* stream)
      : runtime_(runtime),
        stream_(stream),
        base_(bytes ? static_cast<std::byte*>(runtime.allocate_async(bytes, stream)) : nullptr) {}
  ~Scratch() {
    if (base_ == nullptr) return;
    try {
      runtime_.free_async(base_, stream_);
    } catch (const Error&) {
      // NOTE: only reachable when the driver is already failing; the error that got us here
      // (or the next call's) reports it.
    }
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  std::byte* at(std::size_t offset) const { return base_ + offset; }

 private:
  Runtime& runtime_;
  void* stream_;
  std::byte* base_;
};

std::size_t align_up(std::size_t bytes) {
  return (bytes + 255) / 256 * 256;
}

// A fresh tag for a split call's flags (DecodeParams::split_tag): 1 to 2^48 - 2, a new one for
// each call of the process, so a word an earlier call left set (one that failed half-way) never
// reads as set.
unsigned long long next_split_tag() {
  constexpr std::uint64_t kTags = (std::uint64_t{1} << 48) - 2;
  static std::atomic<std::uint64_t> next{0};
  return next.fetch_add(1, std::memory_order_relaxed) % kTags + 1;
}

}  // namespace

int decode_m_tiles(int rows_per_kv_head, int head_dim_v) {
  // Output accumulators a thread holds: m_tiles * round_up(head_dim_v, 16) / 2; at most 128.
  const int most = head_dim_v <= 64 ? 4 : head_dim_v <= 128 ? 2 : 1;
  return std::min(most, rows_per_kv_head <= 16 ? 1 : rows_per_kv_head <= 32 ? 2 : 4);
}

std::int64_t decode_row_blocks(const DecodeProblem& problem, const DecodeConfig& config) {
  return ceil_div(std::max(problem.rows_per_kv_head, 0), 16 * config.m_tiles);
}

KernelSpec decode_append_spec(const DecodeProblem& problem) {
  KernelSpec spec{.source = "attention/decode/append.cuh",
                  .entry = "kiln::decode_append",
                  .params = "kiln::DecodeParams"};
  spec.set("dtype", problem.dtype)
      .set("head_dim", problem.head_dim)
      .set("head_dim_v", problem.head_dim_v)
      .set("paged", problem.paged)
      .set("rotary", problem.rotary);
  return spec;
}

KernelSpec decode_attention_spec(const DecodeProblem& problem, const DecodeConfig& config) {
  KernelSpec spec{.source = "attention/decode/attention.cuh",
                  .entry = "kiln::attention_decode",
                  .params = "kiln::DecodeParams"};
  spec.set("dtype", problem.dtype)
      .set("head_dim", problem.head_dim)
      .set("head_dim_v", problem.head_dim_v)
      .set("m_tiles", config.m_tiles)
      .set("block_n", config.block_n)
      .set("warps", config.warps)
      .set("stages", config.stages)
      .set("paged", problem.paged)
      .set("band", problem.band)
      .set("has_softcap", problem.softcap)
      .set("has_alibi", problem.alibi);
  set_variant(spec, problem.variant);
  return spec;
}

KernelSpec merge_spec(DType in, DType out, int head_dim) {
  KernelSpec spec{.source = "attention/decode/merge.cuh",
                  .entry = "kiln::merge_states_kernel",
                  .params = "kiln::MergeParams"};
  spec.set("dtype_in", in).set("dtype_out", out).set("head_dim", head_dim);
  return spec;
}

LaunchPlan decode_append_plan(const DecodeProblem& problem) {
  return {.spec = decode_append_spec(problem), .threads = kDecodeAppendThreads};
}

LaunchPlan decode_attention_plan(const DecodeProblem& problem, const DecodeConfig& config) {
  return {.spec = decode_attention_spec(problem, config),
          .threads = config.warps * 32,
          .shared_bytes = smem_bytes(problem, config)};
}

LaunchPlan merge_plan(DType in, DType out, int head_dim) {
  return {.spec = merge_spec(in, out, head_dim), .threads = kMergeThreads};
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

void launch_merge(Runtime& runtime, CallName call, DType in, DType out, int head_dim,
                  const MergeParams& p, void* stream) {
  const long long rows = static_cast<long long>(p.seqlen) * p.heads;
  if (rows == 0 || p.batch == 0) return;
  if (rows > std::numeric_limits<std::int32_t>::max()) {
    throw Error(ErrorCategory::unsupported,
                fmt::format("merging {} tokens x {} heads: the launch grid allows at most {} rows",
                            p.seqlen, p.heads, std::numeric_limits<std::int32_t>::max()));
  }
  const LaunchPlan plan = merge_plan(in, out, head_dim);
  require_gpu(runtime, call, &plan.spec);
  const Kernel kernel = runtime.kernel(plan.spec, stream);
  // The kernel waits for the previous grid before touching memory, so it may start early.
  kernel.launch({.grid = {static_cast<std::uint32_t>(rows), static_cast<std::uint32_t>(p.batch)},
                 .block = {static_cast<std::uint32_t>(plan.threads)},
                 .stream = stream,
                 .overlap_previous = true},
                p);
}

void launch_decode(Runtime& runtime, const DecodeProblem& problem, const DecodeConfig& config,
                   const DecodePlan& plan, DecodeParams p, void* stream) {
  // Both kernels before any memory is taken or written: a failed compile leaves nothing behind.
  const Kernel append = plan.append ? runtime.kernel(plan.append->spec, stream) : Kernel();
  const Kernel attention = runtime.kernel(plan.attention.spec, stream);
  const int splits = config.num_splits;
  const std::int64_t row_blocks = decode_row_blocks(problem, config);
  const std::size_t rows = static_cast<std::size_t>(p.batch) * p.seqlen_q * p.heads;
  const std::size_t q_rotated_bytes =
      problem.rotary ? align_up(rows * problem.head_dim * size_of(problem.dtype)) : 0;
  const std::size_t partial_out_bytes =
      splits > 1 ? align_up(splits * rows * problem.head_dim_v * sizeof(float)) : 0;
  const std::size_t partial_lse_bytes = splits > 1 ? align_up(splits * rows * sizeof(float)) : 0;
  const std::size_t flag_bytes = splits > 1
                                     ? align_up(static_cast<std::size_t>(p.batch) * p.heads_kv *
                                                row_blocks * splits * sizeof(unsigned long long))
                                     : 0;
  // The split flags start zero and the kernel leaves them zero: the stream's kept zeros, or,
  // where it has none (graph capture), zeroed scratch of this call.
  const std::shared_ptr<void> kept_flags = runtime.stream_zeros(flag_bytes, stream);
  const std::size_t scratch_flag_bytes = kept_flags ? 0 : flag_bytes;
  const Scratch scratch(
      runtime, q_rotated_bytes + partial_out_bytes + partial_lse_bytes + scratch_flag_bytes,
      stream);

  if (plan.append) {
    p.maybe_q_rotated = problem.rotary ? scratch.at(0) : nullptr;
    const int tokens = std::max(p.seqlen_new, problem.rotary ? p.seqlen_q : 0);
    append.launch(
        {.grid = {static_cast<std::uint32_t>(tokens), static_cast<std::uint32_t>(p.batch)},
         .block = {static_cast<std::uint32_t>(plan.append->threads)},
         .stream = stream},
        p);
  }
  if (problem.rotary) {
    p.q = p.maybe_q_rotated;
    p.q_head_stride = problem.head_dim;
    p.q_seq_stride = static_cast<long long>(p.heads) * problem.head_dim;
    p.q_batch_stride = p.seqlen_q * p.q_seq_stride;
  }
  p.num_splits = splits;
  if (splits > 1) {
    std::size_t at = q_rotated_bytes;
    p.partial_out = reinterpret_cast<float*>(scratch.at(at));
    at += partial_out_bytes;
    p.partial_lse = reinterpret_cast<float*>(scratch.at(at));
    at += partial_lse_bytes;
    void* flags = kept_flags.get();
    if (!flags) {
      flags = scratch.at(at);
      runtime.zero_async(flags, flag_bytes, stream);
    }
    p.split_flags = static_cast<unsigned long long*>(flags);
    p.split_tag = next_split_tag();
  }

  // The kernel waits for the previous grid before touching memory, so it may be scheduled
  // while the one before it finishes.
  attention.launch(
      {.grid = {static_cast<std::uint32_t>(row_blocks * splits),
                static_cast<std::uint32_t>(p.heads_kv), static_cast<std::uint32_t>(p.batch)},
       .block = {static_cast<std::uint32_t>(plan.attention.threads)},
       .shared_bytes = static_cast<std::uint32_t>(plan.attention.shared_bytes),
       .stream = stream,
       .overlap_previous = true},
      p);
}

}  // namespace detail
}  // namespace kiln
