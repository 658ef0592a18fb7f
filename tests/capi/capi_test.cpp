// SPDX-License-Identifier: Apache-2.0
// The C API (kiln.h) as a C caller meets it: its version, structs that can grow, each call on
// its tensors' device's runtime, and messages naming C's own knobs. Fake device addresses: every
// call here is refused before anything could launch, GPU or not; the [gpu] case launches.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <random>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gpu.hpp"
#include "kiln/attention_backward.hpp"
#include "kiln/kiln.h"
#include "kiln/kiln.hpp"
#include "ops/attention_reference.hpp"
#include "support.hpp"
#include "variants.hpp"

namespace kiln::test {
namespace {

constexpr DLDataType kBf16{kDLBfloat, 16, 1};
constexpr DLDataType kI32{kDLInt, 32, 1};

// The DLPack device type of the process-wide runtimes' backend, and one it does not take.
std::int32_t native_type() {
  return default_runtime().backend() == kiln::Vendor::amd ? kDLROCM : kDLCUDA;
}
std::int32_t foreign_type() {
  return native_type() == kDLCUDA ? kDLROCM : kDLCUDA;
}

// A DLPack tensor over a fake address on `device` of the native type.
class Tensor {
 public:
  Tensor(std::uintptr_t address, DLDataType dtype, std::vector<std::int64_t> shape, int device = 0)
      : shape_(std::move(shape)) {
    t_.data = reinterpret_cast<void*>(address);
    set_device(native_type(), device);
    t_.ndim = static_cast<std::int32_t>(shape_.size());
    t_.dtype = dtype;
    t_.shape = shape_.data();
  }
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;

  // Copied in, not assigned, as any code must be (see device_type_of in lib/capi.cpp).
  void set_device(std::int32_t type, int id) {
    std::memcpy(&t_.device.device_type, &type, sizeof type);
    t_.device.device_id = id;
  }
  const DLTensor* get() const { return &t_; }
  DLTensor& t() { return t_; }

 private:
  std::vector<std::int64_t> shape_;
  DLTensor t_{};
};

// An attention call (1, 3, 2, 64) against 17 keys, whose output has no data: validation always
// refuses it, after the call has found its runtime.
struct Call {
  explicit Call(int device = 0)
      : q(0x1000000, kBf16, {1, 3, 2, 64}, device),
        k(0x2000000, kBf16, {1, 17, 2, 64}, device),
        v(0x3000000, kBf16, {1, 17, 2, 64}, device),
        out(0, kBf16, {1, 3, 2, 64}, device) {
    kiln_attention_options_init(&options);
  }
  kiln_status run(const kiln_attention_options* o) const {
    return kiln_attention(q.get(), k.get(), v.get(), out.get(), o, nullptr, nullptr);
  }
  kiln_status run() const { return run(&options); }

  Tensor q, k, v, out;
  kiln_attention_options options;
};

// The decode form of Call.
struct DecodeCall {
  DecodeCall()
      : q(0x1000000, kBf16, {2, 1, 8, 64}),
        k(0x2000000, kBf16, {3, 256, 2, 64}),
        v(0x3000000, kBf16, {3, 256, 2, 64}),
        seqlens(0x4000000, kI32, {2}),
        out(0, kBf16, {2, 1, 8, 64}) {
    kiln_kvcache_init(&cache);
    cache.k = k.get();
    cache.v = v.get();
    cache.seqlens = seqlens.get();
    kiln_decode_options_init(&options);
  }
  kiln_status run(const kiln_kvcache* c, const kiln_decode_options* o) const {
    return kiln_attention_with_kvcache(q.get(), c, out.get(), o, nullptr, nullptr);
  }
  kiln_status run() const { return run(&cache, &options); }

  Tensor q, k, v, seqlens, out;
  kiln_kvcache cache;
  kiln_decode_options options;
};

// The backward of Call: dout like out, dq, dk and dv like q, k and v, and the forward's lse;
// dq has no data, so validation always refuses it, after the call has found its runtime.
struct BackwardCall {
  BackwardCall()
      : dout(0x5000000, kBf16, {1, 3, 2, 64}),
        dq(0, kBf16, {1, 3, 2, 64}),
        dk(0x6000000, kBf16, {1, 17, 2, 64}),
        dv(0x7000000, kBf16, {1, 17, 2, 64}),
        lse(0x8000000, {kDLFloat, 32, 1}, {1, 2, 3}) {
    forward.out.t().data = reinterpret_cast<void*>(0x4000000);
    kiln_attention_grad_options_init(&grads);
  }
  kiln_status run(const kiln_attention_grad_options* g) const {
    return kiln_attention_backward(forward.q.get(), forward.k.get(), forward.v.get(),
                                   forward.out.get(), dout.get(), dq.get(), dk.get(), dv.get(),
                                   &forward.options, lse.get(), g, nullptr);
  }
  kiln_status run() const { return run(&grads); }

  Call forward;
  Tensor dout, dq, dk, dv, lse;
  kiln_attention_grad_options grads;
};

std::string last_error() {
  return kiln_last_error();
}

// `status` is `expected` and the message holds every one of `words`.
void check_status(kiln_status status, kiln_status expected,
                  std::initializer_list<const char*> words) {
  INFO("kiln_last_error(): " << last_error());
  CHECK(status == expected);
  for (const char* word : words) CHECK_THAT(last_error(), Catch::Contains(word));
}

// The first `size` bytes of `full` in a heap block of exactly that size, as a caller built
// against an older kiln.h holds its smaller struct: a read past it is a sanitizer finding.
template <class C>
class OlderStruct {
 public:
  OlderStruct(const C& full, std::size_t size) : bytes_(size) {
    std::memcpy(bytes_.data(), &full, size);
    std::memcpy(bytes_.data(), &size, sizeof size);  // struct_size, the first field
  }
  const C* get() const { return reinterpret_cast<const C*>(bytes_.data()); }

