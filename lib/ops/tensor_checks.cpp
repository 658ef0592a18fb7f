// SPDX-License-Identifier: Apache-2.0
// Input checks the attention and decode families share.
#include "ops/tensor_checks.hpp"

#include <cstdint>
#include <limits>
#include <optional>
#include <utility>

#include <fmt/format.h>

#include "core/checked_math.hpp"
#include "core/config.hpp"
#include "kiln/error.hpp"

namespace kiln::detail {
namespace {

// One tensor of check_tile_tensors().
void check_tile_tensor(const TensorView& t, std::string_view name) {
  require_contiguous_last(t, name);
  if (reinterpret_cast<std::uintptr_t>(t.data) % 16 != 0) {
    invalid(
        fmt::format("{}'s data pointer {} is not 16-byte aligned: kiln moves tiles in "
                    "16-byte copies; allocate or offset {} on a 16-byte boundary",
                    name, t.data, name));
  }
  const std::int64_t chunk = 16 / static_cast<std::int64_t>(size_of(t.dtype));  // elements
  for (int d = 0; d + 1 < t.rank; ++d) {
    if (t.size(d) > 1 && t.stride(d) % chunk != 0) {
      invalid(
          fmt::format("{}.stride({}) is {}: strides must be multiples of {} elements (16 "
                      "bytes); copy {} to contiguous memory",
                      name, d, t.stride(d), chunk, name));
    }
  }
}

// The product of t's sizes (sizes >= 0), or nullopt when it does not fit int64.
std::optional<std::int64_t> element_count(const TensorView& t) {
  std::optional<std::int64_t> count = 1;
  for (int d = 0; d < t.rank; ++d) {
    if (t.size(d) == 0) return 0;  // however large the others
    if (count) count = checked_mul(*count, t.size(d));
  }
  return count;
}

}  // namespace

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

void require_int32(std::optional<std::int64_t> value, std::string_view what) {
  if (!value || *value > std::numeric_limits<std::int32_t>::max()) {
    invalid(fmt::format("{} is {}: at most {} is supported", what,
                        value ? std::to_string(*value) : "beyond int64",
                        std::numeric_limits<std::int32_t>::max()));
  }
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
  if (size_of(t.dtype) == 0) {
    invalid(fmt::format("{} has dtype code {}, which is no kiln::DType: use one of its values",
                        name, static_cast<int>(t.dtype)));
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
  std::optional<std::int64_t> last = 0;
  for (int d = 0; d < t.rank && last; ++d) {
    if (t.size(d) == 0) continue;
    const std::optional<std::int64_t> span = checked_mul(t.size(d) - 1, t.stride(d));
    last = span ? checked_add(*last, *span) : std::nullopt;
  }
  if (!last || *last > std::numeric_limits<std::int64_t>::max() / 8) {
    invalid(fmt::format("{} {} spans more elements than 64-bit offsets can address", name,
                        t.describe()));
  }
  const std::optional<std::int64_t> count = element_count(t);
  if (t.data == nullptr && (!count || *count > 0)) {
    invalid(fmt::format("{} has a null data pointer but {} elements: pass its device memory", name,
                        count ? std::to_string(*count) : "more than 2^63"));
  }
  if (reinterpret_cast<std::uintptr_t>(t.data) % size_of(t.dtype) != 0) {
    invalid(
        fmt::format("{}'s data pointer {} is not aligned to its {}-byte {} elements: pass "
                    "the tensor's own storage, or a view whose offset is a whole number of "
                    "elements",
                    name, t.data, size_of(t.dtype), to_string(t.dtype)));
  }
  if (t.device != device) {
    invalid(
        fmt::format("{} is on device {} but the runtime's device is {}: move {} there, or "
                    "set {} to {}",
                    name, t.device, device, name, knob_name(Knob::device), t.device));
  }
}

void require_no_overlap(const TensorView& t, std::string_view name) {
  for (int d = 0; d < t.rank; ++d) {
    if (t.size(d) == 0) return;  // no elements to overlap
  }
  // Dims ordered by stride, and of equal strides the inner one first, as in a row-major layout.
  const auto inside = [&](int a, int b) {
    return std::pair{t.stride(a), -a} < std::pair{t.stride(b), -b};
  };
  for (int d = 0; d < t.rank; ++d) {
    if (t.size(d) == 1) continue;
    if (t.stride(d) == 0) {
      invalid(fmt::format(
          "{}.stride({}) is 0 but {}.size({}) is {}: those elements of the output would all be "
          "written to one address; give {} memory of its own for every element (e.g. contiguous "
          "strides)",
          name, dim_name(t, d), name, dim_name(t, d), t.size(d), name));
    }
    // The furthest offset the dims inside this one reach, which check_common bounded.
    std::int64_t reach = 0;
    for (int e = 0; e < t.rank; ++e) {
      if (t.size(e) > 1 && inside(e, d)) reach += (t.size(e) - 1) * t.stride(e);
    }
    if (t.stride(d) <= reach) {
      invalid(fmt::format(
          "{}.stride({}) is {}, within the {} elements the dims of smaller strides span: "
          "elements of the output would share addresses; give {} strides that do not overlap "
          "(e.g. contiguous ones)",
          name, dim_name(t, d), t.stride(d), reach + 1, name));
    }
  }
}

void require_apart(const TensorView& a, std::string_view a_name, const TensorView& b,
                   std::string_view b_name) {
  // The bytes [first, last] of a tensor with elements, or none.
  const auto span =
      [](const TensorView& t) -> std::optional<std::pair<std::uintptr_t, std::uintptr_t>> {
    std::int64_t reach = 0;
    for (int d = 0; d < t.rank; ++d) {
      if (t.size(d) == 0) return std::nullopt;
      reach += (t.size(d) - 1) * t.stride(d);
    }
    const auto first = reinterpret_cast<std::uintptr_t>(t.data);
    const auto bytes = static_cast<std::uintptr_t>(reach + 1) * size_of(t.dtype);
    return std::pair{first, first + bytes - 1};
  };
  const auto sa = span(a), sb = span(b);
  if (sa && sb && sa->first <= sb->second && sb->first <= sa->second) {
    invalid(fmt::format(
        "{} and {} share memory: the call writes both, so one would overwrite the other; give "
        "each memory of its own",
        a_name, b_name));
  }
}

void check_tile_tensors(
    std::initializer_list<std::pair<const TensorView*, std::string_view>> tensors) {
  for (const auto& [t, name] : tensors) {
    check_tile_tensor(*t, name);
    for (int dim = 0; dim < t->rank; ++dim) {
      // NOTE: the name is formatted only for the message: every call passes here.
      if (t->size(dim) > std::numeric_limits<std::int32_t>::max()) {
        require_int32(t->size(dim), fmt::format("{}.size({})", name, dim));
      }
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

}  // namespace kiln::detail
