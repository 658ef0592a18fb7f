// SPDX-License-Identifier: Apache-2.0
// The C API (include/kiln/kiln.h): DLPack tensors in, status codes and a thread-local message out.
#include "kiln/kiln.h"

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/checked_math.hpp"
#include "core/config.hpp"
#include "core/tensor_strides.hpp"
#include "kiln/attention_backward.hpp"
#include "kiln/kiln.hpp"

namespace kiln {
namespace {

// DLPack 1.1's codes of the fp8 types (kDLFloat8_e4m3fn, kDLFloat8_e5m2), which Debian's DLPack
// 0.6 header predates; PyTorch exports torch.float8_e4m3fn and torch.float8_e5m2 with them.
constexpr std::uint8_t kDLPackFloat8E4m3fn = 10;
constexpr std::uint8_t kDLPackFloat8E5m2 = 12;

thread_local std::string t_last_error;

kiln_status status_of(ErrorCategory category) {
  switch (category) {
    case ErrorCategory::invalid_argument: return KILN_ERROR_INVALID_ARGUMENT;
    case ErrorCategory::unsupported: return KILN_ERROR_UNSUPPORTED;
    case ErrorCategory::compile: return KILN_ERROR_COMPILE;
    case ErrorCategory::driver: return KILN_ERROR_DRIVER;
    case ErrorCategory::cache: return KILN_ERROR_CACHE;
    case ErrorCategory::not_found: return KILN_ERROR_NOT_FOUND;
  }
  return KILN_ERROR_INTERNAL;
}

// Runs `body` as the C interface, turning any exception into a status and this thread's
// message.
template <class Body>
kiln_status guarded(Body&& body) noexcept {
  const detail::InterfaceScope c_interface(detail::Interface::c);
  try {
    body();
    t_last_error.clear();
    return KILN_OK;
  } catch (const Error& e) {
    t_last_error = e.what();
    return status_of(e.category());
  } catch (const std::exception& e) {
    t_last_error = fmt::format("internal error: {}", e.what());
  } catch (...) {
    t_last_error = "internal error: an unknown exception";
  }
  return KILN_ERROR_INTERNAL;
}

// The parts of KILN_VERSION ("0.2.0", CMakeLists.txt's project version), for the check below.
constexpr std::array<int, 3> version_parts(std::string_view text) {
  std::array<int, 3> parts{};
  std::size_t part = 0;
  for (const char ch : text) {
    if (ch == '.') {
      ++part;
    } else {
      parts.at(part) = parts.at(part) * 10 + (ch - '0');
    }
  }
  return parts;
}
static_assert(version_parts(KILN_VERSION) ==
                  std::array{KILN_VERSION_MAJOR, KILN_VERSION_MINOR, KILN_VERSION_PATCH},
              "KILN_VERSION_MAJOR, _MINOR and _PATCH in include/kiln/kiln.h must match "
              "project(kiln VERSION) in CMakeLists.txt");
static_assert(KILN_VERSION_MINOR < 100 && KILN_VERSION_PATCH < 100,
              "KILN_VERSION_NUMBER gives the minor and patch versions two digits each");

// --- sized structs ----------------------------------------------------------------------------

// Where a field of a C struct ends: a struct_size an older kiln.h's struct may have, since
// fields are only ever appended.
#define KILN_FIELD_END(type, field) (offsetof(type, field) + sizeof(type::field))

constexpr std::array kScoreOptionsEnds = {KILN_FIELD_END(kiln_score_options, softmax_scale),
                                          KILN_FIELD_END(kiln_score_options, causal),
                                          KILN_FIELD_END(kiln_score_options, window_left),
                                          KILN_FIELD_END(kiln_score_options, window_right),
                                          KILN_FIELD_END(kiln_score_options, top_left),
                                          KILN_FIELD_END(kiln_score_options, softcap),
                                          KILN_FIELD_END(kiln_score_options, alibi_slopes),
                                          KILN_FIELD_END(kiln_score_options, sinks),
                                          KILN_FIELD_END(kiln_score_options, variant_name),
                                          KILN_FIELD_END(kiln_score_options, variant_code),
                                          KILN_FIELD_END(kiln_score_options, variant_scalars),
                                          KILN_FIELD_END(kiln_score_options, num_variant_tensors),
                                          KILN_FIELD_END(kiln_score_options, variant_tensors)};

// The options structs' own fields, after their score.
constexpr std::array kAttentionOptionsEnds = {KILN_FIELD_END(kiln_attention_options, bias),
                                              KILN_FIELD_END(kiln_attention_options, cu_seqlens_q),
                                              KILN_FIELD_END(kiln_attention_options, cu_seqlens_k),
                                              KILN_FIELD_END(kiln_attention_options, seqused_k),
                                              KILN_FIELD_END(kiln_attention_options, max_seqlen_q),
                                              KILN_FIELD_END(kiln_attention_options, max_seqlen_k),
                                              KILN_FIELD_END(kiln_attention_options, k_descale),
                                              KILN_FIELD_END(kiln_attention_options, v_descale),
                                              KILN_FIELD_END(kiln_attention_options, q_descale)};

constexpr std::array kDecodeOptionsEnds = {KILN_FIELD_END(kiln_decode_options, k_new),
                                           KILN_FIELD_END(kiln_decode_options, v_new),
                                           KILN_FIELD_END(kiln_decode_options, rotary_cos),
                                           KILN_FIELD_END(kiln_decode_options, rotary_sin),
                                           KILN_FIELD_END(kiln_decode_options, rotary_interleaved),
                                           KILN_FIELD_END(kiln_decode_options, num_splits)};

constexpr std::array kWarmupOptionsEnds = {KILN_FIELD_END(kiln_warmup_options, target),
                                           KILN_FIELD_END(kiln_warmup_options, threads),
                                           KILN_FIELD_END(kiln_warmup_options, progress),
                                           KILN_FIELD_END(kiln_warmup_options, progress_user)};

constexpr std::array kGradOptionsEnds = {KILN_FIELD_END(kiln_attention_grad_options, deterministic),
                                         KILN_FIELD_END(kiln_attention_grad_options, dsinks),
                                         KILN_FIELD_END(kiln_attention_grad_options, dbias)};

constexpr std::array kKVCacheEnds = {KILN_FIELD_END(kiln_kvcache, k),
                                     KILN_FIELD_END(kiln_kvcache, v),
                                     KILN_FIELD_END(kiln_kvcache, seqlens),
                                     KILN_FIELD_END(kiln_kvcache, batch_idx),
                                     KILN_FIELD_END(kiln_kvcache, block_table),
                                     KILN_FIELD_END(kiln_kvcache, k_descale),
                                     KILN_FIELD_END(kiln_kvcache, v_descale),
                                     KILN_FIELD_END(kiln_kvcache, k_token_descale),
                                     KILN_FIELD_END(kiln_kvcache, v_token_descale)};

#undef KILN_FIELD_END

// A field appended to a struct but not to its list above would leave its full size unknown.
template <class C, std::size_t N>
constexpr bool lists_every_field(const std::array<std::size_t, N>& ends) {
  return sizeof(C) - ends.back() < alignof(C);
}
static_assert(lists_every_field<kiln_score_options>(kScoreOptionsEnds));
static_assert(lists_every_field<kiln_attention_options>(kAttentionOptionsEnds));
static_assert(lists_every_field<kiln_decode_options>(kDecodeOptionsEnds));
static_assert(lists_every_field<kiln_kvcache>(kKVCacheEnds));
static_assert(lists_every_field<kiln_attention_grad_options>(kGradOptionsEnds));
static_assert(lists_every_field<kiln_warmup_options>(kWarmupOptionsEnds));

// Whether `size` is a struct_size a caller of C may give: this header's sizeof(C), or an older
// kiln.h's, which ended at one of the fields that end at `ends`, padded to C's alignment as its
// sizeof was. Anything else is refused: 0 (no *_init), garbage, or a newer header's, whose
// fields this library would ignore.
template <class C, std::size_t N>
bool known_size(std::size_t size, const std::array<std::size_t, N>& ends) {
  return size == sizeof(C) || std::ranges::any_of(ends, [size](std::size_t end) {
           return size == (end + alignof(C) - 1) / alignof(C) * alignof(C);
         });
}

// `field` (a struct's struct_size) holds `size`, which known_size() refuses.
template <class C>
[[noreturn]] void refuse_size(std::string_view field, std::size_t size, std::string_view type,
                              std::string_view init, std::string_view name) {
  throw Error(ErrorCategory::invalid_argument,
              fmt::format("{} is {}, which is no size of {} this libkiln ({}) knows ({} bytes, or "
                          "an older kiln.h's prefix of it): call {}({}) before setting the fields "
                          "(a caller built against a newer kiln.h needs a libkiln at least as new)",
                          field, size, type, KILN_VERSION, sizeof(C), init, name));
}

// `given` as a caller built against this or an older kiln.h filled it: its first struct_size
// bytes over `defaults`, which the fields it lacks keep.
template <class C, std::size_t N>
C read_sized(const C& given, const C& defaults, const std::array<std::size_t, N>& ends,
             std::string_view name, std::string_view type, std::string_view init) {
  const std::size_t size = given.struct_size;
  if (!known_size<C>(size, ends)) {
    refuse_size<C>(fmt::format("{}->struct_size", name), size, type, init, name);
  }
  C c = defaults;
  std::memcpy(&c, &given, size);
  return c;
}

// The options structs hold their score right after struct_size, and the score's own struct_size
// says where it ends, so that both can grow: a caller's own fields start where its score ends.
template <class C>
concept OptionsStruct =
    std::same_as<C, kiln_attention_options> || std::same_as<C, kiln_decode_options>;

constexpr std::size_t kScoreAt = sizeof(std::size_t);  // past struct_size
static_assert(offsetof(kiln_attention_options, score) == kScoreAt &&
              offsetof(kiln_decode_options, score) == kScoreAt);
// NOTE: the own fields then start right after a score of any size (a multiple of its
// alignment), at the same offsets from there: none of them is aligned more strictly.
static_assert(alignof(kiln_attention_options) == alignof(kiln_score_options) &&
              alignof(kiln_decode_options) == alignof(kiln_score_options));

// Where a caller's options struct, or the library's, keeps its parts after struct_size.
struct OptionsLayout {
  std::size_t score_size;  // the score's bytes (its struct_size)
  std::size_t own_size;    // the bytes of the fields after it
};

template <OptionsStruct C>
constexpr OptionsLayout kLibraryLayout{sizeof(kiln_score_options),
                                       sizeof(C) - kScoreAt - sizeof(kiln_score_options)};

// Copies struct_size and as much of the score and of the own fields as both layouts hold, from
// `from` laid out as `from_layout` into `to` laid out as `to_layout`.
void copy_options(const void* from, OptionsLayout from_layout, void* to, OptionsLayout to_layout) {
  const auto* source = static_cast<const unsigned char*>(from);
  auto* target = static_cast<unsigned char*>(to);
  std::memcpy(target, source, kScoreAt);
  std::memcpy(target + kScoreAt, source + kScoreAt,
              std::min(from_layout.score_size, to_layout.score_size));
  std::memcpy(target + kScoreAt + to_layout.score_size, source + kScoreAt + from_layout.score_size,
              std::min(from_layout.own_size, to_layout.own_size));
}

// `given` as read_sized() reads a struct, for an options struct: its score's struct_size is
// checked as well, and each part is read over `defaults`.
template <OptionsStruct C, std::size_t N>
C read_options(const C& given, const C& defaults, const std::array<std::size_t, N>& ends,
               std::string_view type, std::string_view init) {
  const std::size_t size = given.struct_size;
  // The score's struct_size is read only where the caller's struct holds it.
  if (size < kScoreAt + sizeof(std::size_t)) {
    refuse_size<C>("options->struct_size", size, type, init, "options");
  }
  const std::size_t score_size = given.score.struct_size;
  if (!known_size<kiln_score_options>(score_size, kScoreOptionsEnds)) {
    refuse_size<kiln_score_options>("options->score.struct_size", score_size, "kiln_score_options",
                                    init, "options");
  }
  // The caller's own fields end where the library's would after a score of its size.
  if (size < kScoreAt + score_size ||
      !known_size<C>(size - score_size + sizeof(kiln_score_options), ends)) {
    refuse_size<C>("options->struct_size", size, type, init, "options");
  }
  C c = defaults;
  copy_options(&given, {score_size, size - kScoreAt - score_size}, &c, kLibraryLayout<C>);
  return c;
}

// The C structs as their *_init leave them.
kiln_score_options score_defaults() {
  kiln_score_options score{};
  score.struct_size = sizeof(kiln_score_options);
  score.window_left = -1;  // unbounded, which a zeroed struct would not give
  score.window_right = -1;
  return score;
}

kiln_attention_options attention_defaults() {
  kiln_attention_options options{};
  options.struct_size = sizeof(kiln_attention_options);
  options.score = score_defaults();
  return options;
}

kiln_decode_options decode_defaults() {
  kiln_decode_options options{};
  options.struct_size = sizeof(kiln_decode_options);
  options.score = score_defaults();
  options.rotary_interleaved = 1;  // FlashAttention's flash_attn_with_kvcache default
  return options;
}

kiln_warmup_options warmup_defaults() {
  kiln_warmup_options options{};
  options.struct_size = sizeof(kiln_warmup_options);
  return options;
}

kiln_attention_grad_options grad_defaults() {
  kiln_attention_grad_options grads{};
  grads.struct_size = sizeof(kiln_attention_grad_options);
  return grads;
}

kiln_kvcache kvcache_defaults() {
  kiln_kvcache cache{};
  cache.struct_size = sizeof(kiln_kvcache);
  return cache;
}

// The *_init_sized functions: the first `size` bytes of `defaults` (no more than it has) into a
// caller's struct of `size` bytes, with struct_size = `size`, which the call then checks.
template <class C>
void init_sized(C* c, std::size_t size, C defaults) {
  if (c == nullptr) return;
  defaults.struct_size = size;
  std::memcpy(static_cast<void*>(c), &defaults, std::min(size, sizeof(C)));
}

// init_sized() for an options struct, whose caller also gives the size of its score: each part
// of `defaults` into the caller's, never past its `size` bytes. One too small to hold its
// struct_size gets nothing.
template <OptionsStruct C>
void init_options(C* c, std::size_t size, std::size_t score_size, C defaults) {
  if (c == nullptr || size < kScoreAt) return;
  defaults.struct_size = size;
  defaults.score.struct_size = score_size;
  const std::size_t score_bytes = std::min(score_size, size - kScoreAt);
  copy_options(&defaults, kLibraryLayout<C>, c, {score_bytes, size - kScoreAt - score_bytes});
}

// `options` as read_options() reads it, or the defaults when it is null.
kiln_attention_options attention_options(const kiln_attention_options* options) {
  if (options == nullptr) return attention_defaults();
  return read_options(*options, attention_defaults(), kAttentionOptionsEnds,
                      "kiln_attention_options", "kiln_attention_options_init");
}

kiln_decode_options decode_options(const kiln_decode_options* options) {
  if (options == nullptr) return decode_defaults();
  return read_options(*options, decode_defaults(), kDecodeOptionsEnds, "kiln_decode_options",
                      "kiln_decode_options_init");
}

// --- tensors ----------------------------------------------------------------------------------

DType dtype_of(const DLDataType& t, std::string_view name) {
  if (t.lanes != 1) {
    throw Error(ErrorCategory::unsupported,
                fmt::format("{} has DLPack lanes {} (dtype code {}, bits {}): kiln takes one "
                            "value per element, lanes 1; vector dtypes are not supported",
                            name, t.lanes, t.code, t.bits));
  }
  if (t.code == kDLFloat && t.bits == 16) return DType::f16;
  if (t.code == kDLBfloat && t.bits == 16) return DType::bf16;
  if (t.code == kDLFloat && t.bits == 32) return DType::f32;
  if (t.code == kDLFloat && t.bits == 64) return DType::f64;
  if (t.code == kDLInt && t.bits == 32) return DType::i32;
  if (t.code == kDLInt && t.bits == 64) return DType::i64;
  if (t.code == kDLPackFloat8E4m3fn && t.bits == 8) return DType::e4m3;
  if (t.code == kDLPackFloat8E5m2 && t.bits == 8) return DType::e5m2;
  throw Error(ErrorCategory::unsupported,
              fmt::format("{} has DLPack dtype (code {}, bits {}): kiln takes float16, "
                          "bfloat16, float32, float64, int32, int64, float8_e4m3fn (code {}) and "
                          "float8_e5m2 (code {})",
                          name, t.code, t.bits, kDLPackFloat8E4m3fn, kDLPackFloat8E5m2));
}

// The DLPack device type of `t`, read as the integer it is: a code outside DLDeviceType's
// enumerators (a caller's garbage) must not be loaded as the enum, which is undefined behaviour.
std::int32_t device_type_of(const DLTensor& t) {
  static_assert(sizeof(t.device.device_type) == sizeof(std::int32_t));
  std::int32_t code = 0;
  std::memcpy(&code, &t.device.device_type, sizeof code);
  return code;
}

// Where element 0 of `t` lives: data plus byte_offset, added as integers, since a pointer sum
// that wraps is undefined behaviour; null data stays null (validation refuses it unless the
// tensor is empty).
void* data_of(const DLTensor& t, std::string_view name) {
  static_assert(sizeof(std::uintptr_t) == sizeof(std::uint64_t), "kiln needs a 64-bit host");
  if (t.data == nullptr) return nullptr;
  const auto address =
      detail::checked_add<std::uint64_t>(reinterpret_cast<std::uintptr_t>(t.data), t.byte_offset);
  if (!address) {
    throw Error(ErrorCategory::invalid_argument,
                fmt::format("{} has data {} and byte_offset {}, whose sum passes the end of the "
                            "address space: byte_offset is the offset of element 0 within the "
                            "allocation at data",
                            name, t.data, t.byte_offset));
  }
  return reinterpret_cast<void*>(static_cast<std::uintptr_t>(*address));
}

TensorView view_of(const DLTensor& t, std::string_view name) {
  if (t.ndim < 1 || t.ndim > TensorView::max_rank) {
    throw Error(ErrorCategory::invalid_argument, fmt::format("{} has ndim {}: expected 1 to {}",
                                                             name, t.ndim, TensorView::max_rank));
  }
  if (t.shape == nullptr) {
    throw Error(ErrorCategory::invalid_argument,
                fmt::format("{} has ndim {} but its shape pointer is NULL: point shape at its {} "
                            "sizes",
                            name, t.ndim, t.ndim));
  }
  const std::span<const std::int64_t> shape(t.shape, static_cast<std::size_t>(t.ndim));
  TensorView view;
  view.data = data_of(t, name);
  view.dtype = dtype_of(t.dtype, name);
  view.rank = t.ndim;
  view.device = t.device.device_id;
  std::copy(shape.begin(), shape.end(), view.shape.begin());
  if (t.strides) {
    std::copy_n(t.strides, shape.size(), view.strides.begin());
  } else if (const auto compact = detail::compact_strides(shape)) {
    view.strides = *compact;
  } else {
    throw Error(ErrorCategory::invalid_argument,
                fmt::format("{} has shape ({}) and no strides, and its compact row-major "
                            "strides do not fit int64: pass strides, or a smaller shape",
                            name, fmt::join(shape, ", ")));
  }
  return view;
}

// The tensors of one call, converted in argument order (so that the first bad one is the one
// named), and the device they share, whose process-wide runtime runs the call.
class CallTensors {
 public:
  TensorView operator()(const DLTensor* t, std::string_view name) {
    if (t == nullptr) {
      throw Error(ErrorCategory::invalid_argument,
                  fmt::format("{} is NULL: it is required; pass a DLTensor (kiln.h says which "
                              "tensors may be NULL)",
                              name));
    }
    const std::int32_t type = device_type_of(*t);
    if (type != kDLCUDA && type != kDLROCM) {
      throw Error(ErrorCategory::invalid_argument,
                  fmt::format("{} is on DLPack device type {}: kiln takes GPU memory, kDLCUDA "
                              "({}) or kDLROCM ({})",
                              name, type, static_cast<int>(kDLCUDA), static_cast<int>(kDLROCM)));
    }
    const Device device{name, type, t->device.device_id};
    if (!first_) {
      first_ = device;
    } else if (device.type != first_->type || device.id != first_->id) {
      throw Error(ErrorCategory::invalid_argument,
                  fmt::format("{} is on DLPack device ({}, {}) but {} is on ({}, {}): all "
                              "tensors of a call must be on one device; move {} to {}'s device",
                              name, device.type, device.id, first_->name, first_->type, first_->id,
                              name, first_->name));
    }
    return view_of(*t, name);
  }

