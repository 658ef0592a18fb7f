// SPDX-License-Identifier: Apache-2.0
// Decode attention over a KV cache (FlashAttention's flash_attn_with_kvcache semantics), and
// merging attention states computed over disjoint key sets.
#pragma once

#include <optional>
#include <string_view>
#include <vector>

#include "kiln/runtime.hpp"
#include "kiln/score.hpp"
#include "kiln/target.hpp"
#include "kiln/tensor.hpp"

namespace kiln {

// A KV cache, contiguous or paged: q's dtype (fp16 or bf16), or fp8 (e4m3 or e5m2) on sm_89 and
// newer, converted to q's dtype as it is read (exactly: every fp8 value is an fp16 and a bf16
// value; with token descales each value times its descales, rounded to q's dtype once). The head
// dims are q's head_dim for k and out's head_dim_v for v; an fp8 cache's are multiples of 16.
//   contiguous: k (batch_cache, seqlen_cache, heads_kv, head_dim), v likewise with head_dim_v;
//               sequence b lives in cache row batch_idx[b] (b when batch_idx is absent).
//   paged:      k (num_pages, page_size, heads_kv, head_dim), v likewise; key j of sequence b
//               is row j % page_size of page block_table[b][j / page_size]. Any page_size >= 1.
// Page indices are not checked on the device (a read per key would cost bandwidth): an index
// outside [0, num_pages) reads or writes out of bounds. Options::debug (KILN_DEBUG=1) checks
// block tables, seqlens, batch_idx and descales on the host before each launch, at the price of
// a synchronizing copy.
struct KVCache {
  TensorView k;
  TensorView v;
  // int32 (batch) on the device: keys already cached per sequence, before any append.
  TensorView seqlens;
  // int32 (batch) on the device, contiguous caches only: the cache row of each sequence.
  std::optional<TensorView> batch_idx;
  // int32 (batch, max_pages) on the device: a paged cache's page table.
  std::optional<TensorView> block_table;
  // An fp8 cache's descales, FlashAttention-3's convention: fp32 (batch, heads_kv) on the
  // device, any strides (stride 0 broadcasts one scale); the key that sequence b's kv head h
  // attends is k times k_descale[b][h], and likewise v. Absent: 1. Only with an fp8 cache. The
  // values must be finite and positive (k_descale joins the softmax scale): they are on the
  // device, where the call does not read them but under Options::debug (KILN_DEBUG=1).
  std::optional<TensorView> k_descale;
  std::optional<TensorView> v_descale;
  // An fp8 cache's descales per (token, kv head), as per-token-head quantization keeps them: fp32
  // laid out as the cache without its head dim, contiguous (batch_cache, seqlen_cache, heads_kv)
  // or paged (num_pages, page_size, heads_kv), any strides (with an append, which writes them,
  // each element at its own address and the two apart). The key in a slot of the cache at kv
  // head h is the cached one times k_token_descale's entry of that slot and head (and times
  // k_descale[b][h] when that is given too); likewise v. Both or neither, only with an fp8 cache.
  // Not checked on the device (Options::debug does not read them either). An append writes the
  // descales of the keys it appends: each new row's own (DecodeOptions::k_new).
  std::optional<TensorView> k_token_descale;
  std::optional<TensorView> v_token_descale;
};

struct DecodeOptions {
  // Scale, band, softcap and ALiBi, as in AttentionOptions. The band runs over the keys
  // 0 .. seqlen_k - 1 of each sequence, where seqlen_k = seqlens[b] + seqlen_new.
  ScoreOptions score;

