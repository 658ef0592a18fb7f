# SPDX-License-Identifier: Apache-2.0
"""kiln: attention kernels compiled at run time (NVRTC / hipRTC), called from PyTorch with
FlashAttention's names, as torch custom ops that torch.compile and CUDA graphs accept.

    import kiln
    out = kiln.flash_attn_func(q, k, v, causal=True)

`import kiln` needs no torch (the version and the C API's binding load without it); the calls
import torch on first use.
"""
from ._capi import KilnError, KilnNotImplementedError, KilnTypeError, KilnValueError
from ._capi import version as _library_version
from .variant import Variant

# libkiln's kiln_version(), which CMakeLists.txt's project version sets, as does the wheel's.
__version__ = _library_version()

# The calls, from kiln.interface, which imports torch (and registers kiln's ops) on first use.
_TORCH_NAMES = ("flash_attn_func", "flash_attn_varlen_func", "flash_attn_qkvpacked_func",
                "flash_attn_kvpacked_func", "flash_attn_varlen_qkvpacked_func",
                "flash_attn_varlen_kvpacked_func", "flash_attn_with_kvcache", "merge_states",
                "warmup", "info")
__all__ = ["KilnError", "KilnValueError", "KilnTypeError", "KilnNotImplementedError", "Variant",
           "__version__", *_TORCH_NAMES]


def __getattr__(name):
    if name in _TORCH_NAMES:
        try:
            from . import interface
        except ModuleNotFoundError as e:
            if e.name != "torch":
                raise
            raise ImportError(f"kiln.{name} needs PyTorch, which is not installed: "
                              f"pip install 'torch>=2.4'") from e
        value = getattr(interface, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'kiln' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_TORCH_NAMES))
