// SPDX-License-Identifier: Apache-2.0
// kiln::attention_with_kvcache() and kiln::merge_states() input validation, KILN_DEBUG's index
// checks and their C API, with no GPU: every bad input is refused with a kiln::Error (or a
// status and kiln_last_error()) that names the tensor, the values and the fix.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kiln/decode.hpp"
#include "kiln/error.hpp"
#include "kiln/kiln.h"
#include "ops/kvcache_checks.hpp"
#include "ops/score.hpp"
#include "ops/validation_support.hpp"

namespace kiln::test {
namespace {

struct DecodeCall {
  TensorView q, out;
  KVCache cache;
  DecodeOptions options;
};

// A valid decode step over a contiguous cache: batch 2, one query token, 8 query heads on 2 kv
// heads, head dim 64; 3 cache rows of 256 keys, sequence b in row batch_idx[b].
DecodeCall contiguous_call(DType dtype = DType::bf16) {
  DecodeCall c{view(0x1000000, dtype, {2, 1, 8, 64}),
               view(0x5000000, dtype, {2, 1, 8, 64}),
               {view(0x2000000, dtype, {3, 256, 2, 64}), view(0x3000000, dtype, {3, 256, 2, 64}),
                view(0x4000000, DType::i32, {2})},
               {}};
  c.cache.batch_idx = view(0x6000000, DType::i32, {2});
  return c;
}

// The same step over a paged cache: 10 pages of 16 keys, 8 pages per sequence (128 keys).
DecodeCall paged_call() {
  DecodeCall c = contiguous_call();
  c.cache.k = view(0x2000000, DType::bf16, {10, 16, 2, 64});
  c.cache.v = view(0x3000000, DType::bf16, {10, 16, 2, 64});
  c.cache.batch_idx.reset();
  c.cache.block_table = view(0x7000000, DType::i32, {2, 8});
  return c;
}

// With one appended token and a 32-dim rotary embedding of q and k_new.
DecodeCall append_call() {
  DecodeCall c = contiguous_call();
  c.options.k_new = view(0x8000000, DType::bf16, {2, 1, 2, 64});
  c.options.v_new = view(0x9000000, DType::bf16, {2, 1, 2, 64});
  c.options.rotary_cos = view(0xA000000, DType::bf16, {256, 16});
  c.options.rotary_sin = view(0xB000000, DType::bf16, {256, 16});
  return c;
}

// The step of contiguous_call() over an fp8 cache (e4m3 or e5m2) under q and out of `dtype`.
DecodeCall fp8_call(DType kv = DType::e4m3, DType dtype = DType::bf16) {
  DecodeCall c = contiguous_call(dtype);
  c.cache.k.dtype = kv;
  c.cache.v.dtype = kv;
  for (TensorView* t : {&c.cache.k, &c.cache.v}) *t = reshaped(*t, {3, 256, 2, 64});
  return c;
}

void decode(const DecodeCall& c, Runtime& runtime = validating_runtime()) {
  kiln::attention_with_kvcache(c.q, c.cache, c.out, c.options, nullptr, runtime);
}

// The error attention_with_kvcache() refuses `c` with; is_supported() must agree.
void check_refused(const DecodeCall& c, ErrorCategory category,
                   std::initializer_list<const char*> words,
                   Runtime& runtime = validating_runtime()) {
  check_refusal(refusal([&] { decode(c, runtime); },
                        [&](std::string* why) {
                          return kiln::is_supported(c.q, c.cache, c.out, c.options, why, runtime);
                        }),
                category, words);
}

void check_invalid(const DecodeCall& c, std::initializer_list<const char*> words) {
  check_refused(c, ErrorCategory::invalid_argument, words);
}

// Whether `c` got through validation: is_supported() says so, and the call returned (nothing
// to do) or stopped where it needs a device (none here) or a kernel (none compiled).
void check_accepted(const DecodeCall& c) {
  std::string why;
  CHECK(kiln::is_supported(c.q, c.cache, c.out, c.options, &why, validating_runtime()));
  INFO("why: " << why);
  try {
    decode(c);
  } catch (const Error& e) {
    INFO("message: " << e.what());
    CHECK(e.category() == ErrorCategory::not_found);
  }
}

TEST_CASE("decode is_supported() accepts a good problem and explains a refusal", "[decode]") {
  Runtime& rt = validating_runtime();
  const DecodeCall good = contiguous_call();
  std::string why;
  CHECK(kiln::is_supported(good.q, good.cache, good.out, good.options, &why, rt));
  INFO("why: " << why);
  const DecodeCall paged = paged_call();
  CHECK(kiln::is_supported(paged.q, paged.cache, paged.out, paged.options, nullptr, rt));

  DecodeCall bad = contiguous_call();
  bad.q = reshaped(bad.q, {2, 1, 8, 12});
  CHECK_FALSE(kiln::is_supported(bad.q, bad.cache, bad.out, bad.options, &why, rt));
  CHECK_THAT(why, Catch::Contains("head_dim") && Catch::Contains("12"));
  CHECK_FALSE(kiln::is_supported(bad.q, bad.cache, bad.out, bad.options, nullptr, rt));
}

TEST_CASE("decode passes valid calls of every cache layout and option", "[decode]") {
  check_accepted(contiguous_call());
  check_accepted(contiguous_call(DType::f16));
  check_accepted(paged_call());
  check_accepted(append_call());

  DecodeCall rows = contiguous_call();  // no batch_idx: sequence b in row b of 3
  rows.cache.batch_idx.reset();
  check_accepted(rows);

  DecodeCall odd_pages = paged_call();  // any page size, 1 and 17 included
  for (std::int64_t page_size : {1, 17}) {
    odd_pages.cache.k = view(0x2000000, DType::bf16, {10, page_size, 2, 64});
    odd_pages.cache.v = view(0x3000000, DType::bf16, {10, page_size, 2, 64});
    check_accepted(odd_pages);
  }

  DecodeCall options = append_call();
  options.options.score.softmax_scale = 0.5f;
  options.options.score.causal = true;
  options.options.score.window_left = 32;
  options.options.score.softcap = 30;
  options.options.rotary_interleaved = false;  // GPT-NeoX, not the default
  options.options.score.alibi_slopes = view(0xC000000, DType::f32, {2, 8});
  options.options.score.sinks = view(0xC100000, DType::f32, {8});
  options.options.lse = view(0xD000000, DType::f32, {2, 8, 1});
  options.options.num_splits = 128;
  check_accepted(options);

  DecodeCall speculative = paged_call();  // 4 query tokens, head_dim_v 128 != head_dim 64
  speculative.q = reshaped(speculative.q, {2, 4, 8, 64});
  speculative.out = view(0x5000000, DType::bf16, {2, 4, 8, 128});
  speculative.cache.v = view(0x3000000, DType::bf16, {10, 16, 2, 128});
  check_accepted(speculative);

  DecodeCall strided = contiguous_call();  // q and out as views with a padded batch stride
  strided.q.strides = {16 * 64, 8 * 64, 64, 1};
  strided.out.strides = strided.q.strides;
  check_accepted(strided);

  // Nothing to compute: no error, no device and no kernel lookup.
  DecodeCall empty = append_call();
  empty.q = reshaped(empty.q, {2, 0, 8, 64});
  empty.out = reshaped(empty.out, {2, 0, 8, 64});
  CHECK_NOTHROW(decode(empty));
  DecodeCall no_batch = paged_call();
  no_batch.q = reshaped(no_batch.q, {0, 1, 8, 64});
  no_batch.out = reshaped(no_batch.out, {0, 1, 8, 64});
  no_batch.cache.seqlens = view(0x4000000, DType::i32, {0});
  no_batch.cache.block_table = view(0x7000000, DType::i32, {0, 8});
  CHECK_NOTHROW(decode(no_batch));
}

TEST_CASE("decode refuses rank mismatches", "[decode]") {
  DecodeCall c = contiguous_call();
  c.q = reshaped(c.q, {2, 8, 64});
  check_invalid(c, {"q has rank 3 but must have rank 4", "(batch, seqlen_q, heads, head_dim)"});
  c = contiguous_call();
  c.out = reshaped(c.out, {2, 8, 64});
  check_invalid(c, {"out has rank 3 but must have rank 4"});
  c = contiguous_call();
  c.cache.k = reshaped(c.cache.k, {3 * 256, 2, 64});
  check_invalid(c, {"cache.k has rank 3", "(batch_cache, seqlen_cache, heads_kv, head_dim)"});
  c = paged_call();
  c.cache.v = reshaped(c.cache.v, {160, 2, 64});
  check_invalid(c, {"cache.v has rank 3", "(num_pages, page_size, heads_kv, head_dim_v)"});
}

TEST_CASE("decode refuses shape mismatches, naming both sizes", "[decode]") {
  DecodeCall c = contiguous_call();
  c.out = reshaped(c.out, {2, 1, 4, 64});
  check_invalid(c, {"out.size(2) is 4", "q.size(2) (heads) is 8"});
  c = contiguous_call();
  c.out = reshaped(c.out, {3, 1, 8, 64});
  check_invalid(c, {"out.size(0) is 3", "q.size(0) (batch) is 2"});
  c = contiguous_call();
  c.out = reshaped(c.out, {2, 2, 8, 64});
  check_invalid(c, {"out.size(1) is 2", "seqlen_q", "1"});
  c = contiguous_call();
  c.out = reshaped(c.out, {2, 1, 8, 128});
  check_invalid(c, {"out.size(-1) is 128", "head_dim_v", "64"});
  c = contiguous_call();
  c.cache.v = reshaped(c.cache.v, {3, 128, 2, 64});
  check_invalid(c, {"cache.v.size(1) is 128", "cache.k.size(1) is 256"});
  c = contiguous_call();
  c.cache.v = reshaped(c.cache.v, {2, 256, 2, 64});
  check_invalid(c, {"cache.v.size(0) is 2", "cache.k.size(0) is 3"});
  c = contiguous_call();
  c.cache.v = reshaped(c.cache.v, {3, 256, 1, 64});
  check_invalid(c, {"cache.v.size(2) is 1", "heads_kv", "2"});
  c = contiguous_call();
  c.cache.k = reshaped(c.cache.k, {3, 256, 2, 128});
  check_invalid(c, {"cache.k.size(-1) is 128", "q.size(-1) (head_dim) is 64"});
}

TEST_CASE("decode refuses query heads that are not a multiple of the kv heads", "[decode]") {
  DecodeCall c = contiguous_call();
  c.cache.k = reshaped(c.cache.k, {3, 256, 3, 64});
  c.cache.v = reshaped(c.cache.v, {3, 256, 3, 64});
  check_invalid(c, {"q has 8 heads and cache.k has 3", "multiple"});
}

TEST_CASE("decode refuses mixed and unsupported dtypes", "[decode]") {
  DecodeCall c = contiguous_call();
  c.q.dtype = DType::f32;
  c.out.dtype = DType::f32;
  check_refused(c, ErrorCategory::unsupported, {"q has dtype f32", "bf16 or f16"});
  c = contiguous_call();
  c.cache.v.dtype = DType::f16;
  check_invalid(c, {"cache.v has dtype f16 but q has dtype bf16: decode attention takes (q, k and "
                    "v, out) in the dtypes (bf16, bf16, bf16) or (f16, f16, f16) or (bf16, e4m3, "
                    "bf16) or (f16, e4m3, f16) or (bf16, e5m2, bf16) or (f16, e5m2, f16), so "
                    "cache.v needs bf16"});
  c = contiguous_call();
  c.cache.k.dtype = DType::e4m3;
  check_invalid(c, {"cache.v has dtype bf16 but cache.k has dtype e4m3", "so cache.v needs e4m3"});
  c = contiguous_call();
  c.out.dtype = DType::f16;
  check_invalid(c, {"out has dtype f16 but q has dtype bf16", "so out needs bf16"});
  c = append_call();
  c.options.k_new->dtype = DType::f16;
  check_invalid(c, {"k_new has dtype f16 but q has dtype bf16", "so k_new needs bf16"});
}

TEST_CASE("decode refuses a non-contiguous last dim, misalignment and negative strides",
          "[decode]") {
  DecodeCall c = contiguous_call();
  c.cache.k.strides[3] = 2;
  check_invalid(c, {"cache.k.stride(-1) is 2", "contiguous"});
  c = contiguous_call();
  c.cache.v.strides[1] = 2 * 64 + 4;
  check_invalid(c, {"cache.v.stride(1) is 132", "multiples of 8 elements"});
  c = contiguous_call();
  c.out.data = fake(0x5000008);
  check_invalid(c, {"out's data pointer", "16-byte aligned"});
  c = contiguous_call();
  c.q.strides[0] = -512;
  check_invalid(c, {"q.stride(0) is -512", "negative"});
  c = append_call();
  c.options.v_new->data = fake(0x9000004);
  check_invalid(c, {"v_new's data pointer", "16-byte aligned"});
}

TEST_CASE("decode refuses null data pointers and negative sizes", "[decode]") {
  DecodeCall c = contiguous_call();
  c.cache.k.data = nullptr;
  check_invalid(c, {"cache.k has a null data pointer", std::to_string(3 * 256 * 2 * 64).c_str()});
  c = contiguous_call();
  c.cache.seqlens.data = nullptr;
  check_invalid(c, {"cache.seqlens has a null data pointer"});
  c = contiguous_call();
  c.cache.k.shape[1] = -5;
  check_invalid(c, {"cache.k.size(1) is -5", "negative"});
}

TEST_CASE("decode refuses sizes beyond int32 and spans beyond 64-bit offsets", "[decode]") {
  constexpr std::int64_t big = std::int64_t{1} << 31;
  DecodeCall c = contiguous_call();
  c.cache.k = reshaped(c.cache.k, {3, big, 2, 64});
  c.cache.v = reshaped(c.cache.v, {3, big, 2, 64});
  check_invalid(c, {"cache.k.size(1) is 2147483648", "2147483647"});

  c = paged_call();
  c.cache.block_table = view(0x7000000, DType::i32, {2, big / 16});
  check_invalid(c, {"capacity", "2147483648"});

  c = contiguous_call();
  c.q.strides[0] = std::int64_t{1} << 62;
  check_invalid(c, {"q", "64-bit offsets"});

  // 2^32 query rows (a broadcast q) would overflow the split-KV scratch's sizes.
  c = contiguous_call();
  c.q = view(0x1000000, DType::bf16, {2, 1 << 20, 2048, 64});
  c.q.strides = {0, 0, 0, 1};
  c.out = reshaped(c.out, {2, 1 << 20, 2048, 64});
  c.cache.k = reshaped(c.cache.k, {3, 256, 2048, 64});
  c.cache.v = reshaped(c.cache.v, {3, 256, 2048, 64});
  check_invalid(c, {"batch * seqlen_q * heads (query rows) is 4294967296", "2147483647"});
}

TEST_CASE("decode refuses a paged capacity that overflows int64", "[decode]") {
  // (2^59 + 1) pages of 32 keys are 2^64 + 32 keys, which wrap to a capacity of 32 in int64.
  DecodeCall c = paged_call();
  c.cache.k = reshaped(c.cache.k, {10, 32, 2, 64});
  c.cache.v = reshaped(c.cache.v, {10, 32, 2, 64});
  c.cache.block_table = view(0x7000000, DType::i32, {2, (std::int64_t{1} << 59) + 1});
  c.cache.block_table->strides[0] = 0;  // one row for both sequences spans 2^59 + 1 elements
  check_invalid(c, {"capacity", "576460752303423489 * 32", "beyond int64", "2147483647"});
}

TEST_CASE("decode refuses outputs whose elements share addresses", "[decode]") {
  DecodeCall c = contiguous_call();
  c.out.strides[0] = 0;
  check_invalid(c, {"out.stride(0) is 0", "out.size(0) is 2", "one address"});
  c = contiguous_call();
  c.options.lse = view(0xD000000, DType::f32, {2, 8, 1});
  c.options.lse->strides = {8, 0, 1};
  check_invalid(c, {"lse.stride(1) is 0", "lse.size(1) is 8"});

  // The append writes the cache, which must not alias then; without one it is only read.
  c = append_call();
  c.cache.k.strides[1] = 0;
  check_invalid(c, {"cache.k.stride(1) is 0", "cache.k.size(1) is 256"});
  c = append_call();
  c.cache.v.strides[0] = 64;
  check_invalid(c, {"cache.v.stride(0) is 64", "overlap"});
  c = contiguous_call();
  c.cache.k.strides[1] = 0;
  check_accepted(c);
}

TEST_CASE("decode refuses grids the launch cannot express", "[decode]") {
  DecodeCall c = contiguous_call();
  c.q = reshaped(c.q, {70000, 1, 8, 64});
  c.out = reshaped(c.out, {70000, 1, 8, 64});
  c.cache.k = reshaped(c.cache.k, {70000, 256, 2, 64});
  c.cache.v = reshaped(c.cache.v, {70000, 256, 2, 64});
  c.cache.seqlens = view(0x4000000, DType::i32, {70000});
  c.cache.batch_idx.reset();
  check_refused(c, ErrorCategory::unsupported, {"batch 70000", "65535"});
}

TEST_CASE("decode refuses head dims it does not compile", "[decode]") {
  for (std::int64_t dim : {12, 0, 4, 264}) {
    INFO("head_dim " << dim);
    DecodeCall c = contiguous_call();
    c.q = reshaped(c.q, {2, 1, 8, dim});
    c.cache.k = reshaped(c.cache.k, {3, 256, 2, dim});
    check_refused(c, ErrorCategory::unsupported,
                  {"head_dim", std::to_string(dim).c_str(), "multiple of 8 from 8 to 256"});
  }
  DecodeCall c = contiguous_call();
  c.cache.v = reshaped(c.cache.v, {3, 256, 2, 20});
  c.out = reshaped(c.out, {2, 1, 8, 20});
  check_refused(c, ErrorCategory::unsupported, {"head_dim_v", "20", "multiple of 8"});
}

TEST_CASE("decode refuses tensors on another device than the runtime's", "[decode]") {
  DecodeCall c = contiguous_call();
  c.cache.v.device = 1;
  check_invalid(c, {"cache.v is on device 1", "device is 0"});
  c = paged_call();
  c.cache.block_table->device = 2;
  check_invalid(c, {"cache.block_table is on device 2"});
}

TEST_CASE("decode refuses malformed seqlens and batch_idx", "[decode]") {
  DecodeCall c = contiguous_call();
  c.cache.seqlens = view(0x4000000, DType::i32, {3});
  check_invalid(c, {"cache.seqlens.size(-1) is 3", "batch", "2"});
  c.cache.seqlens = view(0x4000000, DType::i64, {2});
  check_invalid(c, {"cache.seqlens has dtype i64", "int32"});
  c.cache.seqlens = view(0x4000000, DType::i32, {2, 1});
  check_invalid(c, {"cache.seqlens has rank 2 but must have rank 1"});
  c.cache.seqlens = view(0x4000000, DType::i32, {2});
  c.cache.seqlens.strides[0] = 2;
  check_invalid(c, {"cache.seqlens.stride(0) is 2", "contiguous"});

  c = contiguous_call();
  c.cache.batch_idx = view(0x6000000, DType::i32, {1});
  check_invalid(c, {"cache.batch_idx.size(-1) is 1", "batch", "2"});
  c.cache.batch_idx = view(0x6000002, DType::i32, {2});
  check_invalid(c, {"cache.batch_idx", "aligned"});

  c = contiguous_call();  // without batch_idx, sequence b needs cache row b
  c.cache.batch_idx.reset();
  c.cache.k = reshaped(c.cache.k, {1, 256, 2, 64});
  c.cache.v = reshaped(c.cache.v, {1, 256, 2, 64});
  check_invalid(c, {"cache.k.size(0) is 1", "batch) is 2", "batch_idx"});

  c = paged_call();
  c.cache.batch_idx = view(0x6000000, DType::i32, {2});
  check_invalid(c, {"cache.batch_idx is for contiguous caches", "block_table"});
}

TEST_CASE("decode refuses a malformed block table or page size", "[decode]") {
  DecodeCall c = paged_call();
  c.cache.block_table = view(0x7000000, DType::i64, {2, 8});
  check_invalid(c, {"cache.block_table has dtype i64", "int32"});
  c.cache.block_table = view(0x7000000, DType::i32, {16});
  check_invalid(c, {"cache.block_table has rank 1 but must have rank 2", "(batch, max_pages)"});
  c.cache.block_table = view(0x7000000, DType::i32, {3, 8});
  check_invalid(c, {"cache.block_table.size(0) is 3", "batch", "2"});
  c.cache.block_table = view(0x7000000, DType::i32, {2, 8});
  c.cache.block_table->strides = {16, 2};
  check_invalid(c, {"cache.block_table.stride(-1) is 2", "contiguous"});

  c = paged_call();  // a wide table seen through a row stride is fine
  c.cache.block_table->strides = {100, 1};
  check_accepted(c);

  c = paged_call();
  c.cache.k = reshaped(c.cache.k, {10, 0, 2, 64});
  c.cache.v = reshaped(c.cache.v, {10, 0, 2, 64});
  check_invalid(c, {"page_size", "at least one key"});
}

TEST_CASE("decode refuses k_new and v_new that do not fit q and the cache", "[decode]") {
  DecodeCall c = append_call();
  c.options.v_new.reset();
  c.options.rotary_cos.reset();
  c.options.rotary_sin.reset();
  check_invalid(c, {"k_new and v_new come together", "v_new is missing"});
  c.options.v_new = c.options.k_new;
  c.options.k_new.reset();
  check_invalid(c, {"k_new is missing"});

  c = append_call();
  c.options.k_new = view(0x8000000, DType::bf16, {2, 1, 64});
  check_invalid(c, {"k_new has rank 3 but must have rank 4"});
  c = append_call();
  c.options.k_new = view(0x8000000, DType::bf16, {3, 1, 2, 64});
  check_invalid(c, {"k_new.size(0) is 3", "batch", "2"});
  c = append_call();
  c.options.v_new = view(0x9000000, DType::bf16, {2, 1, 4, 64});
  check_invalid(c, {"v_new.size(2) is 4", "heads_kv", "2"});
  c = append_call();
  c.options.v_new = view(0x9000000, DType::bf16, {2, 2, 2, 64});
  check_invalid(c, {"v_new.size(1) is 2", "seqlen_new", "1"});
  c = append_call();
  c.options.k_new = view(0x8000000, DType::bf16, {2, 1, 2, 32});
  check_invalid(c, {"k_new.size(-1) is 32", "head_dim", "64"});
  c = append_call();
  c.options.v_new = view(0x9000000, DType::bf16, {2, 1, 2, 128});
  check_invalid(c, {"v_new.size(-1) is 128", "head_dim_v", "64"});

  c = paged_call();  // 128 keys per sequence
  c.options.k_new = view(0x8000000, DType::bf16, {2, 129, 2, 64});
  c.options.v_new = view(0x9000000, DType::bf16, {2, 129, 2, 64});
  check_invalid(c, {"seqlen_new", "129", "at most 128 keys", "block_table.size(1) * page_size"});
}

TEST_CASE("decode refuses rotary tables that do not fit", "[decode]") {
  DecodeCall c = append_call();
  c.options.rotary_sin.reset();
  check_invalid(c, {"rotary_cos and rotary_sin come together", "rotary_sin is missing"});

  c = append_call();
  c.options.k_new.reset();
  c.options.v_new.reset();
  check_invalid(c, {"rotary_cos and rotary_sin need k_new"});

  c = append_call();
  c.options.rotary_cos = view(0xA000000, DType::bf16, {256, 16, 1});
  check_invalid(c, {"rotary_cos has rank 3 but must have rank 2", "(seqlen_ro, rotary_dim / 2)"});
  c = append_call();
  c.options.rotary_sin->dtype = DType::f16;
  check_invalid(c, {"rotary_sin has dtype f16 but q has dtype bf16"});
  c = append_call();
  c.options.rotary_sin = view(0xB000000, DType::bf16, {256, 8});
  check_invalid(c, {"rotary_sin.size(-1) is 8", "rotary_cos.size(1)", "16"});
  c = append_call();
  c.options.rotary_sin = view(0xB000000, DType::bf16, {300, 16});
  check_invalid(c, {"rotary_sin.size(0) is 300", "seqlen_ro", "256"});
  c = append_call();
  c.options.rotary_cos->strides = {16, 2};
  check_invalid(c, {"rotary_cos.stride(-1) is 2", "contiguous"});
  c = append_call();
  c.options.rotary_sin->strides = {32, 1};
  check_invalid(c, {"rotary_sin.stride(0) is 32", "rotary_cos.stride(0) is 16"});

  for (std::int64_t half : {0, 33}) {
    INFO("rotary_dim / 2 = " << half);
    c = append_call();
    c.options.rotary_cos = view(0xA000000, DType::bf16, {256, half});
    c.options.rotary_sin = view(0xB000000, DType::bf16, {256, half});
    check_invalid(c, {"rotary_dim is", "from 2 to head_dim (64)"});
  }

  // The tables need a row for every position the cache can hold: 256 keys here, 128 paged.
  c = append_call();
  c.options.rotary_cos = view(0xA000000, DType::bf16, {255, 16});
  c.options.rotary_sin = view(0xB000000, DType::bf16, {255, 16});
  check_invalid(c, {"rotary_cos.size(0) (seqlen_ro) is 255", "256 keys", "seqlen_cache"});
  DecodeCall paged = paged_call();
  paged.options = append_call().options;
  paged.options.rotary_cos = view(0xA000000, DType::bf16, {128, 16});
  paged.options.rotary_sin = view(0xB000000, DType::bf16, {128, 16});
  check_accepted(paged);
  paged.options.rotary_cos = view(0xA000000, DType::bf16, {127, 16});
  paged.options.rotary_sin = view(0xB000000, DType::bf16, {127, 16});
  check_invalid(paged, {"seqlen_ro) is 127", "128 keys"});

  // With a band, q tokens past the appended ones rotate at positions past the cache's keys.
  paged.options.rotary_cos = view(0xA000000, DType::bf16, {130, 16});
  paged.options.rotary_sin = view(0xB000000, DType::bf16, {130, 16});
  paged.q = reshaped(paged.q, {2, 4, 8, 64});
  paged.out = reshaped(paged.out, {2, 4, 8, 64});
  check_accepted(paged);
  paged.options.score.causal = true;
  check_invalid(paged, {"seqlen_ro) is 130", "128 keys", "q's last 3 tokens"});
  paged.options.rotary_cos = view(0xA000000, DType::bf16, {131, 16});
  paged.options.rotary_sin = view(0xB000000, DType::bf16, {131, 16});
  check_accepted(paged);
}

// The checks decode shares with attention (lse, ALiBi, scalar options) are tested in full in
// attention_validation_test.cpp; these check that decode passes them its own sizes.
TEST_CASE("decode refuses an lse, alibi slopes or sinks of the wrong shape", "[decode]") {
  DecodeCall c = contiguous_call();
  c.options.lse = view(0xD000000, DType::f32, {2, 8, 2});
  check_invalid(c, {"lse.size(-1) is 2", "seqlen_q", "1"});
  c.options.lse = view(0xD000000, DType::f32, {2, 4, 1});
  check_invalid(c, {"lse.size(1) is 4", "heads", "8"});
  c.options.lse = view(0xD000000, DType::f32, {2, 8, 1});
  c.options.lse->strides = {16, 2, 5};  // a size-1 dim may have any stride
  check_accepted(c);

  c = contiguous_call();
  c.options.score.alibi_slopes = view(0xC000000, DType::f32, {4});
  check_invalid(c, {"alibi_slopes.size(-1) is 4", "heads", "8"});
  c.options.score.alibi_slopes = view(0xC000000, DType::f32, {3, 8});
  check_invalid(c, {"alibi_slopes.size(0) is 3", "batch", "2"});

  c = contiguous_call();
  c.options.score.sinks = view(0xC000000, DType::f32, {2});
  check_invalid(c, {"sinks.size(-1) is 2", "heads", "8"});
}

TEST_CASE("decode takes causal as window_right 0 whatever window_right says, as FlashAttention",
          "[decode]") {
  // Hugging Face transformers' sliding-window layers: causal with (w - 1, w - 1).
  for (int window_right : {-1, 0, 5, 4095}) {
    INFO("window_right " << window_right);
    DecodeCall c = append_call();
    c.options.score.causal = true;
    c.options.score.window_left = 4095;
    c.options.score.window_right = window_right;
    check_accepted(c);
    const ScoreParams p = detail::score_params(c.options.score, 2, 8, 64, 0);
    CHECK(p.window_left == 4095);
    CHECK(p.window_right == 0);
  }
}

TEST_CASE("DecodeOptions rotates interleaved pairs by default, as flash_attn_with_kvcache",
          "[decode]") {
  const DecodeOptions defaults;
  CHECK(defaults.rotary_interleaved);
  CHECK_FALSE(defaults.score.causal);
  CHECK(defaults.score.window_left == -1);
  CHECK(defaults.score.window_right == -1);
  CHECK(defaults.num_splits == 0);
}

TEST_CASE("decode refuses bad scalar options and split counts", "[decode]") {
  DecodeCall c = contiguous_call();
  c.options.score.window_left = -2;
  check_invalid(c, {"window (-2, -1)", "below -1"});
  c = contiguous_call();
  c.options.score.softmax_scale = std::numeric_limits<float>::quiet_NaN();
  check_invalid(c, {"softmax_scale is nan", "finite"});
  for (int splits : {-1, 129}) {
    c = contiguous_call();
    c.options.num_splits = splits;
    check_invalid(c, {"num_splits is", std::to_string(splits).c_str(), "1 to 128"});
  }
}

TEST_CASE("decode with a given config refuses one out of range, naming the value and the fix",
          "[decode]") {
  const DecodeCall c = contiguous_call();
  const auto refused = [&](const DecodeConfig& config) {
    return refusal([&] {
      kiln::attention_with_kvcache(c.q, c.cache, c.out, c.options, config, nullptr,
                                   validating_runtime());
    });
  };
  const auto invalid = [&](const DecodeConfig& config, std::initializer_list<const char*> words) {
    check_refusal(refused(config), ErrorCategory::invalid_argument, words);
  };
  invalid({.kernel = static_cast<DecodeKernel>(3)}, {"config.kernel is 3", "no DecodeKernel"});
  invalid({.num_splits = 0}, {"config.num_splits is 0", "1 (one pass) to 128"});
  invalid({.num_splits = 129}, {"config.num_splits is 129"});
  invalid({.block_n = 24}, {"config.block_n is 24", "multiple of 16 from 16 to 128"});
  invalid({.block_n = 144}, {"config.block_n is 144"});
  invalid({.warps = 0}, {"config.warps is 0", "1 to 16"});
  invalid({.warps = 17}, {"config.warps is 17"});
  invalid({.stages = 1}, {"config.stages is 1", "2 to 8"});
  invalid({.m_tiles = 3}, {"config.m_tiles is 3", "1, 2 or 4"});
  // The target is checked first, as without a config; a good config gets as far as the device.
  check_refusal(refusal([&] {
                  kiln::attention_with_kvcache(c.q, c.cache, c.out, c.options, DecodeConfig{},
                                               nullptr, validating_runtime("gfx90a"));
                }),
                ErrorCategory::unsupported, {"gfx90a", "not supported yet"});
  CHECK(refused({}).category == ErrorCategory::not_found);
}

TEST_CASE("decode refuses targets without bf16 tensor cores, and AMD targets for now", "[decode]") {
  const DecodeCall c = contiguous_call();
  check_refused(c, ErrorCategory::unsupported, {"gfx90a", "not supported yet"},
                validating_runtime("gfx90a"));
  check_refused(c, ErrorCategory::unsupported, {"sm_80 or newer", "sm_75"},
                validating_runtime("sm_75"));
  CHECK(kiln::is_supported(c.q, c.cache, c.out, c.options, nullptr, validating_runtime("sm_80")));
}

// fp8 caches: e4m3 and e5m2 under bf16 and f16, contiguous and paged, with FlashAttention-3's
// descales (fp32 (batch, heads_kv), one broadcast by stride 0 too), on sm_89 and newer.
TEST_CASE("decode reads an fp8 cache with descales of (batch, heads_kv) on sm_89 and newer",
          "[decode]") {
  for (DType kv : {DType::e4m3, DType::e5m2}) {
    for (DType dtype : {DType::bf16, DType::f16}) {
      INFO(to_string(kv) << " under " << to_string(dtype));
      DecodeCall c = fp8_call(kv, dtype);
      check_accepted(c);
      c.cache.k_descale = view(0xC000000, DType::f32, {2, 2});
      c.cache.v_descale = view(0xD000000, DType::f32, {2, 2});
      check_accepted(c);
      c.cache.k_descale->strides = {0, 0};
      check_accepted(c);
      CHECK(
          kiln::is_supported(c.q, c.cache, c.out, c.options, nullptr, validating_runtime("sm_89")));
    }
  }
  DecodeCall paged = paged_call();
  paged.cache.k.dtype = DType::e4m3;
  paged.cache.v.dtype = DType::e4m3;
  check_accepted(paged);
}

TEST_CASE("decode refuses an fp8 cache where it cannot read one, and misplaced descales",
          "[decode]") {
  check_refused(fp8_call(), ErrorCategory::unsupported,
                {"an e4m3 KV cache needs an sm_89 or newer GPU", "sm_80"},
                validating_runtime("sm_80"));
  // Head dims of 16-byte pieces only: 72 fp8 elements (in rows padded to 80) end mid-piece.
  DecodeCall c = fp8_call(DType::e5m2);
  c.q = reshaped(c.q, {2, 1, 8, 72});
  c.cache.k.shape = {3, 256, 2, 72};
  c.cache.k.strides = {256 * 2 * 80, 2 * 80, 80, 1};
  check_refused(c, ErrorCategory::unsupported,
                {"head_dim 72 and head_dim_v 64 with an e5m2 KV cache", "multiples of 16"});
  c = fp8_call();
  c.cache.v.strides[1] = 2 * 64 + 8;
  check_invalid(c, {"cache.v.stride(1) is 136", "multiples of 16 elements"});
  c = fp8_call();
  c.options.k_new = view(0x8000000, DType::e4m3, {2, 1, 2, 64});
  c.options.v_new = view(0x9000000, DType::e4m3, {2, 1, 2, 64});
  check_invalid(c, {"k_new has dtype e4m3 with an e4m3 cache", "q's dtype (bf16)", "quantizes"});
  c.options.k_new->dtype = DType::bf16;
  check_invalid(c, {"v_new has dtype e4m3 with an e4m3 cache", "q's dtype (bf16)"});

  c = contiguous_call();
  c.cache.v_descale = view(0xD000000, DType::f32, {2, 2});
  check_invalid(c, {"cache.v_descale is for an fp8 cache, but the cache has dtype bf16"});
  c = fp8_call();
  c.cache.k_descale = view(0xC000000, DType::f16, {2, 2});
  check_invalid(c, {"cache.k_descale has dtype f16", "float32"});
  c.cache.k_descale = view(0xC000000, DType::f32, {2, 8});
  check_invalid(c, {"cache.k_descale", "8", "heads_kv"});
  c.cache.k_descale = view(0xC000000, DType::f32, {2});
  check_invalid(c, {"cache.k_descale", "(batch, heads_kv)"});
}

// Descales per (token, kv head): fp32 shaped as the cache less its head dim, contiguous or
// paged, any strides; written by an append (so they must not overlap then).
TEST_CASE("decode reads an fp8 cache with descales per token and kv head", "[decode]") {
  DecodeCall c = fp8_call();
  c.cache.k_token_descale = view(0xE000000, DType::f32, {3, 256, 2});
  c.cache.v_token_descale = view(0xF000000, DType::f32, {3, 256, 2});
  check_accepted(c);
  c.cache.k_descale = view(0xC000000, DType::f32, {2, 2});  // both kinds multiply
  c.cache.v_descale = view(0xD000000, DType::f32, {2, 2});
  c.options.k_new = view(0x8000000, DType::bf16, {2, 1, 2, 64});
  c.options.v_new = view(0x9000000, DType::bf16, {2, 1, 2, 64});
  check_accepted(c);
  // A head-major layout, (heads_kv, batch_cache, seqlen_cache) seen as the cache's order.
  c.cache.v_token_descale->strides = {256, 1, 3 * 256};
  check_accepted(c);
  DecodeCall paged = paged_call();
  paged.cache.k.dtype = DType::e5m2;
  paged.cache.v.dtype = DType::e5m2;
  paged.cache.k_token_descale = view(0xE000000, DType::f32, {10, 16, 2});
  paged.cache.v_token_descale = view(0xF000000, DType::f32, {10, 16, 2});
  check_accepted(paged);
}

TEST_CASE("decode refuses descales per token that do not match the cache", "[decode]") {
  DecodeCall c = fp8_call();
  c.cache.k_token_descale = view(0xE000000, DType::f32, {3, 256, 2});
  check_invalid(c, {"cache.k_token_descale and cache.v_token_descale come together",
                    "cache.v_token_descale is missing"});
  c.cache.v_token_descale = view(0xF000000, DType::f32, {3, 256, 2});
  c.cache.v_token_descale->dtype = DType::bf16;
  check_invalid(c, {"cache.v_token_descale has dtype bf16", "float32"});
  c.cache.v_token_descale = view(0xF000000, DType::f32, {3, 256, 2, 1});
  check_invalid(c, {"cache.v_token_descale", "(batch_cache, seqlen_cache, heads_kv)"});
  c.cache.v_token_descale = view(0xF000000, DType::f32, {3, 128, 2});
  check_invalid(c, {"cache.v_token_descale", "128", "cache.k.size(1)"});
  c.cache.v_token_descale = view(0xF000000, DType::f32, {2, 256, 2});
  check_invalid(c, {"cache.v_token_descale", "cache.k.size(0)"});
  c.cache.v_token_descale = view(0xF000000, DType::f32, {3, 256, 1});
  check_invalid(c, {"cache.v_token_descale", "heads_kv"});
  // An append writes them: each slot's own element.
  c.cache.v_token_descale = view(0xF000000, DType::f32, {3, 256, 2});
  c.cache.v_token_descale->strides = {0, 2, 1};
  check_accepted(c);
  c.options.k_new = view(0x8000000, DType::bf16, {2, 1, 2, 64});
  c.options.v_new = view(0x9000000, DType::bf16, {2, 1, 2, 64});
  check_invalid(c, {"cache.v_token_descale"});
  // One tensor for both: the append would write the keys' descale, then the values' over it.
  c.cache.v_token_descale = c.cache.k_token_descale;
  check_invalid(c, {"cache.k_token_descale and cache.v_token_descale share memory"});
  c.options.k_new.reset();
  c.options.v_new.reset();
  check_accepted(c);  // without an append nothing is written: one tensor may serve both

  DecodeCall paged = paged_call();
  paged.cache.k.dtype = DType::e4m3;
  paged.cache.v.dtype = DType::e4m3;
  paged.cache.k_token_descale = view(0xE000000, DType::f32, {10, 32, 2});
  paged.cache.v_token_descale = view(0xF000000, DType::f32, {10, 16, 2});
  check_invalid(paged, {"cache.k_token_descale", "32", "cache.k.size(1)"});

  c = contiguous_call();
  c.cache.k_token_descale = view(0xE000000, DType::f32, {3, 256, 2});
  c.cache.v_token_descale = view(0xF000000, DType::f32, {3, 256, 2});
  check_invalid(c, {"cache.k_token_descale is for an fp8 cache, but the cache has dtype bf16"});
}

// --- KILN_DEBUG's index checks ---------------------------------------------------------------

using detail::CacheBounds;
using detail::CacheIndices;

void check_index_refused(const CacheIndices& host, const CacheBounds& bounds,
                         std::initializer_list<const char*> words) {
  check_refusal(refusal([&] { detail::check_cache_indices(host, bounds); }),
                ErrorCategory::invalid_argument, words);
}

TEST_CASE("KILN_DEBUG's checks name the sequence, the value and its bound", "[decode]") {
  const CacheBounds bounds{.capacity = 20, .seqlen_new = 2, .rows = 3};
  std::vector<std::int32_t> seqlens = {5, 18};
  std::vector<std::int32_t> batch_idx = {2, 0};
  CHECK_NOTHROW(detail::check_cache_indices({seqlens, batch_idx}, bounds));

  seqlens = {5, -1};
  check_index_refused({seqlens}, bounds, {"cache.seqlens[1] is -1", "negative", "KILN_DEBUG"});
  seqlens = {19, 3};
  check_index_refused({seqlens}, bounds,
                      {"cache.seqlens[0] + seqlen_new is 19 + 2 = 21", "at most 20 keys"});
  seqlens = {5, 3};
  batch_idx = {1, 3};
  check_index_refused({seqlens, batch_idx}, bounds, {"cache.batch_idx[1] is 3", "[0, 3)"});
  batch_idx = {-1, 0};
  check_index_refused({seqlens, batch_idx}, bounds, {"cache.batch_idx[0] is -1"});
}

TEST_CASE("KILN_DEBUG's checks refuse an fp8 cache's descales that are not finite and positive",
          "[decode]") {
  std::vector<float> k = {1.f, 0.5f, 2.f, 0.25f}, v = {1.f, 1.f, 1.f, 1.f};  // batch 2, 2 heads
  CHECK_NOTHROW(detail::check_cache_descales({.k = k, .v = v, .heads_kv = 2}));
  CHECK_NOTHROW(detail::check_cache_descales({}));
  k[3] = 0.f;
  check_refusal(refusal([&] { detail::check_cache_descales({.k = k, .v = v, .heads_kv = 2}); }),
                ErrorCategory::invalid_argument,
                {"cache.k_descale[1][1] is 0", "finite and positive", "KILN_DEBUG"});
  k[3] = 1.f;
  v[2] = std::numeric_limits<float>::quiet_NaN();
  check_refusal(refusal([&] { detail::check_cache_descales({.k = k, .v = v, .heads_kv = 2}); }),
                ErrorCategory::invalid_argument, {"cache.v_descale[1][0] is nan"});
  v[2] = -1.f;
  check_refusal(refusal([&] { detail::check_cache_descales({.k = k, .v = v, .heads_kv = 2}); }),
                ErrorCategory::invalid_argument, {"cache.v_descale[1][0] is -1"});
}

TEST_CASE("KILN_DEBUG's checks read only the pages each sequence uses", "[decode]") {
  // 6 pages of 8 keys; rows of 4 pages, 5 apart; one key appended. Sequence 0 holds 7 + 1 keys
  // (1 page), sequence 1 holds 16 + 1 (3 pages): the entries past those are never read.
  const CacheBounds bounds{.capacity = 32, .seqlen_new = 1, .pages = 6, .page_size = 8};
  const std::vector<std::int32_t> seqlens = {7, 16};
  std::vector<std::int32_t> table = {0, 99, -5, 99, 77, 1, 2, 5, 99, 77};
  CHECK_NOTHROW(detail::check_cache_indices({seqlens, {}, table, 5}, bounds));

  table[7] = 6;
  check_index_refused({seqlens, {}, table, 5}, bounds,
                      {"cache.block_table[1][2] is 6", "[0, 6)", "17 keys in 3 pages of 8"});
  table[7] = 5;
  table[0] = -1;
  check_index_refused({seqlens, {}, table, 5}, bounds, {"cache.block_table[0][0] is -1"});
}

// --- merge_states -----------------------------------------------------------------------------

struct MergeCall {
  TensorView v_a, s_a, v_b, s_b, v_out, s_out;
};

// Two states of 5 tokens, 8 heads, head dim 64, merged into fp32.
MergeCall merge_call(DType dtype = DType::bf16) {
  return {view(0x1000000, dtype, {5, 8, 64}),      view(0x2000000, DType::f32, {5, 8}),
          view(0x3000000, dtype, {5, 8, 64}),      view(0x4000000, DType::f32, {5, 8}),
          view(0x5000000, DType::f32, {5, 8, 64}), view(0x6000000, DType::f32, {5, 8})};
}

void merge(const MergeCall& c) {
  kiln::merge_states(c.v_a, c.s_a, c.v_b, c.s_b, c.v_out, &c.s_out, nullptr, validating_runtime());
}

// Three states per row, (tokens, states, heads, head_dim).
struct MergeManyCall {
  TensorView v, s, v_out;
};

MergeManyCall merge_many_call() {
  return {view(0x1000000, DType::f16, {5, 3, 8, 64}), view(0x2000000, DType::f32, {5, 3, 8}),
          view(0x5000000, DType::bf16, {5, 8, 64})};
}

void merge_many(const MergeManyCall& c) {
  kiln::merge_states(c.v, c.s, c.v_out, nullptr, nullptr, validating_runtime());
}

// Got through validation: it stopped at the kernel lookup (no kernel compiled, or no driver).
template <class Call>
void check_merge_accepted(const Call& call) {
  try {
    call();
  } catch (const Error& e) {
    INFO("message: " << e.what());
    CHECK(e.category() == ErrorCategory::not_found);
    CHECK_THAT(e.what(), Catch::Contains("attention/decode/merge.cuh"));
  }
}

TEST_CASE("merge_states passes valid states of every dtype and layout", "[decode]") {
  for (DType dtype : {DType::f16, DType::bf16, DType::f32}) {
    INFO(to_string(dtype));
    check_merge_accepted([&] { merge(merge_call(dtype)); });
  }
  MergeCall strided = merge_call();  // slices of wider buffers; odd strides are fine
  strided.v_a.strides = {8 * 72, 72, 1};
  strided.s_b.strides = {9, 1};
  check_merge_accepted([&] { merge(strided); });
  check_merge_accepted([&] { merge_many(merge_many_call()); });

  MergeCall empty = merge_call();  // no tokens: nothing to launch
  for (TensorView* t :
       {&empty.v_a, &empty.s_a, &empty.v_b, &empty.s_b, &empty.v_out, &empty.s_out}) {
    t->shape[0] = 0;
  }
  CHECK_NOTHROW(merge(empty));
}

TEST_CASE("merge_states refuses mismatched shapes, dtypes and layouts", "[decode]") {
  const auto refused = [](const MergeCall& c, ErrorCategory category,
                          std::initializer_list<const char*> words) {
    check_refusal(refusal([&] { merge(c); }), category, words);
  };
  const auto invalid = [&](const MergeCall& c, std::initializer_list<const char*> words) {
    refused(c, ErrorCategory::invalid_argument, words);
  };
  MergeCall c = merge_call();
  c.v_a = view(0x1000000, DType::f64, {5, 8, 64});
  refused(c, ErrorCategory::unsupported, {"v_a has dtype f64", "f16, bf16 or f32"});
  c = merge_call();
  c.v_b.dtype = DType::f16;
  invalid(c, {"v_b has dtype f16 but v_a has dtype bf16"});
  c = merge_call();
  c.v_out.dtype = DType::i32;
  refused(c, ErrorCategory::unsupported, {"v_out has dtype i32"});
  c = merge_call();
  c.s_a.dtype = DType::bf16;
  invalid(c, {"s_a has dtype bf16", "f32"});

  c = merge_call();
  c.v_a = reshaped(c.v_a, {5, 8 * 64});
  invalid(c, {"v_a has rank 2 but must have rank 3", "(tokens, heads, head_dim)"});
  c = merge_call();
  c.v_b = reshaped(c.v_b, {5, 4, 64});
  invalid(c, {"v_b.size(1) is 4", "heads is 8"});
  c = merge_call();
  c.v_out = reshaped(c.v_out, {6, 8, 64});
  invalid(c, {"v_out.size(0) is 6", "tokens is 5"});
  c = merge_call();
  c.s_b = reshaped(c.s_b, {5, 8, 1});
  invalid(c, {"s_b has rank 3 but must have rank 2", "(tokens, heads)"});
  c = merge_call();
  c.s_out = reshaped(c.s_out, {5, 7});
  invalid(c, {"s_out.size(-1) is 7", "heads is 8"});

  for (std::int64_t dim : {12, 264}) {
    c = merge_call();
    for (TensorView* t : {&c.v_a, &c.v_b, &c.v_out}) *t = reshaped(*t, {5, 8, dim});
    refused(c, ErrorCategory::unsupported, {"head_dim (v_a.size(-1))", "multiple of 8"});
  }

  c = merge_call();
  c.v_b.strides[2] = 2;
  invalid(c, {"v_b.stride(-1) is 2", "contiguous"});
  c = merge_call();
  c.s_a.strides[1] = 2;
  invalid(c, {"s_a.stride(-1) is 2"});
  c = merge_call();
  c.v_out.device = 1;
  invalid(c, {"v_out is on device 1"});
  c = merge_call();
  c.s_out.data = nullptr;
  invalid(c, {"s_out has a null data pointer"});
}

TEST_CASE("merge_states refuses outputs whose elements share addresses", "[decode]") {
  const auto invalid = [](const MergeCall& c, std::initializer_list<const char*> words) {
    check_refusal(refusal([&] { merge(c); }), ErrorCategory::invalid_argument, words);
  };
  MergeCall c = merge_call();
  c.v_out.strides[1] = 0;
  invalid(c, {"v_out.stride(1) is 0", "v_out.size(1) is 8"});
  c = merge_call();
  c.s_out.strides[0] = 4;
  invalid(c, {"s_out.stride(0) is 4", "8 elements"});
  c = merge_call();  // inputs may broadcast
  c.v_a.strides[0] = 0;
  c.s_a.strides[0] = 0;
  check_merge_accepted([&] { merge(c); });
}

TEST_CASE("merge_states of many refuses mismatched states", "[decode]") {
  const auto invalid = [](const MergeManyCall& c, std::initializer_list<const char*> words) {
    check_refusal(refusal([&] { merge_many(c); }), ErrorCategory::invalid_argument, words);
  };
  MergeManyCall c = merge_many_call();
  c.v = reshaped(c.v, {5, 8, 64});
  invalid(c, {"v has rank 3 but must have rank 4", "(tokens, states, heads, head_dim)"});
  c = merge_many_call();
  c.s = reshaped(c.s, {5, 2, 8});
  invalid(c, {"s.size(1) is 2", "states is 3"});
  c = merge_many_call();
  c.s = reshaped(c.s, {5, 8});
  invalid(c, {"s has rank 2 but must have rank 3", "(tokens, states, heads)"});
  c = merge_many_call();
  c.v = reshaped(c.v, {5, 0, 8, 64});
  c.s = reshaped(c.s, {5, 0, 8});
  invalid(c, {"v.size(1) (states) is 0"});
  c = merge_many_call();
  c.v_out = reshaped(c.v_out, {5, 3, 8, 64});
  invalid(c, {"v_out has rank 4 but must have rank 3"});
}

// --- the C API ----------------------------------------------------------------------------------

constexpr DLDataType kBf16{kDLBfloat, 16, 1};
constexpr DLDataType kF32{kDLFloat, 32, 1};
constexpr DLDataType kI32{kDLInt, 32, 1};

// A DLPack tensor over a fake address on the process-wide runtime's backend.
class FakeDLTensor {
 public:
  FakeDLTensor(std::uintptr_t address, DLDataType dtype, std::initializer_list<std::int64_t> shape)
      : shape_(shape) {
    tensor_.data = fake(address);
    tensor_.device = {default_runtime().backend() == kiln::Vendor::amd ? kDLROCM : kDLCUDA, 0};
    tensor_.ndim = static_cast<std::int32_t>(shape_.size());
    tensor_.dtype = dtype;
    tensor_.shape = shape_.data();
  }
  FakeDLTensor(const FakeDLTensor&) = delete;
  FakeDLTensor& operator=(const FakeDLTensor&) = delete;

