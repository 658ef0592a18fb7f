"""A small ctypes binding to kiln's C API (include/kiln/kiln.h), for use next to torch.

    from kiln_ctypes import Kiln
    kiln = Kiln()                      # libkiln.so from $KILN_LIB, else ./build
    kiln.attention(q, k, v, out, causal=True)
    kiln.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, out, block_table=table)
    kiln.merge_states(v_a, s_a, v_b, s_b, v_out, s_out)

Tensors go in as DLPack 0.6 DLTensors that point at the torch tensors' own memory: no copy is
made, so any strided view (a transpose, a slice of packed QKV) reaches kiln as it is. torch is
imported only when a torch tensor is converted, so the struct layout can be tested without it.
"""
import ctypes
import glob
import os

# DLPack 0.6 (/usr/include/dlpack/dlpack.h): enum values.
KDL_CPU, KDL_CUDA, KDL_ROCM = 1, 2, 10
KDL_INT, KDL_FLOAT, KDL_BFLOAT = 0, 2, 4

# kiln_status (kiln.h), for messages and for callers that test a specific failure.
STATUS_NAMES = {
    0: "KILN_OK", 1: "KILN_ERROR_INVALID_ARGUMENT", 2: "KILN_ERROR_UNSUPPORTED",
    3: "KILN_ERROR_COMPILE", 4: "KILN_ERROR_DRIVER", 5: "KILN_ERROR_CACHE",
    6: "KILN_ERROR_NOT_FOUND", 7: "KILN_ERROR_INTERNAL",
}
KILN_OK, KILN_ERROR_INVALID_ARGUMENT, KILN_ERROR_UNSUPPORTED = 0, 1, 2


class DLDevice(ctypes.Structure):
    # device_type is a C enum: int-sized on every ABI kiln targets.
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


TENSOR_PTR = ctypes.POINTER(DLTensor)  # a struct field that takes a tensor (NULL: none)

# The first field of every kiln.h struct: its size, which the *_init_sized functions set from
# ctypes.sizeof of these mirrors, so the library reads (and writes) only what they hold.
STRUCT_SIZE_FIELD = ("struct_size", ctypes.c_size_t)

# The fields kiln_attention_options and kiln_decode_options both start with, in kiln.h's order.
SHARED_OPTION_FIELDS = [
    STRUCT_SIZE_FIELD,
    ("softmax_scale", ctypes.c_float),
    ("causal", ctypes.c_int),
    ("window_left", ctypes.c_int),
    ("window_right", ctypes.c_int),
    ("top_left", ctypes.c_int),
    ("softcap", ctypes.c_float),
    ("alibi_slopes", TENSOR_PTR),
]


class AttentionOptions(ctypes.Structure):
    """kiln_attention_options, field for field; fill it with Kiln.init."""
    c_name = "kiln_attention_options"
    _fields_ = SHARED_OPTION_FIELDS + [
        ("bias", TENSOR_PTR),
        ("cu_seqlens_q", TENSOR_PTR),
        ("cu_seqlens_k", TENSOR_PTR),
        ("seqused_k", TENSOR_PTR),
        ("max_seqlen_q", ctypes.c_int),
        ("max_seqlen_k", ctypes.c_int),
    ]


class KVCache(ctypes.Structure):
    """kiln_kvcache: contiguous, or paged when block_table is set; fill it with Kiln.init."""
    c_name = "kiln_kvcache"
    _fields_ = [STRUCT_SIZE_FIELD] + [
        (name, TENSOR_PTR) for name in ("k", "v", "seqlens", "batch_idx", "block_table")]


class DecodeOptions(ctypes.Structure):
    """kiln_decode_options, field for field; fill it with Kiln.init.

    rotary_interleaved defaults to 1 (GPT-J pairs), as flash_attn_with_kvcache's does."""
    c_name = "kiln_decode_options"
    _fields_ = SHARED_OPTION_FIELDS + [
        ("k_new", TENSOR_PTR),
        ("v_new", TENSOR_PTR),
        ("rotary_cos", TENSOR_PTR),
        ("rotary_sin", TENSOR_PTR),
        ("rotary_interleaved", ctypes.c_int),
        ("num_splits", ctypes.c_int),
    ]


