// The table of Params structs; a new kernel family adds its row here.
#include "params/registry.hpp"

#include <string>

#include <fmt/format.h>

#include "kiln/error.hpp"
#include "params/attention.h"
#include "params/decode.h"
#include "params/elementwise.h"

namespace kiln::detail {
namespace {

constexpr ParamsLayout kLayouts[] = {
    {"kiln::UnaryParams", "kiln/params/elementwise.h", sizeof(UnaryParams)},
    {"kiln::AttentionParams", "kiln/params/attention.h", sizeof(AttentionParams)},
    {"kiln::DecodeParams", "kiln/params/decode.h", sizeof(DecodeParams)},
    {"kiln::MergeParams", "kiln/params/decode.h", sizeof(MergeParams)},
};

}  // namespace

const ParamsLayout& params_layout(std::string_view type) {
  for (const ParamsLayout& layout : kLayouts) {
    if (layout.type == type) return layout;
  }
  std::string known;
  for (const ParamsLayout& layout : kLayouts) known += fmt::format(" {}", layout.type);
  throw Error(ErrorCategory::invalid_argument,
              fmt::format("kernel spec names Params type '{}', which libkiln does not define; "
                          "known types:{}",
                          type, known));
}

}  // namespace kiln::detail
