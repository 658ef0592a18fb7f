# SPDX-License-Identifier: Apache-2.0
"""kiln.Variant: attention hooks written by their user as device code (CUDA C++, or HIP on AMD),
compiled into the call's kernels at run time; the C++ kiln::Variant (include/kiln/variant.hpp)
documents the hooks and their coordinates. Needs no torch."""
import dataclasses
import re

from ._capi import KILN_ERROR_INVALID_ARGUMENT, KilnTypeError, KilnValueError

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclasses.dataclass(frozen=True)
class Variant:
    """name: a C++ identifier, naming the variant in kernel specs and compile errors. code:
    device code that defines `struct kiln_variant` with any of its hooks, static __device__
    functions:

        float logit(const kiln::VariantParams& v, const kiln::VariantCoords& at, float logit)
        bool mask(const kiln::VariantParams& v, const kiln::VariantCoords& at)
        float sink(const kiln::VariantParams& v, const kiln::VariantCoords& at, float sink)

    logit returns each logit the softmax sees (-inf masks the key); mask returns whether query
    at.query sees key at.key; sink returns a row's sink logit. v.scalars and v.tensors are the
    call's variant_scalars and variant_tensors (kiln::variant_load<T>(v.tensors[i], ...) reads
    one, each index clamped into its dimension: logit and mask also see coordinates past the
    sequence's end in a tile's overhang, their result discarded); `at` holds batch, head, head_kv, query, key and offset (query row i sits at key
    position i + offset). A kiln_variant with data members and a static __device__
    `kiln_variant row(v, at)` is made once per row and its hooks (then const members) are called
    on it: what a row's logits share is read once. The code is part of the kernels' cache key: a
    new code compiles new kernels, new scalars or tensors do not. A compile error names
    "variant NAME" and the line.
    """
    name: str
    code: str

    def __post_init__(self):
        for field in ("name", "code"):
            if not isinstance(getattr(self, field), str):
                raise KilnTypeError(KILN_ERROR_INVALID_ARGUMENT,
                                    f"Variant {field} {getattr(self, field)!r} is a "
                                    f"{type(getattr(self, field)).__name__}: pass a str")
        if not _IDENTIFIER.fullmatch(self.name):
            raise KilnValueError(KILN_ERROR_INVALID_ARGUMENT,
                                 f"Variant name {self.name!r} must be a C++ identifier, such as "
                                 f"'alibi'")
        if not self.code.strip():
            raise KilnValueError(KILN_ERROR_INVALID_ARGUMENT,
                                 f"Variant {self.name!r} has no code: give it the struct "
                                 f"kiln_variant its hooks live in")
        if "\0" in self.code:
            raise KilnValueError(KILN_ERROR_INVALID_ARGUMENT,
                                 f"Variant {self.name!r} has a NUL character in its code, at "
                                 f"offset {self.code.index(chr(0))}, where C would end it: "
                                 f"remove it")
