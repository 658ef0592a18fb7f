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
# DLPack 1.1's kDLFloat8_e4m3fn and kDLFloat8_e5m2 (fp8 k and v, and KV caches).
KDL_FLOAT8_E4M3FN, KDL_FLOAT8_E5M2 = 10, 12

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
# kiln.h's structs, each described once, field for field in the header's order: the ctypes
# Structures, the struct formats that fill one in a single pack_into, and the values *_init
# gives are all made from these descriptions (python/tests/test_capi.py compiles kiln.h to check
# every field's offset and size, and the library's *_init against the defaults).

def _code(kind):
    """The '=' struct code of a ctypes scalar: its float, or an integer of its size (unsigned for
    pointers)."""
    kind_code = getattr(kind, "_type_", None)
    if kind_code in ("f", "d"):
        return kind_code
    code = {1: "b", 2: "h", 4: "i", 8: "q"}[ctypes.sizeof(kind)]
    return code if kind_code in ("b", "h", "i", "l", "q") else code.upper()


def _scalars(kind, at=0):
    """[(offset, struct code)] of each scalar of a ctypes type at `at`: an array's elements and a
    nested struct's fields each."""
    if issubclass(kind, ctypes.Structure):
        return [scalar for name, field in kind._fields_
                for scalar in _scalars(field, at + getattr(kind, name).offset)]
    if issubclass(kind, ctypes.Array):
        step = ctypes.sizeof(kind._type_)
        return [scalar for i in range(kind._length_)
                for scalar in _scalars(kind._type_, at + i * step)]
    return [(at, _code(kind))]


def _layout_format(ctype):
    """ctype's layout as a struct format: '=' with a pad ('x') wherever ctypes pads, so that one
    pack_into fills the struct as C lays it out."""
    parts, at = [], 0
    # The struct's end comes last, an empty code, so that a padded tail gets its pad too.
    for offset, code in _scalars(ctype) + [(ctypes.sizeof(ctype), "")]:
        if offset > at:
            parts.append(f"{offset - at}x")
        parts.append(code)
        at = offset + struct.calcsize("=" + code)
    return "=" + "".join(parts)


def _flat_defaults(fields):
    """The defaults of described fields, in the packer's order."""
    values = []
    for _, kind, default in fields:
        if isinstance(default, tuple):
            values += default
        else:
            values += [default] * getattr(kind, "_length_", 1)
    return tuple(values)


def _struct(c_name, name, fields):
    """The ctypes Structure of kiln.h's struct `c_name`, described by `fields`: (field, ctype,
    default) after its struct_size, a nested struct's default being its .defaults. It has .c_name,
    .size (its sizeof), .packer (a struct.Struct of its layout) and .defaults: the values *_init
    gives it, in the packer's order (struct_size, then each field's, an array's elements and a
    nested struct's fields each)."""
    fields = (("struct_size", ctypes.c_size_t, None),) + tuple(fields)
    ctype = type(name, (ctypes.Structure,), {"_fields_": [(f, kind) for f, kind, _ in fields]})
    ctype.c_name = c_name
    ctype.size = ctypes.sizeof(ctype)
    ctype.packer = struct.Struct(_layout_format(ctype))
    ctype.defaults = (ctype.size,) + _flat_defaults(fields[1:])
    return ctype


def _tensors(*names):
    """Described fields of DLTensor pointers, NULL by default."""
    return tuple((name, ctypes.c_void_p, 0) for name in names)


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


# A user variant's fields, at the end of the score.
VARIANT_SCALARS, VARIANT_TENSORS = 8, 4
_VARIANT_FIELDS = (
    ("variant_name", ctypes.c_void_p, 0),
    ("variant_code", ctypes.c_void_p, 0),
    ("variant_scalars", ctypes.c_float * VARIANT_SCALARS, 0.0),
    ("num_variant_tensors", ctypes.c_int, 0),
    ("variant_tensors", ctypes.c_void_p * VARIANT_TENSORS, 0),
)
NO_VARIANT = _flat_defaults(_VARIANT_FIELDS)

ScoreOptions = _struct("kiln_score_options", "ScoreOptions", (
    ("softmax_scale", ctypes.c_float, 0.0),
    ("causal", ctypes.c_int, 0),
    ("window_left", ctypes.c_int, -1),
    ("window_right", ctypes.c_int, -1),
    ("top_left", ctypes.c_int, 0),
    ("softcap", ctypes.c_float, 0.0),
    ("alibi_slopes", ctypes.c_void_p, 0),
    ("sinks", ctypes.c_void_p, 0),
) + _VARIANT_FIELDS)

AttentionOptions = _struct("kiln_attention_options", "AttentionOptions", (
    ("score", ScoreOptions, ScoreOptions.defaults),
    *_tensors("bias", "cu_seqlens_q", "cu_seqlens_k", "seqused_k"),
    ("max_seqlen_q", ctypes.c_int, 0),
    ("max_seqlen_k", ctypes.c_int, 0),
    *_tensors("k_descale", "v_descale", "q_descale"),
))

DecodeOptions = _struct("kiln_decode_options", "DecodeOptions", (
    ("score", ScoreOptions, ScoreOptions.defaults),
    *_tensors("k_new", "v_new", "rotary_cos", "rotary_sin"),
    ("rotary_interleaved", ctypes.c_int, 1),  # FlashAttention's default
    ("num_splits", ctypes.c_int, 0),
))

KVCache = _struct("kiln_kvcache", "KVCache",
                  _tensors("k", "v", "seqlens", "batch_idx", "block_table", "k_descale",
                           "v_descale", "k_token_descale", "v_token_descale"))

AttentionGradOptions = _struct("kiln_attention_grad_options", "AttentionGradOptions", (
    ("deterministic", ctypes.c_int, 0),
    *_tensors("dsinks", "dbias"),
))

