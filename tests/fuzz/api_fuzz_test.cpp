// SPDX-License-Identifier: Apache-2.0
// A bounded fuzz of the C and C++ APIs of attention, decode and merge_states: random ranks,
// shapes, strides, dtypes, devices, null pointers, byte offsets, struct sizes and options, in
// calls near a valid one and far from it. Every call must end in a kiln::Error (or a status with a
// message), or return because it has nothing to do. The sanitizer build (ASan and UBSan, which
// abort on a finding) is the real check: no input may crash or trip undefined behaviour on the way.
//
// Nothing can launch, GPU or not: the C++ calls run on validating_runtime() (no compiling, an
// empty cache), and the C calls, which use the process-wide runtime, get a null output whenever
// the output has elements, which validation always refuses.
//
// The seed is Catch's --rng-seed, or kSeed when it is 0 (the default); a failure prints it.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "kiln/attention.hpp"
#include "kiln/decode.hpp"
#include "kiln/error.hpp"
#include "kiln/kiln.h"
#include "ops/validation_support.hpp"

namespace kiln::test {
namespace {

constexpr unsigned kSeed = 13;
constexpr int kCalls = 6000;  // per test case, unless the time budget ends it first
constexpr std::chrono::seconds kBudget{3};

constexpr std::int64_t kI64Max = std::numeric_limits<std::int64_t>::max();
constexpr std::int64_t kI64Min = std::numeric_limits<std::int64_t>::min();
constexpr int kIntMax = std::numeric_limits<int>::max();
constexpr int kIntMin = std::numeric_limits<int>::min();

unsigned seed() {
  return Catch::rngSeed() != 0 ? Catch::rngSeed() : kSeed;
}

// Random choices, biased towards the values at which size arithmetic breaks.
class Random {
 public:
  explicit Random(unsigned seed) : engine_(seed) {}

  bool chance(double p) { return std::bernoulli_distribution(p)(engine_); }
  int below(int n) { return std::uniform_int_distribution<int>(0, n - 1)(engine_); }
  std::uint64_t bits() { return engine_(); }

  template <class T>
  T one_of(std::initializer_list<T> values) {
    return values.begin()[below(static_cast<int>(values.size()))];
  }

  // A size: mostly small, sometimes at an edge of int32 or int64, negative, or any 64 bits.
  std::int64_t size() {
    switch (below(4)) {
      case 0:
      case 1: return one_of<std::int64_t>({0, 1, 2, 3, 7, 8, 16, 17, 64, 128, 256});
      case 2:
        return one_of<std::int64_t>({-1, 65535, 65536, kIntMax, std::int64_t{1} << 31,
                                     std::int64_t{1} << 32, std::int64_t{1} << 40,
                                     std::int64_t{1} << 59, std::int64_t{1} << 62, kI64Max,
                                     kI64Min});
      default: return static_cast<std::int64_t>(bits() >> below(64));
    }
  }

  std::int64_t stride() {
    switch (below(3)) {
      case 0: return one_of<std::int64_t>({0, 1, 8, 64, 512, 4096});
      case 1:
        return one_of<std::int64_t>({-1, -8, 3, std::int64_t{1} << 31, std::int64_t{1} << 60,
                                     std::int64_t{1} << 62, kI64Max, kI64Min});
      default: return static_cast<std::int64_t>(bits() >> below(64));
    }
  }

  void* pointer() {
    return fake(
        one_of<std::uintptr_t>({0, 0x1000000, 0x1000001, 0x1000002, 0x1000008, 0x7ffffffffff0,
                                0xfffffffffffffff0, static_cast<std::uintptr_t>(bits())}));
  }

  DType dtype() {
    return chance(0.8) ? one_of({DType::f16, DType::bf16, DType::f32, DType::i32, DType::i64})
                       : static_cast<DType>(below(256));
  }

  int small_int() { return one_of({-2, -1, 0, 1, 3, 128, 129, kIntMax, kIntMin}); }

  float scalar() {
    return one_of({0.f, -1.f, 0.125f, 30.f, std::numeric_limits<float>::quiet_NaN(),
                   std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                   std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min()});
  }

