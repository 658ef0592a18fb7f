// SPDX-License-Identifier: Apache-2.0
// The attention problem with every feature on, whose specs the tests check against the schema
// (tests/params/registry_test.cpp) and pin (tests/ops/choose_test.cpp).
#pragma once

#include "kiln/attention.hpp"

namespace kiln::test {

inline AttentionProblem every_attention_feature() {
  return {.dtype_q = DType::f16,
          .dtype_kv = DType::f16,
          .dtype_out = DType::f16,
          .head_dim = 96,
          .head_dim_v = 64,
          .band = true,
          .varlen = true,
          .softcap = true,
          .alibi = true,
          .bias = true};
}

}  // namespace kiln::test
