// The C API (include/kiln/kiln.h): DLPack tensors in, status codes and a thread-local message out.
#include "kiln/kiln.h"

#include <string>

#include <fmt/format.h>

#include "kiln/kiln.hpp"

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

TensorView view_of(const DLTensor* t, std::string_view name, std::string_view backend) {
  if (t == nullptr) {
    throw Error(ErrorCategory::invalid_argument, fmt::format("{} is NULL", name));
  }
  const DLDeviceType wanted = backend == "hip" ? kDLROCM : kDLCUDA;
  if (t->device.device_type != wanted) {
    throw Error(ErrorCategory::invalid_argument,
                fmt::format("{} is on DLPack device type {}: kiln's {} backend takes device "
                            "memory (device type {})",
                            name, static_cast<int>(t->device.device_type), backend,
                            static_cast<int>(wanted)));
  }
  if (t->ndim < 1 || t->ndim > TensorView::max_rank || t->shape == nullptr) {
    throw Error(ErrorCategory::invalid_argument,
                fmt::format("{} has {} dims{}: expected 1 to {}", name, t->ndim,
                            t->shape == nullptr ? " and no shape" : "", TensorView::max_rank));
  }
  TensorView view;
  view.data = t->data == nullptr ? nullptr : static_cast<char*>(t->data) + t->byte_offset;
  view.dtype = dtype_of(t->dtype, name);
  view.rank = t->ndim;
  view.device = t->device.device_id;
  std::int64_t compact = 1;
  for (int d = t->ndim - 1; d >= 0; --d) {
    const auto i = static_cast<std::size_t>(d);
    view.shape[i] = t->shape[d];
    view.strides[i] = t->strides ? t->strides[d] : compact;
    compact *= t->shape[d];
  }
  return view;
}

std::optional<TensorView> maybe_view(const DLTensor* t, std::string_view name,
                                     std::string_view backend) {
  if (t == nullptr) return std::nullopt;
  return view_of(t, name, backend);
}

}  // namespace
}  // namespace kiln

extern "C" {

void kiln_attention_options_init(kiln_attention_options* options) {
  if (options == nullptr) return;
  *options = kiln_attention_options{};
  options->window_left = -1;
  options->window_right = -1;
}

kiln_status kiln_attention(const DLTensor* q, const DLTensor* k, const DLTensor* v,
                           const DLTensor* out, const kiln_attention_options* options,
                           const DLTensor* lse, void* stream) {
  return kiln::guarded([&] {
    using kiln::view_of, kiln::maybe_view;
    kiln::Runtime& runtime = kiln::default_runtime();
    const std::string& backend = runtime.backend();
    // Converted in argument order, so the first bad tensor is the one named.
    const kiln::TensorView tq = view_of(q, "q", backend), tk = view_of(k, "k", backend),
                           tv = view_of(v, "v", backend), tout = view_of(out, "out", backend);
    kiln_attention_options c;
    kiln_attention_options_init(&c);
    if (options) c = *options;
    kiln::AttentionOptions o;
    if (c.softmax_scale > 0) o.softmax_scale = c.softmax_scale;
    o.causal = c.causal != 0;
    o.window_left = c.window_left;
    o.window_right = c.window_right;
    o.top_left = c.top_left != 0;
    o.softcap = c.softcap;
    o.alibi_slopes = maybe_view(c.alibi_slopes, "alibi_slopes", backend);
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
