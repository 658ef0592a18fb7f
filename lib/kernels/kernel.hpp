// SPDX-License-Identifier: Apache-2.0
// What every one of kiln's kernels says of itself, whatever its family: its source, entry and
// Params, the constants its template reads, and the shared memory a spec of it launches with;
// and what the descriptions share with the ops: refusals, limits, a variant put into a spec.
// Each family's description (kernels/attention.hpp, decode.hpp, elementwise.hpp) holds one per
// kernel; the registry (params/registry.cpp) lists them.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/error.hpp"
#include "kiln/runtime.hpp"
#include "kiln/spec.hpp"
#include "kiln/target.hpp"
#include "kiln/variant.hpp"

namespace kiln::detail {

// The largest head dim kiln compiles.
constexpr int kMaxHeadDim = 256;

// Refusals as kiln::Error (invalid_argument, unsupported): the descriptions' of configs and
// targets, and the ops' of calls.
[[noreturn]] void invalid(const std::string& message);
[[noreturn]] void unsupported(const std::string& message);

// Kernels that move registers between their warpgroups (setmaxnreg: the tma forward, the wgmma
// backward's dk/dv) claim a count of registers a CTA, `least` a thread over its threads
// (attention_forward_tma_least_registers, attention_backward_wgmma_least_registers), which ptxas
// gives them under their launch bounds; a build with fewer would leave setmaxnreg.inc waiting
// forever. Throws kiln::Error (unsupported) for such a kernel (`info`) built with fewer, naming
// `instead`, the kernel to use; a count not known (-1) passes.
void require_launch_registers(const KernelInfo& info, int least, std::string_view instead);

// Whether `target` is an NVIDIA one with bf16 tensor cores: sm_80 or newer.
bool is_sm80_or_newer(const Target& target);

// Puts `variant` (null: none) into an attention kernel's spec, prefill or decode.
void set_variant(KernelSpec& spec, const Variant* variant);

// The dtypes of an attention kernel's operands: q; k and v (the KV cache in decode); out. Each
// attention family lists the combinations its kernels take in a table of them (kernels/
// attention.cpp, kernels/decode.cpp), which calls and specs (the constants dtype_q, dtype_kv and
// dtype_out) are checked against.
struct OperandDTypes {
  DType q;
  DType kv;
  DType out;
};

// The operand dtypes of the kernels that widen fp8 K and V to q's type as they read them (the
// prefill mma kernel, decode): one dtype, bf16 or f16, for all three, or e4m3 or e5m2 K and V
// under a 16-bit q (sm_89 and newer).
inline constexpr OperandDTypes kWideningOperandDTypes[] = {
    {DType::bf16, DType::bf16, DType::bf16}, {DType::f16, DType::f16, DType::f16},
    {DType::bf16, DType::e4m3, DType::bf16}, {DType::f16, DType::e4m3, DType::f16},
    {DType::bf16, DType::e5m2, DType::bf16}, {DType::f16, DType::e5m2, DType::f16},
};

// An operand of a call or a spec as messages name it ("k", "cache.v", "dtype_q"), and its
// dtype.
struct NamedDType {
  std::string_view name;
  DType dtype;
};

// Why `q`, `kv` (one dtype for all of them: k and v, the cache, the appended keys) and `out`
// make no row of `rows`, as the kiln::Error to throw: unsupported for a q dtype no row has,
// invalid_argument naming the first operand that no row takes with the ones before it; nullopt
// when they make one. An empty `kv`, or no `out`, matches any row. `what` names the op or kernel
// in the message ("attention").
std::optional<Error> operand_dtypes_error(std::string_view what,
                                          std::span<const OperandDTypes> rows, NamedDType q,
                                          std::span<const NamedDType> kv,
                                          std::optional<NamedDType> out);

// Whether `target` has the conversions fp8 K and V are read with: NVIDIA sm_89 and newer.
bool reads_fp8(const Target& target);

// The rows of kWideningOperandDTypes the default warm sets compile for `target`: the 16-bit ones,
// and e4m3 (the common fp8) where the target reads fp8; e5m2 compiles on first use.
std::vector<OperandDTypes> warmed_widening_dtypes(const Target& target);

// An fp8 K/V's conditions (kiln::Error, unsupported): with a target, one that reads_fp8, checked
// first; head dims multiples of 16, whose rows copy as whole 16-byte pieces of fp8. `what` names
// the K/V in messages ("KV cache", "K/V").
void require_fp8_kv(DType kv, int head_dim, int head_dim_v, const Target* target,
                    std::string_view what);

enum class ConstantKind { integer, boolean, dtype };

struct ConstantSchema {
  std::string_view name;
  ConstantKind kind;
  // An integer constant that is an enumeration takes 0 to `values` - 1, which `value_name`
  // names; 0: any integer.
  std::int64_t values = 0;
  std::string_view (*value_name)(std::int64_t value) = nullptr;
};

struct KernelSchema {
  std::string_view source;                    // "elementwise/unary.cuh", under kernels_src
  std::string_view entry;                     // "kiln::unary"
  std::string_view params;                    // "kiln::UnaryParams"
  std::span<const ConstantSchema> constants;  // every one required, no other allowed
  // The dynamic shared memory its launch asks for, in bytes, from a spec that passed
  // check_schema(): for specs that arrive as text (kiln compile, manifests, the C API), parsed
  // once into the family's typed config. The launches compute it from their config instead.
  long long (*shared_bytes)(const KernelSpec& spec);
  // The operand dtypes it takes, of its constants dtype_q, dtype_kv and dtype_out (those it
  // has); empty for kernels without them.
  std::span<const OperandDTypes> operand_dtypes = {};
};

// A spec of `schema`'s kernel, without constants: its family sets them.
KernelSpec spec_of(const KernelSchema& schema);

// Whether `schema`'s kernel reads the constant `name`.
bool takes(const KernelSchema& schema, std::string_view name);

// The value of the integer constant `name` of a spec that passed check_schema(), for the
// families' parsers of specs that arrive as text.
long long integer_constant(const KernelSpec& spec, std::string_view name);
// Likewise for a dtype constant, and a boolean one.
DType dtype_constant(const KernelSpec& spec, std::string_view name);
bool boolean_constant(const KernelSpec& spec, std::string_view name);

// The bytes of an element of `dtype`, as the shared-memory formulas (kiln/params) take them.
long long element_bytes(DType dtype);

long long no_shared_memory(const KernelSpec& spec);

// A kernel whose CTA is the same for every spec: threads fixed by its __launch_bounds__, no
// dynamic shared memory (decode_append, merge_states_kernel, the backward's row dots).
struct FixedKernel {
  KernelSchema schema;
  int threads;
};

// One kernel launch as its family plans it from (problem, config) through the kernel's
// description: the spec to compile and the CTA the kernel declares. The launch reads it, and the
// call checks it against the device before anything is compiled.
struct LaunchPlan {
  KernelSpec spec;
  int threads = 0;             // per CTA
  long long shared_bytes = 0;  // dynamic shared memory per CTA
};

// What of `plan` `device` cannot run, as "N threads per CTA, but device D (NAME) runs at most
// M"; nullopt when it fits, or where the driver did not report the limit. A couple of compares
// when it fits: the hot path asks before each launch.
std::optional<std::string> exceeded_limit(const LaunchPlan& plan, const DeviceInfo& device);

}  // namespace kiln::detail
