// SPDX-License-Identifier: Apache-2.0
// kiln::attention(): forward attention (FlashAttention-2 algorithm), compiled per problem.
#pragma once

#include <optional>
#include <string>

#include "kiln/runtime.hpp"
#include "kiln/score.hpp"
#include "kiln/target.hpp"
#include "kiln/tensor.hpp"

namespace kiln {

// Everything beyond q, k, v and out. Layouts follow FlashAttention:
//   q    (batch, seqlen_q, heads, head_dim)        varlen: (total_q, heads, head_dim)
//   k    (batch, seqlen_k, heads_kv, head_dim)     varlen: (total_k, heads_kv, head_dim)
//   v    (batch, seqlen_k, heads_kv, head_dim_v)   varlen: (total_k, heads_kv, head_dim_v)
//   out  like q, with head_dim_v
// fp16 or bf16, all four the same, or k and v in fp8 (e4m3 or e5m2) under a 16-bit q (see
// k_descale), or q, k and v in e4m3 with a 16-bit out (see q_descale); any strides with stride 1 on
// the last dim, and every other stride and the data pointers multiples of 16 bytes. Inputs may
// broadcast (stride 0), but not an fp8 q's (the tma kernel alone takes it, and TMA needs nonzero
// strides and no empty dim); outputs (out, lse) must give every element its own address.
struct AttentionOptions {
  ScoreOptions score;  // scale, band (causal, sliding window), softcap, ALiBi

  // Additive bias of q's dtype, (batch, heads, seqlen_q, seqlen_k), any strides; stride 0
  // broadcasts (over batch or heads, say). Not with varlen.
  std::optional<TensorView> bias;

  // Output: fp32 natural-log sum of exp per query row, (batch, heads, seqlen_q), or
  // (heads, total_q) with varlen. A fully masked row gives -inf (and output 0).
  std::optional<TensorView> lse;

  // Varlen: int32 device arrays of batch + 1 offsets into the token dim, and the longest
  // sequence of each. seqused_k (int32, batch) limits each sequence's keys, varlen or not.
  std::optional<TensorView> cu_seqlens_q;
  std::optional<TensorView> cu_seqlens_k;
  int max_seqlen_q = 0;
  int max_seqlen_k = 0;
  std::optional<TensorView> seqused_k;

  // fp8 k and v's descales, FlashAttention-3's: fp32 (batch, heads_kv), any strides; unset: 1.
  // The key sequence b's kv head h attends is k's times k_descale[b][h] (v likewise); finite and
  // positive (KILN_DEBUG=1 checks them). fp8 k and v run on sm_89 and newer with head dims
  // multiples of 16, on the tma kernel (sm_90a) or the mma one; each value is widened to q's
  // dtype exactly (but for a bf16 q over e4m3 k on the tma kernel, whose q is split into two e4m3
  // terms, exact to 2^-9 of a tile's largest magnitude, for fp8 products against K), and the
  // descales are applied in fp32 (k's to the scores, v's to the output). No backward.
  std::optional<TensorView> k_descale;
  std::optional<TensorView> v_descale;

