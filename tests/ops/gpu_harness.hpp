// SPDX-License-Identifier: Apache-2.0
// What the attention and decode [gpu] tests share: a case's score model and its inputs (the fp64
// reference's twin and the device's options), poisoned outputs with guards past their end, the
// checks of out and lse against the reference, and the cache the tests compile into.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "attention_reference.hpp"
#include "gpu.hpp"
#include "kiln/runtime.hpp"
#include "kiln/score.hpp"
#include "variant_twins.hpp"

namespace kiln::test {

constexpr DType kDTypes[] = {DType::bf16, DType::f16};

// Poisoned elements after every buffer's layouts, to catch overruns.
constexpr std::int64_t kGuard = 8;

// Options for a [gpu] test's runtime: isolated (isolated_options) in one cache that every [gpu]
// ops test shares, so later test cases hit on disk.
kiln::Options gpu_options();

enum class Alibi { none, per_head, per_batch_head };

// The score model of a case, as kiln::ScoreOptions asks for it; ALiBi slopes, sinks and the
// variant's inputs are drawn at random.
struct ScoreCase {
  bool causal = false;
  int window_left = -1;
  int window_right = -1;
  bool top_left = false;
  float softcap = 0;
  std::optional<float> softmax_scale;
  Alibi alibi = Alibi::none;
  bool sinks = false;                       // a sink logit per query head
  UserVariant variant = UserVariant::none;  // a user variant (variant_twins.hpp)
};

// The score model in words, each part after a space: " causal window (16, 8) softcap 5 ...".
std::string describe(const ScoreCase& s);

// The reference's scale (kiln's default when unset: 1 / sqrt(head_dim), in float), band and
// softcap.
void set_reference_score(const ScoreCase& s, int head_dim, ReferenceProblem& ref);

// The options' scale, band and softcap; add_score_tensors adds the rest.
ScoreOptions score_options(const ScoreCase& s);

// Random ALiBi slopes ((heads) or (batch, heads)) and sinks (random_sinks over `sink_keys`
// keys) where `s` asks for them: in `ref`, and uploaded into `buffers` for `score`.
void add_score_tensors(const ScoreCase& s, int batch, int heads, int sink_keys,
                       ReferenceProblem& ref, ScoreOptions& score,
                       std::vector<std::unique_ptr<DeviceBuffer>>& buffers, std::mt19937& rng);

// The elements of a buffer that holds each of `layouts`, and kGuard more.
std::int64_t guarded_size(std::initializer_list<const Strided*> layouts);

// A view of `s` in `buffer`.
TensorView view_of(const DeviceBuffer& buffer, DType dtype, const Strided& s);

// An output on the device: the elements of its layout (f16, bf16 or f32) in a buffer of
// guarded_size, poisoned (DeviceBuffer::poison) before each run, so that a write anywhere else,
// in the layout's gaps or past its end, shows.
class Output {
 public:
  Output(DType dtype, Strided layout);

  void* data() const { return buffer_.get(); }
  TensorView view() const { return view_of(buffer_, dtype_, layout_); }
  void poison() { buffer_.poison(); }
  std::vector<std::uint8_t> bytes() const { return buffer_.download<std::uint8_t>(); }

  // The layout's values in a download, in fp64, in its logical (row-major) order.
  std::vector<double> values(const std::vector<std::uint8_t>& bytes) const;
  // How many elements of a download no longer hold the poison: outside the layout, or anywhere.
  std::int64_t written_outside(const std::vector<std::uint8_t>& bytes) const;
  std::int64_t written(const std::vector<std::uint8_t>& bytes) const;

 private:
  DType dtype_;
  Strided layout_;
  DeviceBuffer buffer_;
};

// The output's values against `want` with `plain` as the baseline (compare_values, explained for
// (tokens, heads, dim)), and nothing written outside them.
void check_values(const Output& got, const std::vector<std::uint8_t>& bytes,
                  const std::vector<double>& want, const std::vector<double>& plain, int heads,
                  int dim);

// The output's values against the reference's out (check_values).
void check_out(const Output& out, const std::vector<std::uint8_t>& bytes,
               const ReferenceResult& want, int heads, int dim_v);

// The lse output's values against `want` in the layout's logical order (compare_lse), and
// nothing written outside them.
void check_lse(const Output& lse, const std::vector<std::uint8_t>& bytes,
               const std::vector<double>& want);

}  // namespace kiln::test
