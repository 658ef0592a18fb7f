// SPDX-License-Identifier: Apache-2.0
// The attention backward: validate (as the forward call it differentiates, then its gradients)
// -> choose -> plan -> fit -> compile -> launch the row dots, the sinks' sum, dk/dv and dq. The
// kernels' descriptions are in kernels/attention_backward.cpp.
#include "kiln/attention_backward.hpp"

#include <cstdint>
#include <optional>
#include <string_view>

#include <fmt/format.h>

#include "core/checked_math.hpp"
#include "kernels/attention_backward.hpp"
#include "kiln/error.hpp"
#include "kiln/params/attention_backward.h"
#include "ops/attention_call.hpp"
#include "ops/kv_layout.hpp"
#include "ops/launch_plan.hpp"
#include "ops/scratch.hpp"
#include "ops/tensor_checks.hpp"
#include "runtime/device_calls.hpp"

namespace kiln {
namespace {

using detail::invalid;
using detail::unsupported;

constexpr detail::CallName kCall{"kiln::attention_backward", "kiln_attention_backward"};

// A gradient has the shape and dtype of the tensor it differentiates.
void require_like(const TensorView& grad, std::string_view name, const TensorView& of,
                  std::string_view of_name, int device) {
  detail::check_common(grad, name, device);
  if (grad.rank != of.rank) {
    invalid(fmt::format("{} has rank {} but {} has rank {}: {} takes {}'s shape", name, grad.rank,
                        of_name, of.rank, name, of_name));
  }
  for (int d = 0; d < grad.rank; ++d) {
    if (grad.size(d) != of.size(d)) {
      invalid(fmt::format("{}.size({}) is {} but {}.size({}) is {}: {} takes {}'s shape", name, d,
                          grad.size(d), of_name, d, of.size(d), name, of_name));
    }
  }
  if (grad.dtype != of.dtype) {
    invalid(fmt::format("{} has dtype {} but {} has dtype {}: {} takes {}'s dtype", name,
                        to_string(grad.dtype), of_name, to_string(of.dtype), name, of_name));
  }
}

struct BackwardCall {
  detail::ValidatedAttention forward;
  AttentionBackwardProblem problem;
};

BackwardCall validate(const TensorView& q, const TensorView& k, const TensorView& v,
                      const TensorView& out, const TensorView& dout, const TensorView& dq,
                      const TensorView& dk, const TensorView& dv, const AttentionOptions& o,
                      const AttentionGradOptions& grads, int device) {
  if (!o.lse) {
    invalid(
        "the backward needs the forward's LSE in options.lse: pass the forward call's options, "
        "with the lse tensor the forward wrote");
  }
  BackwardCall call{.forward = detail::validate_attention(q, k, v, out, o, device)};
  // The forward's dtypes, less those it alone takes (fp8 k and v).
  const detail::NamedDType kv[] = {{"k", k.dtype}, {"v", v.dtype}};
  if (auto error =
          detail::operand_dtypes_error("attention's backward", detail::attention_operand_dtypes(),
                                       {"q", q.dtype}, kv, std::nullopt)) {
    throw *error;
  }
  const detail::AttentionShape& s = call.forward.shape;
  require_like(dout, "dout", out, "out", device);
  require_like(dq, "dq", q, "q", device);
  require_like(dk, "dk", k, "k", device);
  require_like(dv, "dv", v, "v", device);
  detail::check_tile_tensors({{&dout, "dout"}, {&dq, "dq"}, {&dk, "dk"}, {&dv, "dv"}});
  detail::require_no_overlap(dq, "dq");
  detail::require_no_overlap(dk, "dk");
  detail::require_no_overlap(dv, "dv");
  if (grads.dsinks) {
    if (!o.score.sinks) {
      invalid(
          "grads.dsinks is set but options.score.sinks is not: dsinks is the sinks' gradient; "
          "pass the forward's sinks, or leave dsinks unset");
    }
    detail::check_lse(*grads.dsinks, "dsinks", "(heads), fp32", {{s.heads, "heads"}}, device);
    detail::require_no_overlap(*grads.dsinks, "dsinks");
  }
  if (grads.dbias) {
    if (!o.bias) {
      invalid(
          "grads.dbias is set but options.bias is not: dbias is the bias's gradient; pass the "
          "forward's bias, or leave dbias unset");
    }
    require_like(*grads.dbias, "dbias", *o.bias, "bias", device);
    detail::require_no_overlap(*grads.dbias, "dbias");
  }
  if (s.varlen && k.size(0) > 0 && (o.max_seqlen_k <= 0 || o.max_seqlen_k > k.size(0))) {
    invalid(fmt::format(
        "max_seqlen_k is {}: the varlen backward needs the longest key sequence, from 1 to "
        "k.size(0) ({}), to size its grid",
        o.max_seqlen_k, k.size(0)));
  }
  call.problem = {.forward = call.forward.problem,
                  .deterministic = grads.deterministic,
                  .dsinks = grads.dsinks.has_value(),
                  .dbias = grads.dbias.has_value()};
  return call;
}

// One past the furthest element of `t` (at least 1 element when it has any).
std::int64_t extent(const TensorView& t) {
  std::int64_t last = 0;
  for (int d = 0; d < t.rank; ++d) {
    if (t.size(d) == 0) return 0;
    last += (t.size(d) - 1) * t.stride(d);
  }
  return last + 1;
}

AttentionBackwardParams params_of(const TensorView& q, const TensorView& k, const TensorView& v,
                                  const TensorView& out, const TensorView& dout,
                                  const TensorView& dq, const TensorView& dk, const TensorView& dv,
                                  const AttentionOptions& o, const detail::AttentionShape& s) {
  AttentionBackwardParams bp{};
  bp.fwd = detail::attention_params(q, k, v, out, o, s);
  bp.dout = dout.data;
  detail::token_strides(dout, bp.dout_batch_stride, bp.dout_seq_stride, bp.dout_head_stride);
  bp.dq = dq.data;
  detail::token_strides(dq, bp.dq_batch_stride, bp.dq_seq_stride, bp.dq_head_stride);
  bp.grads = detail::kv_layout(dk, dv);
  return bp;
}

// The bias's gradient: dbias (validated like the bias), and the dk/dv kernel's dL / d logit at
// `accum`.
void set_dbias(AttentionBackwardParams& bp, const TensorView& dbias, std::byte* accum) {
  bp.maybe_dbias_accum = reinterpret_cast<float*>(accum);
  bp.maybe_dbias = dbias.data;
  bp.dbias_batch_stride = dbias.stride(0);
  bp.dbias_head_stride = dbias.stride(1);
  bp.dbias_row_stride = dbias.stride(2);
  bp.dbias_col_stride = dbias.stride(3);
  bp.dbias_batch = static_cast<int>(dbias.size(0));
  bp.dbias_heads = static_cast<int>(dbias.size(1));
}

std::uint32_t grid_dim(std::int64_t n, std::int64_t per_block) {
  return static_cast<std::uint32_t>(detail::ceil_div(n, per_block));
}

void run(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
         const TensorView& dout, const TensorView& dq, const TensorView& dk, const TensorView& dv,
         const AttentionOptions& options, const AttentionGradOptions& grads,
         const std::optional<AttentionBackwardConfig>& config, void* stream, Runtime& runtime) {
  const BackwardCall call =
      validate(q, k, v, out, dout, dq, dk, dv, options, grads, runtime.device());
  const detail::AttentionShape& s = call.forward.shape;
  // No element of any gradient, but for a dbias of size 1 over the heads: its sums, all 0.
  if (s.heads == 0 && !call.problem.dbias) return;
  const Target target = detail::target_to_run(runtime, kCall);
  if (config) detail::check_config(*config, target);
  AttentionBackwardConfig c = config ? *config : choose(call.problem, target);
  if (c.kernel == AttentionBackwardKernel::wgmma && !detail::tma_can_tile({&q, &dout})) {
    if (config) {
      unsupported(fmt::format(
          "the wgmma backward kernel cannot tile q {} and dout {}: TMA needs data, no empty dim "
          "and every stride but the last a nonzero multiple of 16 bytes: use the mma kernel "
          "(AttentionBackwardKernel::mma), or choose()'s config, which does so itself",
          q.describe(), dout.describe()));
    }
    c = detail::mma_config(call.problem, target);
  }
  const detail::AttentionBackwardPlan plan = detail::attention_backward_plan(call.problem, c);
  const DeviceInfo& device = detail::require_gpu(runtime, kCall, &plan.dkdv.spec);
  detail::require_fits(plan, c, device);  // before the compiles: a refused call does nothing

  // Every kernel before any memory is taken or written: a failed compile leaves nothing behind.
  const Kernel dot = runtime.kernel(plan.dot.spec, stream);
  const Kernel sinks = plan.sinks ? runtime.kernel(plan.sinks->spec, stream) : Kernel();
  const Kernel dkdv = runtime.kernel(plan.dkdv.spec, stream);
  const Kernel dq_kernel = runtime.kernel(plan.dq.spec, stream);
  const Kernel dbias = plan.dbias ? runtime.kernel(plan.dbias->spec, stream) : Kernel();

  AttentionBackwardParams bp = params_of(q, k, v, out, dout, dq, dk, dv, options, s);
  if (c.kernel == AttentionBackwardKernel::wgmma) {
    detail::require_launch_registers(dkdv.info(), attention_backward_wgmma_least_registers(c.warps),
                                     "the mma backward kernel (AttentionBackwardKernel::mma)");
    // Its dk/dv kernel's tensor maps, which the driver may refuse: before any memory is taken.
    bp.q_map = detail::tensor_map_of(q, s.head_dim, c.block_m, s.varlen, runtime);
    bp.dout_map = detail::tensor_map_of(dout, s.head_dim_v, c.block_m, s.varlen, runtime);
  }
  const std::int64_t dot_blocks = detail::ceil_div(s.seqlen_q, kAttentionBackwardDotRows);
  bp.dot_row_blocks = static_cast<int>(dot_blocks);
  // The row dots at the LSE's offsets; the sinks' partial sums after them.
  const std::size_t dot_bytes =
      detail::scratch_align(static_cast<std::size_t>(extent(*options.lse)) * sizeof(float));
  const std::size_t partial_bytes = detail::scratch_align(
      plan.sinks ? static_cast<std::size_t>(s.heads * s.batch * dot_blocks) * sizeof(float) : 0);
  // The wgmma kernels' dq accumulators: head_dim floats a row, rows at the LSE's offsets.
  const bool accumulates = c.kernel == AttentionBackwardKernel::wgmma;
  const std::size_t accum_bytes = detail::scratch_align(
      accumulates ? static_cast<std::size_t>(extent(*options.lse) * s.head_dim) * sizeof(float)
                  : 0);
  // With deterministic, their additions' turns: an int a (batch, head, block of rows).
  const std::int64_t dq_row_blocks = detail::ceil_div(s.seqlen_q, c.block_m);
  const std::size_t semaphore_bytes = detail::scratch_align(
      accumulates && call.problem.deterministic
          ? static_cast<std::size_t>(s.batch * s.heads * dq_row_blocks) * sizeof(int)
          : 0);
  // Then dL / d logit of every (batch, head, row, key), for the bias's gradient.
  const std::size_t dbias_bytes =
      plan.dbias
          ? static_cast<std::size_t>(s.batch * s.heads * s.seqlen_q * s.seqlen_k) * sizeof(float)
          : 0;
  const std::size_t accum_at = dot_bytes + partial_bytes;
  const std::size_t dbias_at = accum_at + accum_bytes + semaphore_bytes;
  const detail::Scratch scratch(runtime, dbias_at + dbias_bytes, stream);
  bp.row_dot = reinterpret_cast<float*>(scratch.at(0));
  if (plan.sinks) {
    bp.maybe_sink_partials = reinterpret_cast<float*>(scratch.at(dot_bytes));
    bp.maybe_dsinks = static_cast<float*>(grads.dsinks->data);
  }
  if (accum_bytes > 0) {
    bp.maybe_dq_accum = reinterpret_cast<float*>(scratch.at(accum_at));
    if (semaphore_bytes > 0) {
      bp.maybe_dq_semaphore = reinterpret_cast<int*>(scratch.at(accum_at + accum_bytes));
      bp.dq_row_blocks = static_cast<int>(dq_row_blocks);
    }
    detail::zero_async(runtime, bp.maybe_dq_accum, accum_bytes + semaphore_bytes, stream);
  }
  if (plan.dbias) {
    set_dbias(bp, *grads.dbias, scratch.at(dbias_at));
    // NOTE: the dk/dv kernel visits only the (row, key) pairs of its band: the rest stay 0.
    if (dbias_bytes > 0) detail::zero_async(runtime, bp.maybe_dbias_accum, dbias_bytes, stream);
  }

  const auto heads = static_cast<std::uint32_t>(s.heads);
  const auto batch = static_cast<std::uint32_t>(s.batch);
  if (dot_blocks > 0 && batch > 0 && heads > 0) {
    dot.launch({.grid = {static_cast<std::uint32_t>(dot_blocks), heads, batch},
                .block = {static_cast<std::uint32_t>(plan.dot.threads)},
                .stream = stream},
               bp);
  }
  if (plan.sinks && heads > 0) {  // zeros without rows
    sinks.launch({.grid = {heads},
                  .block = {static_cast<std::uint32_t>(plan.sinks->threads)},
                  .stream = stream},
                 bp);
  }
  const std::uint32_t key_blocks = batch > 0 && heads > 0 ? grid_dim(s.seqlen_k, c.block_n) : 0;
  if (key_blocks > 0) {
    dkdv.launch({.grid = {key_blocks, static_cast<std::uint32_t>(s.heads_kv), batch},
                 .block = {static_cast<std::uint32_t>(plan.dkdv.threads)},
                 .shared_bytes = static_cast<std::uint32_t>(plan.dkdv.shared_bytes),
                 .stream = stream},
                bp);
  }
  const std::uint32_t row_blocks = batch > 0 && heads > 0 ? grid_dim(s.seqlen_q, plan.dq_rows) : 0;
  if (row_blocks > 0) {
    dq_kernel.launch({.grid = {row_blocks, heads, batch},
                      .block = {static_cast<std::uint32_t>(plan.dq.threads)},
                      .shared_bytes = static_cast<std::uint32_t>(plan.dq.shared_bytes),
                      .stream = stream},
                     bp);
  }
  // dbias's dims of size 1 sum over the batch or heads, 0 of them without any.
  const std::uint32_t dbias_blocks =
      plan.dbias && extent(*grads.dbias) > 0
          ? grid_dim(s.seqlen_q * s.seqlen_k, kAttentionBackwardDbiasThreads)
          : 0;
  if (dbias_blocks > 0) {
    dbias.launch({.grid = {dbias_blocks, static_cast<std::uint32_t>(bp.dbias_heads),
                           static_cast<std::uint32_t>(bp.dbias_batch)},
                  .block = {static_cast<std::uint32_t>(plan.dbias->threads)},
                  .stream = stream},
                 bp);
  }
}

}  // namespace

void attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& out, const TensorView& dout, const TensorView& dq,
                        const TensorView& dk, const TensorView& dv, const AttentionOptions& options,
                        const AttentionGradOptions& grads, void* stream, Runtime& runtime) {
  run(q, k, v, out, dout, dq, dk, dv, options, grads, std::nullopt, stream, runtime);
}

void attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& out, const TensorView& dout, const TensorView& dq,
                        const TensorView& dk, const TensorView& dv, const AttentionOptions& options,
                        const AttentionGradOptions& grads, const AttentionBackwardConfig& config,
                        void* stream, Runtime& runtime) {
  run(q, k, v, out, dout, dq, dk, dv, options, grads, config, stream, runtime);
}

}  // namespace kiln