  // The all-fp8 forward: q, k and v in e4m3 and out in bf16 or fp16, on sm_90a (the tma kernel).
  // q_descale is q's descale, as k_descale is k's (FlashAttention-3's,
  // fp32 (batch, heads_kv); unset: 1), applied with it to the scores. The products are fp8 ones:
  // the probabilities are rounded to e4m3 (from 2^8 down, OnlineSoftmax's offset) for P V, whose
  // sums are added into fp32 accumulators every key block. No bias, no backward.
  std::optional<TensorView> q_descale;
};

// The problem as the kernel sees it, after validation: what decides the compiled variant.
struct AttentionProblem {
  // Each operand's dtype: q's (and bias's), k's and v's, out's. The kernels take the
  // combinations in lib/kernels/attention.cpp's tables: one dtype, f16 or bf16, for all, or
  // (mma and tma) fp8 k and v under a 16-bit q, or (tma) e4m3 q, k and v with a 16-bit out.
  DType dtype_q = DType::bf16;
  DType dtype_kv = DType::bf16;
  DType dtype_out = DType::bf16;
  int head_dim = 0;
  int head_dim_v = 0;
  bool band = false;  // any mask: causal or a window
  bool varlen = false;
  bool softcap = false;
  bool alibi = false;
  bool bias = false;
  const Variant* variant = nullptr;  // a user variant (kiln/variant.hpp), kept alive by the caller
  // Keys per sequence (with varlen, max_seqlen_k); 0 when not known. It only steers choose()'s
  // tile shape, which on sm_90a takes longer key blocks from kLongSeqlenK keys on.
  long long seqlen_k = 0;
};

// Where choose() starts giving sm_90a longer key blocks (bench/RESULTS.md, run 16).
inline constexpr long long kLongSeqlenK = 2048;

// The forward kernels attention() can run.
enum class AttentionKernel {
  mma,    // attention/prefill/forward.cuh: mma.sync tensor cores, NVIDIA sm_80 and newer
  wgmma,  // attention/prefill/forward_wgmma.cuh: Hopper's warpgroup MMA, sm_90a only
  tma,    // attention/prefill/forward_tma.cuh: wgmma fed by TMA from a producer warp, sm_90a only;
          // q, k and v need strides TMA can tile (nonzero multiples of 16 bytes)
  portable,  // attention/prefill/forward_portable.cuh: plain loads and fp32 arithmetic, no inline
             // assembly; AMD targets run it, and it runs on NVIDIA too
};

// How it runs. Every config gives results within the same tolerance.
struct AttentionConfig {
  int block_m = 128;  // query rows per CTA; wgmma and tma: 64, 128 or 192 (a warpgroup per 64
                      // rows)
  int block_n = 64;   // keys per step; wgmma: a multiple of 64 up to 256; tma: those or 176
                      // (with an fp8 q: 128 or 256, and 128 past head_dim_v 128)
  int warps = 4;      // the CTA has warps * 32 threads, on AMD too (a wavefront is two warps);
                      // wgmma and tma ignore it (block_m / 16)
  int stages = 1;     // K/V tile slots in shared memory; portable has one, wgmma and tma 2 to 4
  AttentionKernel kernel = AttentionKernel::mma;
};

// The config the hot path, is_supported() and warm-up use for `problem` on `target`: the tma
// kernel on sm_90a for head dims of 64 and more (attention() runs the wgmma kernel instead for
// inputs TMA cannot tile, such as a stride of 0, and the mma kernel for such fp8 k and v), and for
// an fp8 q at every head dim (no other kernel takes it; inputs TMA cannot tile are refused), the
// mma kernel on other sm_80+ targets and dims, the portable one on AMD's wave64 gfx9 targets, such
// as gfx90a (compiling needs one the loaded hipRTC can build: ROCm 5.2's stops at gfx90c). Throws
// kiln::Error (unsupported) for any other target.
AttentionConfig choose(const AttentionProblem& problem, const Target& target);
KernelSpec attention_spec(const AttentionProblem& problem, const AttentionConfig& config);

// Computes out = softmax(scale * q k^T + mask + bias) v on `stream` (CUstream or hipStream_t;
// null: the default stream). Throws kiln::Error naming the tensor, the values and the fix for
// any input it cannot take; never launches on bad input.
void attention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
               const AttentionOptions& options = {}, void* stream = nullptr,
               Runtime& runtime = default_runtime());

// As above, with `config` instead of choose()'s: to test or tune a config, or to run the
// portable kernel on NVIDIA (config = choose(problem, "gfx90a") gives AMD's). A config the
// kernel cannot take fails its compile with the kernel's reason; a kernel the target cannot run
// (mma or wgmma on AMD, wgmma off sm_90a) throws kiln::Error (unsupported).
void attention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
               const AttentionOptions& options, const AttentionConfig& config,
               void* stream = nullptr, Runtime& runtime = default_runtime());

// Whether attention() on `runtime` accepts these inputs, with no compile and no launch; `why`
// receives attention()'s message when it does not.
bool is_supported(const TensorView& q, const TensorView& k, const TensorView& v,
                  const TensorView& out, const AttentionOptions& options = {},
                  std::string* why = nullptr, Runtime& runtime = default_runtime());

// The specs `kiln warm` compiles by default for this family on `target`: bf16 and fp16 (and e4m3
// k and v under them where the target reads fp8, and on sm_90a e4m3 q, k and v with bf16 out), head
// dims 64, 128 and 256, with and without a mask, each with choose()'s configs for short and long
// sequences; none for targets attention does not run on.
std::vector<KernelSpec> attention_default_specs(const Target& target);

}  // namespace kiln