  std::optional<TensorView> maybe(const DLTensor* t, std::string_view name) {
    if (t == nullptr) return std::nullopt;
    return (*this)(t, name);
  }

  // The runtime of the tensors' device, once they are all converted.
  Runtime& runtime() const {
    Runtime& runtime = default_runtime(first_->id);
    const std::int32_t wanted = runtime.backend() == kiln::Vendor::amd ? kDLROCM : kDLCUDA;
    if (first_->type != wanted) {
      throw Error(ErrorCategory::invalid_argument,
                  fmt::format("{} is on DLPack device type {}, but device {}'s runtime uses "
                              "kiln's {} backend, which takes device type {}: set KILN_BACKEND "
                              "to the tensors' vendor (cuda or hip)",
                              first_->name, first_->type, runtime.device(),
                              to_string(runtime.backend()), wanted));
    }
    return runtime;
  }

 private:
  struct Device {
    std::string_view name;
    std::int32_t type;
    std::int32_t id;
  };
  std::optional<Device> first_;
};

// The user variant of `c`, into `variant` (which the options point to), with its scalars and
// tensors (the call's).
void set_variant(const kiln_score_options& c, CallTensors& tensors, Variant& variant,
                 ScoreOptions& o) {
  std::copy(std::begin(c.variant_scalars), std::end(c.variant_scalars), o.variant_scalars.begin());
  if ((c.variant_name == nullptr) != (c.variant_code == nullptr)) {
    throw Error(ErrorCategory::invalid_argument,
                fmt::format("variant_{} is NULL but variant_{} is set: a user variant needs both "
                            "its name and its code; set both, or neither for none",
                            c.variant_name == nullptr ? "name" : "code",
                            c.variant_name == nullptr ? "code" : "name"));
  }
  constexpr int kTensors = static_cast<int>(std::extent_v<decltype(c.variant_tensors)>);
  if (c.num_variant_tensors < 0 || c.num_variant_tensors > kTensors) {
    throw Error(ErrorCategory::invalid_argument,
                fmt::format("num_variant_tensors is {}: it must be 0 to {}", c.num_variant_tensors,
                            kTensors));
  }
  for (int i = 0; i < c.num_variant_tensors; ++i) {
    o.variant_tensors.push_back(
        tensors(c.variant_tensors[i], fmt::format("variant_tensors[{}]", i)));
  }
  if (c.variant_name == nullptr) return;
  variant.name = c.variant_name;
  variant.code = c.variant_code;
  o.variant = &variant;
}

// The score of either options struct as ScoreOptions; the slopes, sinks and variant tensors are
// converted as the call's tensors, and the user variant goes into `variant`.
ScoreOptions score_options(const kiln_score_options& c, CallTensors& tensors, Variant& variant) {
  ScoreOptions o;
  if (c.softmax_scale > 0) o.softmax_scale = c.softmax_scale;
  o.causal = c.causal != 0;
  o.window_left = c.window_left;
  o.window_right = c.window_right;
  o.top_left = c.top_left != 0;
  o.softcap = c.softcap;
  o.alibi_slopes = tensors.maybe(c.alibi_slopes, "alibi_slopes");
  o.sinks = tensors.maybe(c.sinks, "sinks");
  set_variant(c, tensors, variant, o);
  return o;
}

// kiln_attention's options (NULL: the defaults) and `lse` as AttentionOptions, their tensors
// converted as the call's, in the order the forward names them; the user variant goes into
// `variant`.
AttentionOptions attention_options_of(const kiln_attention_options* options, const DLTensor* lse,
                                      CallTensors& tensors, Variant& variant) {
  const kiln_attention_options c = attention_options(options);
  AttentionOptions o;
  o.score = score_options(c.score, tensors, variant);
  o.bias = tensors.maybe(c.bias, "bias");
  o.lse = tensors.maybe(lse, "lse");
  o.cu_seqlens_q = tensors.maybe(c.cu_seqlens_q, "cu_seqlens_q");
  o.cu_seqlens_k = tensors.maybe(c.cu_seqlens_k, "cu_seqlens_k");
  o.seqused_k = tensors.maybe(c.seqused_k, "seqused_k");
  o.max_seqlen_q = c.max_seqlen_q;
  o.max_seqlen_k = c.max_seqlen_k;
  o.k_descale = tensors.maybe(c.k_descale, "k_descale");
  o.v_descale = tensors.maybe(c.v_descale, "v_descale");
  o.q_descale = tensors.maybe(c.q_descale, "q_descale");
  return o;
}

}  // namespace
}  // namespace kiln

