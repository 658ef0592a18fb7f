# SPDX-License-Identifier: Apache-2.0
"""kiln's C API (include/kiln/kiln.h) through ctypes: the loaded libkiln, its structs' layouts and
a per-thread scratch block into which each call packs its DLTensors and options.

Why ctypes and not a compiled extension (nanobind): measured with python/bench_host.py (CPU
thread time on a loaded 2-core VM, Python 3.11, torch 2.15), describing one torch tensor to
kiln costs 1.0 us here (reading data_ptr, shape, strides, device and dtype from torch is about
half of it, then one struct.pack_into), while nanobind's nb::ndarray caster imports a torch
tensor through its __dlpack__ method, 2.3 us alone; a ctypes call costs 0.1 us. From the Python
call to kiln's return, a decode step with an append (7 tensors) costs 15 us here, 12 us without
the append, 11 us for flash_attn_func; through torch's dispatcher (a custom op) the decode step
would cost 27 us, so eager calls skip it (kiln.ops). And libkiln links neither torch nor CUDA: a
wheel with no extension module serves every Python, torch and CUDA version, which an extension
bound to torch's C++ ABI (the only way below torch's Python-level attribute costs) would not.

Nothing here imports torch: tensors arrive as (data, device_type, device_id, dtype code, bits,
shape, strides), so the C layout can be tested and used without it.
"""
import ctypes
import functools
import os
import struct
import threading

# DLPack's enums (dlpack.h): device types and dtype codes.
KDL_CPU, KDL_CUDA, KDL_ROCM = 1, 2, 10
KDL_INT, KDL_FLOAT, KDL_BFLOAT = 0, 2, 4

# kiln_status (kiln.h).
STATUS_NAMES = (
    "KILN_OK", "KILN_ERROR_INVALID_ARGUMENT", "KILN_ERROR_UNSUPPORTED", "KILN_ERROR_COMPILE",
    "KILN_ERROR_DRIVER", "KILN_ERROR_CACHE", "KILN_ERROR_NOT_FOUND", "KILN_ERROR_INTERNAL",
)
KILN_OK, KILN_ERROR_INVALID_ARGUMENT, KILN_ERROR_UNSUPPORTED = 0, 1, 2
KILN_ERROR_NOT_FOUND = 6


class KilnError(Exception):
    """A call kiln refused or could not run: .status is the kiln_status code (kiln.h), .message
    kiln's own message, which names the value at fault and the fix."""

    def __init__(self, status, message):
        self.status = status
        self.message = message
        name = STATUS_NAMES[status] if 0 <= status < len(STATUS_NAMES) else f"status {status}"
        super().__init__(f"{name}: {message}")


class KilnValueError(KilnError, ValueError):
    """A KilnError for an input kiln cannot take (KILN_ERROR_INVALID_ARGUMENT) or cannot run
    (KILN_ERROR_UNSUPPORTED: a dtype, head dim or feature it lacks), whether kiln or the Python
    calls found it: also a ValueError, as Python's bad arguments are."""


class KilnTypeError(KilnValueError, TypeError):
    """A KilnValueError for an argument of the wrong type (a list where a tensor goes, a string
    where a number does): also a TypeError, as Python's are."""


class KilnNotImplementedError(KilnError, NotImplementedError):
    """A KilnError for what kiln does not do yet (KILN_ERROR_UNSUPPORTED), such as a backward
    pass: also a NotImplementedError."""


def error(status, message):
    """The exception for `status`: a KilnValueError for input kiln cannot take or run, else a
    KilnError."""
    bad_input = status in (KILN_ERROR_INVALID_ARGUMENT, KILN_ERROR_UNSUPPORTED)
    return (KilnValueError if bad_input else KilnError)(status, message)


# --- layouts ---------------------------------------------------------------------------------
# ctypes mirrors of kiln.h's structs, field for field: the reference for the packed layouts
# below (python/tests/test_capi.py checks that they agree) and for the *_init_sized sizes.

class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


_SCORE_FIELDS = [
    ("struct_size", ctypes.c_size_t),
    ("softmax_scale", ctypes.c_float),
    ("causal", ctypes.c_int),
    ("window_left", ctypes.c_int),
    ("window_right", ctypes.c_int),
    ("top_left", ctypes.c_int),
    ("softcap", ctypes.c_float),
    ("alibi_slopes", ctypes.c_void_p),
]

# A user variant's fields, at the end of both options structs.
VARIANT_SCALARS, VARIANT_TENSORS = 8, 4
_VARIANT_FIELDS = [
    ("variant_name", ctypes.c_void_p),
    ("variant_code", ctypes.c_void_p),
    ("variant_scalars", ctypes.c_float * VARIANT_SCALARS),
    ("num_variant_tensors", ctypes.c_int),
    ("variant_tensors", ctypes.c_void_p * VARIANT_TENSORS),
]


