// SPDX-License-Identifier: Apache-2.0
// Forward attention: validate -> choose -> plan -> fit (and, for the tma kernel, encode its
// tensor maps) -> (debug checks: fp8 k and v's descales) -> compile -> launch. The kernels'
// descriptions and tuning tables are in kernels/attention.cpp.
#include "kiln/attention.hpp"

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string_view>

#include <fmt/format.h>

#include "core/checked_math.hpp"
#include "kernels/attention.hpp"
#include "kiln/error.hpp"
#include "kiln/params/attention.h"
#include "ops/attention_call.hpp"
#include "ops/kv_layout.hpp"
#include "ops/kvcache_checks.hpp"
#include "ops/launch_plan.hpp"
#include "ops/score.hpp"
#include "ops/tensor_checks.hpp"
#include "runtime/device_calls.hpp"

namespace kiln {
namespace {

using detail::check_common;
using detail::check_head_dim;
using detail::check_int_vector;
using detail::dim_name;
using detail::invalid;
using detail::require_int32;
using detail::require_rank;
using detail::require_size;
using detail::unsupported;

using Shape = detail::AttentionShape;

Shape check_qkv(const TensorView& q, const TensorView& k, const TensorView& v,
                const TensorView& out, const AttentionOptions& o, int device) {
  Shape s;
  s.varlen = o.cu_seqlens_q.has_value() || o.cu_seqlens_k.has_value();
  const int rank = s.varlen ? 3 : 4;
  const std::string_view layout = s.varlen ? "(total_tokens, heads, head_dim) with cu_seqlens"
                                           : "(batch, seqlen, heads, head_dim); for varlen pass "
                                             "cu_seqlens_q and cu_seqlens_k";
  require_rank(q, "q", rank, layout);
  for (const auto& [t, name] : {std::pair{&k, "k"}, std::pair{&v, "v"}, std::pair{&out, "out"}}) {
    if (t->rank != q.rank) {
      invalid(fmt::format("{} has rank {} but q has rank {}: q, k, v and out share one layout, {}",
                          name, t->rank, q.rank, layout));
    }
  }
  for (const auto& [t, name] :
       {std::pair{&q, "q"}, std::pair{&k, "k"}, std::pair{&v, "v"}, std::pair{&out, "out"}}) {
    check_common(*t, name, device);
  }
  const detail::NamedDType kv[] = {{"k", k.dtype}, {"v", v.dtype}};
  if (auto error =
          detail::operand_dtypes_error("attention", detail::attention_forward_operand_dtypes(),
                                       {"q", q.dtype}, kv, {{"out", out.dtype}})) {
    throw *error;
  }
  s.dtypes = {.q = q.dtype, .kv = k.dtype, .out = out.dtype};
  const int h = rank - 2, d = rank - 1;  // the heads and head-dim axes
  s.heads = q.size(h);
  s.heads_kv = k.size(h);
  s.head_dim = q.size(d);
  s.head_dim_v = v.size(d);
  if (s.varlen) {
    s.tokens_q = q.size(0);
    require_size(v, "v", 0, k.size(0), "k.size(0) (total_k)");
    require_size(out, "out", 0, q.size(0), "q.size(0) (total_q)");
  } else {
    s.batch = q.size(0);
    s.seqlen_q = q.size(1);
    s.seqlen_k = k.size(1);
    require_size(k, "k", 0, s.batch, "q.size(0) (batch)");
    require_size(v, "v", 0, s.batch, "q.size(0) (batch)");
    require_size(out, "out", 0, s.batch, "q.size(0) (batch)");
    require_size(v, "v", 1, s.seqlen_k, "k.size(1) (seqlen_k)");
    require_size(out, "out", 1, s.seqlen_q, "q.size(1) (seqlen_q)");
  }
  require_size(v, "v", h, s.heads_kv, fmt::format("k.size({}) (heads_kv)", h));
  require_size(out, "out", h, s.heads, fmt::format("q.size({}) (heads)", h));
  require_size(k, "k", d, s.head_dim, "q.size(-1) (head_dim)");
  require_size(out, "out", d, s.head_dim_v, "v.size(-1) (head_dim_v)");
  detail::check_heads(s.heads, s.heads_kv, "k");
  check_head_dim(s.head_dim, "head_dim (q.size(-1))");
  check_head_dim(s.head_dim_v, "head_dim_v (v.size(-1))");
  if (is_fp8(s.dtypes.kv)) {
    detail::require_fp8_kv(s.dtypes.kv, static_cast<int>(s.head_dim),
                           static_cast<int>(s.head_dim_v), nullptr, "K/V");
  }
  detail::check_tile_tensors({{&q, "q"}, {&k, "k"}, {&v, "v"}, {&out, "out"}});
  detail::require_no_overlap(out, "out");
  return s;
}

// fp8 k and v's descales, as the messages name them.
detail::DescaleTensors descale_tensors(const AttentionOptions& o) {
  return {o.k_descale, o.v_descale, "k_descale", "v_descale"};
}

// An fp8 q's descale, as a DescaleTensors of its own (with no second tensor).
detail::DescaleTensors q_descale_tensors(const AttentionOptions& o) {
  static const std::optional<TensorView> kNone;
  return {o.q_descale, kNone, "q_descale", ""};
}

void check_options(const AttentionOptions& o, Shape& s, const TensorView& q, int device) {
  if (s.varlen) {
    if (!o.cu_seqlens_q || !o.cu_seqlens_k) {
      invalid(fmt::format("varlen needs both cu_seqlens_q and cu_seqlens_k; {} is missing",
                          o.cu_seqlens_q ? "cu_seqlens_k" : "cu_seqlens_q"));
    }
    check_common(*o.cu_seqlens_q, "cu_seqlens_q", device);
    check_common(*o.cu_seqlens_k, "cu_seqlens_k", device);
    require_rank(*o.cu_seqlens_q, "cu_seqlens_q", 1, "(batch + 1) int32 offsets");
    s.batch = std::max<std::int64_t>(o.cu_seqlens_q->size(0) - 1, 0);
    check_int_vector(*o.cu_seqlens_q, "cu_seqlens_q", s.batch + 1, "batch + 1");
    check_int_vector(*o.cu_seqlens_k, "cu_seqlens_k", s.batch + 1,
                     "batch + 1 (the length of cu_seqlens_q)");
    if (o.max_seqlen_q <= 0 && s.tokens_q > 0) {
      invalid(fmt::format("varlen needs max_seqlen_q, the longest query sequence; it is {}",
                          o.max_seqlen_q));
    }
    if (o.max_seqlen_q > s.tokens_q) {
      invalid(
          fmt::format("max_seqlen_q is {} but q holds only {} tokens", o.max_seqlen_q, s.tokens_q));
    }
    s.seqlen_q = o.max_seqlen_q;
    s.seqlen_k = o.max_seqlen_k;
    if (o.bias) unsupported("bias with varlen is not supported: pad the batch instead");
  } else if (o.max_seqlen_q != 0 || o.max_seqlen_k != 0) {
    invalid("max_seqlen_q/max_seqlen_k are for varlen calls (with cu_seqlens); leave them 0");
  }
  require_int32(s.batch, "batch");
  if (s.heads > 65535 || s.batch > 65535) {
    unsupported(fmt::format("{} heads and batch {}: the launch grid allows at most 65535 of each",
                            s.heads, s.batch));
  }
  if (o.seqused_k) {
    check_common(*o.seqused_k, "seqused_k", device);
    check_int_vector(*o.seqused_k, "seqused_k", s.batch, "batch");
  }
  s.score = detail::score_params(o.score, s.batch, s.heads, s.head_dim, device);
  if (o.bias) {
    const TensorView& b = *o.bias;
    check_common(b, "bias", device);
    require_rank(b, "bias", 4, "(batch, heads, seqlen_q, seqlen_k), stride 0 to broadcast");
    if (is_fp8(q.dtype)) {
      unsupported(
          fmt::format("bias with an {} q is not supported yet: add it to the scores "
                      "through a user variant, or pass q, k and v in bf16 or fp16",
                      to_string(q.dtype)));
    }
    if (b.dtype != q.dtype) {
      invalid(fmt::format("bias has dtype {} but q has dtype {}: they must match",
                          to_string(b.dtype), to_string(q.dtype)));
    }
    const std::int64_t expected[4] = {s.batch, s.heads, s.seqlen_q, s.seqlen_k};
    const char* names[4] = {"batch", "heads", "seqlen_q", "seqlen_k"};
    for (int d = 0; d < 4; ++d) {
      // A size-1 dim broadcasts like a stride-0 one.
      if (b.size(d) != expected[d] && !(d < 2 && b.size(d) == 1)) {
        invalid(
            fmt::format("bias.size({}) is {} but {} is {} (size 1 or stride 0 broadcasts "
                        "over batch and heads)",
                        dim_name(b, d), b.size(d), names[d], expected[d]));
      }
    }
  }
  const detail::Extent batch{s.batch,
                             s.varlen ? "cu_seqlens_q.size(0) - 1 (batch)" : "q.size(0) (batch)"};
  const detail::Extent heads_kv{s.heads_kv,
                                s.varlen ? "k.size(1) (heads_kv)" : "k.size(2) (heads_kv)"};
  detail::check_descales(descale_tensors(o), s.dtypes.kv, "fp8 k and v", "k", batch, heads_kv,
                         device);
  detail::check_descales(q_descale_tensors(o), s.dtypes.q, "an fp8 q", "q", batch, heads_kv,
                         device);
  if (o.lse) {
    if (s.varlen) {
      detail::check_lse(*o.lse, "lse", "(heads, total_q) for varlen",
                        {{s.heads, "heads"}, {s.tokens_q, "q.size(0) (total_q)"}}, device);
    } else {
      detail::check_lse(*o.lse, "lse", "(batch, heads, seqlen_q)",
                        {{s.batch, "batch"}, {s.heads, "heads"}, {s.seqlen_q, "seqlen_q"}}, device);
    }
    detail::require_no_overlap(*o.lse, "lse");
  }
}

AttentionProblem problem_of(const Shape& s, const AttentionOptions& o) {
  return {.dtype_q = s.dtypes.q,
          .dtype_kv = s.dtypes.kv,
          .dtype_out = s.dtypes.out,
          .head_dim = static_cast<int>(s.head_dim),
          .head_dim_v = static_cast<int>(s.head_dim_v),
          .band = detail::has_band(o.score),
          .varlen = s.varlen,
          .softcap = o.score.softcap > 0,
          .alibi = o.score.alibi_slopes.has_value(),
          .bias = o.bias.has_value(),
          .variant = o.score.variant,
          .seqlen_k = s.seqlen_k};
}

}  // namespace

detail::ValidatedAttention detail::validate_attention(const TensorView& q, const TensorView& k,
                                                      const TensorView& v, const TensorView& out,
                                                      const AttentionOptions& o, int device) {
  Shape s = check_qkv(q, k, v, out, o, device);
  check_options(o, s, q, device);
  return {s, problem_of(s, o)};
}

// The last-but-one axis is heads, the one before it tokens; batch strides only without varlen.
AttentionParams detail::attention_params(const TensorView& q, const TensorView& k,
                                         const TensorView& v, const TensorView& out,
                                         const AttentionOptions& o, const Shape& s) {
  AttentionParams p{};
  p.q = q.data;
  p.out = out.data;
  p.kv = detail::kv_layout(k, v);
  const int h = q.rank - 2, t = q.rank - 3;
  const bool batched = !s.varlen;
  p.q_batch_stride = batched ? q.stride(0) : 0;
  p.out_batch_stride = batched ? out.stride(0) : 0;
  p.q_seq_stride = q.stride(t);
  p.out_seq_stride = out.stride(t);
  p.q_head_stride = q.stride(h);
  p.out_head_stride = out.stride(h);
  p.batch = static_cast<int>(s.batch);
  p.heads = static_cast<int>(s.heads);
  p.heads_kv = static_cast<int>(s.heads_kv);
  p.seqlen_q = static_cast<int>(s.seqlen_q);
  p.seqlen_k = static_cast<int>(s.seqlen_k);
  p.score = s.score;
  if (o.bias) {
    const TensorView& b = *o.bias;
    p.maybe_bias = b.data;
    p.bias_batch_stride = b.size(0) == 1 ? 0 : b.stride(0);
    p.bias_head_stride = b.size(1) == 1 ? 0 : b.stride(1);
    p.bias_row_stride = b.stride(2);
    p.bias_col_stride = b.stride(3);
  }
  if (o.lse) {
    p.maybe_lse = static_cast<float*>(o.lse->data);
    p.lse_batch_stride = s.varlen ? 0 : o.lse->stride(0);
    p.lse_head_stride = o.lse->stride(s.varlen ? 0 : 1);
  }
  if (s.varlen) {
    p.maybe_cu_seqlens_q = static_cast<const int*>(o.cu_seqlens_q->data);
    p.kv.maybe_cu_seqlens_k = static_cast<const int*>(o.cu_seqlens_k->data);
  }
  if (o.seqused_k) p.maybe_seqused_k = static_cast<const int*>(o.seqused_k->data);
  p.descales = detail::kv_descales(descale_tensors(o));
  return p;
}

bool detail::tma_can_tile(std::initializer_list<const TensorView*> tensors) {
  for (const TensorView* t : tensors) {
    if (t->data == nullptr) return false;
    for (int d = 0; d < t->rank; ++d) {
      if (t->size(d) == 0) return false;
    }
    for (int d = 0; d + 1 < t->rank; ++d) {
      // NOTE: validation bounds the span, not a size-1 dim's stride, which may be near int64's
      // maximum.
      const std::optional<std::int64_t> bytes =
          detail::checked_mul<std::int64_t>(t->stride(d), detail::element_bytes(t->dtype));
      if (!bytes || *bytes <= 0 || *bytes % 16 != 0 || *bytes >= (std::int64_t{1} << 40)) {
        return false;
      }
    }
  }
  return true;
}

TensorMap detail::tensor_map_of(const TensorView& t, std::int64_t dim, int rows, bool varlen,
                                Runtime& runtime, int columns) {
  detail::TensorMapLayout layout{.data = t.data, .dtype = t.dtype, .rank = 4};
  const int h = t.rank - 2, tokens = t.rank - 3;
  const auto bytes = [&](std::int64_t stride) {
    return static_cast<std::uint64_t>(stride) * size_of(t.dtype);
  };
  layout.dims[0] = static_cast<std::uint64_t>(dim);
  layout.dims[1] = static_cast<std::uint64_t>(t.size(tokens));
  layout.dims[2] = static_cast<std::uint64_t>(t.size(h));
  layout.dims[3] = varlen ? 1 : static_cast<std::uint64_t>(t.size(0));
  layout.byte_strides[0] = bytes(t.stride(tokens));
  layout.byte_strides[1] = bytes(t.stride(h));
  layout.byte_strides[2] = varlen ? bytes(t.stride(tokens)) : bytes(t.stride(0));
  layout.box[0] = static_cast<std::uint32_t>(columns);
  layout.box[1] = static_cast<std::uint32_t>(rows);
  layout.box[2] = layout.box[3] = 1;
  TensorMap map{};
  detail::encode_tensor_map(runtime, &map, layout);
  return map;
}

namespace {

// How many (batch, head) pairs the tma kernel's persistent CTAs work through together: as many
// as keep their K and V in 4 MiB of L2, for the CTAs at work at once read the same keys (on an
// H100, 16 MiB read K and V from memory twice as often). Scheduling only: results do not depend
// on it.
int section_pairs_of(const Shape& s) {
  constexpr std::int64_t kL2Bytes = 4 << 20;
  const std::int64_t kv_bytes = std::max<std::int64_t>(s.seqlen_k, 1) *
                                (s.head_dim + s.head_dim_v) * detail::element_bytes(s.dtypes.kv) /
                                (s.heads / s.heads_kv);  // per query head
  return static_cast<int>(std::clamp<std::int64_t>(kL2Bytes / kv_bytes, 1, s.heads * s.batch));
}

// The tma kernel's argument, its tile counter yet to come (null). The all-fp8 forward's boxes
// are 128 columns: 128 bytes, a chunk of the 128-byte swizzle; Q's and K's are 64 (64 bytes,
// the 64-byte swizzle's chunk) at head dims to 64, which then need no padding. A split q's K
// (attention_tma_qk_bytes) takes the all-fp8 forward's boxes, its Q 16-bit ones.
AttentionTmaParams tma_params_of(const AttentionParams& params, const TensorView& q,
                                 const TensorView& k, const TensorView& v,
                                 const AttentionOptions& o, const AttentionConfig& c,
                                 const Shape& s, Runtime& runtime) {
  const int q_size = static_cast<int>(detail::element_bytes(s.dtypes.q));
  const int qk_size = static_cast<int>(detail::attention_tma_qk_bytes(s.dtypes.q, s.dtypes.kv));
  const int columns = 128 / q_size;
  const int q_columns = attention_forward_wgmma_chunk_bytes(s.head_dim, q_size) / q_size;
  const int k_columns = attention_forward_wgmma_chunk_bytes(s.head_dim, qk_size) / qk_size;
  AttentionTmaParams tp{
      .q_map = detail::tensor_map_of(q, s.head_dim, c.block_m, s.varlen, runtime, q_columns),
      .k_map = detail::tensor_map_of(k, s.head_dim, c.block_n, s.varlen, runtime, k_columns),
      .v_map = detail::tensor_map_of(v, s.head_dim_v, c.block_n, s.varlen, runtime, columns),
      .p = params,
      .maybe_tile_counter = nullptr,
      .section_pairs = section_pairs_of(s)};
  if (o.q_descale) {
    tp.maybe_q_descale = static_cast<const float*>(o.q_descale->data);
    tp.q_descale_batch_stride = o.q_descale->stride(0);
    tp.q_descale_head_stride = o.q_descale->stride(1);
  }
  return tp;
}

// The config a call runs: `config`, or choose()'s, moved off the tma kernel (without_tma) for
// inputs TMA cannot tile; refused (kiln::Error, unsupported) where no other kernel may take them:
// an explicit tma config, or an fp8 q.
AttentionConfig config_to_run(const TensorView& q, const TensorView& k, const TensorView& v,
                              const detail::ValidatedAttention& checked,
                              const std::optional<AttentionConfig>& config, const Target& target) {
  AttentionConfig c = config ? *config : choose(checked.problem, target);
  detail::require_fp8_q_tiles(checked.problem, c);
  if (c.kernel == AttentionKernel::tma && !detail::tma_can_tile({&q, &k, &v})) {
    const std::string_view instead = is_fp8(checked.problem.dtype_kv) ? "mma" : "wgmma";
    if (is_fp8(checked.problem.dtype_q)) {
      unsupported(fmt::format(
          "the tma kernel, the only one with fp8 products, cannot tile q {}, k {} and v {}: TMA "
          "needs data, no empty dim and every stride but the last a nonzero multiple of 16 bytes "
          "(broadcast a tensor by copying it, not by a stride of 0)",
          q.describe(), k.describe(), v.describe()));
    }
    if (config) {
      unsupported(fmt::format(
          "the tma kernel cannot tile q {0}, k {1} and v {2}: TMA needs data, no empty dim and "
          "every stride but the last a nonzero multiple of 16 bytes: use the {3} kernel "
          "(AttentionKernel::{3}), or choose()'s config, which does so itself",
          q.describe(), k.describe(), v.describe(), instead));
    }
    c = detail::without_tma(checked.problem, c);
  }
  return c;
}

constexpr detail::CallName kCall{"kiln::attention", "kiln_attention"};

// Runs a call with `config`, or with choose()'s when there is none.
void run(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
         const AttentionOptions& options, const std::optional<AttentionConfig>& config,
         void* stream, Runtime& runtime) {
  const detail::ValidatedAttention checked =
      detail::validate_attention(q, k, v, out, options, runtime.device());
  const Shape& s = checked.shape;
  if (s.batch == 0 || s.heads == 0 || s.seqlen_q == 0) return;  // nothing to write
  const Target target = detail::target_to_run(runtime, kCall);
  if (config) {
    detail::check_config(*config, target);
    detail::require_kv_dtype(checked.problem, config->kernel, target);
  }
  const AttentionConfig c = config_to_run(q, k, v, checked, config, target);
  const detail::LaunchPlan plan = detail::attention_plan(checked.problem, c);
  const DeviceInfo& device = detail::require_gpu(runtime, kCall, &plan.spec);
  detail::require_fits(plan, c, device);  // before the compile: a refused call does nothing
  if (detail::debug(runtime)) {
    detail::check_descale_values(runtime, descale_tensors(options), stream);
    detail::check_descale_values(runtime, q_descale_tensors(options), stream);
  }
  const AttentionParams params = detail::attention_params(q, k, v, out, options, s);
  // The kernel before the tma kernel's tensor maps (which the driver may still refuse, though
  // tma_can_tile screened them): a runtime that cannot compile or load stops at the lookup, with
  // no driver call on the tensors.
  const Kernel kernel = runtime.kernel(plan.spec, stream);
  std::optional<AttentionTmaParams> tma_params;
  if (c.kernel == AttentionKernel::tma) {
    detail::require_launch_registers(kernel.info(),
                                     attention_forward_tma_least_registers(c.block_m),
                                     is_fp8(s.dtypes.q) ? "a bf16 or fp16 q on the mma kernel"
                                                        : "the mma kernel (AttentionKernel::mma)");
    tma_params = tma_params_of(params, q, k, v, options, c, s, runtime);
  }
  const std::int64_t row_blocks = detail::ceil_div(s.seqlen_q, c.block_m);
  LaunchConfig launch{
      .grid = {static_cast<std::uint32_t>(row_blocks), static_cast<std::uint32_t>(s.heads),
               static_cast<std::uint32_t>(s.batch)},
      .block = {static_cast<std::uint32_t>(plan.threads)},
      .shared_bytes = static_cast<std::uint32_t>(plan.shared_bytes),
      .stream = stream};
  if (!tma_params) {
    kernel.launch(launch, params);
    return;
  }
  // Persistent: a CTA per SM (one fits), taking tiles from a counter the stream keeps zero.
  const std::int64_t tiles = row_blocks * s.heads * s.batch;
  launch.grid = {static_cast<std::uint32_t>(
      std::min<std::int64_t>(tiles, std::max(device.multiprocessors, 1)))};
  const std::shared_ptr<void> counter = detail::stream_zeros(runtime, 2 * sizeof(unsigned), stream);
  tma_params->maybe_tile_counter = static_cast<unsigned*>(counter.get());
  kernel.launch(launch, *tma_params);
}

}  // namespace

void attention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
               const AttentionOptions& options, void* stream, Runtime& runtime) {
  run(q, k, v, out, options, std::nullopt, stream, runtime);
}

void attention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
               const AttentionOptions& options, const AttentionConfig& config, void* stream,
               Runtime& runtime) {
  run(q, k, v, out, options, config, stream, runtime);
}

bool is_supported(const TensorView& q, const TensorView& k, const TensorView& v,
                  const TensorView& out, const AttentionOptions& options, std::string* why,
                  Runtime& runtime) {
  try {
    const detail::ValidatedAttention checked =
        detail::validate_attention(q, k, v, out, options, runtime.device());
    const Shape& s = checked.shape;
    if (s.batch == 0 || s.heads == 0 || s.seqlen_q == 0) return true;  // as attention(): no work
    const AttentionConfig config = config_to_run(q, k, v, checked, std::nullopt, runtime.target());
    if (const DeviceInfo* device = detail::present_device(runtime)) {
      const detail::LaunchPlan plan = detail::attention_plan(checked.problem, config);
      detail::require_fits(plan, config, *device);
      detail::require_loadable(runtime, plan.spec);
    }
    return true;
  } catch (const Error& e) {
    if (why) *why = e.what();
    return false;
  }
}

}  // namespace kiln
