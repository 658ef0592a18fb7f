/* SPDX-License-Identifier: Apache-2.0 */
/* kiln's C API over DLPack tensors: attention and its backward, decode over a KV cache and state
 * merging, for C, Python (ctypes), Rust or Go.
 *
 * Every call returns a kiln_status; on failure kiln_last_error() gives this thread's message,
 * which names the value at fault and the fix. Nothing here aborts or exits. */
#ifndef KILN_KILN_H
#define KILN_KILN_H

#include <stddef.h>

#include "kiln/third_party/dlpack/dlpack.h"

/* This header's version; CMakeLists.txt's project(kiln VERSION) is the source of truth, and the
 * library does not build when these differ from it. */
#define KILN_VERSION_MAJOR 0
#define KILN_VERSION_MINOR 2
#define KILN_VERSION_PATCH 0
#define KILN_VERSION_NUMBER \
  (KILN_VERSION_MAJOR * 10000 + KILN_VERSION_MINOR * 100 + KILN_VERSION_PATCH)

#ifdef __cplusplus
extern "C" {
#endif

/* The loaded library's version, counted as KILN_VERSION_NUMBER counts the header's. */
int kiln_version(void);

/* The source the loaded library was built from: its commit's short hash, with "-dirty" when the
   build's tracked files differed from it, or "unknown" when its source was not a git checkout
   of its own. */
const char* kiln_build_id(void);

typedef enum kiln_status {
  KILN_OK = 0,
  KILN_ERROR_INVALID_ARGUMENT = 1, /* an input kiln cannot take */
  KILN_ERROR_UNSUPPORTED = 2,      /* valid, but not supported by this build, backend or GPU */
  KILN_ERROR_COMPILE = 3,          /* the JIT compiler rejected a kernel (log in the message) */
  KILN_ERROR_DRIVER = 4,           /* the CUDA driver or HIP runtime failed */
  KILN_ERROR_CACHE = 5,            /* the disk cache could not be used as asked */
  KILN_ERROR_NOT_FOUND = 6,        /* a library, file, kernel source or device is missing */
  KILN_ERROR_INTERNAL = 7          /* anything else; please report it */
} kiln_status;

/* Every struct below opens with struct_size, which its *_init macro sets to the size this
 * header gives it, so the structs can grow: new fields are only ever appended, a library takes
 * the smaller struct of a caller built against an older kiln.h (the fields it lacks keep their
 * defaults), and refuses a struct_size it does not know (0, garbage, or a newer header's) rather
 * than read past the caller's struct. The macros pass the caller's sizeof to the *_init_sized
 * functions, so that a newer library never writes past an older caller's struct either; callers
 * without the C preprocessor (ctypes, Rust) call those with their struct's size.
 *
 * kiln_score_options, the score's fields, sits in both options structs right after their
 * struct_size, with a struct_size of its own, so that it can grow as they do: a caller's own
 * fields start where its score ends, and the options' *_init_sized functions take the caller's
 * sizeof(kiln_score_options) too. Set the score's fields one by one after *_init (a whole
 * kiln_score_options assigned from zeros has struct_size 0, which the call refuses). Version
 * 0.2.0 nested it: 0.1.0's options structs held the score's fields flat, and their callers must
 * be rebuilt. */

/* The score's fields of kiln_attention_options and kiln_decode_options (kiln::ScoreOptions):
 * the scale, the band mask, softcap, ALiBi, sinks and a user variant. Set by the options'
 * *_init: windows default to -1 (unbounded), which a zeroed struct would not give. */
typedef struct kiln_score_options {
  size_t struct_size;  /* sizeof(kiln_score_options), set by the options' *_init */
  float softmax_scale; /* <= 0: 1 / sqrt(head_dim) */
  int causal;          /* nonzero: window_right = 0 (bottom-right aligned unless top_left) */
  int window_left;     /* -1: unbounded */
  int window_right;    /* -1: unbounded */
  int top_left;        /* nonzero: the band is aligned top-left instead of bottom-right */
  float softcap;       /* > 0: logits = softcap * tanh(logits / softcap) */
  const DLTensor* alibi_slopes; /* fp32 (heads) or (batch, heads) */
  const DLTensor* sinks;        /* fp32 (heads): a logit per head added to each row's softmax
                                   denominator with no value (kiln::ScoreOptions::sinks) */
  /* A user variant (kiln/variant.hpp): attention hooks written as device code, compiled into the
   * call's kernels (and cached under their text). Both strings NULL: none. They and the tensors
   * are read during the call only; the scalars and tensors change without a recompile. */
  const char* variant_name;           /* a C++ identifier, naming it in specs and errors */
  const char* variant_code;           /* defines struct kiln_variant and its hooks */
  float variant_scalars[8];           /* v.scalars in the hooks */
  int num_variant_tensors;            /* 0 to 4: how many of variant_tensors are given */
  const DLTensor* variant_tensors[4]; /* v.tensors in the hooks: any dtype, rank 1 to 4 */
} kiln_score_options;

/* Options of kiln_attention. Call kiln_attention_options_init first. Pointers may be NULL
 * (feature off). */
typedef struct kiln_attention_options {
  size_t struct_size;       /* sizeof(kiln_attention_options), set by kiln_attention_options_init */
  kiln_score_options score; /* first: its struct_size tells where the fields below start */
  const DLTensor* bias;     /* q's dtype, (batch, heads, seqlen_q, seqlen_k), any strides */
  const DLTensor* cu_seqlens_q; /* int32 (batch + 1): varlen offsets into q's token dim */
  const DLTensor* cu_seqlens_k; /* int32 (batch + 1): varlen offsets into k's token dim */
  const DLTensor* seqused_k;    /* int32 (batch): keys used per sequence */
  int max_seqlen_q;             /* varlen: the longest query sequence */
  int max_seqlen_k;             /* varlen: the longest key sequence */
  /* fp8 k and v's descales (DLPack float8_e4m3fn or float8_e5m2 k and v under f16 or bf16 q,
   * sm_89 and newer): fp32 (batch, heads_kv) or NULL (1); real key = stored key *
   * k_descale[b][h], likewise v (kiln::AttentionOptions::k_descale). */
  const DLTensor* k_descale;
  const DLTensor* v_descale;
  /* The all-fp8 forward's q descale (float8_e4m3fn q, k and v, f16 or bf16 out, sm_90a): fp32
   * (batch, heads_kv) or NULL (1), as k_descale (kiln::AttentionOptions::q_descale). */
  const DLTensor* q_descale;
} kiln_attention_options;

void kiln_attention_options_init_sized(kiln_attention_options* options, size_t struct_size,
                                       size_t score_struct_size);
#define kiln_attention_options_init(options)                                   \
  kiln_attention_options_init_sized((options), sizeof(kiln_attention_options), \
                                    sizeof(kiln_score_options))

/* Forward attention, FlashAttention's layouts: q (batch, seqlen_q, heads, head_dim), k and v
 * (batch, seqlen_k, heads_kv, head_dim / head_dim_v), out like q with head_dim_v; varlen drops
 * the batch dim. fp16 or bf16 (k and v may be fp8, see the options' k_descale; or q, k and v all
 * float8_e4m3fn with an f16 or bf16 out, see q_descale) on a CUDA (kDLCUDA)
 * or ROCm (kDLROCM) device; strides in elements (NULL: compact row-major). lse (may be NULL): fp32
 * (batch, heads, seqlen_q), or (heads, total_q) with varlen. options may be NULL for the defaults.
 * stream: a CUstream or hipStream_t, NULL for the default stream. All tensors of a call must be on
 * one device: the call runs on the process-wide runtime of that device ordinal (made on first use,
 * with the KILN_* settings), so threads or processes driving different GPUs need nothing more. */
kiln_status kiln_attention(const DLTensor* q, const DLTensor* k, const DLTensor* v,
                           const DLTensor* out, const kiln_attention_options* options,
                           const DLTensor* lse, void* stream);

/* What kiln_attention_backward computes besides dq, dk and dv (kiln::AttentionGradOptions).
 * Call kiln_attention_grad_options_init first. Pointers may be NULL (not asked for). */
typedef struct kiln_attention_grad_options {
  size_t struct_size;     /* sizeof(kiln_attention_grad_options), set by its *_init */
  int deterministic;      /* nonzero: bitwise the same gradients from run to run */
  const DLTensor* dsinks; /* output: fp32 (heads), the gradient of options->score.sinks, summed
                             over batch and rows; only with sinks */
  const DLTensor* dbias;  /* output: the gradient of options->bias, its shape and dtype; summed
                             over batch or heads where the bias has size 1 there (see
                             kiln::AttentionGradOptions::dbias); only with a bias */
} kiln_attention_grad_options;

void kiln_attention_grad_options_init_sized(kiln_attention_grad_options* grads, size_t struct_size);
#define kiln_attention_grad_options_init(grads) \
  kiln_attention_grad_options_init_sized((grads), sizeof(kiln_attention_grad_options))

/* The backward of kiln_attention: dq, dk and dv of out = attention(q, k, v, options), given dout
 * (the gradient of out, laid out like out) and the forward's lse (required: what kiln_attention
 * wrote into its lse). Pass the forward's tensors and options as they were. dq, dk and dv are
 * written, like q, k and v (shapes and dtypes); under GQA/MQA dk and dv sum over the query heads
 * of each group. grads may be NULL for the defaults. Scratch comes from the runtime's
 * stream-ordered allocator; no host synchronization. */
kiln_status kiln_attention_backward(const DLTensor* q, const DLTensor* k, const DLTensor* v,
                                    const DLTensor* out, const DLTensor* dout, const DLTensor* dq,
                                    const DLTensor* dk, const DLTensor* dv,
                                    const kiln_attention_options* options, const DLTensor* lse,
                                    const kiln_attention_grad_options* grads, void* stream);

/* A KV cache for kiln_attention_with_kvcache (kiln::KVCache in decode.hpp has the details).
 * Contiguous: k (batch_cache, seqlen_cache, heads_kv, head_dim), v likewise with head_dim_v.
 * Paged (block_table set): k (num_pages, page_size, heads_kv, head_dim), v likewise. Call
 * kiln_kvcache_init first. */
typedef struct kiln_kvcache {
  size_t struct_size; /* sizeof(kiln_kvcache), set by kiln_kvcache_init */
  const DLTensor* k;
  const DLTensor* v;
  const DLTensor* seqlens;     /* int32 (batch): keys cached per sequence, before the append */
  const DLTensor* batch_idx;   /* int32 (batch) or NULL: cache row per sequence (contiguous) */
  const DLTensor* block_table; /* int32 (batch, max_pages) or NULL: page table (paged) */
  /* An fp8 cache's descales (DLPack float8_e4m3fn or float8_e5m2 k and v, sm_89 and newer):
   * fp32 (batch, heads_kv) or NULL (1); real key = stored key * k_descale[b][h], likewise v;
   * finite and positive. */
  const DLTensor* k_descale;
  const DLTensor* v_descale;
  /* An fp8 cache's descales per (token, kv head), both or NULL: fp32 laid out as the cache less
   * its head dim, (batch_cache, seqlen_cache, heads_kv) or paged (num_pages, page_size,
   * heads_kv), any strides (apart and an element each when an append writes them); they multiply
   * k_descale's and v_descale's. An append writes the new rows' own (kiln::KVCache). */
  const DLTensor* k_token_descale;
  const DLTensor* v_token_descale;
} kiln_kvcache;

/* Sets struct_size and every tensor to NULL. */
void kiln_kvcache_init_sized(kiln_kvcache* cache, size_t struct_size);
#define kiln_kvcache_init(cache) kiln_kvcache_init_sized((cache), sizeof(kiln_kvcache))

/* Options of kiln_attention_with_kvcache. Call kiln_decode_options_init first. Pointers may be
 * NULL (feature off). */
typedef struct kiln_decode_options {
  size_t struct_size;         /* sizeof(kiln_decode_options), set by kiln_decode_options_init */
  kiln_score_options score;   /* first, as in kiln_attention_options */
  const DLTensor* k_new;      /* (batch, seqlen_new, heads_kv, head_dim): appended first */
  const DLTensor* v_new;      /* (batch, seqlen_new, heads_kv, head_dim_v) */
  const DLTensor* rotary_cos; /* (seqlen_ro, rotary_dim / 2), q's dtype; needs k_new */
  const DLTensor* rotary_sin; /* like rotary_cos */
  int rotary_interleaved;     /* nonzero (the default, as FlashAttention's): pairs (2i, 2i + 1)
                                 (GPT-J); 0: (i, i + rotary_dim / 2) (GPT-NeoX) */
  int num_splits;             /* 0: heuristic; n >= 1: at most n key splits (<= 128) */
} kiln_decode_options;

void kiln_decode_options_init_sized(kiln_decode_options* options, size_t struct_size,
                                    size_t score_struct_size);
#define kiln_decode_options_init(options) \
  kiln_decode_options_init_sized((options), sizeof(kiln_decode_options), sizeof(kiln_score_options))

/* Decode attention over a KV cache (FlashAttention's flash_attn_with_kvcache): q (batch,
 * seqlen_q, heads, head_dim), out (batch, seqlen_q, heads, head_dim_v), lse (may be NULL) fp32
 * (batch, heads, seqlen_q). No host synchronization (unless KILN_DEBUG=1), so it can be
 * captured in a CUDA graph. */
kiln_status kiln_attention_with_kvcache(const DLTensor* q, const kiln_kvcache* cache,
                                        const DLTensor* out, const kiln_decode_options* options,
                                        const DLTensor* lse, void* stream);

/* Merges two attention states (v, natural-log LSE s) over disjoint keys: v_a, v_b, v_out
 * (tokens, heads, head_dim), s_a, s_b, s_out (tokens, heads) fp32; s_out may be NULL. */
kiln_status kiln_merge_states(const DLTensor* v_a, const DLTensor* s_a, const DLTensor* v_b,
                              const DLTensor* s_b, const DLTensor* v_out, const DLTensor* s_out,
                              void* stream);

/* Merges many: v (tokens, states, heads, head_dim), s (tokens, states, heads). */
kiln_status kiln_merge_states_many(const DLTensor* v, const DLTensor* s, const DLTensor* v_out,
                                   const DLTensor* s_out, void* stream);

/* Compiles (or finds in the cache) the default kernel set for device `device` (the DLPack device
 * id of the tensors it will run on: a process per GPU passes its own, as with torch's
 * cuda:<rank>), or for `target` ("sm_90a", "gfx90a") when it is not NULL; threads 0 means one per
 * hardware thread. Kernels for that device's target are loaded on its runtime as well; the
 * runtimes of other devices find them in the disk cache on their first call. */
kiln_status kiln_warmup(int device, const char* target, int threads);

/* kiln_warmup on device 0. */
kiln_status kiln_warmup_default(const char* target, int threads);

/* Called by kiln_warmup_with after each kernel of the set is compiled or found: `done` of
 * `total` (done counts up from 1 to total), `spec` the kernel's canonical spec (valid during the
 * call only), `ms` the time it took, `ok` zero when it failed (kiln_warmup_with then fails once
 * the set is done). Calls come one at a time, in order, but from whichever of kiln's threads
 * finished the kernel: the callback must be thread-safe in that sense, and must not call kiln. */
typedef void (*kiln_warmup_progress)(void* user, size_t done, size_t total, const char* spec,
                                     double ms, int ok);

/* Options of kiln_warmup_with. Call kiln_warmup_options_init first: it sets struct_size, and
 * the rest to kiln_warmup's defaults (the device's target, one thread per hardware thread, no
 * progress). */
typedef struct kiln_warmup_options {
  size_t struct_size;            /* sizeof(kiln_warmup_options), set by kiln_warmup_options_init */
  const char* target;            /* "sm_90a", "gfx90a"; NULL: the device's */
  int threads;                   /* 0: one per hardware thread */
  kiln_warmup_progress progress; /* NULL: none */
  void* progress_user;           /* passed to progress as `user` */
} kiln_warmup_options;

void kiln_warmup_options_init_sized(kiln_warmup_options* options, size_t struct_size);
#define kiln_warmup_options_init(options) \
  kiln_warmup_options_init_sized((options), sizeof(kiln_warmup_options))

/* kiln_warmup with options, such as a progress callback (a warm-up takes tens of seconds);
 * options NULL: kiln_warmup's defaults. */
kiln_status kiln_warmup_with(int device, const kiln_warmup_options* options);

/* This thread's message for the last failed call; "" when none failed. Valid until the next
 * kiln call on this thread. */
const char* kiln_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* KILN_KILN_H */
