// SPDX-License-Identifier: Apache-2.0
// What the backends share: the default of drivers without TMA, and their messages.
#include "backend/backend.hpp"

#include "kiln/error.hpp"

namespace kiln::detail {

void Driver::encode_tensor_map(void*, const TensorMapLayout&) {
  throw Error(ErrorCategory::unsupported,
              std::string("the ") + std::string(to_string(vendor())) +
                  " driver has no tensor memory accelerator (TMA): use a kernel that loads "
                  "without it");
}

std::string copying_to_host(std::string_view device, int ordinal, std::size_t bytes) {
  return "copying " + std::to_string(bytes) + " bytes to the host (is the source memory of " +
         std::string(device) + " device " + std::to_string(ordinal) + "?)";
}

}  // namespace kiln::detail