 private:
  std::vector<std::byte> bytes_;
};

// An options struct as a caller built against an older kiln.h holds it: struct_size, its score
// of `score_size` bytes (the first of kiln's), then the first `own_size` bytes of its own fields,
// which start where its score ends; in a heap block of exactly that size.
template <class C>
class OlderOptions {
 public:
  static constexpr std::size_t kScoreAt = offsetof(C, score);
  static constexpr std::size_t kOwnAt = kScoreAt + sizeof(kiln_score_options);

  OlderOptions(const C& full, std::size_t score_size, std::size_t own_size)
      : score_size_(score_size), bytes_(kScoreAt + score_size + own_size) {
    const auto* from = reinterpret_cast<const std::byte*>(&full);
    std::memcpy(bytes_.data() + kScoreAt, from + kScoreAt, score_size);
    std::memcpy(bytes_.data() + kScoreAt + score_size, from + kOwnAt, own_size);
    set(0, bytes_.size());      // struct_size
    set(kScoreAt, score_size);  // score.struct_size
  }
  // A block of `size` bytes for *_init_sized to fill, every byte 0xab.
  OlderOptions(std::size_t score_size, std::size_t size)
      : score_size_(score_size), bytes_(size, std::byte{0xab}) {}

  C* get() { return reinterpret_cast<C*>(bytes_.data()); }
  std::size_t size() const { return bytes_.size(); }

  // The value of the field at `offset` in kiln's C, read where this caller keeps it.
  template <class T>
  T at(std::size_t offset) const {
    T value;
    const std::size_t here = offset < kOwnAt ? offset : offset - kOwnAt + kScoreAt + score_size_;
    std::memcpy(&value, bytes_.data() + here, sizeof value);
    return value;
  }

 private:
  void set(std::size_t offset, std::size_t value) {
    std::memcpy(bytes_.data() + offset, &value, sizeof value);
  }