extern "C" {

int kiln_version(void) {
  return KILN_VERSION_NUMBER;
}

const char* kiln_build_id(void) {
  return
#include "build_id.inc"
      ;
}

void kiln_attention_options_init_sized(kiln_attention_options* options, size_t struct_size,
                                       size_t score_struct_size) {
  kiln::init_options(options, struct_size, score_struct_size, kiln::attention_defaults());
}

kiln_status kiln_attention(const DLTensor* q, const DLTensor* k, const DLTensor* v,
                           const DLTensor* out, const kiln_attention_options* options,
                           const DLTensor* lse, void* stream) {
  return kiln::guarded([&] {
    kiln::CallTensors tensors;
    const kiln::TensorView tq = tensors(q, "q"), tk = tensors(k, "k"), tv = tensors(v, "v"),
                           tout = tensors(out, "out");
    kiln::Variant variant;
    const kiln::AttentionOptions o = kiln::attention_options_of(options, lse, tensors, variant);
    kiln::attention(tq, tk, tv, tout, o, stream, tensors.runtime());
  });
}

void kiln_attention_grad_options_init_sized(kiln_attention_grad_options* grads,
                                            size_t struct_size) {
  kiln::init_sized(grads, struct_size, kiln::grad_defaults());
}

kiln_status kiln_attention_backward(const DLTensor* q, const DLTensor* k, const DLTensor* v,
                                    const DLTensor* out, const DLTensor* dout, const DLTensor* dq,
                                    const DLTensor* dk, const DLTensor* dv,
                                    const kiln_attention_options* options, const DLTensor* lse,
                                    const kiln_attention_grad_options* grads, void* stream) {
  return kiln::guarded([&] {
    kiln::CallTensors tensors;
    const kiln::TensorView tq = tensors(q, "q"), tk = tensors(k, "k"), tv = tensors(v, "v"),
                           tout = tensors(out, "out"), tdout = tensors(dout, "dout"),
                           tdq = tensors(dq, "dq"), tdk = tensors(dk, "dk"),
                           tdv = tensors(dv, "dv");
    if (lse == nullptr) {
      throw kiln::Error(kiln::ErrorCategory::invalid_argument,
                        "lse is NULL: the backward needs the forward's LSE; pass the fp32 lse "
                        "that kiln_attention wrote (its lse argument, which the forward of a "
                        "training step must not leave NULL)");
    }
    kiln::Variant variant;
    const kiln::AttentionOptions o = kiln::attention_options_of(options, lse, tensors, variant);
    const kiln_attention_grad_options c =
        grads == nullptr
            ? kiln::grad_defaults()
            : kiln::read_sized(*grads, kiln::grad_defaults(), kiln::kGradOptionsEnds, "grads",
                               "kiln_attention_grad_options", "kiln_attention_grad_options_init");
    const kiln::AttentionGradOptions g{.deterministic = c.deterministic != 0,
                                       .dsinks = tensors.maybe(c.dsinks, "dsinks"),
                                       .dbias = tensors.maybe(c.dbias, "dbias")};
    kiln::attention_backward(tq, tk, tv, tout, tdout, tdq, tdk, tdv, o, g, stream,
                             tensors.runtime());
  });
}

void kiln_kvcache_init_sized(kiln_kvcache* cache, size_t struct_size) {
  kiln::init_sized(cache, struct_size, kiln::kvcache_defaults());
}

void kiln_decode_options_init_sized(kiln_decode_options* options, size_t struct_size,
                                    size_t score_struct_size) {
  kiln::init_options(options, struct_size, score_struct_size, kiln::decode_defaults());
}

kiln_status kiln_attention_with_kvcache(const DLTensor* q, const kiln_kvcache* cache,
                                        const DLTensor* out, const kiln_decode_options* options,
                                        const DLTensor* lse, void* stream) {
  return kiln::guarded([&] {
    kiln::CallTensors tensors;
    const kiln::TensorView tq = tensors(q, "q");
    if (cache == nullptr) {
      throw kiln::Error(kiln::ErrorCategory::invalid_argument,
                        "cache is NULL: pass a kiln_kvcache with k, v and seqlens (after "
                        "kiln_kvcache_init)");
    }
    const kiln_kvcache ccache =
        kiln::read_sized(*cache, kiln::kvcache_defaults(), kiln::kKVCacheEnds, "cache",
                         "kiln_kvcache", "kiln_kvcache_init");
    kiln::KVCache tcache{
        .k = tensors(ccache.k, "cache.k"),
        .v = tensors(ccache.v, "cache.v"),
        .seqlens = tensors(ccache.seqlens, "cache.seqlens"),
        .batch_idx = tensors.maybe(ccache.batch_idx, "cache.batch_idx"),
        .block_table = tensors.maybe(ccache.block_table, "cache.block_table"),
        .k_descale = tensors.maybe(ccache.k_descale, "cache.k_descale"),
        .v_descale = tensors.maybe(ccache.v_descale, "cache.v_descale"),
        .k_token_descale = tensors.maybe(ccache.k_token_descale, "cache.k_token_descale"),
        .v_token_descale = tensors.maybe(ccache.v_token_descale, "cache.v_token_descale")};
    const kiln::TensorView tout = tensors(out, "out");
    const kiln_decode_options c = kiln::decode_options(options);
    kiln::DecodeOptions o;
    kiln::Variant variant;
    o.score = kiln::score_options(c.score, tensors, variant);
    o.k_new = tensors.maybe(c.k_new, "k_new");
    o.v_new = tensors.maybe(c.v_new, "v_new");
    o.rotary_cos = tensors.maybe(c.rotary_cos, "rotary_cos");
    o.rotary_sin = tensors.maybe(c.rotary_sin, "rotary_sin");
    o.rotary_interleaved = c.rotary_interleaved != 0;
    o.num_splits = c.num_splits;
    o.lse = tensors.maybe(lse, "lse");
    kiln::attention_with_kvcache(tq, tcache, tout, o, stream, tensors.runtime());
  });
}

kiln_status kiln_merge_states(const DLTensor* v_a, const DLTensor* s_a, const DLTensor* v_b,
                              const DLTensor* s_b, const DLTensor* v_out, const DLTensor* s_out,
                              void* stream) {
  return kiln::guarded([&] {
    kiln::CallTensors tensors;
    const kiln::TensorView ta = tensors(v_a, "v_a"), tsa = tensors(s_a, "s_a"),
                           tb = tensors(v_b, "v_b"), tsb = tensors(s_b, "s_b"),
                           tout = tensors(v_out, "v_out");
    const auto tsout = tensors.maybe(s_out, "s_out");
    kiln::merge_states(ta, tsa, tb, tsb, tout, tsout ? &*tsout : nullptr, stream,
                       tensors.runtime());
  });
}

kiln_status kiln_merge_states_many(const DLTensor* v, const DLTensor* s, const DLTensor* v_out,
                                   const DLTensor* s_out, void* stream) {
  return kiln::guarded([&] {
    kiln::CallTensors tensors;
    const kiln::TensorView tv = tensors(v, "v"), ts = tensors(s, "s"),
                           tout = tensors(v_out, "v_out");
    const auto tsout = tensors.maybe(s_out, "s_out");
    kiln::merge_states(tv, ts, tout, tsout ? &*tsout : nullptr, stream, tensors.runtime());
  });
}

void kiln_warmup_options_init_sized(kiln_warmup_options* options, size_t struct_size) {
  kiln::init_sized(options, struct_size, kiln::warmup_defaults());
}

kiln_status kiln_warmup(int device, const char* target, int threads) {
  kiln_warmup_options options = kiln::warmup_defaults();
  options.target = target;
  options.threads = threads;
  return kiln_warmup_with(device, &options);
}

kiln_status kiln_warmup_with(int device, const kiln_warmup_options* options) {
  return kiln::guarded([&] {
    const kiln_warmup_options c =
        options == nullptr
            ? kiln::warmup_defaults()
            : kiln::read_sized(*options, kiln::warmup_defaults(), kiln::kWarmupOptionsEnds,
                               "options", "kiln_warmup_options", "kiln_warmup_options_init");
    kiln::Runtime& runtime = kiln::default_runtime(device);
    const kiln::Target chosen = c.target ? kiln::Target(c.target) : runtime.target();
    kiln::WarmupOptions warmup{.threads = c.threads};
    if (c.progress != nullptr) {
      warmup.on_progress = [&c](const kiln::WarmupProgress& p) {
        c.progress(c.progress_user, p.done, p.total, p.last->spec.c_str(), p.last->ms,
                   p.last->status != kiln::WarmupStatus::failed);
      };
    }
    const auto report = runtime.warmup(kiln::default_specs(chosen), warmup);
    for (const kiln::WarmupItem& item : report.items) {
      if (item.status == kiln::WarmupStatus::failed) {
        const std::string message = fmt::format("warm-up of {} failed: {}", item.spec, item.error);
        // Anything but a kiln::Error is an internal error.
        if (!item.category) throw std::runtime_error(message);
        throw kiln::Error(*item.category, message);
      }
    }
  });
}

kiln_status kiln_warmup_default(const char* target, int threads) {
  return kiln_warmup(0, target, threads);
}

const char* kiln_last_error(void) {
  return kiln::t_last_error.c_str();
}

}  // extern "C"
