// SPDX-License-Identifier: Apache-2.0
// A spec made concrete: the generated translation unit, its headers, options and cache key.
#pragma once

#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "cache/key.hpp"
#include "jit/sources.hpp"
#include "kiln/spec.hpp"
#include "kiln/target.hpp"
#include "params/registry.hpp"

namespace kiln::detail {

struct Unit {
  KernelSpec kernel;  // what it compiles, with the target filled in
  std::string spec;   // kernel, printed canonically
  Target target;
  std::string compiler;  // identity, e.g. "nvrtc 13.0"
  std::string source;    // the generated unit
  std::vector<Header> headers;
  std::vector<std::string> options;  // canonical options
  std::string name_expression;
  const ParamsLayout* params = nullptr;
  Key key;
};

// `spec` for `target`, which its own target is set to. Validates the spec (names, constants
// against its kernel's schema, options, target), reads the include closure and hashes
// everything that decides the compiled bytes.
Unit make_unit(KernelSpec spec, const Target& target, const SourceTree& sources,
               const Compiler& compiler);

// The generated translation unit for `spec`: includes, a `kiln_spec` struct of constants, and a
// static_assert that the Params layout matches the host's.
std::string render_source(const KernelSpec& spec, const ParamsLayout& params);

// XXH3-128 over the fields of `unit` that decide the binary (README, "Cache key").
Key compute_key(const Unit& unit);

}  // namespace kiln::detail