  std::size_t score_size_;
  std::vector<std::byte> bytes_;
};

// --- version ----------------------------------------------------------------------------------

TEST_CASE("kiln_build_id names a commit or says it is unknown", "[capi]") {
  // A build in a git checkout (CI's, a developer's) names its commit; a tarball's says unknown.
  const std::string id = kiln_build_id();
  INFO(id);
  CHECK(std::regex_match(id, std::regex("[0-9a-f]{12,}(-dirty)?|unknown")));
}

TEST_CASE("kiln_version is the header's version", "[capi]") {
  CHECK(kiln_version() == KILN_VERSION_NUMBER);
  CHECK(KILN_VERSION_NUMBER ==
        KILN_VERSION_MAJOR * 10000 + KILN_VERSION_MINOR * 100 + KILN_VERSION_PATCH);
}

// --- sized structs ----------------------------------------------------------------------------

TEST_CASE("the C structs' init macros set struct_size and the defaults", "[capi]") {
  kiln_attention_options a;
  std::memset(&a, 0xab, sizeof a);
  kiln_attention_options_init(&a);
  CHECK(a.struct_size == sizeof(kiln_attention_options));
  CHECK(a.score.struct_size == sizeof(kiln_score_options));
  CHECK(a.score.window_left == -1);
  CHECK(a.score.window_right == -1);
  CHECK(a.score.variant_name == nullptr);
  CHECK(a.bias == nullptr);

  kiln_decode_options d;
  std::memset(&d, 0xab, sizeof d);
  kiln_decode_options_init(&d);
  CHECK(d.struct_size == sizeof(kiln_decode_options));
  CHECK(d.score.struct_size == sizeof(kiln_score_options));
  CHECK(d.score.window_left == -1);
  CHECK(d.rotary_interleaved == 1);  // FlashAttention's flash_attn_with_kvcache default

  kiln_kvcache c;
  std::memset(&c, 0xab, sizeof c);
  kiln_kvcache_init(&c);
  CHECK(c.struct_size == sizeof(kiln_kvcache));
  for (const DLTensor* t : {c.k, c.v, c.seqlens, c.batch_idx, c.block_table, c.k_descale,
                            c.v_descale, c.k_token_descale, c.v_token_descale}) {
    CHECK(t == nullptr);
  }
  kiln_kvcache_init(nullptr);  // no crash

  kiln_attention_grad_options g;
  std::memset(&g, 0xab, sizeof g);
  kiln_attention_grad_options_init(&g);
  CHECK(g.struct_size == sizeof(kiln_attention_grad_options));
  CHECK(g.deterministic == 0);  // FlashAttention's default
  CHECK(g.dsinks == nullptr);
  CHECK(g.dbias == nullptr);
  kiln_attention_grad_options_init(nullptr);  // no crash
}

TEST_CASE("kiln_attention_grad_options_init_sized writes no byte past an older caller's struct",
          "[capi]") {
  // A kiln.h whose struct ended at dsinks: its sizeof, padded, stops before dbias.
  const std::size_t size = offsetof(kiln_attention_grad_options, dbias);
  std::vector<std::byte> older(size + 8, std::byte{0xab});
  kiln_attention_grad_options_init_sized(
      reinterpret_cast<kiln_attention_grad_options*>(older.data()), size);
  kiln_attention_grad_options read{};
  std::memcpy(&read, older.data(), size);
  CHECK(read.struct_size == size);
  CHECK(read.deterministic == 0);
  CHECK(read.dsinks == nullptr);
  for (std::size_t i = size; i < older.size(); ++i) CHECK(older[i] == std::byte{0xab});
}

TEST_CASE("an older kiln.h's smaller options get the defaults at its own offsets, no further",
          "[capi]") {
  using Older = OlderOptions<kiln_decode_options>;
  // Its score ends at alibi_slopes, so its own fields start 96 bytes before kiln's; it has them
  // all, and its sizeof is padded as a compiler pads it.
  const std::size_t score_size = offsetof(kiln_score_options, sinks);
  const std::size_t size =
      Older::kScoreAt + score_size + (sizeof(kiln_decode_options) - Older::kOwnAt);
  Older older(score_size, size + 8);  // 8 bytes past it that must stay 0xab
  kiln_decode_options_init_sized(older.get(), size, score_size);
  CHECK(older.at<std::size_t>(0) == size);
  CHECK(older.at<std::size_t>(Older::kScoreAt) == score_size);
  CHECK(older.at<int>(offsetof(kiln_decode_options, score.window_left)) == -1);
  CHECK(older.at<int>(offsetof(kiln_decode_options, score.window_right)) == -1);
  CHECK(older.at<const DLTensor*>(offsetof(kiln_decode_options, k_new)) == nullptr);
  CHECK(older.at<int>(offsetof(kiln_decode_options, rotary_interleaved)) == 1);
  CHECK(older.at<int>(offsetof(kiln_decode_options, num_splits)) == 0);
  std::array<std::byte, 8> past{};
  std::memcpy(past.data(), reinterpret_cast<const std::byte*>(older.get()) + size, past.size());
  CHECK(past == std::array<std::byte, 8>{std::byte{0xab}, std::byte{0xab}, std::byte{0xab},
                                         std::byte{0xab}, std::byte{0xab}, std::byte{0xab},
                                         std::byte{0xab}, std::byte{0xab}});

  // Sizes that cannot hold what they claim write nothing past them, and the call refuses them.
  Older tiny(sizeof(kiln_score_options), 4);
  kiln_decode_options_init_sized(tiny.get(), 4, sizeof(kiln_score_options));
  CHECK(
      tiny.at<std::array<std::byte, 4>>(0) ==
      std::array<std::byte, 4>{std::byte{0xab}, std::byte{0xab}, std::byte{0xab}, std::byte{0xab}});
  kiln_attention_options_init_sized(nullptr, 8, 8);  // no crash
}

TEST_CASE("a struct_size kiln does not know is refused, naming it and the fix", "[capi]") {
  for (const std::size_t size : {std::size_t{0}, std::size_t{3}, std::size_t{13},
                                 sizeof(kiln_attention_options) + 8, std::size_t{0xdeadbeef}}) {
    INFO("struct_size " << size);
    Call a;
    a.options.struct_size = size;
    check_status(a.run(), KILN_ERROR_INVALID_ARGUMENT,
                 {("options->struct_size is " + std::to_string(size)).c_str(),
                  "call kiln_attention_options_init(options)"});
    DecodeCall d;
    d.options.struct_size = size;
    check_status(
        d.run(), KILN_ERROR_INVALID_ARGUMENT,
        {("options->struct_size is " + std::to_string(size)).c_str(), "kiln_decode_options_init"});
    DecodeCall c;
    c.cache.struct_size = size;
    check_status(c.run(), KILN_ERROR_INVALID_ARGUMENT,
                 {("cache->struct_size is " + std::to_string(size)).c_str(), "kiln_kvcache_init"});
    BackwardCall b;
    b.grads.struct_size = size;
    check_status(
        b.run(), KILN_ERROR_INVALID_ARGUMENT,
        {("grads->struct_size is " + std::to_string(size)).c_str(),
         "no size of kiln_attention_grad_options", "call kiln_attention_grad_options_init(grads)"});
    b.grads.struct_size = sizeof(kiln_attention_grad_options);
    b.forward.options.struct_size = size;
    check_status(b.run(), KILN_ERROR_INVALID_ARGUMENT,
                 {("options->struct_size is " + std::to_string(size)).c_str(),
                  "call kiln_attention_options_init(options)"});
  }
}

TEST_CASE("a score struct_size kiln does not know is refused, naming it and the fix", "[capi]") {
  // 0: the score overwritten by a zeroed one after *_init; 100: the end of a field, but not a
  // size the struct's padding gives it.
  for (const std::size_t size :
       {std::size_t{0}, std::size_t{13}, offsetof(kiln_score_options, variant_tensors) - 4,
        sizeof(kiln_score_options) + 8, std::size_t{0xdeadbeef}}) {
    INFO("score.struct_size " << size);
    Call a;
    a.options.score.struct_size = size;
    check_status(a.run(), KILN_ERROR_INVALID_ARGUMENT,
                 {("options->score.struct_size is " + std::to_string(size)).c_str(),
                  "no size of kiln_score_options", "call kiln_attention_options_init(options)"});
    DecodeCall d;
    d.options.score.struct_size = size;
    check_status(d.run(), KILN_ERROR_INVALID_ARGUMENT,
                 {("options->score.struct_size is " + std::to_string(size)).c_str(),
                  "call kiln_decode_options_init(options)"});
  }
  // A struct_size too small for the score it says it holds.
  Call a;
  a.options.struct_size = offsetof(kiln_attention_options, bias);
  check_status(a.run(), KILN_ERROR_INVALID_ARGUMENT,
               {("options->struct_size is " + std::to_string(a.options.struct_size)).c_str()});
}

TEST_CASE("an older kiln.h's smaller struct is read to its struct_size, the rest from defaults",
          "[capi]") {
  Tensor host(0x5000000, kBf16, {1, 2, 3, 17});
  host.set_device(kDLCPU, 0);  // refused wherever it is read
  constexpr std::size_t kScore = sizeof(kiln_score_options);
  using OlderAttention = OlderOptions<kiln_attention_options>;
  using OlderDecode = OlderOptions<kiln_decode_options>;

  // Own fields cut short.
  Call a;
  a.options.seqused_k = host.get();
  check_status(a.run(), KILN_ERROR_INVALID_ARGUMENT, {"seqused_k is on DLPack device type 1"});
  OlderAttention older_a(a.options, kScore,
                         offsetof(kiln_attention_options, seqused_k) - OlderAttention::kOwnAt);
  check_status(a.run(older_a.get()), KILN_ERROR_INVALID_ARGUMENT, {"out has a null data"});

  DecodeCall d;
  d.options.rotary_sin = host.get();
  check_status(d.run(), KILN_ERROR_INVALID_ARGUMENT, {"rotary_sin is on DLPack device type 1"});
  OlderDecode older_d(d.options, kScore,
                      offsetof(kiln_decode_options, rotary_sin) - OlderDecode::kOwnAt);
  check_status(d.run(&d.cache, older_d.get()), KILN_ERROR_INVALID_ARGUMENT,
               {"out has a null data"});

  // A score cut short: its fields past it are the defaults, and the own fields are read where
  // the caller keeps them, right after its score, not where kiln's are.
  const std::size_t short_score = offsetof(kiln_score_options, sinks);
  Call s;
  s.options.score.sinks = host.get();
  check_status(s.run(), KILN_ERROR_INVALID_ARGUMENT, {"sinks is on DLPack device type 1"});
  const std::size_t own = sizeof(kiln_attention_options) - OlderAttention::kOwnAt;
  OlderAttention older_s(s.options, short_score, own);
  check_status(s.run(older_s.get()), KILN_ERROR_INVALID_ARGUMENT, {"out has a null data"});
  s.options.bias = host.get();
  OlderAttention older_bias(s.options, short_score, own);
  check_status(s.run(older_bias.get()), KILN_ERROR_INVALID_ARGUMENT,
               {"bias is on DLPack device type 1"});

  // A score that ended with num_variant_tensors, whose sizeof is padded past that field.
  DecodeCall v;
  v.options.score.num_variant_tensors = 9;
  check_status(v.run(), KILN_ERROR_INVALID_ARGUMENT, {"num_variant_tensors is 9"});
  const std::size_t padded = offsetof(kiln_score_options, variant_tensors);
  OlderDecode older_v(v.options, padded, sizeof(kiln_decode_options) - OlderDecode::kOwnAt);
  check_status(v.run(&v.cache, older_v.get()), KILN_ERROR_INVALID_ARGUMENT,
               {"num_variant_tensors is 9"});
  v.options.score.num_variant_tensors = 0;
  v.options.rotary_sin = host.get();
  OlderDecode older_rotary(v.options, padded, sizeof(kiln_decode_options) - OlderDecode::kOwnAt);
  check_status(v.run(&v.cache, older_rotary.get()), KILN_ERROR_INVALID_ARGUMENT,
               {"rotary_sin is on DLPack device type 1"});

  // The grads of a kiln.h that ended at deterministic: dsinks and dbias, past it, are unread.
  BackwardCall b;
  b.grads.dsinks = host.get();
  check_status(b.run(), KILN_ERROR_INVALID_ARGUMENT, {"dsinks is on DLPack device type 1"});
  const OlderStruct older_b(b.grads, offsetof(kiln_attention_grad_options, dsinks));
  b.run(older_b.get());
  CHECK_THAT(last_error(), !Catch::Contains("dsinks"));

  DecodeCall c;
  c.cache.block_table = host.get();
  check_status(c.run(), KILN_ERROR_INVALID_ARGUMENT,
               {"cache.block_table is on DLPack device type 1"});
  const OlderStruct older_c(c.cache, offsetof(kiln_kvcache, block_table));
  check_status(c.run(older_c.get(), &c.options), KILN_ERROR_INVALID_ARGUMENT,
               {"out has a null data"});
}

// --- devices ----------------------------------------------------------------------------------

TEST_CASE("a C call on device 1's tensors runs on device 1's runtime", "[capi]") {
  Call one(1);
  check_status(one.run(), KILN_ERROR_INVALID_ARGUMENT, {"out has a null data pointer"});
  CHECK_THAT(last_error(), !Catch::Contains("runtime's device"));

  // Tensors of a type the runtime does not take get a message that names the runtime's device.
  for (const int device : {0, 1}) {
    Call call(device);
    for (Tensor* t : {&call.q, &call.k, &call.v, &call.out}) t->set_device(foreign_type(), device);
    check_status(call.run(), KILN_ERROR_INVALID_ARGUMENT,
                 {("device " + std::to_string(device) + "'s runtime").c_str(), "KILN_BACKEND"});
  }
  CHECK(default_runtime(1).device() == 1);
  CHECK(default_runtime(0).device() == 0);
  CHECK(&default_runtime() == &default_runtime(0));
}

TEST_CASE("a C call with tensors on two devices is refused, naming them", "[capi]") {
  Call mixed;
  mixed.v.set_device(native_type(), 1);
  check_status(mixed.run(), KILN_ERROR_INVALID_ARGUMENT,
               {"v is on DLPack device (", ", 1) but q is on (", ", 0)",
                "all tensors of a call must be on one device"});
}

TEST_CASE("a device ordinal without a process-wide runtime is refused", "[capi]") {
  for (const int device : {-1, kMaxDefaultRuntimes, std::numeric_limits<int>::max()}) {
    Call call(device);
    check_status(
        call.run(), KILN_ERROR_INVALID_ARGUMENT,
        {("device " + std::to_string(device) + " has no process-wide runtime").c_str(), "0 to 63"});
  }
  CHECK_THROWS_AS(default_runtime(-1), Error);
}

TEST_CASE("threads driving different devices each get their device's runtime", "[capi]") {
  constexpr int kThreads = 8, kDevices = 4, kCalls = 50;
  std::mutex mutex;
  std::vector<std::set<const Runtime*>> seen(kDevices);
  std::vector<std::string> failures;
  std::vector<std::jthread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, device = i % kDevices] {
      Call call(device);
      for (Tensor* t : {&call.q, &call.k, &call.v, &call.out}) {
        t->set_device(foreign_type(), device);
      }
      const std::string wanted = "device " + std::to_string(device) + "'s runtime";
      for (int n = 0; n < kCalls; ++n) {
        const kiln_status status = call.run();
        const std::string message = kiln_last_error();
        const Runtime* runtime = &default_runtime(device);
        std::lock_guard lock(mutex);
        seen[static_cast<std::size_t>(device)].insert(runtime);
        if (status != KILN_ERROR_INVALID_ARGUMENT || !contains(message, wanted)) {
          failures.push_back(message);
        }
      }
    });
  }
  threads.clear();
  CHECK(failures.empty());
  for (int device = 0; device < kDevices; ++device) {
    REQUIRE(seen[static_cast<std::size_t>(device)].size() == 1);
    CHECK((*seen[static_cast<std::size_t>(device)].begin())->device() == device);
  }
}

