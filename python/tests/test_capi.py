# SPDX-License-Identifier: Apache-2.0
"""The binding to kiln.h: packed layouts equal to the C structs' (as ctypes lays them out), the
sizes the library's *_init_sized functions accept, errors carrying kiln's status and message."""
import ctypes
import re

import pytest

import kiln
from kiln import _capi

from conftest import REPO


def test_version_is_the_libraries_and_the_cmake_projects():
    project = re.search(r"project\(kiln VERSION ([0-9.]+)", (REPO / "CMakeLists.txt").read_text())
    assert kiln.__version__ == project.group(1)
    number = _capi.lib.kiln_version()
    assert kiln.__version__ == f"{number // 10000}.{number // 100 % 100}.{number % 100}"


def offsets(ctype):
    """The offset of each field of a ctypes struct, an array's elements each."""
    out = []
    for name, kind in ctype._fields_:
        at = getattr(ctype, name).offset
        n = getattr(kind, "_length_", 1)
        out += [at + i * ctypes.sizeof(kind) // n for i in range(n)]
    return out


def packed_offsets(fmt):
    """The offset of each field of a struct format ('=' packing; 'x' pads are no field)."""
    import struct
    out, at = [], 0
    for count, code in re.findall(r"(\d*)([a-zA-Z?])", fmt.lstrip("=")):
        if code == "x":
            at += int(count or 1)
            continue
        for _ in range(int(count or 1)):
            out.append(at)
            at += struct.calcsize("=" + code)
    return out


@pytest.mark.parametrize("ctype, packer", [
    (_capi.AttentionOptions, _capi.OPTIONS),
    (_capi.DecodeOptions, _capi.OPTIONS),
    (_capi.KVCache, _capi.KVCACHE),
])
def test_packed_options_have_the_c_layout(ctype, packer):
    assert packer.size == ctypes.sizeof(ctype)
    assert packed_offsets(packer.format) == offsets(ctype)


def test_packed_dltensor_has_the_c_layout():
    flat = [0] + [_capi.DLTensor.device.offset + f.offset for f in
                  (_capi.DLDevice.device_type, _capi.DLDevice.device_id)]
    flat += [_capi.DLTensor.ndim.offset]
    flat += [_capi.DLTensor.dtype.offset + getattr(_capi.DLDataType, n).offset
             for n in ("code", "bits", "lanes")]
    flat += [getattr(_capi.DLTensor, n).offset for n in ("shape", "strides", "byte_offset")]
    assert packed_offsets(_capi.DLTENSOR.format) == flat
    assert _capi.DLTENSOR.size == ctypes.sizeof(_capi.DLTensor)


def test_a_packed_tensor_reads_back_as_the_dltensor_kiln_gets(as_gpu):
    import torch

    from kiln import ops
    base = torch.empty(4, 8, 6, dtype=torch.bfloat16)
    view = base[1:3, ::2, 1:4]  # offset, strided
    t = _capi.DLTensor.from_address(ops._tensor(3, view, "view"))
    assert (t.data, t.device.device_type, t.device.device_id, t.ndim) == (
        view.data_ptr(), ops._GPU, 0, 3)
    assert (t.dtype.code, t.dtype.bits, t.dtype.lanes, t.byte_offset) == (
        _capi.KDL_BFLOAT, 16, 1, 0)
    assert [t.shape[i] for i in range(3)] == [2, 4, 3]
    assert [t.strides[i] for i in range(3)] == [48, 12, 1]
    # A row-major tensor goes with NULL strides, DLPack's compact layout.
    t = _capi.DLTensor.from_address(ops._tensor(4, base, "base"))
    assert [t.shape[i] for i in range(3)] == [4, 8, 6] and not t.strides
    assert t.data == base.data_ptr()


@pytest.mark.parametrize("ctype, init", [
    (_capi.AttentionOptions, "kiln_attention_options_init_sized"),
    (_capi.DecodeOptions, "kiln_decode_options_init_sized"),
    (_capi.KVCache, "kiln_kvcache_init_sized"),
])
def test_the_library_fills_our_struct_sizes_with_its_defaults(ctype, init):
    # The library writes at most our size and echoes it: kiln.h's contract for an older
    # caller's struct, and no read past ours.
    buffer = (ctypes.c_char * (ctypes.sizeof(ctype) + 8))(*([b"\xab"] * (ctypes.sizeof(ctype) + 8)))
    getattr(_capi.lib, init)(ctypes.addressof(buffer), ctypes.sizeof(ctype))
    value = ctype.from_buffer(buffer)
    assert value.struct_size == ctypes.sizeof(ctype)
    assert bytes(buffer[ctypes.sizeof(ctype):]) == b"\xab" * 8
    if ctype is not _capi.KVCache:
        assert (value.window_left, value.window_right, value.softmax_scale) == (-1, -1, 0.0)
    if ctype is _capi.DecodeOptions:
        assert value.rotary_interleaved == 1  # FlashAttention's default


def test_errors_carry_kilns_status_and_message():
    status = _capi.lib.kiln_attention(0, 0, 0, 0, 0, 0, 0)
    assert status == _capi.KILN_ERROR_INVALID_ARGUMENT
    with pytest.raises(kiln.KilnValueError) as caught:
        _capi.check(status)
    assert caught.value.status == _capi.KILN_ERROR_INVALID_ARGUMENT
    assert "q is NULL" in caught.value.message
    assert str(caught.value).startswith("KILN_ERROR_INVALID_ARGUMENT: q is NULL")
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, kiln.KilnError)

    # What kiln cannot run (a dtype, a head dim) is bad input too, as the README promises.
    unsupported = _capi.error(_capi.KILN_ERROR_UNSUPPORTED, "x")
    assert type(unsupported) is kiln.KilnValueError and isinstance(unsupported, ValueError)
    missing = _capi.error(_capi.KILN_ERROR_NOT_FOUND, "z")
    assert type(missing) is kiln.KilnError and not isinstance(missing, ValueError)
    assert str(_capi.error(42, "y")) == "status 42: y"
