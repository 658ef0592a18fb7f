// SPDX-License-Identifier: Apache-2.0
// The KV layout every attention family's Params hold (AttentionParams::kv, DecodeParams::kv):
// where the keys and values of each sequence are, and an fp8 K/V's descales. Like every Params
// header, the host includes it and JIT compiles are handed it by this one name,
// "kiln/params/kv_layout.h".
#pragma once

namespace kiln {

// k (.., heads_kv, head_dim) and v (.., heads_kv, head_dim_v), each 4-d (batch, seq, heads_kv,
// dim), or 3-d (tokens, heads_kv, dim) for varlen. Strides are in elements; the last dim is
// contiguous; k, v and every stride must be 16-byte aligned (8 elements of f16 or bf16).
// Key j of sequence b at kv head h is, in k (v likewise with its strides), at
//   batched:  b * k_batch_stride + j * k_seq_stride + h * k_head_stride
//   indexed:  as batched, sequence b in row maybe_batch_idx[b] (row b when null)
//   varlen:   (maybe_cu_seqlens_k[b] + j) * k_seq_stride + h * k_head_stride
//   paged:    page * k_batch_stride + (j % page_size) * k_seq_stride + h * k_head_stride, with
//             page = maybe_block_table[b * block_table_stride + j / page_size]
// A kernel's spec fixes which one it reads (prefill: batched, or varlen; decode: indexed, or
// paged); the fields only the others read are unused.
struct KVLayout {
  void* k;  // decode_append writes the cache; the attention kernels only read k and v
  void* v;
  // The batch stride steps a page when paged, and is unused when varlen.
  long long k_batch_stride, k_seq_stride, k_head_stride;
  long long v_batch_stride, v_seq_stride, v_head_stride;

  // Indexed: int32 on the device, batch entries.
  const int* maybe_batch_idx;
  // Varlen: int32 on the device, batch + 1 entries: sequence b is tokens [maybe_cu_seqlens_k[b],
  // maybe_cu_seqlens_k[b + 1]) of k and v.
  const int* maybe_cu_seqlens_k;
  // Paged: int32 on the device, a row of pages per sequence, rows block_table_stride apart;
  // page_size keys per page.
  const int* maybe_block_table;
  long long block_table_stride;
  int page_size;
};

// An fp8 K/V's descales, FlashAttention-3's (batch, heads_kv) fp32 (AttentionParams::descales,
// DecodeParams::descales): the key sequence b's kv head h attends is the stored one times
// maybe_k[b * k_batch_stride + h * k_head_stride], and likewise v. Null: 1.
struct KVDescales {
  const float* maybe_k;
  const float* maybe_v;
  long long k_batch_stride, k_head_stride;
  long long v_batch_stride, v_head_stride;
};

}  // namespace kiln