// --- messages ---------------------------------------------------------------------------------

TEST_CASE("a C call without a GPU says that it needs one, naming itself, not a target", "[capi]") {
  // Device 63, which no machine has, with valid tensors: only the device is missing. Its
  // runtime has no target unless KILN_TARGET gives one; either way the device comes first.
  constexpr int kDevice = 63;
  Call call(kDevice);
  call.out.t().data = reinterpret_cast<void*>(0x4000000);
  Tensor seqlens(0x5000000, kI32, {1}, kDevice);
  kiln_kvcache cache;
  kiln_kvcache_init(&cache);
  cache.k = call.k.get();
  cache.v = call.v.get();
  cache.seqlens = seqlens.get();
  constexpr DLDataType kF32{kDLFloat, 32, 1};
  const Tensor states(0x6000000, kBf16, {3, 2, 2, 64}, kDevice),
      states_lse(0x7000000, kF32, {3, 2, 2}, kDevice), v(0x8000000, kBf16, {3, 2, 64}, kDevice),
      lse(0x9000000, kF32, {3, 2}, kDevice);
  const Tensor dout(0xa000000, kBf16, {1, 3, 2, 64}, kDevice),
      dq(0xb000000, kBf16, {1, 3, 2, 64}, kDevice), dk(0xc000000, kBf16, {1, 17, 2, 64}, kDevice),
      dv(0xd000000, kBf16, {1, 17, 2, 64}, kDevice), call_lse(0xe000000, kF32, {1, 2, 3}, kDevice);
  const std::pair<const char*, std::function<kiln_status()>> calls[] = {
      {"kiln_attention", [&] { return call.run(); }},
      {"kiln_attention_with_kvcache",
       [&] {
         return kiln_attention_with_kvcache(call.q.get(), &cache, call.out.get(), nullptr, nullptr,
                                            nullptr);
       }},
      {"kiln_attention_backward",
       [&] {
         return kiln_attention_backward(call.q.get(), call.k.get(), call.v.get(), call.out.get(),
                                        dout.get(), dq.get(), dk.get(), dv.get(), &call.options,
                                        call_lse.get(), nullptr, nullptr);
       }},
      {"kiln_merge_states",
       [&] {
         return kiln_merge_states(v.get(), lse.get(), v.get(), lse.get(), v.get(), nullptr,
                                  nullptr);
       }},
      {"kiln_merge_states_many", [&] {
         return kiln_merge_states_many(states.get(), states_lse.get(), v.get(), nullptr, nullptr);
       }}};
  for (const auto& [name, run] : calls) {
    check_status(run(), KILN_ERROR_NOT_FOUND,
                 {(std::string(name) + " needs a GPU").c_str(), "device 63"});
    CHECK(last_error().starts_with(name));
    // Compile-only advice belongs to kiln_warmup; it would not make this call run.
    CHECK_FALSE(contains(last_error(), "target"));
    CHECK_FALSE(contains(last_error(), "compile"));
  }
}

