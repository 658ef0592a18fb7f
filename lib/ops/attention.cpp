// Forward attention: validate -> problem -> choose -> spec -> params -> launch.
#include "kiln/attention.hpp"

#include <cmath>
#include <cstdint>
#include <limits>

#include <fmt/format.h>

#include "kiln/error.hpp"
#include "params/attention.h"

namespace kiln {
namespace {

constexpr int kMaxHeadDim = 256;

[[noreturn]] void invalid(const std::string& message) {
  throw Error(ErrorCategory::invalid_argument, message);
}
[[noreturn]] void unsupported(const std::string& message) {
  throw Error(ErrorCategory::unsupported, message);
}

// The sizes of one call, read off the validated tensors.
struct Shape {
  bool varlen = false;
  std::int64_t batch = 0, seqlen_q = 0, seqlen_k = 0, heads = 0, heads_kv = 0;
  std::int64_t head_dim = 0, head_dim_v = 0;
  std::int64_t tokens_q = 0;  // varlen: total query tokens
};

std::string dim_name(const TensorView& t, int dim) {
  return dim == t.rank - 1 ? "-1" : std::to_string(dim);
}

void require_rank(const TensorView& t, std::string_view name, int rank, std::string_view layout) {
  if (t.rank != rank) {
    invalid(fmt::format("{} has rank {} but must have rank {}: {}", name, t.rank, rank, layout));
  }
}

void require_size(const TensorView& t, std::string_view name, int dim, std::int64_t expected,
                  std::string_view what) {
  if (t.size(dim) != expected) {
    invalid(fmt::format("{}.size({}) is {} but {} is {}", name, dim_name(t, dim), t.size(dim), what,
                        expected));
  }
}

void require_int32(std::int64_t value, std::string_view what) {
  if (value > std::numeric_limits<std::int32_t>::max()) {
    invalid(fmt::format("{} is {}: at most {} is supported", what, value,
                        std::numeric_limits<std::int32_t>::max()));
  }
}

std::int64_t element_count(const TensorView& t) {
  std::int64_t count = 1;
  for (int d = 0; d < t.rank; ++d) count *= t.size(d);
  return count;
}

// Shape, pointer and device checks every tensor gets.
void check_common(const TensorView& t, std::string_view name, int device) {
  if (t.rank < 1 || t.rank > TensorView::max_rank) {
    invalid(fmt::format("{} has rank {}: expected 1 to {}", name, t.rank, TensorView::max_rank));
  }
  for (int d = 0; d < t.rank; ++d) {
    if (t.size(d) < 0) {
      invalid(fmt::format("{}.size({}) is {}: sizes cannot be negative", name, d, t.size(d)));
    }
    if (t.stride(d) < 0) {
      invalid(
          fmt::format("{}.stride({}) is {}: negative strides are not supported; make {} "
                      "contiguous",
                      name, d, t.stride(d), name));
    }
  }
  // The furthest element must be addressable with 64-bit element offsets.
  std::int64_t last = 0;
  bool overflow = false;
  for (int d = 0; d < t.rank; ++d) {
    std::int64_t span = 0;
    if (t.size(d) > 0) {
      overflow |= __builtin_mul_overflow(t.size(d) - 1, t.stride(d), &span);
      overflow |= __builtin_add_overflow(last, span, &last);
    }
  }
  if (overflow || last > std::numeric_limits<std::int64_t>::max() / 8) {
    invalid(fmt::format("{} {} spans more elements than 64-bit offsets can address", name,
                        t.describe()));
  }
  if (t.data == nullptr && element_count(t) > 0) {
    invalid(fmt::format("{} has a null data pointer but {} elements", name, element_count(t)));
  }
  if (reinterpret_cast<std::uintptr_t>(t.data) % size_of(t.dtype) != 0) {
    invalid(fmt::format("{}'s data pointer {} is not aligned to its {}-byte {} elements", name,
                        t.data, size_of(t.dtype), to_string(t.dtype)));
  }
  if (t.device != device) {
    invalid(
        fmt::format("{} is on device {} but the runtime's device is {}: move {} there or "
                    "use a Runtime with Options::device = {}",
                    name, t.device, device, name, t.device));
  }
}

// q, k, v and out: stride 1 on the last dim, 16-byte aligned pointer and other strides.
void check_tile_tensor(const TensorView& t, std::string_view name, DType dtype) {
  if (t.dtype != dtype) {
    invalid(fmt::format("{} has dtype {} but q has dtype {}: q, k, v and out must share one", name,
                        to_string(t.dtype), to_string(dtype)));
  }
  if (t.size(t.rank - 1) > 1 && t.stride(t.rank - 1) != 1) {
    invalid(fmt::format("{}.stride(-1) is {}: the last dim must be contiguous (stride 1)", name,
                        t.stride(t.rank - 1)));
  }
  if (reinterpret_cast<std::uintptr_t>(t.data) % 16 != 0) {
    invalid(
        fmt::format("{}'s data pointer {} is not 16-byte aligned: kiln moves tiles in "
                    "16-byte copies; allocate or offset {} on a 16-byte boundary",
                    name, t.data, name));
  }
  for (int d = 0; d + 1 < t.rank; ++d) {
    if (t.size(d) > 1 && t.stride(d) % 8 != 0) {
      invalid(
          fmt::format("{}.stride({}) is {}: strides must be multiples of 8 elements (16 "
                      "bytes); copy {} to contiguous memory",
                      name, d, t.stride(d), name));
    }
  }
}

void check_head_dim(std::int64_t dim, std::string_view what) {
  if (dim % 8 == 0 && dim >= 8 && dim <= kMaxHeadDim) return;
  const bool paddable = dim > 0 && dim < kMaxHeadDim;
  unsupported(fmt::format(
      "{} is {}: kiln compiles every multiple of 8 from 8 to {}{}", what, dim, kMaxHeadDim,
      paddable ? "; pad the head dim with zeros to the next multiple of 8" : ""));
}

void check_int_vector(const TensorView& t, std::string_view name, std::int64_t length,
                      std::string_view length_name) {
  require_rank(t, name, 1, "an int32 vector");
  if (t.dtype != DType::i32) {
    invalid(fmt::format("{} has dtype {}: it must be int32", name, to_string(t.dtype)));
  }
  require_size(t, name, 0, length, length_name);
  if (length > 1 && t.stride(0) != 1) {
    invalid(fmt::format("{}.stride(0) is {}: it must be contiguous", name, t.stride(0)));
  }
}

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
  if (q.dtype != DType::f16 && q.dtype != DType::bf16) {
    unsupported(fmt::format("q has dtype {}: attention takes f16 or bf16", to_string(q.dtype)));
  }
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
  if (s.heads_kv == 0 ? s.heads != 0 : s.heads % s.heads_kv != 0) {
    invalid(
        fmt::format("q has {} heads and k has {}: the query heads must be a multiple of the "
                    "kv heads (GQA/MQA)",
                    s.heads, s.heads_kv));
  }
  check_head_dim(s.head_dim, "head_dim (q.size(-1))");
  check_head_dim(s.head_dim_v, "head_dim_v (v.size(-1))");
  for (const auto& [t, name] :
       {std::pair{&q, "q"}, std::pair{&k, "k"}, std::pair{&v, "v"}, std::pair{&out, "out"}}) {
    check_tile_tensor(*t, name, q.dtype);
    for (int dim = 0; dim < t->rank; ++dim) {
      require_int32(t->size(dim), fmt::format("{}.size({})", name, dim));
    }
  }
  return s;
}

void check_options(const AttentionOptions& o, Shape& s, const TensorView& q, int device) {
  if (o.softmax_scale && !std::isfinite(*o.softmax_scale)) {
    invalid(fmt::format("softmax_scale is {}: it must be finite", *o.softmax_scale));
  }
  if (!std::isfinite(o.softcap) || o.softcap < 0) {
    invalid(fmt::format("softcap is {}: use 0 (off) or a positive value", o.softcap));
  }
  if (o.window_left < -1 || o.window_right < -1) {
    invalid(
        fmt::format("window ({}, {}) has a value below -1: windows are -1 (unbounded) or "
                    "a key count",
                    o.window_left, o.window_right));
  }
  if (o.causal && o.window_right > 0) {
    invalid(
        fmt::format("causal is set and window_right is {}: causal means window_right 0; "
                    "drop one of them",
                    o.window_right));
  }
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
  if (o.alibi_slopes) {
    const TensorView& a = *o.alibi_slopes;
    check_common(a, "alibi_slopes", device);
    if (a.dtype != DType::f32) {
      invalid(fmt::format("alibi_slopes has dtype {}: it must be f32", to_string(a.dtype)));
    }
    if (a.rank != 1 && a.rank != 2) {
      invalid(fmt::format("alibi_slopes has rank {}: use (heads) or (batch, heads)", a.rank));
    }
    require_size(a, "alibi_slopes", a.rank - 1, s.heads, "heads");
    if (a.rank == 2) require_size(a, "alibi_slopes", 0, s.batch, "batch");
    if (s.heads > 1 && a.stride(a.rank - 1) != 1) {
      invalid(fmt::format("alibi_slopes.stride(-1) is {}: it must be 1", a.stride(a.rank - 1)));
    }
  }
  if (o.bias) {
    const TensorView& b = *o.bias;
    check_common(b, "bias", device);
    require_rank(b, "bias", 4, "(batch, heads, seqlen_q, seqlen_k), stride 0 to broadcast");
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
  if (o.lse) {
    const TensorView& l = *o.lse;
    check_common(l, "lse", device);
    if (l.dtype != DType::f32) {
      invalid(fmt::format("lse has dtype {}: it must be f32", to_string(l.dtype)));
    }
    if (s.varlen) {
      require_rank(l, "lse", 2, "(heads, total_q) for varlen");
      require_size(l, "lse", 0, s.heads, "heads");
      require_size(l, "lse", 1, s.tokens_q, "q.size(0) (total_q)");
    } else {
      require_rank(l, "lse", 3, "(batch, heads, seqlen_q)");
      require_size(l, "lse", 0, s.batch, "batch");
      require_size(l, "lse", 1, s.heads, "heads");
      require_size(l, "lse", 2, s.seqlen_q, "seqlen_q");
    }
    if (l.size(l.rank - 1) > 1 && l.stride(l.rank - 1) != 1) {
      invalid(fmt::format("lse.stride(-1) is {}: it must be 1", l.stride(l.rank - 1)));
    }
  }
}

AttentionProblem problem_of(const Shape& s, DType dtype, const AttentionOptions& o) {
  return {.dtype = dtype,
          .head_dim = static_cast<int>(s.head_dim),
          .head_dim_v = static_cast<int>(s.head_dim_v),
          .band = o.causal || o.window_left >= 0 || o.window_right >= 0,
          .varlen = s.varlen,
          .softcap = o.softcap > 0,
          .alibi = o.alibi_slopes.has_value(),
          .bias = o.bias.has_value()};
}

struct Validated {
  Shape shape;
  AttentionProblem problem;
};

Validated validate(const TensorView& q, const TensorView& k, const TensorView& v,
                   const TensorView& out, const AttentionOptions& o, int device) {
  Shape s = check_qkv(q, k, v, out, o, device);
  check_options(o, s, q, device);
  return {s, problem_of(s, q.dtype, o)};
}

// The last-but-one axis is heads, the one before it tokens; batch strides only without varlen.
AttentionParams params_of(const TensorView& q, const TensorView& k, const TensorView& v,
                          const TensorView& out, const AttentionOptions& o, const Shape& s) {
  AttentionParams p{};
  p.q = q.data;
  p.k = k.data;
  p.v = v.data;
  p.out = out.data;
  const int h = q.rank - 2, t = q.rank - 3;
  const bool batched = !s.varlen;
  p.q_batch_stride = batched ? q.stride(0) : 0;
  p.k_batch_stride = batched ? k.stride(0) : 0;
  p.v_batch_stride = batched ? v.stride(0) : 0;
  p.out_batch_stride = batched ? out.stride(0) : 0;
  p.q_seq_stride = q.stride(t);
  p.k_seq_stride = k.stride(t);
  p.v_seq_stride = v.stride(t);
  p.out_seq_stride = out.stride(t);
  p.q_head_stride = q.stride(h);
  p.k_head_stride = k.stride(h);
  p.v_head_stride = v.stride(h);
  p.out_head_stride = out.stride(h);
  p.batch = static_cast<int>(s.batch);
  p.heads = static_cast<int>(s.heads);
  p.heads_kv = static_cast<int>(s.heads_kv);
  p.seqlen_q = static_cast<int>(s.seqlen_q);
  p.seqlen_k = static_cast<int>(s.seqlen_k);
  p.softmax_scale = o.softmax_scale.value_or(1.0f / std::sqrt(static_cast<float>(s.head_dim)));
  p.window_left = o.window_left;
  p.window_right = o.causal ? 0 : o.window_right;
  p.top_left = o.top_left ? 1 : 0;
  p.softcap = o.softcap;
  if (o.alibi_slopes) {
    p.maybe_alibi_slopes = static_cast<const float*>(o.alibi_slopes->data);
    p.alibi_batch_stride = o.alibi_slopes->rank == 2 ? o.alibi_slopes->stride(0) : 0;
  }
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
    p.maybe_cu_seqlens_k = static_cast<const int*>(o.cu_seqlens_k->data);
  }
  if (o.seqused_k) p.maybe_seqused_k = static_cast<const int*>(o.seqused_k->data);
  return p;
}

void require_target(std::string_view target) {
  if (target.starts_with("gfx")) {
    unsupported(
        fmt::format("attention on {} is not supported yet: the forward kernel uses "
                    "NVIDIA tensor-core instructions; AMD support is planned",
                    target));
  }
  const std::string_view digits = target.substr(target.find('_') + 1);
  if (!target.starts_with("sm_") || digits.size() < 2 || (digits[0] < '8' && digits.size() == 2)) {
    unsupported(
        fmt::format("attention needs an sm_80 or newer GPU (bf16 tensor cores); the "
                    "target is {}",
                    target));
  }
}

}  // namespace

