// The default warm-up set: what each kernel family's hot path asks for most.
#include "kiln/kiln.hpp"

namespace kiln {

std::vector<KernelSpec> default_specs(const Target& target) {
  std::vector<KernelSpec> specs = unary_default_specs();
  for (KernelSpec& spec : attention_default_specs(target)) specs.push_back(std::move(spec));
  for (KernelSpec& spec : decode_default_specs(target)) specs.push_back(std::move(spec));
  for (KernelSpec& spec : specs) spec.target = target.name();
  return specs;
}

}  // namespace kiln