TEST_CASE("the C API's messages on malformed tensors say what is wrong and the fix", "[capi]") {
  Call null_q;
  check_status(kiln_attention(nullptr, null_q.k.get(), null_q.v.get(), null_q.out.get(), nullptr,
                              nullptr, nullptr),
               KILN_ERROR_INVALID_ARGUMENT, {"q is NULL", "pass a DLTensor"});

  Call no_shape;
  no_shape.q.t().shape = nullptr;
  check_status(no_shape.run(), KILN_ERROR_INVALID_ARGUMENT,
               {"q has ndim 4 but its shape pointer is NULL", "point shape at its 4 sizes"});

  Call lanes;
  lanes.k.t().dtype.lanes = 2;
  check_status(lanes.run(), KILN_ERROR_UNSUPPORTED, {"k has DLPack lanes 2", "lanes 1"});

  Call misaligned;
  misaligned.q.t().data = reinterpret_cast<void*>(0x1000001);
  check_status(misaligned.run(), KILN_ERROR_INVALID_ARGUMENT,
               {"q's data pointer", "not aligned", "a whole number of elements"});

  Call mixed;
  mixed.out.t().data = reinterpret_cast<void*>(0x4000000);
  mixed.k.t().dtype = {kDLFloat, 16, 1};
  check_status(mixed.run(), KILN_ERROR_INVALID_ARGUMENT,
               {"k has dtype f16 but q has dtype bf16", "so k needs bf16"});
  DecodeCall mixed_cache;
  mixed_cache.out.t().data = reinterpret_cast<void*>(0x5000000);
  mixed_cache.v.t().dtype = {kDLFloat, 16, 1};
  check_status(mixed_cache.run(), KILN_ERROR_INVALID_ARGUMENT,
               {"cache.v has dtype f16 but q has dtype bf16", "so cache.v needs bf16"});
}

