// SPDX-License-Identifier: Apache-2.0
// The decode family's launch sequences: append and split-KV attention, and merge_states.
#include "ops/decode_kernels.hpp"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>

#include <fmt/format.h>

#include "kiln/error.hpp"
#include "ops/scratch.hpp"
#include "runtime/device_calls.hpp"

namespace kiln::detail {
namespace {

// A fresh tag for a split call's flags (DecodeParams::split_tag): 1 to 2^48 - 2, a new one for
// each call of the process, so a word an earlier call left set (one that failed half-way) never
// reads as set.
unsigned long long next_split_tag() {
  constexpr std::uint64_t kTags = (std::uint64_t{1} << 48) - 2;
  static std::atomic<std::uint64_t> next{0};
  return next.fetch_add(1, std::memory_order_relaxed) % kTags + 1;
}

}  // namespace

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
      problem.rotary ? scratch_align(rows * problem.head_dim * size_of(problem.dtype_q)) : 0;
  const std::size_t partial_out_bytes =
      splits > 1 ? scratch_align(splits * rows * problem.head_dim_v * sizeof(float)) : 0;
  const std::size_t partial_lse_bytes =
      splits > 1 ? scratch_align(splits * rows * sizeof(float)) : 0;
  const std::size_t flag_bytes =
      splits > 1 ? scratch_align(static_cast<std::size_t>(p.batch) * p.heads_kv * row_blocks *
                                 splits * sizeof(unsigned long long))
                 : 0;
  // The split flags start zero and the kernel leaves them zero: the stream's kept zeros, or,
  // where it has none (graph capture), zeroed scratch of this call.
  const std::shared_ptr<void> kept_flags = detail::stream_zeros(runtime, flag_bytes, stream);
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
      detail::zero_async(runtime, flags, flag_bytes, stream);
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

}  // namespace kiln::detail