class KilnError(RuntimeError):
    """A nonzero kiln_status; .status is the code, the message is kiln_last_error()."""

    def __init__(self, status, message):
        self.status = status
        super().__init__(f"{STATUS_NAMES.get(status, status)}: {message}")


class Tensor:
    """A DLTensor plus everything it points to, kept alive together.

    ctypes does not own what a POINTER field refers to: without this holder the shape and
    strides arrays (and the tensor whose memory `data` is) could be freed while kiln reads them.
    """

    def __init__(self, data_ptr, shape, strides, dtype, device, owner=None):
        ndim = len(shape)
        self.shape = (ctypes.c_int64 * ndim)(*shape)
        self.strides = (ctypes.c_int64 * ndim)(*strides) if strides is not None else None
        self.owner = owner
        self.dl = DLTensor()
        self.dl.data = data_ptr
        self.dl.device = DLDevice(*device)
        self.dl.ndim = ndim
        self.dl.dtype = DLDataType(dtype[0], dtype[1], 1)
        self.dl.shape = self.shape
        # A NULL strides pointer means compact row-major in DLPack.
        self.dl.strides = self.strides
        self.dl.byte_offset = 0  # data_ptr already includes any view offset

    @property
    def ref(self):
        return ctypes.byref(self.dl)


def torch_dtype_code(dtype):
    """(DLDataTypeCode, bits) of a torch dtype; kiln takes fp16/bf16 data, fp32 LSE/ALiBi, int32."""
    import torch
    table = {
        torch.float16: (KDL_FLOAT, 16),
        torch.bfloat16: (KDL_BFLOAT, 16),
        torch.float32: (KDL_FLOAT, 32),
        torch.int32: (KDL_INT, 32),
    }
    if dtype not in table:
        raise TypeError(f"kiln_ctypes: no DLPack mapping for {dtype}")
    return table[dtype]


def torch_device(device):
    """(DLDeviceType, device_id) of a torch device; ROCm builds of torch also call it 'cuda'."""
    import torch
    if device.type == "cuda":
        kind = KDL_ROCM if getattr(torch.version, "hip", None) else KDL_CUDA
        return kind, device.index if device.index is not None else torch.cuda.current_device()
    if device.type == "cpu":
        return KDL_CPU, 0
    raise TypeError(f"kiln_ctypes: no DLPack device for {device}")


def from_torch(t):
    """A Tensor viewing torch tensor t's memory: its data pointer, shape and element strides."""
    return Tensor(t.data_ptr(), tuple(t.shape), tuple(t.stride()), torch_dtype_code(t.dtype),
                  torch_device(t.device), owner=t)


def as_tensor(x):
    """Accepts a Tensor as it is (tests build them by hand) or converts a torch tensor."""
    return x if isinstance(x, Tensor) else from_torch(x)


def fill(struct, values):
    """Sets the fields of a ctypes struct from `values`: tensors (torch or Tensor) for the
    DLTensor pointer fields, numbers (bools too) for the rest; None leaves a field as it is.

    Returns the Tensors the struct now points to: keep them alive as long as the struct.
    """
    kinds = dict(struct._fields_)
    keep = []
    for name, value in values.items():
        if value is None:
            continue
        if name not in kinds:
            raise TypeError(f"{struct.c_name} has no field {name!r}")
        if kinds[name] is TENSOR_PTR:
            t = as_tensor(value)
            keep.append(t)
            setattr(struct, name, ctypes.pointer(t.dl))
        else:
            setattr(struct, name, int(value) if isinstance(value, bool) else value)
    return keep