 private:
  std::mt19937_64 engine_;
};

// Fake device addresses, 16-byte aligned and far apart, for the tensors of one call.
std::uintptr_t address(int tensor) {
  return 0x1000000 + static_cast<std::uintptr_t>(tensor) * 0x10000000;
}

// One random change to `t`: any field, to any value.
void mutate(TensorView& t, Random& r) {
  switch (r.below(7)) {
    case 0: t.data = r.pointer(); break;
    case 1: t.dtype = r.dtype(); break;
    case 2: t.rank = r.one_of({-1, 0, 1, 2, 3, 4, 5, kIntMax, kIntMin}); break;
    case 3: t.shape[static_cast<std::size_t>(r.below(TensorView::max_rank))] = r.size(); break;
    case 4: t.strides[static_cast<std::size_t>(r.below(TensorView::max_rank))] = r.stride(); break;
    case 5: t.device = r.one_of({-1, 1, kIntMax}); break;
    default: t.strides.fill(0); break;
  }
}

// The sizes of a call near a valid one: some of them 0, none far off.
struct Dims {
  std::int64_t batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, head_dim_v;
};

Dims random_dims(Random& r) {
  Dims d{};
  d.batch = r.one_of<std::int64_t>({0, 1, 2, 3});
  d.seqlen_q = r.one_of<std::int64_t>({0, 1, 4, 17});
  d.seqlen_k = r.one_of<std::int64_t>({0, 1, 33, 256});
  d.heads_kv = r.one_of<std::int64_t>({1, 2});
  d.heads = d.heads_kv * r.one_of<std::int64_t>({1, 4});
  d.head_dim = r.one_of<std::int64_t>({8, 64, 128, 256});
  d.head_dim_v = r.chance(0.8) ? d.head_dim : r.one_of<std::int64_t>({64, 128});
  return d;
}

// A contiguous tensor of `shape` at the fake address of tensor number `n`.
TensorView tensor(int n, DType dtype, std::initializer_list<std::int64_t> shape) {
  return view(address(n), dtype, shape);
}

// Up to three changes to the tensors in `all`; none in about one call of five.
void mutate_some(const std::vector<TensorView*>& all, Random& r) {
  const int count = r.one_of({0, 1, 1, 2, 3});
  for (int i = 0; i < count; ++i) {
    mutate(*all[static_cast<std::size_t>(r.below(static_cast<int>(all.size())))], r);
  }
}

// --- the calls --------------------------------------------------------------------------------

// The score's scalar options of either family, any of them set at random.
void random_score_scalars(ScoreOptions& s, Random& r) {
  if (r.chance(0.3)) s.softmax_scale = r.scalar();
  if (r.chance(0.3)) s.softcap = r.scalar();
  s.causal = r.chance(0.3);
  if (r.chance(0.3)) s.window_left = r.small_int();
  if (r.chance(0.3)) s.window_right = r.small_int();
  s.top_left = r.chance(0.2);
}

struct AttentionCall {
  TensorView q, k, v, out;
  AttentionOptions options;
  std::optional<AttentionConfig> config;
  const char* target = "sm_90a";
};

AttentionCall random_attention(Random& r) {
  const Dims d = random_dims(r);
  const DType dtype = r.chance(0.9) ? r.one_of({DType::bf16, DType::f16}) : r.dtype();
  AttentionCall c;
  AttentionOptions& o = c.options;
  if (r.chance(0.3)) {  // varlen
    c.q = tensor(0, dtype, {d.batch * d.seqlen_q, d.heads, d.head_dim});
    c.k = tensor(1, dtype, {d.batch * d.seqlen_k, d.heads_kv, d.head_dim});
    c.v = tensor(2, dtype, {d.batch * d.seqlen_k, d.heads_kv, d.head_dim_v});
    c.out = tensor(3, dtype, {d.batch * d.seqlen_q, d.heads, d.head_dim_v});
    o.cu_seqlens_q = tensor(4, DType::i32, {d.batch + 1});
    o.cu_seqlens_k = tensor(5, DType::i32, {d.batch + 1});
    o.max_seqlen_q = static_cast<int>(d.seqlen_q);
    o.max_seqlen_k = static_cast<int>(d.seqlen_k);
    if (r.chance(0.3)) o.lse = tensor(7, DType::f32, {d.heads, d.batch * d.seqlen_q});
  } else {
    c.q = tensor(0, dtype, {d.batch, d.seqlen_q, d.heads, d.head_dim});
    c.k = tensor(1, dtype, {d.batch, d.seqlen_k, d.heads_kv, d.head_dim});
    c.v = tensor(2, dtype, {d.batch, d.seqlen_k, d.heads_kv, d.head_dim_v});
    c.out = tensor(3, dtype, {d.batch, d.seqlen_q, d.heads, d.head_dim_v});
    if (r.chance(0.2)) o.bias = tensor(6, dtype, {d.batch, d.heads, d.seqlen_q, d.seqlen_k});
    if (r.chance(0.3)) o.lse = tensor(7, DType::f32, {d.batch, d.heads, d.seqlen_q});
  }
  if (r.chance(0.2)) o.score.alibi_slopes = tensor(8, DType::f32, {d.heads});
  if (r.chance(0.2)) o.seqused_k = tensor(9, DType::i32, {d.batch});
  if (r.chance(0.2)) o.score.sinks = tensor(10, DType::f32, {d.heads});
  random_score_scalars(o.score, r);
  if (r.chance(0.1)) o.max_seqlen_q = r.small_int();
  if (r.chance(0.1)) o.max_seqlen_k = r.small_int();
  std::vector<TensorView*> all{&c.q, &c.k, &c.v, &c.out};
  for (auto* t : {&o.bias, &o.lse, &o.score.alibi_slopes, &o.score.sinks, &o.seqused_k,
                  &o.cu_seqlens_q, &o.cu_seqlens_k}) {
    if (*t) all.push_back(&**t);
  }
  mutate_some(all, r);
  if (r.chance(0.2)) {
    c.config = AttentionConfig{
        .block_m = r.chance(0.5) ? 64 : r.small_int(),
        .block_n = r.chance(0.5) ? 64 : r.small_int(),
        .warps = r.chance(0.5) ? 4 : r.small_int(),
        .stages = r.chance(0.5) ? 2 : r.small_int(),
        .kernel = static_cast<AttentionKernel>(r.one_of({0, 1, 2, 3, -1, kIntMax}))};
  }
  c.target = r.one_of<const char*>({"sm_90a", "sm_80", "gfx90a"});
  return c;
}

struct DecodeCall {
  TensorView q, out;
  KVCache cache;
  DecodeOptions options;
  const char* target = "sm_90a";
};

DecodeCall random_decode(Random& r) {
  const Dims d = random_dims(r);
  const DType dtype = r.chance(0.9) ? r.one_of({DType::bf16, DType::f16}) : r.dtype();
  DecodeCall c;
  c.q = tensor(0, dtype, {d.batch, d.seqlen_q, d.heads, d.head_dim});
  c.out = tensor(3, dtype, {d.batch, d.seqlen_q, d.heads, d.head_dim_v});
  KVCache& cache = c.cache;
  cache.seqlens = tensor(4, DType::i32, {d.batch});
  if (r.chance(0.5)) {
    const std::int64_t page_size = r.one_of<std::int64_t>({1, 16, 17});
    const std::int64_t pages = (d.seqlen_k + page_size - 1) / page_size;
    cache.k = tensor(1, dtype, {d.batch * pages + 1, page_size, d.heads_kv, d.head_dim});
    cache.v = tensor(2, dtype, {d.batch * pages + 1, page_size, d.heads_kv, d.head_dim_v});
    cache.block_table = tensor(5, DType::i32, {d.batch, pages});
  } else {
    cache.k = tensor(1, dtype, {d.batch + 1, d.seqlen_k, d.heads_kv, d.head_dim});
    cache.v = tensor(2, dtype, {d.batch + 1, d.seqlen_k, d.heads_kv, d.head_dim_v});
    if (r.chance(0.5)) cache.batch_idx = tensor(6, DType::i32, {d.batch});
  }
  DecodeOptions& o = c.options;
  if (r.chance(0.4)) {
    const std::int64_t seqlen_new = r.one_of<std::int64_t>({0, 1, 2});
    o.k_new = tensor(7, dtype, {d.batch, seqlen_new, d.heads_kv, d.head_dim});
    o.v_new = tensor(8, dtype, {d.batch, seqlen_new, d.heads_kv, d.head_dim_v});
    if (r.chance(0.5)) {
      const std::int64_t half = r.one_of<std::int64_t>({1, 16, d.head_dim / 2});
      o.rotary_cos = tensor(9, dtype, {d.seqlen_k + d.seqlen_q, half});
      o.rotary_sin = tensor(10, dtype, {d.seqlen_k + d.seqlen_q, half});
      o.rotary_interleaved = r.chance(0.5);
    }
  }
  if (r.chance(0.3)) o.lse = tensor(11, DType::f32, {d.batch, d.heads, d.seqlen_q});
  if (r.chance(0.2)) o.score.alibi_slopes = tensor(12, DType::f32, {d.batch, d.heads});
  if (r.chance(0.2)) o.score.sinks = tensor(13, DType::f32, {d.heads});
  random_score_scalars(o.score, r);
  if (r.chance(0.4)) o.num_splits = r.small_int();
  std::vector<TensorView*> all{&c.q, &c.out, &cache.k, &cache.v, &cache.seqlens};
  for (auto* t : {&cache.batch_idx, &cache.block_table, &o.k_new, &o.v_new, &o.rotary_cos,
                  &o.rotary_sin, &o.lse, &o.score.alibi_slopes, &o.score.sinks}) {
    if (*t) all.push_back(&**t);
  }
  mutate_some(all, r);
  c.target = r.one_of<const char*>({"sm_90a", "sm_80", "gfx90a"});
  return c;
}

// merge_states of two states (v_a, s_a, v_b, s_b), or of many (v, s in v_a, s_a).
struct MergeCall {
  bool many = false;
  TensorView v_a, s_a, v_b, s_b, v_out;
  std::optional<TensorView> s_out;
};

MergeCall random_merge(Random& r) {
  const std::int64_t tokens = r.one_of<std::int64_t>({0, 1, 5});
  const std::int64_t heads = r.one_of<std::int64_t>({0, 1, 8});
  const std::int64_t dim = r.one_of<std::int64_t>({8, 64, 256});
  const DType dtype = r.chance(0.9) ? r.one_of({DType::bf16, DType::f16, DType::f32}) : r.dtype();
  MergeCall c;
  c.many = r.chance(0.5);
  if (c.many) {
    const std::int64_t states = r.one_of<std::int64_t>({0, 1, 3});
    c.v_a = tensor(0, dtype, {tokens, states, heads, dim});
    c.s_a = tensor(1, DType::f32, {tokens, states, heads});
  } else {
    c.v_a = tensor(0, dtype, {tokens, heads, dim});
    c.s_a = tensor(1, DType::f32, {tokens, heads});
    c.v_b = tensor(2, dtype, {tokens, heads, dim});
    c.s_b = tensor(3, DType::f32, {tokens, heads});
  }
  c.v_out = tensor(4, r.chance(0.8) ? dtype : r.dtype(), {tokens, heads, dim});
  if (r.chance(0.5)) c.s_out = tensor(5, DType::f32, {tokens, heads});
  std::vector<TensorView*> all{&c.v_a, &c.s_a, &c.v_out};
  if (!c.many) all.insert(all.end(), {&c.v_b, &c.s_b});
  if (c.s_out) all.push_back(&*c.s_out);
  mutate_some(all, r);
  return c;
}

// --- the C++ API ------------------------------------------------------------------------------

// How the calls ended.
struct Outcomes {
  int refused = 0;   // validation's kiln::Error, or its status
  int backend = 0;   // passed validation, stopped at the kernel lookup or the device
  int returned = 0;  // nothing to do
};

// Runs `call`, which may return or throw kiln::Error with a message; anything else escapes to
// Catch and fails the test. `accepted` is what is_supported() said, if it applies: an accepted
// call may fail only where it needs a kernel or a device.
void run_cpp(const std::function<void()>& call, std::optional<bool> accepted, Outcomes& outcomes) {
  try {
    call();
    ++outcomes.returned;
  } catch (const Error& e) {
    const std::string message = e.what();
    if (message.empty()) FAIL_CHECK("a kiln::Error without a message");
    const bool backend =
        e.category() == ErrorCategory::not_found || e.category() == ErrorCategory::driver;
    if (accepted == true && !backend) {
      FAIL_CHECK("is_supported() accepted a call that failed with: " << message);
    }
    ++(backend ? outcomes.backend : outcomes.refused);
  }
}

void run_cpp(const AttentionCall& c, Outcomes& outcomes) {
  Runtime& runtime = validating_runtime(c.target);
  if (c.config) {
    run_cpp([&] { kiln::attention(c.q, c.k, c.v, c.out, c.options, *c.config, nullptr, runtime); },
            std::nullopt, outcomes);
    return;
  }
  const bool accepted = kiln::is_supported(c.q, c.k, c.v, c.out, c.options, nullptr, runtime);
  run_cpp([&] { kiln::attention(c.q, c.k, c.v, c.out, c.options, nullptr, runtime); }, accepted,
          outcomes);
}

void run_cpp(const DecodeCall& c, Outcomes& outcomes) {
  Runtime& runtime = validating_runtime(c.target);
  const bool accepted = kiln::is_supported(c.q, c.cache, c.out, c.options, nullptr, runtime);
  run_cpp([&] { kiln::attention_with_kvcache(c.q, c.cache, c.out, c.options, nullptr, runtime); },
          accepted, outcomes);
}

void run_cpp(const MergeCall& c, Outcomes& outcomes) {
  Runtime& runtime = validating_runtime();
  const TensorView* s_out = c.s_out ? &*c.s_out : nullptr;
  run_cpp(
      [&] {
        if (c.many) {
          kiln::merge_states(c.v_a, c.s_a, c.v_out, s_out, nullptr, runtime);
        } else {
          kiln::merge_states(c.v_a, c.s_a, c.v_b, c.s_b, c.v_out, s_out, nullptr, runtime);
        }
      },
      std::nullopt, outcomes);
}

// --- the C API --------------------------------------------------------------------------------

// A DLPack tensor with the arrays it points to.
struct CTensor {
  DLTensor t{};
  std::array<std::int64_t, 8> shape{};
  std::array<std::int64_t, 8> strides{};
};

DLDataType dlpack_dtype(DType dtype, Random& r) {
  switch (dtype) {
    case DType::f16: return {kDLFloat, 16, 1};
    case DType::bf16: return {kDLBfloat, 16, 1};
    case DType::f32: return {kDLFloat, 32, 1};
    case DType::f64: return {kDLFloat, 64, 1};
    case DType::i32: return {kDLInt, 32, 1};
    case DType::i64: return {kDLInt, 64, 1};
    case DType::e4m3: return {10, 8, 1};  // DLPack 1.1's kDLFloat8_e4m3fn
    case DType::e5m2: return {12, 8, 1};  // kDLFloat8_e5m2
  }
  return {static_cast<std::uint8_t>(r.bits()), static_cast<std::uint8_t>(r.bits()),
          static_cast<std::uint16_t>(r.bits())};
}

// Builds DLPack tensors from views, on the process-wide runtime's device type, some with one
// change only DLPack can carry; they live as long as the converter.
class ToDLPack {
 public:
  explicit ToDLPack(Random& r)
      : r_(r), device_type_(default_runtime().backend() == kiln::Vendor::amd ? kDLROCM : kDLCUDA) {}

