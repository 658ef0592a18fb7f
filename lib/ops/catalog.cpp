// The default warm-up set: what each kernel family's hot path asks for most.
#include "kiln/kiln.hpp"

namespace kiln {

std::vector<KernelSpec> default_specs() { return unary_default_specs(); }

}  // namespace kiln