TEST_CASE("kiln_attention_backward names a NULL tensor, and takes NULL options and grads",
          "[capi]") {
  BackwardCall b;
  const DLTensor* q = b.forward.q.get();
  const DLTensor* k = b.forward.k.get();
  const DLTensor* v = b.forward.v.get();
  const DLTensor* out = b.forward.out.get();
  const DLTensor *dout = b.dout.get(), *dq = b.dq.get(), *dk = b.dk.get(), *dv = b.dv.get();
  const std::array<const DLTensor*, 8> all = {q, k, v, out, dout, dq, dk, dv};
  const std::array<const char*, 8> names = {"q", "k", "v", "out", "dout", "dq", "dk", "dv"};
  for (std::size_t i = 0; i < all.size(); ++i) {
    std::array<const DLTensor*, 8> t = all;
    t[i] = nullptr;
    check_status(kiln_attention_backward(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7],
                                         &b.forward.options, b.lse.get(), &b.grads, nullptr),
                 KILN_ERROR_INVALID_ARGUMENT,
                 {(std::string(names[i]) + " is NULL: it is required").c_str()});
  }
  check_status(kiln_attention_backward(q, k, v, out, dout, dq, dk, dv, &b.forward.options, nullptr,
                                       &b.grads, nullptr),
               KILN_ERROR_INVALID_ARGUMENT,
               {"lse is NULL", "the backward needs the forward's LSE", "kiln_attention wrote"});

  // The tensors of one call share a device, the gradients' too.
  b.dk.set_device(native_type(), 1);
  check_status(b.run(), KILN_ERROR_INVALID_ARGUMENT,
               {"dk is on DLPack device (", ", 1) but q is on (", "one device"});
  b.dk.set_device(native_type(), 0);

  // The options' and grads' tensors are converted as the call's, named by their fields.
  Tensor host(0x9000000, {kDLFloat, 32, 1}, {2});
  host.set_device(kDLCPU, 0);
  b.grads.dbias = host.get();
  check_status(b.run(), KILN_ERROR_INVALID_ARGUMENT, {"dbias is on DLPack device type 1"});
  b.grads.dbias = nullptr;
  b.forward.options.score.sinks = host.get();
  check_status(b.run(), KILN_ERROR_INVALID_ARGUMENT, {"sinks is on DLPack device type 1"});
  b.forward.options.score.sinks = nullptr;

  // NULL options and grads are the defaults: the call gets past them to kiln's own checks.
  for (const bool null_options : {false, true}) {
    const kiln_status status = kiln_attention_backward(
        q, k, v, out, dout, dq, dk, dv, null_options ? nullptr : &b.forward.options, b.lse.get(),
        null_options ? &b.grads : nullptr, nullptr);
    INFO(last_error());
    CHECK(status != KILN_OK);
    CHECK_FALSE(contains(last_error(), "struct_size"));
    CHECK_FALSE(contains(last_error(), "NULL"));
  }
}

TEST_CASE("the score's fields of both C options structs reach the call", "[capi]") {
  const Tensor slopes(0x6000000, {kDLFloat, 32, 1}, {5});
  // `init` resets the call's options to the defaults before each bad field.
  const auto check_fields = [&](auto& call, auto init) {
    // With an output, validation reaches the score.
    call.out.t().data = reinterpret_cast<void*>(0x5000000);
    init(&call.options);
    call.options.score.softmax_scale = std::numeric_limits<float>::infinity();
    check_status(call.run(), KILN_ERROR_INVALID_ARGUMENT, {"softmax_scale is inf"});
    init(&call.options);
    call.options.score.softcap = -2;
    check_status(call.run(), KILN_ERROR_INVALID_ARGUMENT, {"softcap is -2"});
    init(&call.options);
    call.options.score.window_left = -3;
    check_status(call.run(), KILN_ERROR_INVALID_ARGUMENT, {"window (-3, -1)"});
    init(&call.options);
    call.options.score.causal = 1;
    call.options.score.window_right = -4;
    check_status(call.run(), KILN_ERROR_INVALID_ARGUMENT, {"window (-1, -4)"});
    init(&call.options);
    call.options.score.top_left = 1;
    call.options.score.alibi_slopes = slopes.get();
    check_status(call.run(), KILN_ERROR_INVALID_ARGUMENT, {"alibi_slopes.size(-1) is 5"});
    init(&call.options);
    call.options.score.sinks = slopes.get();
    check_status(call.run(), KILN_ERROR_INVALID_ARGUMENT, {"sinks.size(-1) is 5"});
    init(&call.options);
    call.options.score.variant_code = "struct kiln_variant {};";
    check_status(call.run(), KILN_ERROR_INVALID_ARGUMENT,
                 {"variant_name is NULL but variant_code is set", "set both, or neither"});
    init(&call.options);
    call.options.score.variant_name = "mine";
    call.options.score.variant_code = "struct kiln_variant {};";
    call.options.score.num_variant_tensors = 5;
    check_status(call.run(), KILN_ERROR_INVALID_ARGUMENT, {"num_variant_tensors is 5", "0 to 4"});
    call.options.score.num_variant_tensors = 2;
    call.options.score.variant_tensors[0] = slopes.get();
    check_status(call.run(), KILN_ERROR_INVALID_ARGUMENT, {"variant_tensors[1] is NULL"});
    init(&call.options);
    call.options.score.num_variant_tensors = 1;
    call.options.score.variant_tensors[0] = slopes.get();
    check_status(call.run(), KILN_ERROR_INVALID_ARGUMENT,
                 {"variant_tensors holds 1 tensors but there is no variant"});
    call.options.score.variant_name = "mine";
    call.options.score.variant_code = "";
    check_status(call.run(), KILN_ERROR_INVALID_ARGUMENT, {"variant 'mine' has no code"});
  };
  Call attention;
  check_fields(attention, [](kiln_attention_options* o) { kiln_attention_options_init(o); });
  DecodeCall decode;
  check_fields(decode, [](kiln_decode_options* o) { kiln_decode_options_init(o); });
}

