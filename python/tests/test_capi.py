# SPDX-License-Identifier: Apache-2.0
"""The binding to kiln.h: the described layouts equal to the C structs' (as a C compiler lays them
out) and their packers to the ctypes structs', the defaults the library's *_init_sized functions
give, errors carrying kiln's status and message."""
import ctypes
import os
import re
import shutil
import subprocess

import pytest

import kiln
from kiln import _capi

from conftest import REPO


def test_version_is_the_libraries_and_the_cmake_projects():
    project = re.search(r"project\(kiln VERSION ([0-9.]+)", (REPO / "CMakeLists.txt").read_text())
    assert kiln.__version__ == project.group(1)
    number = _capi.lib.kiln_version()
    assert kiln.__version__ == f"{number // 10000}.{number // 100 % 100}.{number % 100}"


# kiln.h's structs as _capi describes them, and DLPack's DLTensor, by their C names.
STRUCTS = {ctype: ctype.c_name for ctype in (
    _capi.ScoreOptions, _capi.AttentionOptions, _capi.DecodeOptions, _capi.KVCache,
    _capi.WarmupOptions, _capi.AttentionGradOptions)}
STRUCTS[_capi.DLTensor] = "DLTensor"


def fields(ctype):
    """(path, offset, size) of each field of a ctypes struct, a nested struct's fields each
    (path "score.causal")."""
    out = []
    for name, kind in ctype._fields_:
        field = getattr(ctype, name)
        if issubclass(kind, ctypes.Structure):
            out += [(f"{name}.{path}", field.offset + at, size) for path, at, size in fields(kind)]
        else:
            out.append((name, field.offset, field.size))
    return out


def test_the_described_layouts_are_kiln_hs(tmp_path):
    # A C program compiled against kiln.h prints the offset and size of every field described
    # here, and each struct's size: a field the header lacks does not compile, one moved or
    # resized differs.
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        pytest.skip("no C compiler (cc, or $CC) to compile kiln.h with")
    expected, prints = {}, []
    for ctype, c_name in STRUCTS.items():
        expected[c_name] = f"{ctypes.sizeof(ctype)}"
        prints.append(f'printf("{c_name} %zu\\n", sizeof({c_name}));')
        for path, offset, size in fields(ctype):
            expected[f"{c_name}.{path}"] = f"{offset} {size}"
            prints.append(f'printf("{c_name}.{path} %zu %zu\\n", offsetof({c_name}, {path}), '
                          f'sizeof((({c_name}*)0)->{path}));')
    source = tmp_path / "layouts.c"
    source.write_text("#include <stddef.h>\n#include <stdio.h>\n#include \"kiln/kiln.h\"\n"
                      "int main(void) {\n" + "\n".join(prints) + "\nreturn 0;\n}\n")
    program = tmp_path / "layouts"
    subprocess.run([compiler, "-std=c11", f"-I{REPO / 'include'}", str(source), "-o",
                    str(program)], check=True)
    printed = subprocess.run([str(program)], check=True, capture_output=True, text=True).stdout
    assert dict(line.split(" ", 1) for line in printed.splitlines()) == expected


def offsets(ctype):
    """The offset of each scalar of a ctypes struct: an array's elements and a nested struct's
    fields each."""
    out = []
    for name, kind in ctype._fields_:
        at = getattr(ctype, name).offset
        if issubclass(kind, ctypes.Structure):
            out += [at + offset for offset in offsets(kind)]
            continue
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


@pytest.mark.parametrize("ctype", list(STRUCTS)[:-1])
def test_packers_have_the_c_layout(ctype):
    assert ctype.packer.size == ctypes.sizeof(ctype)
    assert packed_offsets(ctype.packer.format) == offsets(ctype)
    assert len(ctype.defaults) == len(offsets(ctype))


def test_packed_dltensor_has_the_c_layout():
    assert packed_offsets(_capi.DLTENSOR.format) == offsets(_capi.DLTensor)
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
    (_capi.WarmupOptions, "kiln_warmup_options_init_sized"),
    (_capi.AttentionGradOptions, "kiln_attention_grad_options_init_sized"),
])
def test_the_library_fills_our_struct_sizes_with_the_described_defaults(ctype, init):
    # The library writes at most our size and echoes it: kiln.h's contract for an older
    # caller's struct, and no read past ours.
    size = ctypes.sizeof(ctype)
    buffer = (ctypes.c_char * (size + 8))(*([b"\xab"] * (size + 8)))
    sizes = (size, _capi.ScoreOptions.size) if hasattr(ctype, "score") else (size,)
    getattr(_capi.lib, init)(ctypes.addressof(buffer), *sizes)
    assert ctype.packer.unpack_from(buffer) == ctype.defaults
    assert bytes(buffer[size:]) == b"\xab" * 8


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