# kiln_warmup_progress(user, done, total, spec, ms, ok)
WARMUP_PROGRESS = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t,
                                   ctypes.c_char_p, ctypes.c_double, ctypes.c_int)

WarmupOptions = _struct("kiln_warmup_options", "WarmupOptions", (
    ("target", ctypes.c_char_p, 0),
    ("threads", ctypes.c_int, 0),
    ("progress", WARMUP_PROGRESS, 0),
    ("progress_user", ctypes.c_void_p, 0),
))

# A tensor's slot holds its DLTensor, then room for MAX_RANK sizes, then MAX_RANK strides: the
# same offsets whatever its rank, so that only the format depends on the rank ('x' skips the
# unused sizes).
MAX_RANK = 4  # kiln::TensorView::max_rank
DLTENSOR = struct.Struct(_layout_format(DLTensor))
TENSOR_SLOT = DLTENSOR.size + 2 * 8 * MAX_RANK
TENSOR_PACKERS = [struct.Struct(f"{DLTENSOR.format}{n}q{8 * (MAX_RANK - n)}x{n}q").pack_into
                  for n in range(MAX_RANK + 1)]
# A row-major tensor goes without strides (a NULL strides pointer means compact in DLPack),
# which saves reading them from torch.
COMPACT_PACKERS = [struct.Struct(f"{DLTENSOR.format}{n}q").pack_into for n in range(MAX_RANK + 1)]

# Tensors one call passes at most (kiln_attention_with_kvcache: q, k, v, seqlens, batch_idx,
# block_table, out, alibi_slopes, k_new, v_new, rotary_cos, rotary_sin, lse, sinks, k_descale,
# v_descale, k_token_descale, v_token_descale, then the variant's, from VARIANT_SLOT on), and
# kiln_attention_backward's own (dout, dq, dk, dv, dsinks, dbias), from BACKWARD_SLOT on, past the
# forward's. kiln_attention's q_descale takes slot 16, which it does not otherwise use.
VARIANT_SLOT = 18
BACKWARD_SLOT = VARIANT_SLOT + VARIANT_TENSORS
MAX_TENSORS = BACKWARD_SLOT + 6
_OPTIONS_AT = TENSOR_SLOT * MAX_TENSORS
_CACHE_AT = _OPTIONS_AT + max(AttentionOptions.size, DecodeOptions.size)
_GRADS_AT = _CACHE_AT + KVCache.size
_SCRATCH_SIZE = _GRADS_AT + AttentionGradOptions.size


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
        self.grads = self.base + _GRADS_AT
        self.slots = []
        for i in range(MAX_TENSORS):
            address = self.base + i * TENSOR_SLOT
            sizes = address + DLTENSOR.size
            self.slots.append((i * TENSOR_SLOT, address, sizes, sizes + 8 * MAX_RANK))


scratch = Scratch()


def _options_packer(ctype):
    """pack(score, *fields), which writes options struct `ctype` into this thread's block and
    returns its address: `score` holds the score's fields after its struct_size (its variant's
    last) and `fields` the struct's own, each in the header's order, flattened as .defaults."""
    pack_into, size, score_size = ctype.packer.pack_into, ctype.size, ScoreOptions.size

    # NOTE: one tuple and one pack_into a call, which costs no more than the flat structs did.
    def pack(score, *fields):
        s = scratch
        pack_into(s.buffer, _OPTIONS_AT, size, score_size, *score, *fields)
        return s.options
    return pack


pack_attention_options = _options_packer(AttentionOptions)
pack_decode_options = _options_packer(DecodeOptions)
_pack_cache = KVCache.packer.pack_into
_pack_grads = AttentionGradOptions.packer.pack_into


@functools.lru_cache(maxsize=64)
def c_string(text):
    """A NUL-terminated copy of `text` that stays put while it is referenced: a variant's name or
    code, kept across calls so that each call does not encode it again."""
    return ctypes.create_string_buffer(text.encode())


def pack_cache(k, v, seqlens, batch_idx, block_table, k_descale, v_descale, k_token_descale,
               v_token_descale):
    """Writes kiln_kvcache into this thread's block; returns its address."""
    s = scratch
    _pack_cache(s.buffer, _CACHE_AT, KVCache.size, k, v, seqlens, batch_idx, block_table,
                k_descale, v_descale, k_token_descale, v_token_descale)
    return s.cache


def pack_grad_options(deterministic, dsinks, dbias):
    """Writes kiln_attention_grad_options into this thread's block; returns its address."""
    s = scratch
    _pack_grads(s.buffer, _GRADS_AT, AttentionGradOptions.size, deterministic, dsinks, dbias)
    return s.grads


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
            ("kiln_attention_backward", [p] * 12, i),
            ("kiln_attention_grad_options_init_sized", [p, ctypes.c_size_t], None),
            ("kiln_attention_with_kvcache", [p] * 6, i),
            ("kiln_merge_states", [p] * 7, i),
            ("kiln_merge_states_many", [p] * 5, i),
            ("kiln_warmup", [i, ctypes.c_char_p, i], i),
            ("kiln_warmup_with", [i, p], i),
            ("kiln_warmup_options_init_sized", [p, ctypes.c_size_t], None),
            ("kiln_last_error", [], ctypes.c_char_p),
            ("kiln_attention_options_init_sized", [p, ctypes.c_size_t, ctypes.c_size_t], None),
            ("kiln_decode_options_init_sized", [p, ctypes.c_size_t, ctypes.c_size_t], None),
            ("kiln_kvcache_init_sized", [p, ctypes.c_size_t], None)):
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, result
    return path, lib


path, lib = _load()
attention = lib.kiln_attention
attention_backward = lib.kiln_attention_backward
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
