// Input checks the attention and decode families share.
#include "ops/tensor_checks.hpp"

#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "kiln/error.hpp"

namespace kiln::detail {
namespace {

// One tensor of check_tile_tensors().
void check_tile_tensor(const TensorView& t, std::string_view name, DType dtype) {
  if (t.dtype != dtype) {
    invalid(fmt::format("{} has dtype {} but q has dtype {}: q, k, v and out must share one", name,
                        to_string(t.dtype), to_string(dtype)));
  }
  require_contiguous_last(t, name);
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

}  // namespace

void invalid(const std::string& message) {
  throw Error(ErrorCategory::invalid_argument, message);
}

void unsupported(const std::string& message) {
  throw Error(ErrorCategory::unsupported, message);
}

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

void require_contiguous_last(const TensorView& t, std::string_view name) {
  if (t.size(t.rank - 1) > 1 && t.stride(t.rank - 1) != 1) {
    invalid(fmt::format("{}.stride(-1) is {}: the last dim must be contiguous (stride 1)", name,
                        t.stride(t.rank - 1)));
  }
}

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

void check_tile_tensors(
    std::initializer_list<std::pair<const TensorView*, std::string_view>> tensors, DType dtype) {
  for (const auto& [t, name] : tensors) {
    check_tile_tensor(*t, name, dtype);
    for (int dim = 0; dim < t->rank; ++dim) {
      require_int32(t->size(dim), fmt::format("{}.size({})", name, dim));
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

void check_heads(std::int64_t heads, std::int64_t heads_kv, std::string_view k_name) {
  if (heads_kv == 0 ? heads != 0 : heads % heads_kv != 0) {
    invalid(
        fmt::format("q has {} heads and {} has {}: the query heads must be a multiple of the "
                    "kv heads (GQA/MQA)",
                    heads, k_name, heads_kv));
  }
}

void check_score_options(std::optional<float> softmax_scale, float softcap, bool causal,
                         int window_left, int window_right) {
  // NOTE: the kernels fold the scale into the softmax's base-2 exponent, where a zero or
  // negative factor would turn masked -inf logits into NaN and invert the running max.
  if (softmax_scale && !(std::isfinite(*softmax_scale) && *softmax_scale > 0)) {
    invalid(fmt::format("softmax_scale is {}: it must be finite and positive", *softmax_scale));
  }
  if (!std::isfinite(softcap) || softcap < 0) {
    invalid(fmt::format("softcap is {}: use 0 (off) or a positive value", softcap));
  }
  if (window_left < -1 || window_right < -1) {
    invalid(
        fmt::format("window ({}, {}) has a value below -1: windows are -1 (unbounded) or "
                    "a key count",
                    window_left, window_right));
  }
  if (causal && window_right > 0) {
    invalid(
        fmt::format("causal is set and window_right is {}: causal means window_right 0; "
                    "drop one of them",
                    window_right));
  }
}

void check_alibi_slopes(const TensorView& a, std::int64_t batch, std::int64_t heads, int device) {
  check_common(a, "alibi_slopes", device);
  if (a.dtype != DType::f32) {
    invalid(fmt::format("alibi_slopes has dtype {}: it must be f32", to_string(a.dtype)));
  }
  if (a.rank != 1 && a.rank != 2) {
    invalid(fmt::format("alibi_slopes has rank {}: use (heads) or (batch, heads)", a.rank));
  }
  require_size(a, "alibi_slopes", a.rank - 1, heads, "heads");
  if (a.rank == 2) require_size(a, "alibi_slopes", 0, batch, "batch");
  if (heads > 1 && a.stride(a.rank - 1) != 1) {
    invalid(fmt::format("alibi_slopes.stride(-1) is {}: it must be 1", a.stride(a.rank - 1)));
  }
}

void check_lse(const TensorView& l, std::string_view name, std::string_view layout,
               std::initializer_list<Extent> extents, int device) {
  check_common(l, name, device);
  if (l.dtype != DType::f32) {
    invalid(fmt::format("{} has dtype {}: it must be f32", name, to_string(l.dtype)));
  }
  require_rank(l, name, static_cast<int>(extents.size()), layout);
  int dim = 0;
  for (const Extent& extent : extents) require_size(l, name, dim++, extent.size, extent.what);
  if (l.size(l.rank - 1) > 1 && l.stride(l.rank - 1) != 1) {
    invalid(fmt::format("{}.stride(-1) is {}: it must be 1", name, l.stride(l.rank - 1)));
  }
}

bool is_sm80_or_newer(std::string_view target) {
  const std::string_view digits = target.substr(target.find('_') + 1);
  return target.starts_with("sm_") && digits.size() >= 2 && (digits[0] >= '8' || digits.size() > 2);
}

}  // namespace kiln::detail
