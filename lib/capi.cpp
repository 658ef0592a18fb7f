// The C API (include/kiln/kiln.h): DLPack tensors in, status codes and a thread-local message out.
#include "kiln/kiln.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "checked_math.hpp"
#include "kiln/kiln.hpp"
#include "tensor_strides.hpp"

namespace kiln {
namespace {

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

// Runs `body`, turning any exception into a status and this thread's message.
template <class Body>
kiln_status guarded(Body&& body) noexcept {
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

// guarded() on the process-wide runtime: `body` gets it and its backend's name, which says the
// DLPack device type tensors must have.
template <class Body>
kiln_status guarded_on_runtime(Body&& body) noexcept {
  return guarded([&] {
    Runtime& runtime = default_runtime();
    body(runtime, std::string_view(runtime.backend()));
  });
}

DType dtype_of(const DLDataType& t, std::string_view name) {
  if (t.lanes == 1) {
    if (t.code == kDLFloat && t.bits == 16) return DType::f16;
    if (t.code == kDLBfloat && t.bits == 16) return DType::bf16;
    if (t.code == kDLFloat && t.bits == 32) return DType::f32;
    if (t.code == kDLFloat && t.bits == 64) return DType::f64;
    if (t.code == kDLInt && t.bits == 32) return DType::i32;
    if (t.code == kDLInt && t.bits == 64) return DType::i64;
  }
  throw Error(ErrorCategory::unsupported,
              fmt::format("{} has DLPack dtype (code {}, bits {}, lanes {}): kiln takes float16, "
                          "bfloat16, float32, float64, int32 and int64",
                          name, t.code, t.bits, t.lanes));
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

TensorView view_of(const DLTensor* t, std::string_view name, std::string_view backend) {
  if (t == nullptr) {
    throw Error(ErrorCategory::invalid_argument, fmt::format("{} is NULL", name));
  }
  const std::int32_t wanted = backend == "hip" ? kDLROCM : kDLCUDA;
  if (device_type_of(*t) != wanted) {
    throw Error(ErrorCategory::invalid_argument,
                fmt::format("{} is on DLPack device type {}: kiln's {} backend takes device "
                            "memory (device type {})",
                            name, device_type_of(*t), backend, wanted));
  }
  if (t->ndim < 1 || t->ndim > TensorView::max_rank || t->shape == nullptr) {
    throw Error(ErrorCategory::invalid_argument,
                fmt::format("{} has {} dims{}: expected 1 to {}", name, t->ndim,
                            t->shape == nullptr ? " and no shape" : "", TensorView::max_rank));
  }
  const std::span<const std::int64_t> shape(t->shape, static_cast<std::size_t>(t->ndim));
  TensorView view;
  view.data = data_of(*t, name);
  view.dtype = dtype_of(t->dtype, name);
  view.rank = t->ndim;
  view.device = t->device.device_id;
  std::copy(shape.begin(), shape.end(), view.shape.begin());
  if (t->strides) {
    std::copy_n(t->strides, shape.size(), view.strides.begin());
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

std::optional<TensorView> maybe_view(const DLTensor* t, std::string_view name,
                                     std::string_view backend) {
  if (t == nullptr) return std::nullopt;
  return view_of(t, name, backend);
}

// The score options kiln_attention_options and kiln_decode_options share, C to C++.
template <class COptions, class Options>
void copy_score_options(const COptions& c, Options& o, std::string_view backend) {
  if (c.softmax_scale > 0) o.softmax_scale = c.softmax_scale;
  o.causal = c.causal != 0;
  o.window_left = c.window_left;
  o.window_right = c.window_right;
  o.top_left = c.top_left != 0;
  o.softcap = c.softcap;
  o.alibi_slopes = maybe_view(c.alibi_slopes, "alibi_slopes", backend);
}

// Zeroes `options` but for the windows, which are unbounded (-1) by default.
template <class COptions>
void init_options(COptions* options) {
  if (options == nullptr) return;
  *options = COptions{};
  options->window_left = -1;
  options->window_right = -1;
}

// `options`, or the defaults when it is null.
template <class COptions>
COptions options_or_defaults(const COptions* options) {
  COptions c;
  init_options(&c);
  if (options) c = *options;
  return c;
}

}  // namespace
}  // namespace kiln

extern "C" {

void kiln_attention_options_init(kiln_attention_options* options) {
  kiln::init_options(options);
}

kiln_status kiln_attention(const DLTensor* q, const DLTensor* k, const DLTensor* v,
                           const DLTensor* out, const kiln_attention_options* options,
                           const DLTensor* lse, void* stream) {
  return kiln::guarded_on_runtime([&](kiln::Runtime& runtime, std::string_view backend) {
    using kiln::view_of, kiln::maybe_view;
    // Converted in argument order, so the first bad tensor is the one named.
    const kiln::TensorView tq = view_of(q, "q", backend), tk = view_of(k, "k", backend),
                           tv = view_of(v, "v", backend), tout = view_of(out, "out", backend);
    const kiln_attention_options c = kiln::options_or_defaults(options);
    kiln::AttentionOptions o;
    kiln::copy_score_options(c, o, backend);
    o.bias = maybe_view(c.bias, "bias", backend);
    o.lse = maybe_view(lse, "lse", backend);
    o.cu_seqlens_q = maybe_view(c.cu_seqlens_q, "cu_seqlens_q", backend);
    o.cu_seqlens_k = maybe_view(c.cu_seqlens_k, "cu_seqlens_k", backend);
    o.seqused_k = maybe_view(c.seqused_k, "seqused_k", backend);
    o.max_seqlen_q = c.max_seqlen_q;
    o.max_seqlen_k = c.max_seqlen_k;
    kiln::attention(tq, tk, tv, tout, o, stream, runtime);
  });
}

void kiln_decode_options_init(kiln_decode_options* options) {
  kiln::init_options(options);
}

kiln_status kiln_attention_with_kvcache(const DLTensor* q, const kiln_kvcache* cache,
                                        const DLTensor* out, const kiln_decode_options* options,
                                        const DLTensor* lse, void* stream) {
  return kiln::guarded_on_runtime([&](kiln::Runtime& runtime, std::string_view backend) {
    using kiln::view_of, kiln::maybe_view;
    const kiln::TensorView tq = view_of(q, "q", backend);
    if (cache == nullptr) {
      throw kiln::Error(kiln::ErrorCategory::invalid_argument,
                        "cache is NULL: pass a kiln_kvcache with k, v and seqlens");
    }
    kiln::KVCache tcache{
        .k = view_of(cache->k, "cache.k", backend),
        .v = view_of(cache->v, "cache.v", backend),
        .seqlens = view_of(cache->seqlens, "cache.seqlens", backend),
        .batch_idx = maybe_view(cache->batch_idx, "cache.batch_idx", backend),
        .block_table = maybe_view(cache->block_table, "cache.block_table", backend)};
    const kiln::TensorView tout = view_of(out, "out", backend);
    const kiln_decode_options c = kiln::options_or_defaults(options);
    kiln::DecodeOptions o;
    kiln::copy_score_options(c, o, backend);
    o.k_new = maybe_view(c.k_new, "k_new", backend);
    o.v_new = maybe_view(c.v_new, "v_new", backend);
    o.rotary_cos = maybe_view(c.rotary_cos, "rotary_cos", backend);
    o.rotary_sin = maybe_view(c.rotary_sin, "rotary_sin", backend);
    o.rotary_interleaved = c.rotary_interleaved != 0;
    o.num_splits = c.num_splits;
    o.lse = maybe_view(lse, "lse", backend);
    kiln::attention_with_kvcache(tq, tcache, tout, o, stream, runtime);
  });
}

kiln_status kiln_merge_states(const DLTensor* v_a, const DLTensor* s_a, const DLTensor* v_b,
                              const DLTensor* s_b, const DLTensor* v_out, const DLTensor* s_out,
                              void* stream) {
  return kiln::guarded_on_runtime([&](kiln::Runtime& runtime, std::string_view backend) {
    using kiln::view_of;
    const kiln::TensorView ta = view_of(v_a, "v_a", backend), tsa = view_of(s_a, "s_a", backend),
                           tb = view_of(v_b, "v_b", backend), tsb = view_of(s_b, "s_b", backend),
                           tout = view_of(v_out, "v_out", backend);
    const auto tsout = kiln::maybe_view(s_out, "s_out", backend);
    kiln::merge_states(ta, tsa, tb, tsb, tout, tsout ? &*tsout : nullptr, stream, runtime);
  });
}

kiln_status kiln_merge_states_many(const DLTensor* v, const DLTensor* s, const DLTensor* v_out,
                                   const DLTensor* s_out, void* stream) {
  return kiln::guarded_on_runtime([&](kiln::Runtime& runtime, std::string_view backend) {
    using kiln::view_of;
    const kiln::TensorView tv = view_of(v, "v", backend), ts = view_of(s, "s", backend),
                           tout = view_of(v_out, "v_out", backend);
    const auto tsout = kiln::maybe_view(s_out, "s_out", backend);
    kiln::merge_states(tv, ts, tout, tsout ? &*tsout : nullptr, stream, runtime);
  });
}

kiln_status kiln_warmup_default(const char* target, int threads) {
  return kiln::guarded([&] {
    kiln::Runtime& runtime = kiln::default_runtime();
    const std::string chosen = target ? std::string(target) : runtime.target();
    const auto report = runtime.warmup(kiln::default_specs(chosen), {.threads = threads});
    for (const kiln::WarmupItem& item : report.items) {
      if (item.status == kiln::WarmupStatus::failed) {
        throw kiln::Error(kiln::ErrorCategory::compile,
                          fmt::format("warm-up of {} failed: {}", item.spec, item.error));
      }
    }
  });
}

const char* kiln_last_error(void) {
  return kiln::t_last_error.c_str();
}

}  // extern "C"