TEST_CASE("an fp8 cache's descales reach the call through kiln_kvcache", "[capi]") {
  DecodeCall call;
  call.out.t().data = reinterpret_cast<void*>(0x5000000);
  const Tensor head(0x6000000, {kDLFloat, 32, 1}, {2, 3});
  const Tensor token(0x7000000, {kDLFloat, 32, 1}, {3, 256, 2});
  call.cache.k_descale = head.get();
  check_status(call.run(), KILN_ERROR_INVALID_ARGUMENT,
               {"cache.k_descale is for an fp8 cache, but the cache has dtype bf16"});
  call.cache.k_descale = nullptr;
  call.cache.v_token_descale = token.get();
  check_status(call.run(), KILN_ERROR_INVALID_ARGUMENT,
               {"cache.k_token_descale and cache.v_token_descale come together"});
  call.cache.k_token_descale = token.get();
  check_status(call.run(), KILN_ERROR_INVALID_ARGUMENT,
               {"cache.k_token_descale is for an fp8 cache, but the cache has dtype bf16"});
}

// --- GPU --------------------------------------------------------------------------------------

TEST_CASE("kiln_attention on cuda:0 matches the reference, and a missing ordinal is an error",
          "[gpu][capi]") {
  KILN_REQUIRE_GPU();
  ReferenceProblem p;
  p.dtype = DType::bf16;
  p.heads = p.heads_kv = 2;
  p.head_dim = p.head_dim_v = 64;
  p.softmax_scale = 1 / std::sqrt(64.0);
  p.set_padded(1, 3, 17);
  std::mt19937 rng(14);
  const auto q = random_normal(DType::bf16, 3 * 2 * 64, rng);
  const auto k = random_normal(DType::bf16, 17 * 2 * 64, rng);
  const auto v = random_normal(DType::bf16, 17 * 2 * 64, rng);
  const auto bits = [](const std::vector<double>& values) {
    std::vector<std::uint16_t> image;
    for (const double x : values) image.push_back(to_bits(DType::bf16, x));
    return image;
  };
  const auto dq = upload(bits(q)), dk = upload(bits(k)), dv = upload(bits(v));
  DeviceBuffer dout(3 * 2 * 64 * sizeof(std::uint16_t));
  dout.poison();

  Call call(0);
  call.q.t().data = dq->get();
  call.k.t().data = dk->get();
  call.v.t().data = dv->get();
  call.out.t().data = dout.get();
  check_status(call.run(), KILN_OK, {});
  sync_and_check();
  std::vector<double> got;
  for (const std::uint16_t b : dout.download<std::uint16_t>()) {
    got.push_back(from_bits(DType::bf16, b));
  }
  const ErrorReport report = compare_output(got, attention_reference(p, q, k, v));
  INFO(explain(report, got, attention_reference(p, q, k, v), 2, 64));
  CHECK(report.ok());

  // A user variant through the options: the key padding mask of examples/variants.hpp, keys 3,
  // 4 and 11 padding, against the reference with those keys masked.
  const std::vector<std::int64_t> keep = {1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1};
  const auto dkeep = upload(keep);
  Tensor keep_tensor(reinterpret_cast<std::uintptr_t>(dkeep->get()), {kDLInt, 64, 1}, {1, 17});
  call.options.score.variant_name = kiln::examples::key_padding_variant().name.c_str();
  call.options.score.variant_code = kiln::examples::key_padding_variant().code.c_str();
  call.options.score.num_variant_tensors = 1;
  call.options.score.variant_tensors[0] = keep_tensor.get();
  dout.poison();
  check_status(call.run(), KILN_OK, {});
  sync_and_check();
  got.clear();
  for (const std::uint16_t b : dout.download<std::uint16_t>()) {
    got.push_back(from_bits(DType::bf16, b));
  }
  p.bias = [&](int, int, int, int j) {
    return keep[static_cast<std::size_t>(j)] != 0 ? 0.0 : -std::numeric_limits<double>::infinity();
  };
  const ReferenceResult padded = attention_reference(p, q, k, v);
  const ErrorReport padded_report = compare_output(got, padded);
  INFO(explain(padded_report, got, padded, 2, 64));
  CHECK(padded_report.ok());
  kiln_attention_options_init(&call.options);

  // The same memory labelled with an ordinal past the last device: refused, not launched.
  int count = 0;
  KILN_CUDA_CHECK(cudaGetDeviceCount(&count));
  for (Tensor* t : {&call.q, &call.k, &call.v, &call.out}) t->set_device(kDLCUDA, count);
  check_status(call.run(), KILN_ERROR_NOT_FOUND,
               {("there is no cuda device " + std::to_string(count)).c_str()});
}

