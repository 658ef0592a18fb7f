// SPDX-License-Identifier: Apache-2.0
// One attention [gpu] case on the device, and its reference's problem.
#include "attention_case.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <tuple>
#include <utility>

#include "variant_twins.hpp"

namespace kiln::test {
namespace {

// The layout of one q-like tensor: (batch, seqlen, heads, dim), or (tokens, heads, dim).
Strided layout_of(Layout layout, bool varlen, std::int64_t batch, std::int64_t seqlen,
                  std::int64_t heads, std::int64_t dim) {
  std::vector<std::int64_t> shape = {seqlen, heads, dim};
  if (!varlen) shape.insert(shape.begin(), batch);
  Strided s = Strided::dense(shape);
  const std::size_t seq = varlen ? 0 : 1;  // the token axis
  if (layout == Layout::padded) {
    // Strides stay multiples of 8 elements (16 bytes), as kiln requires.
    s.strides[seq + 1] = dim + 8;
    s.strides[seq] = heads * (dim + 8) + 8;
    if (!varlen) s.strides[0] = seqlen * s.strides[1] + 8;
    s.offset = 8;
  } else if (layout == Layout::bhsd) {
    s.strides[seq] = dim;
    s.strides[seq + 1] = seqlen * dim;
    if (!varlen) s.strides[0] = heads * seqlen * dim;
  }
  return s;
}

// The lse layout: (batch, heads, seqlen_q) or (heads, total_q); padded strides are odd on
// purpose, as nothing but the last dim's stride is constrained.
Strided lse_layout(const Case& c, std::int64_t total_q) {
  Strided s = c.varlen() ? Strided::dense({c.heads, total_q})
                         : Strided::dense({c.batch, c.heads, c.seqlen_q});
  if (c.layout == Layout::padded) {
    const std::size_t h = c.varlen() ? 0 : 1;
    s.strides[h] = s.shape[h + 1] + 3;
    if (!c.varlen()) s.strides[0] = c.heads * s.strides[1] + 5;
    s.offset = 1;
  }
  return s;
}

// What the reference needs to know of `c`; ALiBi slopes, sinks and bias come with their uploads.
ReferenceProblem reference_problem(const Case& c) {
  ReferenceProblem ref;
  ref.dtype = c.dtype;
  if (c.q_fp8) ref.p_fp8 = c.kv_fp8;
  ref.heads = c.heads;
  ref.heads_kv = c.heads_kv;
  ref.head_dim = c.head_dim;
  ref.head_dim_v = c.dim_v();
  if (c.varlen()) {
    ref.set_lengths(c.seqlens_q, c.seqlens_k);
  } else {
    ref.set_padded(c.batch, c.seqlen_q, c.seqlen_k);
  }
  ref.seqused_k = c.seqused_k;
  kiln::test::set_reference_score(c.score, c.head_dim, ref);
  return ref;
}

// A device copy of a 16-bit image, or for fp8 of its low bytes, where to_bits puts fp8 codes
// (the poison's 0xff is fp8's NaN).
std::unique_ptr<DeviceBuffer> upload_image(DType dtype, const std::vector<std::uint16_t>& image) {
  if (!kiln::is_fp8(dtype)) return upload(image);
  std::vector<std::uint8_t> bytes(image.size());
  std::transform(image.begin(), image.end(), bytes.begin(),
                 [](std::uint16_t x) { return static_cast<std::uint8_t>(x); });
  return upload(bytes);
}

// q, k and v in their layouts (k and v as stored: fp8 values before their descales), the rest of
// each buffer NaN; packed QKV shares one buffer.
void upload_qkv(const Case& c, const Layouts& l, const std::vector<double>& q,
                const std::vector<double>& k, const std::vector<double>& v, DeviceCase& d) {
  if (c.layout == Layout::packed_qkv) {
    REQUIRE_FALSE(c.kv_fp8);
    std::vector<std::uint16_t> image(guarded_size({&l.q, &l.k, &l.v}), kPoison16);
    kiln::test::scatter(c.dtype, l.q, q, image);
    kiln::test::scatter(c.dtype, l.k, k, image);
    kiln::test::scatter(c.dtype, l.v, v, image);
    d.buffers.push_back(upload(image));
    d.q = view_of(*d.buffers[0], c.dtype, l.q);
    d.k = view_of(*d.buffers[0], c.dtype, l.k);
    d.v = view_of(*d.buffers[0], c.dtype, l.v);
    return;
  }
  for (auto [layout, values, view, dtype] :
       {std::tuple{&l.q, &q, &d.q, c.q_dtype()}, std::tuple{&l.k, &k, &d.k, c.kv_dtype()},
        std::tuple{&l.v, &v, &d.v, c.kv_dtype()}}) {
    std::vector<std::uint16_t> image(guarded_size({layout}), kPoison16);
    kiln::test::scatter(dtype, *layout, *values, image);
    d.buffers.push_back(upload_image(dtype, image));
    *view = view_of(*d.buffers.back(), dtype, *layout);
  }
}

void add_bias(const Case& c, ReferenceProblem& ref, DeviceCase& d, std::mt19937& rng) {
  REQUIRE_FALSE(c.varlen());
  const std::int64_t b = c.batch, h = c.heads, sq = c.seqlen_q, sk = c.seqlen_k;
  // The memory the bias lives in, and the view's (batch, heads, row, key) shape and strides.
  Strided storage;
  std::vector<std::int64_t> shape = {b, h, sq, sk};
  std::vector<std::int64_t> strides;
  switch (c.bias) {
    case Bias::batch_broadcast:
      storage = Strided::dense({h, sq, sk});
      strides = {0, sq * sk, sk, 1};
      break;
    case Bias::head_broadcast:
      storage = Strided::dense({b, sq, sk});
      strides = {sq * sk, 0, sk, 1};
      break;
    case Bias::transposed:  // keys are the rows of memory
      storage = Strided::dense({b, h, sk, sq});
      strides = {h * sk * sq, sk * sq, 1, sq};
      break;
    case Bias::batch_size_one:  // the reference reads every batch through the stride 0
      shape[0] = 1;
      storage = Strided::dense({h, sq, sk});
      strides = {0, sq * sk, sk, 1};
      break;
    case Bias::heads_size_one:
      shape[1] = 1;
      storage = Strided::dense({b, sq, sk});
      strides = {sq * sk, 0, sk, 1};
      break;
    default: storage = Strided::dense({b, h, sq, sk}); strides = storage.strides;
  }
  const auto values = kiln::test::random_normal(c.dtype, storage.count(), rng);
  std::vector<std::uint16_t> image(static_cast<std::size_t>(storage.count()));
  kiln::test::scatter(c.dtype, storage, values, image);
  d.buffers.push_back(upload(image));
  ref.bias = [values, strides](int bi, int hi, int i, int j) {
    return values[bi * strides[0] + hi * strides[1] + i * strides[2] + j * strides[3]];
  };
  d.options.bias = view_of(*d.buffers.back(), c.dtype, Strided{shape, strides, 0});
}

// Random descales of fp8 k and v (and an fp8 q), (batch, heads_kv) fp32 from 1/4 to 4, uploaded
// for the call; scales the reference's q, k and v, each stored value times its sequence's (and
// kv head's) descale.
void add_descales(const Case& c, const ReferenceProblem& ref, std::vector<double>& q,
                  std::vector<double>& k, std::vector<double>& v, DeviceCase& d,
                  std::mt19937& rng) {
  const int batch = ref.batch();
  std::uniform_real_distribution<double> exponent(-2, 2);
  struct Scaled {
    std::vector<double>* values;
    std::optional<TensorView>* view;
    const std::vector<int>& cu_seqlens;
    int heads, dim;
  };
  std::vector<Scaled> tensors = {
      {&k, &d.options.k_descale, ref.cu_seqlens_k, c.heads_kv, c.head_dim},
      {&v, &d.options.v_descale, ref.cu_seqlens_k, c.heads_kv, c.dim_v()}};
  if (c.q_fp8) {
    tensors.push_back({&q, &d.options.q_descale, ref.cu_seqlens_q, c.heads, c.head_dim});
  }
  for (const Scaled& t : tensors) {
    std::vector<float> descales(static_cast<std::size_t>(batch * c.heads_kv));
    for (float& x : descales) x = static_cast<float>(std::exp2(exponent(rng)));
    const int group = t.heads / c.heads_kv;  // heads per kv head: q's descale is a kv head's
    for (int b = 0; b < batch; ++b) {
      for (int token = t.cu_seqlens[b]; token < t.cu_seqlens[b + 1]; ++token) {
        for (int h = 0; h < t.heads; ++h) {
          double* const row = &(*t.values)[(std::size_t{1} * token * t.heads + h) * t.dim];
          for (int e = 0; e < t.dim; ++e) row[e] *= descales[b * c.heads_kv + h / group];
        }
      }
    }
    d.buffers.push_back(upload(descales));
    *t.view = TensorView::contiguous(d.buffers.back()->get(), DType::f32, {batch, c.heads_kv});
  }
}

void add_sequences(const Case& c, const ReferenceProblem& ref, DeviceCase& d) {
  const int batch = ref.batch();
  if (c.varlen()) {
    d.buffers.push_back(upload(ref.cu_seqlens_q));
    d.options.cu_seqlens_q =
        TensorView::contiguous(d.buffers.back()->get(), DType::i32, {batch + 1});
    d.buffers.push_back(upload(ref.cu_seqlens_k));
    d.options.cu_seqlens_k =
        TensorView::contiguous(d.buffers.back()->get(), DType::i32, {batch + 1});
    d.options.max_seqlen_q = *std::max_element(c.seqlens_q.begin(), c.seqlens_q.end());
    d.options.max_seqlen_k = *std::max_element(c.seqlens_k.begin(), c.seqlens_k.end());
  }
  if (!c.seqused_k.empty()) {
    d.buffers.push_back(upload(c.seqused_k));
    d.options.seqused_k = TensorView::contiguous(d.buffers.back()->get(), DType::i32, {batch});
  }
}
}  // namespace

std::string describe(const Case& c) {
  std::ostringstream s;
  s << kiln::to_string(c.dtype) << " heads " << c.heads << "/" << c.heads_kv << " d " << c.head_dim
    << "/" << c.dim_v();
  if (c.varlen()) {
    s << " varlen q";
    for (int n : c.seqlens_q) s << " " << n;
    s << " k";
    for (int n : c.seqlens_k) s << " " << n;
  } else {
    s << " batch " << c.batch << " seqlen " << c.seqlen_q << "x" << c.seqlen_k;
  }
  if (!c.seqused_k.empty()) s << " seqused_k";
  if (c.kv_fp8) {
    s << (c.q_fp8 ? " q, k and v " : " k and v ") << kiln::to_string(*c.kv_fp8)
      << (c.descales ? " descaled" : "");
  }
  s << kiln::test::describe(c.score);
  const char* layouts[] = {"contiguous", "padded", "packed qkv", "bhsd"};
  s << " layout " << layouts[static_cast<int>(c.layout)];
  const char* biases[] = {"",
                          " bias",
                          " bias shared by the batch (stride 0)",
                          " bias shared by the heads (stride 0)",
                          " bias transposed",
                          " bias of size 1 over the batch",
                          " bias of size 1 over the heads"};
  s << biases[static_cast<int>(c.bias)];
  if (c.lse) s << " lse";
  return s.str();
}

Layouts layouts_of(const Case& c, const ReferenceProblem& ref) {
  const bool varlen = c.varlen();
  const std::int64_t total_q = ref.cu_seqlens_q.back(), total_k = ref.cu_seqlens_k.back();
  const std::int64_t seqlen_q = varlen ? total_q : c.seqlen_q;
  const std::int64_t seqlen_k = varlen ? total_k : c.seqlen_k;
  Layouts l;
  if (c.layout == Layout::packed_qkv) {
    REQUIRE((seqlen_q == seqlen_k && c.heads == c.heads_kv && c.head_dim == c.dim_v()));
    const std::int64_t token = 3 * c.heads * c.head_dim;
    l.q = layout_of(Layout::contiguous, varlen, c.batch, seqlen_q, c.heads, c.head_dim);
    l.q.strides[varlen ? 0 : 1] = token;
    if (!varlen) l.q.strides[0] = seqlen_q * token;
    l.k = l.v = l.q;
    l.k.offset = c.heads * c.head_dim;
    l.v.offset = 2 * c.heads * c.head_dim;
    l.out = layout_of(Layout::contiguous, varlen, c.batch, seqlen_q, c.heads, c.dim_v());
  } else {
    l.q = layout_of(c.layout, varlen, c.batch, seqlen_q, c.heads, c.head_dim);
    l.k = layout_of(c.layout, varlen, c.batch, seqlen_k, c.heads_kv, c.head_dim);
    l.v = layout_of(c.layout, varlen, c.batch, seqlen_k, c.heads_kv, c.dim_v());
    l.out = layout_of(c.layout, varlen, c.batch, seqlen_q, c.heads, c.dim_v());
  }
  l.lse = lse_layout(c, total_q);
  return l;
}

Prepared prepare(const Case& c, std::mt19937& rng) {
  ReferenceProblem ref = reference_problem(c);
  const Layouts l = layouts_of(c, ref);
  Prepared p;
  DeviceCase& d = p.d;
  const std::int64_t total_q = ref.cu_seqlens_q.back(), total_k = ref.cu_seqlens_k.back();
  auto q = kiln::test::random_normal(c.q_dtype(), total_q * c.heads * c.head_dim, rng);
  auto k = kiln::test::random_normal(c.kv_dtype(), total_k * c.heads_kv * c.head_dim, rng);
  auto v = kiln::test::random_normal(c.kv_dtype(), total_k * c.heads_kv * c.dim_v(), rng);

  upload_qkv(c, l, q, k, v, d);
  d.out = std::make_unique<Output>(c.dtype, l.out);
  d.lse = std::make_unique<Output>(DType::f32, l.lse);
  d.options = {.score = kiln::test::score_options(c.score)};
  const int keys = c.varlen() ? std::ranges::max(c.seqlens_k) : c.seqlen_k;
  kiln::test::add_score_tensors(c.score, ref.batch(), c.heads, keys, ref, d.options.score,
                                d.buffers, rng);
  if (c.bias != Bias::none) add_bias(c, ref, d, rng);
  if (c.score.variant != UserVariant::none) {
    REQUIRE_FALSE(c.varlen());
    const int offset = c.score.top_left ? 0 : c.seqlen_k - c.seqlen_q;
    kiln::test::add_user_variant(
        c.score.variant,
        {c.batch, c.heads, c.seqlen_q, c.seqlen_k, std::vector<int>(c.batch, offset)}, ref,
        d.options.score, d.buffers, rng);
  }
  add_sequences(c, ref, d);
  if (c.descales) add_descales(c, ref, q, k, v, d, rng);
  if (c.lse) d.options.lse = d.lse->view();
  p.want = kiln::test::attention_reference(ref, q, k, v);
  const int rows = c.varlen() ? d.options.max_seqlen_q : c.seqlen_q;
  p.has_rows = ref.batch() > 0 && c.heads > 0 && rows > 0;
  p.ref = std::move(ref);
  p.q = q;
  p.k = k;
  p.v = v;
  return p;
}
}  // namespace kiln::test