AttentionConfig choose(const AttentionProblem& problem, std::string_view target) {
  require_target(target);
  // Tuned on an H200 (kernels_src/attention/forward.cuh has the reasoning); every sm_80+ part
  // fits these, sm_86/89's 99 KiB included.
  const int widest = std::max(problem.head_dim, problem.head_dim_v);
  if (widest <= 64)
    return problem.band ? AttentionConfig{128, 128, 4, 2} : AttentionConfig{128, 64, 4, 2};
  if (widest <= 128) return {128, 64, 4, 1};
  return {64, 64, 4, 1};
}

KernelSpec attention_spec(const AttentionProblem& problem, const AttentionConfig& config) {
  KernelSpec spec{.source = "attention/forward.cuh",
                  .entry = "kiln::attention_forward",
                  .params = "kiln::AttentionParams"};
  spec.set("dtype", problem.dtype)
      .set("head_dim", problem.head_dim)
      .set("head_dim_v", problem.head_dim_v)
      .set("block_m", config.block_m)
      .set("block_n", config.block_n)
      .set("warps", config.warps)
      .set("stages", config.stages)
      .set("band", problem.band)
      .set("varlen", problem.varlen)
      .set("has_softcap", problem.softcap)
      .set("has_alibi", problem.alibi)
      .set("has_bias", problem.bias);
  return spec;
}