  const DLTensor* operator()(const TensorView& view) { return &make(view).t; }
  const DLTensor* operator()(const std::optional<TensorView>& view) {
    return view ? (*this)(*view) : nullptr;
  }

  // An output: null data when it has elements, so that validation refuses it whatever else the
  // call holds, and nothing can reach a kernel (see the top of the file).
  const DLTensor* output(const TensorView& view) {
    CTensor& c = make(view);
    const bool readable = c.t.ndim >= 1 && c.t.ndim <= TensorView::max_rank && c.t.shape;
    bool empty = false;
    for (int d = 0; readable && d < c.t.ndim; ++d) empty |= c.t.shape[d] == 0;
    if (!empty) c.t.data = nullptr;
    return &c.t;
  }
  const DLTensor* output(const std::optional<TensorView>& view) {
    return view ? output(*view) : nullptr;
  }

  // A C struct's struct_size: `size` mostly, else any other (a smaller one reads only a prefix).
  std::size_t struct_size(std::size_t size) {
    if (!r_.chance(0.05)) return size;
    return r_.one_of<std::size_t>({0, 1, 8, 12, 16, 24, size - 4, size + 8, r_.bits()});
  }

 private:
  CTensor& make(const TensorView& view) {
    CTensor& c = *tensors_.emplace_back(std::make_unique<CTensor>());
    c.t.data = view.data;
    std::int32_t device_type = device_type_;
    c.t.device.device_id = view.device;
    c.t.ndim = view.rank;
    c.t.dtype = dlpack_dtype(view.dtype, r_);
    std::copy(view.shape.begin(), view.shape.end(), c.shape.begin());
    std::copy(view.strides.begin(), view.strides.end(), c.strides.begin());
    c.t.shape = c.shape.data();
    c.t.strides = r_.chance(0.2) ? nullptr : c.strides.data();
    if (r_.chance(0.3)) {
      switch (r_.below(6)) {
        case 0:
          c.t.byte_offset = r_.one_of<std::uint64_t>(
              {16, 1, std::uint64_t{1} << 63, std::numeric_limits<std::uint64_t>::max(),
               std::numeric_limits<std::uint64_t>::max() - 15, r_.bits()});
          break;
        case 1: device_type = r_.one_of({0, 1, -1, 16, 32, 1000, kIntMax, kIntMin}); break;
        case 2: c.t.shape = nullptr; break;
        case 3: c.t.ndim = r_.one_of({-1, 0, 5, 8, kIntMax, kIntMin}); break;
        case 4: c.t.dtype.lanes = r_.one_of<std::uint16_t>({0, 2, 65535}); break;
        default: c.t.device.device_id = r_.one_of({-1, 1, kIntMax}); break;
      }
    }
    // NOTE: copied, not assigned: a code outside DLDeviceType is what callers may pass, but a
    // cast to the enum would be undefined behaviour here in the test.
    std::memcpy(&c.t.device.device_type, &device_type, sizeof device_type);
    return c;
  }