def find_library(where=None):
    """Path of libkiln.so from `where` or $KILN_LIB: the .so itself or a build/install dir."""
    where = where or os.environ.get("KILN_LIB") or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "build")
    if os.path.isfile(where):
        return where
    # The build tree mirrors the install tree, so the library sits in <dir>/lib (or a
    # multiarch subdir of it); a dir holding the .so directly works too.
    for pattern in ("libkiln.so", "lib/libkiln.so", "lib64/libkiln.so", "lib/*/libkiln.so"):
        hits = sorted(glob.glob(os.path.join(where, pattern)))
        if hits:
            return hits[0]
    raise FileNotFoundError(f"kiln_ctypes: no libkiln.so in {where!r} (set KILN_LIB to the "
                            f"build dir or to the library)")


class Kiln:
    """The loaded library and typed wrappers of its C functions."""

    def __init__(self, where=None):
        self.path = find_library(where)
        self.lib = ctypes.CDLL(self.path)
        self._declare()

    def _declare(self):
        lib, ptr, stream = self.lib, TENSOR_PTR, ctypes.c_void_p
        lib.kiln_attention.argtypes = [ptr, ptr, ptr, ptr, ctypes.POINTER(AttentionOptions), ptr,
                                       stream]
        lib.kiln_attention.restype = ctypes.c_int
        lib.kiln_version.argtypes = []
        lib.kiln_version.restype = ctypes.c_int
        # kiln.h's *_init macros, as functions of the struct's size.
        for fn, struct in (("kiln_attention_options_init_sized", AttentionOptions),
                           ("kiln_decode_options_init_sized", DecodeOptions),
                           ("kiln_kvcache_init_sized", KVCache)):
            getattr(lib, fn).argtypes = [ctypes.POINTER(struct), ctypes.c_size_t]
            getattr(lib, fn).restype = None
        lib.kiln_attention_with_kvcache.argtypes = [ptr, ctypes.POINTER(KVCache), ptr,
                                                    ctypes.POINTER(DecodeOptions), ptr, stream]
        lib.kiln_attention_with_kvcache.restype = ctypes.c_int
        lib.kiln_merge_states.argtypes = [ptr] * 6 + [stream]
        lib.kiln_merge_states.restype = ctypes.c_int
        lib.kiln_merge_states_many.argtypes = [ptr] * 4 + [stream]
        lib.kiln_merge_states_many.restype = ctypes.c_int
        lib.kiln_warmup.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.kiln_warmup.restype = ctypes.c_int
        lib.kiln_last_error.argtypes = []
        lib.kiln_last_error.restype = ctypes.c_char_p

    def version(self):
        """kiln_version() of the loaded library: MAJOR * 10000 + MINOR * 100 + PATCH."""
        return self.lib.kiln_version()

    def init(self, struct):
        """A kiln.h struct filled with the library's defaults: kiln.h's *_init macro."""
        name = {AttentionOptions: "kiln_attention_options_init_sized",
                DecodeOptions: "kiln_decode_options_init_sized",
                KVCache: "kiln_kvcache_init_sized"}[struct]
        value = struct()
        getattr(self.lib, name)(ctypes.byref(value), ctypes.sizeof(struct))
        return value

    def last_error(self):
        msg = self.lib.kiln_last_error()
        return msg.decode("utf-8", "replace") if msg else ""

    def check(self, status):
        if status != KILN_OK:
            raise KilnError(status, self.last_error())

    def options(self, **kw):
        """kiln_attention_options from the library's defaults, with kw overriding fields.

        Returns (options, keep): keep holds the Tensors that the options point to.
        """
        opts = self.init(AttentionOptions)
        return opts, fill(opts, kw)

    def decode_options(self, **kw):
        """kiln_decode_options from the library's defaults, with kw overriding fields.

        Returns (options, keep) like options().
        """
        opts = self.init(DecodeOptions)
        return opts, fill(opts, kw)

    def bind_attention(self, q, k, v, out, lse=None, stream=None, **options):
        """A BoundCall of kiln_attention on these tensors, converted once, so that a timed call
        costs only the C call. stream: a CUstream as an int; None takes torch's current stream
        for q's device now, at bind time."""
        call = BoundCall(self, self.lib.kiln_attention, stream, q)
        opts = call.hold(*self.options(**options))
        call.args = [call.tensor(x) for x in (q, k, v, out)] + [opts, call.tensor(lse)]
        return call

    def attention(self, q, k, v, out, lse=None, stream=None, **options):
        """kiln_attention once: out (and lse if given) are written in place."""
        self.bind_attention(q, k, v, out, lse=lse, stream=stream, **options)()

    def bind_attention_with_kvcache(self, q, k_cache, v_cache, cache_seqlens, out, lse=None,
                                    cache_batch_idx=None, block_table=None, stream=None,
                                    **options):
        """A BoundCall of kiln_attention_with_kvcache (FlashAttention's flash_attn_with_kvcache
        arguments; options are kiln_decode_options fields: k_new, v_new, num_splits, ...)."""
        call = BoundCall(self, self.lib.kiln_attention_with_kvcache, stream, q)
        cache = self.init(KVCache)
        call.keep += fill(cache, {"k": k_cache, "v": v_cache, "seqlens": cache_seqlens,
                                  "batch_idx": cache_batch_idx, "block_table": block_table})
        cache_ref = call.hold(cache, [])
        opts = call.hold(*self.decode_options(**options))
        call.args = [call.tensor(q), cache_ref, call.tensor(out), opts, call.tensor(lse)]
        return call

    def attention_with_kvcache(self, q, k_cache, v_cache, cache_seqlens, out, **kw):
        """kiln_attention_with_kvcache once: out (and lse, the cache when appending) in place."""
        self.bind_attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, out, **kw)()

    def merge_states(self, v_a, s_a, v_b, s_b, v_out, s_out=None, stream=None):
        """kiln_merge_states once: v_out (and s_out if given) written in place."""
        call = BoundCall(self, self.lib.kiln_merge_states, stream, v_out)
        call.args = [call.tensor(x) for x in (v_a, s_a, v_b, s_b, v_out, s_out)]
        call()

    def merge_states_many(self, v, s, v_out, s_out=None, stream=None):
        """kiln_merge_states_many once: v (tokens, states, heads, d), s (tokens, states, heads)."""
        call = BoundCall(self, self.lib.kiln_merge_states_many, stream, v_out)
        call.args = [call.tensor(x) for x in (v, s, v_out, s_out)]
        call()

    def warmup_default(self, target=None, threads=0, device=0):
        self.check(self.lib.kiln_warmup(device, target.encode() if target else None, threads))


class BoundCall:
    """A kiln C function with its arguments built once; holds every object they point to.

    `args` are the arguments before the stream, which is appended: a CUstream as an int, or
    None for torch's current stream on `like`'s device at bind time.
    """

    def __init__(self, kiln, fn, stream, like):
        self.kiln, self.fn = kiln, fn
        self.stream = ctypes.c_void_p(current_stream_handle(like) if stream is None else stream)
        self.keep = []
        self.args = []

    def tensor(self, x):
        """The argument for an optional tensor: a DLTensor* (NULL for None)."""
        if x is None:
            return None
        t = as_tensor(x)
        self.keep.append(t)
        return t.ref

    def hold(self, struct, tensors):
        """The argument for a struct, kept alive with the tensors it points to."""
        self.keep += [struct] + tensors
        return ctypes.byref(struct)

    def __call__(self):
        self.kiln.check(self.fn(*self.args, self.stream))


def current_stream_handle(x):
    """torch's current CUDA stream for x's device as an int (0 for CPU tensors or none)."""
    if isinstance(x, Tensor) or getattr(x, "device", None) is None or x.device.type != "cuda":
        return 0
    import torch
    return torch.cuda.current_stream(x.device).cuda_stream