  // Append: k_new (batch, seqlen_new, heads_kv, head_dim) and v_new (..., head_dim_v), q's
  // dtype, are written into the cache at positions seqlens[b] .. seqlens[b] + seqlen_new - 1
  // before attending. seqlens is not advanced: the caller does that (as FlashAttention). Into an
  // fp8 cache each element goes divided by its descale (fp32) and rounded to the cache's dtype,
  // saturating at its largest finite value (after rotary, whose result is rounded to q's dtype).
  // With token descales (KVCache::k_token_descale) each new (token, kv head) row gets its own,
  // written to its slot: its largest magnitude m (NaN elements aside) over (the dtype's largest
  // finite value, 448 or 57344, times k_descale[b][h] or 1; v_descale for values), in fp32, or 1
  // where that is 0 or not finite; its elements go divided by that head descale times the row's,
  // so that the row fills the fp8 range.
  std::optional<TensorView> k_new;
  std::optional<TensorView> v_new;

  // Rotary embedding of q and k_new (needs k_new): cos and sin (seqlen_ro, rotary_dim / 2), q's
  // dtype, rotary_dim even and <= head_dim. k_new token t of sequence b is rotated at position
  // seqlens[b] + t; q token i at seqlens[b] + i with a band (causal or window) and at seqlens[b]
  // without (FlashAttention's convention). interleaved: pairs (0, 1), (2, 3), ... (GPT-J), the
  // default, as flash_attn_with_kvcache's rotary_interleaved=True; false: pairs
  // (i, i + rotary_dim / 2) (GPT-NeoX, Llama in Hugging Face transformers).
  std::optional<TensorView> rotary_cos;
  std::optional<TensorView> rotary_sin;
  bool rotary_interleaved = true;

  // Output: fp32 natural-log sum of exp per query row, (batch, heads, seqlen_q).
  std::optional<TensorView> lse;

