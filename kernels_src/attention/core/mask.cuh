// SPDX-License-Identifier: Apache-2.0
// The one mask model: a band of keys around each query's diagonal (causal and sliding window
// alike), bounded by seqlen_k, and the KV blocks it lets a row block skip or take unmasked.
#pragma once

#include "kiln/params/score.h"

namespace kiln::attention {

struct Band {
  int offset;  // query i's diagonal is key i + offset
  int left;    // keys allowed left of the diagonal, -1: unbounded
  int right;   // keys allowed right of the diagonal, -1: unbounded
  int seqlen_k;

  // The first and last key query row i attends; last < first when the row attends none.
  __device__ __forceinline__ int first_key(int i) const {
    return left < 0 ? 0 : max(0, i + offset - left);
  }
  __device__ __forceinline__ int last_key(int i) const {
    return right < 0 ? seqlen_k - 1 : min(seqlen_k - 1, i + offset + right);
  }

  // The band seen from the keys (the backward's dk/dv): the first and last of seqlen_q query
  // rows that attend key j; last < first when none does.
  __device__ __forceinline__ int first_query(int j) const {
    return right < 0 ? 0 : max(0, j - offset - right);
  }
  __device__ __forceinline__ int last_query(int j, int seqlen_q) const {
    return j >= seqlen_k ? -1 : left < 0 ? seqlen_q - 1 : min(seqlen_q - 1, j - offset + left);
  }
};

// The band of a sequence of seqlen_q queries over seqlen_k keys. Without a band in the spec
// only seqlen_k bounds the keys; the offset still places ALiBi.
template <bool Banded>
__device__ __forceinline__ Band make_band(const ScoreParams& score, int seqlen_q, int seqlen_k) {
  Band band;
  band.offset = score.top_left ? 0 : seqlen_k - seqlen_q;
  band.left = Banded ? score.window_left : -1;
  band.right = Banded ? score.window_right : -1;
  band.seqlen_k = seqlen_k;
  return band;
}

// The KV blocks of block_n keys that query rows [row_begin, row_end) visit, and which of them
// need no mask (every key of the block is in every row's band).
struct KeyBlocks {
  int begin;
  int end;                 // begin == end: every row is fully masked
  int unmasked_first_key;  // a block is unmasked when its keys lie in [this, unmasked_last_key]
  int unmasked_last_key;

  __device__ __forceinline__ bool needs_mask(int block, int block_n) const {
    const int first = block * block_n;
    return first < unmasked_first_key || first + block_n - 1 > unmasked_last_key;
  }
};

__device__ __forceinline__ KeyBlocks key_blocks(const Band& band, int row_begin, int row_end,
                                                int block_n) {
  // first_key and last_key grow with the row, so the block's extremes come from its end rows.
  const int first = band.first_key(row_begin);
  const int last = band.last_key(row_end - 1);
  KeyBlocks blocks;
  blocks.begin = first / block_n;
  blocks.end = last >= first ? last / block_n + 1 : blocks.begin;
  blocks.unmasked_first_key = band.first_key(row_end - 1);
  blocks.unmasked_last_key = band.last_key(row_begin);
  return blocks;
}

}  // namespace kiln::attention
