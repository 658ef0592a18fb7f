// SPDX-License-Identifier: Apache-2.0
// The CPU reference of decode over a KV cache (paged or contiguous slots, the append, rotary) and
// of merging attention states; the attention itself is attention_reference's.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "attention_reference.hpp"

namespace kiln::test {

// Where a KV cache keeps its keys: `rows` rows of `row_len` slots, each slot one key's
// (heads_kv, dim). A contiguous cache's rows are sequences, (batch_cache, seqlen_cache, ...); a
// paged cache's rows are pages, (num_pages, page_size, ...).
struct CacheMap {
  int rows = 0;
  int row_len = 0;
  std::vector<int> batch_idx;    // contiguous: sequence b lives in row batch_idx[b]; empty: row b
  std::vector<int> block_table;  // paged when not empty: (batch, max_pages), row-major
  int max_pages = 0;

  bool paged() const { return !block_table.empty(); }
  std::int64_t slots() const { return std::int64_t{rows} * row_len; }
  // The slot (row * row_len + position in the row) of key j of sequence b.
  std::int64_t slot(int b, int j) const;
};

// One attention_with_kvcache call as the reference sees it.
struct DecodeReferenceProblem {
  // dtype, heads, head dims, scale, band, softcap and ALiBi; its sequence fields are ignored:
  // they follow from seqlens, seqlen_q and seqlen_new.
  ReferenceProblem attention;
  CacheMap cache;
  std::vector<int> seqlens;  // keys cached per sequence before the append; batch entries
  int seqlen_q = 1;
  int seqlen_new = 0;
  // Rotary embedding of q and k_new when rotary_dim > 0: cos and sin (seqlen_ro, rotary_dim / 2),
  // values exactly representable in the dtype.
  int rotary_dim = 0;
  bool rotary_interleaved = false;
  std::vector<double> rotary_cos, rotary_sin;
  // An fp8 cache (e4m3 or e5m2): the append stores each new key (after rotary) and value divided
  // by its kv head's descale in fp32, rounded to cache_fp8 with saturation (saturate_to), and the
  // sequences attend the stored value times the descale. The descales are (batch, heads_kv); empty:
  // 1. Unset: a 16-bit cache, which keeps the new keys and values as they are.
  std::optional<DType> cache_fp8;
  std::vector<double> k_descale, v_descale;
  // An fp8 cache's descales per (slot, kv head), (rows * row_len, heads_kv) fp32 values, or
  // empty: none. The append gives each appended (slot, kv head) its own, as the device does
  // (row_descale): its largest magnitude over (the largest fp8 value times the kv head's
  // descale) in fp32, or 1 where that is not finite and positive, and stores each element divided
  // by the kv head's descale times it (fp32), saturated. Sequences attend inputs' cache values,
  // which hold the descales already, and the appended ones times both descales. The plain
  // baseline (out_plain) then attends the values rounded to q's dtype, as the kernel has them.
  std::vector<double> k_token_descale, v_token_descale;

  int batch() const { return static_cast<int>(seqlens.size()); }
  // Whether q token i is rotated at seqlens[b] + i (true) or at seqlens[b] for every i: the
  // former with a band (causal or a window), as FlashAttention does.
  bool rotary_q_per_token() const;
};

// Host values of every input, exactly representable in the dtype.
struct DecodeInputs {
  std::vector<double> q;        // (batch, seqlen_q, heads, head_dim)
  std::vector<double> k_cache;  // (rows, row_len, heads_kv, head_dim)
  std::vector<double> v_cache;  // (rows, row_len, heads_kv, head_dim_v)
  std::vector<double> k_new;    // (batch, seqlen_new, heads_kv, head_dim); empty: no append
  std::vector<double> v_new;    // (batch, seqlen_new, heads_kv, head_dim_v)
};

struct DecodeReferenceResult {
  // out (batch * seqlen_q, heads, head_dim_v), which is (batch, seqlen_q, heads, head_dim_v).
  ReferenceResult attention;
  std::vector<double> lse;  // kiln's order, (batch, heads, seqlen_q)
  // The cache after the append, and which slots the append wrote.
  std::vector<double> k_cache, v_cache;
  std::vector<bool> appended;
  // The descales per (slot, kv head) after the append (empty: none).
  std::vector<double> k_token_descale, v_token_descale;
};

// The descale an appended row gets (DecodeReferenceProblem::k_token_descale): `largest` over the
// largest value of fp8 `dtype` times `head_descale`, in fp32; 1 where that is not finite and
// positive.
double row_descale(DType dtype, double largest, double head_descale);

DecodeReferenceResult decode_reference(const DecodeReferenceProblem& problem,
                                       const DecodeInputs& inputs);

// `value` rounded to fp8 `dtype` (e4m3 or e5m2), saturating: past the largest finite value, that
// value (signed); NaN stays NaN. As the device's cvt.rn.satfinite.
double saturate_to(DType dtype, double value);

// Rotates channels [0, rotary_dim) of one head vector x at `position` (GPT-NeoX pairs
// (i, i + rotary_dim / 2), or (2i, 2i + 1) interleaved) in fp64, then rounds to the dtype.
void rotate(const DecodeReferenceProblem& problem, double* x, int position);

// Merging `states` attention states of each (token, head) row: v (tokens, states, heads, dim)
// and natural-log lse (tokens, states, heads), as merge_states() takes them. Returns out
// (tokens, heads, dim) in fp64 and, as out_plain, that rounded to out_dtype (f16, bf16 or f32);
// lse (heads, tokens), attention_reference's order. A row whose states are all -inf gives out 0
// and lse -inf.
ReferenceResult merge_reference(DType out_dtype, int tokens, int states, int heads, int dim,
                                const std::vector<double>& v, const std::vector<double>& lse);

}  // namespace kiln::test