  // Split-KV: 0 lets the heuristic choose from batch, heads_kv, cache capacity and the SM count;
  // n >= 1 asks for at most n splits (1: one pass, no combine). At most 128.
  int num_splits = 0;
};

// The decode attention kernels attention_with_kvcache() can run.
enum class DecodeKernel {
  mma,  // attention/decode/attention.cuh: split-KV over mma.sync tensor cores, NVIDIA sm_80+
};

// How the decode kernel runs; every config gives results within the same tolerance.
struct DecodeConfig {
  int num_splits = 1;  // key ranges per sequence, 1 to 128, merged by the kernel when > 1
  int block_n = 16;    // keys per warp and step: a multiple of 16 from 16 to 128
  int warps = 4;       // warps per CTA, 1 to 16, each streaming its own keys
  int stages = 4;      // cp.async slots per warp, 2 to 8
  int m_tiles = 1;     // m16 row tiles per CTA, 1, 2 or 4: 16 * m_tiles query rows of a kv head
  DecodeKernel kernel = DecodeKernel::mma;
};

// out (batch, seqlen_q, heads, head_dim_v) = attention of q (batch, seqlen_q, heads, head_dim)
// over each sequence's cached keys (plus the appended ones), on `stream`. The query heads that
// share a kv head are processed together, so K and V are read once per group. No host
// synchronization happens (unless Options::debug), so a decode step can be captured in a CUDA
// graph; split-KV scratch comes from the stream-ordered allocator of the runtime's device.
// Outputs (out, lse, and the cache when k_new is given) must give every element its own address.
// Throws kiln::Error naming the tensor, the values and the fix for any input it cannot take.
void attention_with_kvcache(const TensorView& q, const KVCache& cache, const TensorView& out,
                            const DecodeOptions& options = {}, void* stream = nullptr,
                            Runtime& runtime = default_runtime());

// As above, with `config` instead of choose()'s: to test or tune a config, or to run on the
// device at hand the config choose() gives another target (config = choose(problem, "sm_89",
// 84)). options.num_splits, which steers choose(), is not read: config.num_splits is the split
// count. A config out of range throws kiln::Error (invalid_argument), and one the device cannot
// run (more shared memory or threads per CTA than it has) kiln::Error (unsupported), before
// anything is compiled or written.
void attention_with_kvcache(const TensorView& q, const KVCache& cache, const TensorView& out,
                            const DecodeOptions& options, const DecodeConfig& config,
                            void* stream = nullptr, Runtime& runtime = default_runtime());

// Whether attention_with_kvcache() accepts these inputs, without compiling or launching.
bool is_supported(const TensorView& q, const KVCache& cache, const TensorView& out,
                  const DecodeOptions& options = {}, std::string* why = nullptr,
                  Runtime& runtime = default_runtime());

// A decode call as its kernels see it: what decides the compiled variants, and the sizes that
// steer the config. Enough to choose() a model's decode config and list its specs
// (decode_specs) without calling attention_with_kvcache(), to warm them ahead.
struct DecodeProblem {
  // Each operand's dtype: q's (and the rotary tables', and k_new's and v_new's), the cache's,
  // out's. The kernels take the combinations in lib/kernels/decode.cpp's table: one dtype, f16
  // or bf16, for all, or an fp8 cache (e4m3 or e5m2) under f16 or bf16 q and out.
  DType dtype_q = DType::bf16;
  DType dtype_kv = DType::bf16;
  DType dtype_out = DType::bf16;
  int head_dim = 0;
  int head_dim_v = 0;
  int rows_per_kv_head = 1;  // seqlen_q * heads / heads_kv: the query rows a kv head serves
  bool paged = false;
  bool band = false;  // any mask: causal or a window
  bool softcap = false;
  bool alibi = false;
  bool append = false;  // k_new and v_new given, with keys to append or q to rotate
  bool rotary = false;
  bool token_descales = false;       // an fp8 cache with descales per (token, kv head)
  const Variant* variant = nullptr;  // a user variant (kiln/variant.hpp), kept alive by the caller
  // The sizes choose() weighs: sequences, kv heads, keys each sequence's cache holds, and
  // DecodeOptions::num_splits.
  int batch = 1;
  int heads_kv = 1;
  long long capacity = 0;
  int requested_splits = 0;
};

// The config attention_with_kvcache() uses for `problem` on a device of `target` with
// `multiprocessors` SMs: tiles within the target's shared memory per CTA
// (Target::max_shared_bytes_per_block), splits from the heuristic, or at most
// problem.requested_splits when that is positive. A pure function of its arguments, so that
// warming ahead for a target (decode_specs) gives the specs its devices run.
DecodeConfig choose(const DecodeProblem& problem, const Target& target, int multiprocessors);

// Every spec a call of `problem` with `config` compiles: the append kernel (problem.append)
// and the attention kernel.
std::vector<KernelSpec> decode_specs(const DecodeProblem& problem, const DecodeConfig& config);

// The specs `kiln warm` compiles by default for decode on `target` (sm_80 or newer; none
// elsewhere): bf16 and fp16, head dims 64 and 128, contiguous and paged caches, one query token
// with GQA groups of up to 16 heads, and the merge of split-KV; on sm_89 and newer e4m3 caches
// too, with and without descales per token. Planned without a device, for
// the SM count of a part of the target (an H100 SXM's 132 on sm_90a); the count steers only the
// splits, which no spec holds.
std::vector<KernelSpec> decode_default_specs(const Target& target);

// Merging attention states. A state is an attention output v (fp16, bf16 or fp32) over some
// set of keys and its fp32 natural-log LSE s; the merge is the attention over the union:
//   s_out = log(sum_i exp(s_i)),  v_out = sum_i exp(s_i - s_out) v_i.
// States with s = -inf (no keys) contribute nothing; if all are -inf, v_out = 0, s_out = -inf.
// A NaN s, or a NaN in the v of a state that is not empty, makes the merge NaN.
// Two states: v_a, v_b, v_out (tokens, heads, head_dim) and s_a, s_b, s_out (tokens, heads),
// any strides with a contiguous last dim. s_out may be null.
void merge_states(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b,
                  const TensorView& s_b, const TensorView& v_out, const TensorView* s_out = nullptr,
                  void* stream = nullptr, Runtime& runtime = default_runtime());
// Many states: v (tokens, states, heads, head_dim), s (tokens, states, heads).
void merge_states(const TensorView& v, const TensorView& s, const TensorView& v_out,
                  const TensorView* s_out = nullptr, void* stream = nullptr,
                  Runtime& runtime = default_runtime());

}  // namespace kiln