void attention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
               const AttentionOptions& options, void* stream, Runtime& runtime) {
  const Validated checked = validate(q, k, v, out, options, runtime.device());
  const Shape& s = checked.shape;
  if (s.batch == 0 || s.heads == 0 || s.seqlen_q == 0) return;  // nothing to write
  const AttentionConfig config = choose(checked.problem, runtime.target());
  const Kernel kernel = runtime.kernel(attention_spec(checked.problem, config));
  const std::int64_t row_blocks = (s.seqlen_q + config.block_m - 1) / config.block_m;
  const auto shared = attention_forward_smem_bytes(s.head_dim, s.head_dim_v, config.block_m,
                                                   config.block_n, config.stages);
  kernel.launch({.grid = {static_cast<std::uint32_t>(row_blocks),
                          static_cast<std::uint32_t>(s.heads), static_cast<std::uint32_t>(s.batch)},
                 .block = {static_cast<std::uint32_t>(config.warps * 32)},
                 .shared_bytes = static_cast<std::uint32_t>(shared),
                 .stream = stream},
                params_of(q, k, v, out, options, s));
}

bool is_supported(const TensorView& q, const TensorView& k, const TensorView& v,
                  const TensorView& out, const AttentionOptions& options, std::string* why,
                  Runtime& runtime) {
  try {
    const Validated checked = validate(q, k, v, out, options, runtime.device());
    choose(checked.problem, runtime.target());
    return true;
  } catch (const Error& e) {
    if (why) *why = e.what();
    return false;
  }
}

std::vector<KernelSpec> attention_default_specs(std::string_view target) {
  std::vector<KernelSpec> specs;
  if (target.starts_with("gfx")) return specs;  // not supported there yet
  for (DType dtype : {DType::bf16, DType::f16}) {
    for (int dim : {64, 128, 256}) {
      for (bool band : {false, true}) {
        const AttentionProblem problem{
            .dtype = dtype, .head_dim = dim, .head_dim_v = dim, .band = band};
        specs.push_back(attention_spec(problem, choose(problem, target)));
      }
    }
  }
  return specs;
}

}  // namespace kiln