TEST_CASE("kiln_attention_backward writes what kiln::attention_backward writes", "[gpu][capi]") {
  KILN_REQUIRE_GPU();
  std::mt19937 rng(31);
  const auto random_bf16 = [&rng](std::size_t count) {
    std::vector<std::uint16_t> image;
    for (const double x : random_normal(DType::bf16, count, rng)) {
      image.push_back(to_bits(DType::bf16, x));
    }
    return upload(image);
  };
  constexpr std::size_t kQ = 3 * 2 * 64, kKV = 17 * 2 * 64;
  const auto q = random_bf16(kQ), k = random_bf16(kKV), v = random_bf16(kKV),
             dout = random_bf16(kQ);
  const auto sinks = upload(std::vector<float>{0.5f, -1.25f});
  DeviceBuffer out(kQ * 2), lse(2 * 3 * 4);

  // The forward through C, causal with sinks, then its backward through C and through C++.
  BackwardCall b;
  b.forward.q.t().data = q->get();
  b.forward.k.t().data = k->get();
  b.forward.v.t().data = v->get();
  b.forward.out.t().data = out.get();
  b.dout.t().data = dout->get();
  b.lse.t().data = lse.get();
  Tensor sinks_tensor(reinterpret_cast<std::uintptr_t>(sinks->get()), {kDLFloat, 32, 1}, {2});
  b.forward.options.score.causal = 1;
  b.forward.options.score.sinks = sinks_tensor.get();
  check_status(kiln_attention(b.forward.q.get(), b.forward.k.get(), b.forward.v.get(),
                              b.forward.out.get(), &b.forward.options, b.lse.get(), nullptr),
               KILN_OK, {});

  struct Gradients {
    DeviceBuffer dq{kQ * 2}, dk{kKV * 2}, dv{kKV * 2}, dsinks{2 * 4};
    Gradients() {
      for (DeviceBuffer* g : {&dq, &dk, &dv, &dsinks}) g->poison();
    }
  } c, cpp;
  b.dq.t().data = c.dq.get();
  b.dk.t().data = c.dk.get();
  b.dv.t().data = c.dv.get();
  Tensor dsinks_tensor(reinterpret_cast<std::uintptr_t>(c.dsinks.get()), {kDLFloat, 32, 1}, {2});
  b.grads.deterministic = 1;
  b.grads.dsinks = dsinks_tensor.get();
  check_status(b.run(), KILN_OK, {});

  const auto view = [](const DeviceBuffer& buffer, DType dtype,
                       std::initializer_list<std::int64_t> shape) {
    return TensorView::contiguous(buffer.get(), dtype, shape);
  };
  AttentionOptions o;
  o.score.causal = true;
  o.score.sinks = view(*sinks, DType::f32, {2});
  o.lse = view(lse, DType::f32, {1, 2, 3});
  attention_backward(
      view(*q, DType::bf16, {1, 3, 2, 64}), view(*k, DType::bf16, {1, 17, 2, 64}),
      view(*v, DType::bf16, {1, 17, 2, 64}), view(out, DType::bf16, {1, 3, 2, 64}),
      view(*dout, DType::bf16, {1, 3, 2, 64}), view(cpp.dq, DType::bf16, {1, 3, 2, 64}),
      view(cpp.dk, DType::bf16, {1, 17, 2, 64}), view(cpp.dv, DType::bf16, {1, 17, 2, 64}), o,
      {.deterministic = true, .dsinks = view(cpp.dsinks, DType::f32, {2})});
  sync_and_check();

  // Deterministic: the same bits both ways, every element written (the poison is NaN).
  for (const auto& [from_c, from_cpp] :
       {std::pair{&c.dq, &cpp.dq}, std::pair{&c.dk, &cpp.dk}, std::pair{&c.dv, &cpp.dv}}) {
    const auto got = from_c->download<std::uint16_t>();
    CHECK(got == from_cpp->download<std::uint16_t>());
    CHECK(std::none_of(got.begin(), got.end(),
                       [](std::uint16_t x) { return std::isnan(from_bits(DType::bf16, x)); }));
  }
  const auto dsinks = c.dsinks.download<float>();
  CHECK(dsinks == cpp.dsinks.download<float>());
  CHECK(std::none_of(dsinks.begin(), dsinks.end(), [](float x) { return std::isnan(x); }));
}

TEST_CASE("kiln_warmup warms the runtime of the device it is given", "[capi]") {
  // No GPU here, so each call stops where it needs the device's target: the message names the
  // device whose runtime it reached.
  if (default_runtime(0).info().target.empty()) {
    for (const int device : {0, 3}) {
      check_status(kiln_warmup(device, nullptr, 1), KILN_ERROR_NOT_FOUND,
                   {("device " + std::to_string(device)).c_str(), "kiln_warmup's target argument"});
    }
    check_status(kiln_warmup_default(nullptr, 1), KILN_ERROR_NOT_FOUND, {"device 0"});
  }
  check_status(
      kiln_warmup(kMaxDefaultRuntimes, "sm_90a", 1), KILN_ERROR_INVALID_ARGUMENT,
      {("device " + std::to_string(kMaxDefaultRuntimes) + " has no process-wide runtime").c_str()});
  check_status(kiln_warmup(-1, "sm_90a", 1), KILN_ERROR_INVALID_ARGUMENT,
               {"device -1 has no process-wide runtime"});
}

TEST_CASE("kiln_warmup for a target the compiler cannot build for is unsupported", "[capi]") {
  const kiln_status status = kiln_warmup(0, "sm_200", 1);
  const std::string message = kiln_last_error();
  if (status == KILN_ERROR_NOT_FOUND && contains(message, "NVRTC")) {
    WARN("skipped: " << message);
    return;
  }
  check_status(status, KILN_ERROR_UNSUPPORTED,
               {"target 'sm_200' is not one", "can build for: use one of", "sm_90a"});
}

}  // namespace
}  // namespace kiln::test
