// SPDX-License-Identifier: Apache-2.0
// Input checks the attention and decode families share: each throws kiln::Error naming the
// tensor, the expected and actual values, and the fix.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "kernels/kernel.hpp"
#include "kiln/target.hpp"
#include "kiln/tensor.hpp"

namespace kiln::detail {

// How messages write dim `dim` of `t`: "-1" for the last, else its index.
std::string dim_name(const TensorView& t, int dim);

void require_rank(const TensorView& t, std::string_view name, int rank, std::string_view layout);
void require_size(const TensorView& t, std::string_view name, int dim, std::int64_t expected,
                  std::string_view what);
// A size within int32; nullopt stands for one beyond int64 (a checked product that overflowed).
void require_int32(std::optional<std::int64_t> value, std::string_view what);
// Stride 1 on the last dim (unless it has one element).
void require_contiguous_last(const TensorView& t, std::string_view name);

// Shape, dtype, pointer and device checks every tensor gets, first: the others may assume a
// rank of 1 to TensorView::max_rank, a kiln::DType, sizes and strides >= 0 and offsets that fit
// int64.
void check_common(const TensorView& t, std::string_view name, int device);

// An output (after check_common): no two elements at one address, which would make the kernel's
// writes race. Sufficient, not necessary: ordered by stride, each dim of more than one element
// must step past the furthest offset of the dims inside it, as in any permutation of a padded
// contiguous layout.
void require_no_overlap(const TensorView& t, std::string_view name);

// Two outputs (after check_common) whose bytes lie apart: the spans from each one's first
// element to its last do not meet, so that writing one never changes the other.
void require_apart(const TensorView& a, std::string_view a_name, const TensorView& b,
                   std::string_view b_name);

// q, k, v, out and the like, read in 16-byte rows: stride 1 on the last dim, 16-byte aligned
// pointers and other strides, and sizes that fit int32. Their dtypes are the family's to check
// (operand_dtypes_error), first.
void check_tile_tensors(
    std::initializer_list<std::pair<const TensorView*, std::string_view>> tensors);

// A head dim kiln compiles: a multiple of 8 from 8 to kMaxHeadDim.
void check_head_dim(std::int64_t dim, std::string_view what);

void check_int_vector(const TensorView& t, std::string_view name, std::int64_t length,
                      std::string_view length_name);

// GQA/MQA: `heads` query heads over `heads_kv` kv heads (those of tensor `k_name`).
void check_heads(std::int64_t heads, std::int64_t heads_kv, std::string_view k_name);

// One expected size of a tensor and how messages name it: {8, "heads"}.
struct Extent {
  std::int64_t size;
  std::string_view what;
};

// An fp32 LSE tensor of exactly `extents` (its rank is their count), described by `layout`,
// with a contiguous last dim.
void check_lse(const TensorView& l, std::string_view name, std::string_view layout,
               std::initializer_list<Extent> extents, int device);

}  // namespace kiln::detail