  const DLTensor* get() const { return &tensor_; }
  DLTensor& tensor() { return tensor_; }

 private:
  std::vector<std::int64_t> shape_;
  DLTensor tensor_{};
};

// The C form of contiguous_call(), with seqlen_q as given.
struct CCall {
  explicit CCall(std::int64_t seqlen_q = 1)
      : q(0x1000000, kBf16, {2, seqlen_q, 8, 64}),
        k(0x2000000, kBf16, {3, 256, 2, 64}),
        v(0x3000000, kBf16, {3, 256, 2, 64}),
        seqlens(0x4000000, kI32, {2}),
        out(0x5000000, kBf16, {2, seqlen_q, 8, 64}),
        cache{.struct_size = sizeof(kiln_kvcache),
              .k = k.get(),
              .v = v.get(),
              .seqlens = seqlens.get()} {
    kiln_decode_options_init(&options);
  }
  kiln_status run(const DLTensor* lse = nullptr) const {
    return kiln_attention_with_kvcache(q.get(), &cache, out.get(), &options, lse, nullptr);
  }

  FakeDLTensor q, k, v, seqlens, out;
  kiln_kvcache cache;
  kiln_decode_options options{};
};

void check_status(kiln_status status, kiln_status expected,
                  std::initializer_list<const char*> words) {
  INFO("kiln_last_error(): " << kiln_last_error());
  CHECK(status == expected);
  for (const char* word : words) CHECK_THAT(kiln_last_error(), Catch::Contains(word));
}

TEST_CASE("kiln_decode_options_init leaves windows unbounded and every feature off", "[decode]") {
  kiln_decode_options o;
  o.num_splits = 7;
  o.k_new = reinterpret_cast<const DLTensor*>(&o);
  kiln_decode_options_init(&o);
  CHECK(o.score.window_left == -1);
  CHECK(o.score.window_right == -1);
  CHECK(o.score.softmax_scale == 0);
  CHECK(o.score.causal == 0);
  CHECK(o.score.top_left == 0);
  CHECK(o.score.softcap == 0);
  CHECK(o.num_splits == 0);
  CHECK(o.rotary_interleaved == 1);  // FlashAttention's default
  for (const DLTensor* t :
       {o.score.alibi_slopes, o.k_new, o.v_new, o.rotary_cos, o.rotary_sin, o.score.sinks}) {
    CHECK(t == nullptr);
  }
  kiln_decode_options_init(nullptr);  // no crash
}

TEST_CASE("kiln_attention_with_kvcache reports bad inputs with a status and a message",
          "[decode]") {
  CCall c;
  check_status(
      kiln_attention_with_kvcache(c.q.get(), nullptr, c.out.get(), nullptr, nullptr, nullptr),
      KILN_ERROR_INVALID_ARGUMENT, {"cache is NULL"});
  check_status(
      kiln_attention_with_kvcache(nullptr, &c.cache, c.out.get(), nullptr, nullptr, nullptr),
      KILN_ERROR_INVALID_ARGUMENT, {"q is NULL"});

  CCall host;
  host.k.tensor().device = {kDLCPU, 0};
  check_status(host.run(), KILN_ERROR_INVALID_ARGUMENT, {"cache.k", "DLPack device type"});

  CCall bad_dim;
  bad_dim.q.tensor().shape[3] = 12;
  bad_dim.k.tensor().shape[3] = 12;
  check_status(bad_dim.run(), KILN_ERROR_UNSUPPORTED, {"head_dim", "12"});

  CCall paged;
  const FakeDLTensor table(0x7000000, kF32, {2, 8});
  paged.cache.block_table = table.get();
  check_status(paged.run(), KILN_ERROR_INVALID_ARGUMENT, {"cache.block_table has dtype f32"});

  CCall append;
  const FakeDLTensor k_new(0x8000000, kBf16, {2, 1, 2, 64});
  append.options.k_new = k_new.get();
  check_status(append.run(), KILN_ERROR_INVALID_ARGUMENT, {"v_new is missing"});

  CCall splits;
  splits.options.num_splits = 200;
  check_status(splits.run(), KILN_ERROR_INVALID_ARGUMENT, {"num_splits is 200"});

  CCall with_lse;
  const FakeDLTensor lse(0xD000000, kF32, {2, 8, 2});
  check_status(with_lse.run(lse.get()), KILN_ERROR_INVALID_ARGUMENT, {"lse.size(-1) is 2"});

  // Nothing to compute succeeds, with no device, and clears the message; causal takes any
  // window_right, as FlashAttention.
  CCall empty(0);
  empty.options.score.causal = 1;
  empty.options.score.window_left = 3;
  empty.options.score.window_right = 3;
  check_status(empty.run(), KILN_OK, {});
  CHECK(std::string(kiln_last_error()).empty());
}

TEST_CASE("kiln_merge_states and kiln_merge_states_many report bad inputs", "[decode]") {
  const FakeDLTensor v_a(0x1000000, kBf16, {5, 8, 64}), s_a(0x2000000, kF32, {5, 8}),
      v_b(0x3000000, kF32, {5, 8, 64}), s_b(0x4000000, kF32, {5, 8}),
      v_out(0x5000000, kBf16, {5, 8, 64}), s_out(0x6000000, kF32, {5, 7});
  check_status(
      kiln_merge_states(v_a.get(), s_a.get(), v_b.get(), s_b.get(), v_out.get(), nullptr, nullptr),
      KILN_ERROR_INVALID_ARGUMENT, {"v_b has dtype f32 but v_a has dtype bf16"});
  check_status(kiln_merge_states(v_a.get(), s_a.get(), v_a.get(), s_b.get(), v_out.get(),
                                 s_out.get(), nullptr),
               KILN_ERROR_INVALID_ARGUMENT, {"s_out.size(-1) is 7"});
  check_status(
      kiln_merge_states(v_a.get(), nullptr, v_b.get(), s_b.get(), v_out.get(), nullptr, nullptr),
      KILN_ERROR_INVALID_ARGUMENT, {"s_a is NULL"});

  const FakeDLTensor v(0x1000000, kBf16, {5, 3, 8, 64}), s(0x2000000, kF32, {5, 3});
  check_status(kiln_merge_states_many(v.get(), s.get(), v_out.get(), nullptr, nullptr),
               KILN_ERROR_INVALID_ARGUMENT, {"s has rank 2 but must have rank 3"});

  const FakeDLTensor no_v(0x1000000, kBf16, {0, 3, 8, 64}), no_s(0x2000000, kF32, {0, 3, 8}),
      no_out(0x5000000, kBf16, {0, 8, 64});
  check_status(kiln_merge_states_many(no_v.get(), no_s.get(), no_out.get(), nullptr, nullptr),
               KILN_OK, {});
}

TEST_CASE("the C API reads out-of-range DLPack fields as values and refuses them", "[decode]") {
  // Each of these was undefined behaviour (UBSan stops on it): a device type outside
  // DLDeviceType loaded as the enum, a data pointer plus byte_offset that wraps, and compact
  // strides computed, and overflowing, for a tensor that brings its own.
  CCall device;
  const std::int32_t unknown_device = 1000;
  std::memcpy(&device.k.tensor().device.device_type, &unknown_device, sizeof unknown_device);
  check_status(device.run(), KILN_ERROR_INVALID_ARGUMENT, {"cache.k", "DLPack device type 1000"});

  CCall offset;
  offset.q.tensor().byte_offset = std::numeric_limits<std::uint64_t>::max() - 0xFF;
  check_status(offset.run(), KILN_ERROR_INVALID_ARGUMENT,
               {"q has data", "byte_offset 18446744073709551360", "address space"});

  constexpr std::int64_t big = std::int64_t{1} << 40;
  const FakeDLTensor huge(0x2000000, kBf16, {3, big, big, 64});
  CCall compact;
  compact.cache.k = huge.get();
  check_status(compact.run(), KILN_ERROR_INVALID_ARGUMENT,
               {"cache.k has shape (3, 1099511627776, 1099511627776, 64) and no strides",
                "compact row-major strides do not fit int64"});

  std::int64_t strides[4] = {0, 0, 0, 1};
  FakeDLTensor strided(0x2000000, kBf16, {3, big, big, 64});
  strided.tensor().strides = strides;
  CCall given;
  given.cache.k = strided.get();
  check_status(given.run(), KILN_ERROR_INVALID_ARGUMENT, {"cache.k.size(1) is 1099511627776"});
}

}  // namespace
}  // namespace kiln::test