class AttentionOptions(ctypes.Structure):
    _fields_ = _SCORE_FIELDS + [
        ("bias", ctypes.c_void_p),
        ("cu_seqlens_q", ctypes.c_void_p),
        ("cu_seqlens_k", ctypes.c_void_p),
        ("seqused_k", ctypes.c_void_p),
        ("max_seqlen_q", ctypes.c_int),
        ("max_seqlen_k", ctypes.c_int),
        ("sinks", ctypes.c_void_p),
    ] + _VARIANT_FIELDS


class DecodeOptions(ctypes.Structure):
    _fields_ = _SCORE_FIELDS + [
        ("k_new", ctypes.c_void_p),
        ("v_new", ctypes.c_void_p),
        ("rotary_cos", ctypes.c_void_p),
        ("rotary_sin", ctypes.c_void_p),
        ("rotary_interleaved", ctypes.c_int),
        ("num_splits", ctypes.c_int),
        ("sinks", ctypes.c_void_p),
    ] + _VARIANT_FIELDS


class KVCache(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t)] + [
        (name, ctypes.c_void_p) for name in ("k", "v", "seqlens", "batch_idx", "block_table")]


# kiln_warmup_progress(user, done, total, spec, ms, ok)
WARMUP_PROGRESS = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t,
                                   ctypes.c_char_p, ctypes.c_double, ctypes.c_int)


class WarmupOptions(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("target", ctypes.c_char_p),
                ("threads", ctypes.c_int), ("progress", WARMUP_PROGRESS),
                ("progress_user", ctypes.c_void_p)]


# The same layouts as struct formats (x86-64 and aarch64 Linux: no padding is needed, as the
# test checks), so that one pack_into fills a whole struct. A tensor's slot holds its DLTensor,
# then room for MAX_RANK sizes, then MAX_RANK strides: the same offsets whatever its rank, so
# that only the format depends on the rank ('x' skips the unused sizes).
MAX_RANK = 4  # kiln::TensorView::max_rank
DLTENSOR = struct.Struct("=QiiiBBHQQQ")
TENSOR_SLOT = DLTENSOR.size + 2 * 8 * MAX_RANK
TENSOR_PACKERS = [struct.Struct(f"{DLTENSOR.format}{n}q{8 * (MAX_RANK - n)}x{n}q").pack_into
                  for n in range(MAX_RANK + 1)]
# A row-major tensor goes without strides (a NULL strides pointer means compact in DLPack),
# which saves reading them from torch.
COMPACT_PACKERS = [struct.Struct(f"{DLTENSOR.format}{n}q").pack_into for n in range(MAX_RANK + 1)]
# kiln_attention_options and kiln_decode_options have the same field types in the same order.
OPTIONS = struct.Struct("=QfiiiifQQQQQiiQQQ8fi4x4Q")
KVCACHE = struct.Struct("=QQQQQQ")
ATTENTION_OPTIONS_SIZE = ctypes.sizeof(AttentionOptions)
DECODE_OPTIONS_SIZE = ctypes.sizeof(DecodeOptions)
KVCACHE_SIZE = ctypes.sizeof(KVCache)

# Tensors one call passes at most (kiln_attention_with_kvcache: q, k, v, seqlens, batch_idx,
# block_table, out, alibi_slopes, k_new, v_new, rotary_cos, rotary_sin, lse, sinks, then the
# variant's, from VARIANT_SLOT on).
VARIANT_SLOT = 14
MAX_TENSORS = VARIANT_SLOT + VARIANT_TENSORS
_OPTIONS_AT = TENSOR_SLOT * MAX_TENSORS
_CACHE_AT = _OPTIONS_AT + OPTIONS.size
_SCRATCH_SIZE = _CACHE_AT + KVCACHE.size


class Scratch(threading.local):
    """This thread's block for one call's structs: kiln reads them during the call only, so each
    call reuses it, and no Python object per tensor is made. slots[i]: (offset, address, sizes'
    address, strides' address) of tensor slot i (0 to MAX_TENSORS - 1), which
    TENSOR_PACKERS[rank] and COMPACT_PACKERS[rank] fill (kiln.ops._tensor)."""

    def __init__(self):
        self.buffer = ctypes.create_string_buffer(_SCRATCH_SIZE)
        self.base = ctypes.addressof(self.buffer)
        self.options = self.base + _OPTIONS_AT
        self.cache = self.base + _CACHE_AT
        self.slots = []
        for i in range(MAX_TENSORS):
            address = self.base + i * TENSOR_SLOT
            sizes = address + DLTENSOR.size
            self.slots.append((i * TENSOR_SLOT, address, sizes, sizes + 8 * MAX_RANK))


scratch = Scratch()