  Random& r_;
  std::int32_t device_type_;
  std::vector<std::unique_ptr<CTensor>> tensors_;
};

void check_status(kiln_status status, Outcomes& outcomes) {
  const std::string message = kiln_last_error();
  if (status < KILN_OK || status > KILN_ERROR_INTERNAL) FAIL_CHECK("status " << status);
  if (status == KILN_OK) {
    if (!message.empty()) FAIL_CHECK("KILN_OK with the message: " << message);
    ++outcomes.returned;
    return;
  }
  if (message.empty()) FAIL_CHECK("status " << status << " without a message");
  if (status == KILN_ERROR_INTERNAL) FAIL_CHECK("an internal error: " << message);
  ++outcomes.refused;
}

// The score of kiln_attention_options and kiln_decode_options, C++ to C (0: the default scale).
void copy_score_options(const ScoreOptions& o, kiln_score_options& c, ToDLPack& dl) {
  c.softmax_scale = o.softmax_scale.value_or(0.f);
  c.causal = o.causal;
  c.window_left = o.window_left;
  c.window_right = o.window_right;
  c.top_left = o.top_left;
  c.softcap = o.softcap;
  c.alibi_slopes = dl(o.alibi_slopes);
  c.sinks = dl(o.sinks);
}

void run_c(const AttentionCall& c, Random& r, Outcomes& outcomes) {
  ToDLPack dl(r);
  const AttentionOptions& o = c.options;
  kiln_attention_options options;
  kiln_attention_options_init(&options);
  copy_score_options(o.score, options.score, dl);
  options.bias = dl(o.bias);
  options.cu_seqlens_q = dl(o.cu_seqlens_q);
  options.cu_seqlens_k = dl(o.cu_seqlens_k);
  options.seqused_k = dl(o.seqused_k);
  options.max_seqlen_q = o.max_seqlen_q;
  options.max_seqlen_k = o.max_seqlen_k;
  options.struct_size = dl.struct_size(options.struct_size);
  options.score.struct_size = dl.struct_size(options.score.struct_size);
  const DLTensor *q = dl(c.q), *k = dl(c.k), *v = dl(c.v), *out = dl.output(c.out),
                 *lse = dl.output(o.lse);
  check_status(kiln_attention(r.chance(0.05) ? nullptr : q, k, v, out,
                              r.chance(0.1) ? nullptr : &options, lse, nullptr),
               outcomes);
}

void run_c(const DecodeCall& c, Random& r, Outcomes& outcomes) {
  ToDLPack dl(r);
  const DecodeOptions& o = c.options;
  kiln_decode_options options;
  kiln_decode_options_init(&options);
  copy_score_options(o.score, options.score, dl);
  options.k_new = dl(o.k_new);
  options.v_new = dl(o.v_new);
  options.rotary_cos = dl(o.rotary_cos);
  options.rotary_sin = dl(o.rotary_sin);
  options.rotary_interleaved = o.rotary_interleaved;
  options.num_splits = o.num_splits;
  options.struct_size = dl.struct_size(options.struct_size);
  options.score.struct_size = dl.struct_size(options.score.struct_size);
  const kiln_kvcache cache{.struct_size = dl.struct_size(sizeof(kiln_kvcache)),
                           .k = dl(c.cache.k),
                           .v = dl(c.cache.v),
                           .seqlens = dl(c.cache.seqlens),
                           .batch_idx = dl(c.cache.batch_idx),
                           .block_table = dl(c.cache.block_table)};
  const DLTensor *q = dl(c.q), *out = dl.output(c.out), *lse = dl.output(o.lse);
  check_status(kiln_attention_with_kvcache(q, r.chance(0.05) ? nullptr : &cache, out,
                                           r.chance(0.1) ? nullptr : &options, lse, nullptr),
               outcomes);
}

void run_c(const MergeCall& c, Random& r, Outcomes& outcomes) {
  ToDLPack dl(r);
  const DLTensor *v_a = dl(c.v_a), *s_a = dl(c.s_a), *v_out = dl.output(c.v_out),
                 *s_out = dl.output(c.s_out);
  if (c.many) {
    check_status(kiln_merge_states_many(v_a, s_a, v_out, s_out, nullptr), outcomes);
  } else {
    check_status(kiln_merge_states(v_a, s_a, dl(c.v_b), dl(c.s_b), v_out, s_out, nullptr),
                 outcomes);
  }
}

// --- the runs -------------------------------------------------------------------------------

// Runs `one` with fresh randomness until kCalls calls or kBudget, whichever comes first.
void fuzz(const char* what, const std::function<void(Random&, Outcomes&)>& one) {
  const unsigned s = seed();
  INFO(what << ": seed " << s << " (rerun with --rng-seed " << s << ")");
  Random r(s);
  Outcomes outcomes;
  const auto start = std::chrono::steady_clock::now();
  int calls = 0;
  while (calls < kCalls && std::chrono::steady_clock::now() - start < kBudget) {
    one(r, outcomes);
    ++calls;
  }
  WARN(what << ": " << calls << " calls from seed " << s << ": " << outcomes.refused << " refused, "
            << outcomes.backend << " stopped at the backend, " << outcomes.returned
            << " with nothing to do");
  CHECK(calls > 0);
}

TEST_CASE("fuzz: the C++ API refuses hostile inputs cleanly", "[fuzz]") {
  fuzz("C++ API", [](Random& r, Outcomes& outcomes) {
    switch (r.below(3)) {
      case 0: run_cpp(random_attention(r), outcomes); break;
      case 1: run_cpp(random_decode(r), outcomes); break;
      default: run_cpp(random_merge(r), outcomes); break;
    }
  });
}

TEST_CASE("fuzz: the C API refuses hostile inputs cleanly", "[fuzz]") {
  fuzz("C API", [](Random& r, Outcomes& outcomes) {
    switch (r.below(3)) {
      case 0: run_c(random_attention(r), r, outcomes); break;
      case 1: run_c(random_decode(r), r, outcomes); break;
      default: run_c(random_merge(r), r, outcomes); break;
    }
  });
}

}  // namespace
}  // namespace kiln::test