NO_VARIANT = (0, 0) + (0.0,) * VARIANT_SCALARS + (0,) * (1 + VARIANT_TENSORS)


def pack_options(size, scale, causal, window_left, window_right, top_left, softcap, alibi,
                 p0, p1, p2, p3, i0, i1, sinks, variant=NO_VARIANT):
    """Writes kiln_attention_options (p0..p3: bias, cu_seqlens_q, cu_seqlens_k, seqused_k; i0, i1:
    max_seqlen_q, max_seqlen_k) or kiln_decode_options (k_new, v_new, rotary_cos, rotary_sin;
    rotary_interleaved, num_splits), then sinks and the variant's fields (name and code
    addresses, the scalars, the tensor count and addresses), into this thread's block; returns
    its address."""
    s = scratch
    OPTIONS.pack_into(s.buffer, _OPTIONS_AT, size, scale, causal, window_left, window_right,
                      top_left, softcap, alibi, p0, p1, p2, p3, i0, i1, sinks, *variant)
    return s.options


@functools.lru_cache(maxsize=64)
def c_string(text):
    """A NUL-terminated copy of `text` that stays put while it is referenced: a variant's name or
    code, kept across calls so that each call does not encode it again."""
    return ctypes.create_string_buffer(text.encode())


def pack_cache(k, v, seqlens, batch_idx, block_table):
    """Writes kiln_kvcache into this thread's block; returns its address."""
    s = scratch
    KVCACHE.pack_into(s.buffer, _CACHE_AT, KVCACHE_SIZE, k, v, seqlens, batch_idx, block_table)
    return s.cache


# --- the library -------------------------------------------------------------------------------

def library_path():
    """libkiln.so in this package's directory, or $KILN_LIB (a build tree's library) if set."""
    return os.environ.get("KILN_LIB") or os.path.join(os.path.dirname(__file__), "libkiln.so")


def _load():
    path = library_path()
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        raise ImportError(f"kiln: cannot load libkiln from {path!r} ({e}): reinstall the package "
                          f"(pip install .), or set KILN_LIB to a built libkiln.so") from e
    p, i = ctypes.c_void_p, ctypes.c_int
    # Every pointer is passed as an int address: the cheapest argument ctypes converts.
    for name, args, result in (
            ("kiln_version", [], i),
            ("kiln_attention", [p] * 7, i),
            ("kiln_attention_with_kvcache", [p] * 6, i),
            ("kiln_merge_states", [p] * 7, i),
            ("kiln_merge_states_many", [p] * 5, i),
            ("kiln_warmup", [i, ctypes.c_char_p, i], i),
            ("kiln_warmup_with", [i, p], i),
            ("kiln_warmup_options_init_sized", [p, ctypes.c_size_t], None),
            ("kiln_last_error", [], ctypes.c_char_p),
            ("kiln_attention_options_init_sized", [p, ctypes.c_size_t], None),
            ("kiln_decode_options_init_sized", [p, ctypes.c_size_t], None),
            ("kiln_kvcache_init_sized", [p, ctypes.c_size_t], None)):
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, result
    return path, lib


path, lib = _load()
attention = lib.kiln_attention
attention_with_kvcache = lib.kiln_attention_with_kvcache
merge_states = lib.kiln_merge_states
merge_states_many = lib.kiln_merge_states_many


def last_error():
    """This thread's message for kiln's last failed call."""
    return (lib.kiln_last_error() or b"").decode("utf-8", "replace")


def check(status):
    """Raises the KilnError of a nonzero kiln_status, with kiln's message."""
    if status:
        raise error(status, last_error())


def version():
    """libkiln's version as "MAJOR.MINOR.PATCH", from kiln_version()."""
    number = lib.kiln_version()
    return f"{number // 10000}.{number // 100 % 100}.{number % 100}"


def build_id():
    """The commit libkiln was built from, from kiln_build_id() ("unknown" outside a checkout);
    a libkiln from before kiln_build_id says so."""
    if not hasattr(lib, "kiln_build_id"):
        return "unknown: this libkiln predates kiln_build_id"
    lib.kiln_build_id.restype = ctypes.c_char_p
    return lib.kiln_build_id().decode("utf-8", "replace")


def warmup(device, target, threads, progress=None):
    """kiln_warmup_with; progress(done, total), if given, after each kernel."""
    options = WarmupOptions()
    lib.kiln_warmup_options_init_sized(ctypes.addressof(options), ctypes.sizeof(options))
    options.target = target.encode() if target else None
    options.threads = threads
    if progress is not None:
        # NOTE: kept in `options` for the whole call, so it is not collected while kiln holds it.
        options.progress = WARMUP_PROGRESS(lambda user, done, total, spec, ms, ok:
                                           progress(done, total))
    check(lib.kiln_warmup_with(device, ctypes.addressof(options)))
