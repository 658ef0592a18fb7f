#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Where a cold NVRTC compile's time goes: front end, NVVM optimizer, ptxas, per kernel family.

For each spec (by default the first of each kernel source in `kiln warm --list`'s default set
for sm_90a), takes the unit kiln generates (`kiln compile --source`), compiles it through NVRTC
(ctypes, libnvrtc from CUDA_HOME or /usr/local/cuda) with kiln's options and `--time`, which
makes NVRTC write each phase's milliseconds to a file, and prints them with the whole call's
wall time, the best of --reps compiles. Headers come from the tree (kernels_src, include), as
kiln's embedded copies of them. No GPU needed. With --extra, each spec compiles with those NVRTC
options too, and a second line gives their times and whether the cubin stayed byte for byte
the same in its executable sections (an option that keeps them costs no kernel speed).

  scripts/compile_phases.py [--kiln build/bin/kiln] [--target sm_90a] [--reps 3] [--all]
                            [--grep TEXT] [--extra=OPTION ...] [MANIFEST]
"""
import argparse
import csv
import ctypes
import os
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_nvrtc():
    home = Path(os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda")
    for name in ("libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"):
        path = home / "lib64" / name
        if path.exists():
            return ctypes.CDLL(str(path)), home / "include"
    sys.exit(f"compile_phases: no libnvrtc under {home / 'lib64'}: set CUDA_HOME")


def machine_code(cubin):
    """The bytes of a cubin's executable sections (.text.*), in section order: what
    scripts/sass_diff.sh compares, so that metadata does not count."""
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    sections = [struct.unpack_from("<IIQQQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    names_at = sections[shstrndx][4]
    code = b""
    for name, _, _, _, offset, size in sections:
        end = cubin.index(b"\0", names_at + name)
        if cubin[names_at + name:end].startswith(b".text"):
            code += cubin[offset:offset + size]
    return code


def default_specs(kiln, target):
    out = subprocess.run([kiln, "warm", "--list", "--target", target], check=True,
                         capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if line.strip()]


def generated_unit(kiln, spec, cache_dir):
    """The unit `kiln compile --source` prints, between its heading and the spec line."""
    out = subprocess.run([kiln, "compile", spec, "--source", "--cache-dir", cache_dir,
                          "--kernels-dir", str(ROOT / "kernels_src")],
                         check=True, capture_output=True, text=True).stdout
    lines = out.splitlines()
    start = lines.index("generated source") + 1
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("spec "))
    return "\n".join(lines[start:end]) + "\n"


def compile_once(nvrtc, source, entry, options):
    """(wall ms, {phase: ms}, cubin) of one NVRTC compile of `entry`<kiln_spec> (the kernel
    template, instantiated through a name expression as kiln does) with `--time` to a temporary
    file."""
    with tempfile.TemporaryDirectory() as tmp:
        table = os.path.join(tmp, "time.csv")
        opts = [o.encode() for o in options + [f"--time={table}"]]
        program = ctypes.c_void_p()
        start = time.perf_counter()
        if nvrtc.nvrtcCreateProgram(ctypes.byref(program), source.encode(), b"unit.cu", 0, None,
                                    None) != 0:
            sys.exit("compile_phases: nvrtcCreateProgram failed")
        nvrtc.nvrtcAddNameExpression(program, f"{entry}<kiln_spec>".encode())
        result = nvrtc.nvrtcCompileProgram(program, len(opts), (ctypes.c_char_p * len(opts))(*opts))
        wall = (time.perf_counter() - start) * 1000
        if result != 0:
            size = ctypes.c_size_t()
            nvrtc.nvrtcGetProgramLogSize(program, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            nvrtc.nvrtcGetProgramLog(program, log)
            sys.exit(f"compile_phases: NVRTC failed ({result}):\n{log.value.decode()}")
        size = ctypes.c_size_t()
        nvrtc.nvrtcGetCUBINSize(program, ctypes.byref(size))
        cubin = ctypes.create_string_buffer(size.value)
        nvrtc.nvrtcGetCUBIN(program, cubin)
        nvrtc.nvrtcDestroyProgram(ctypes.byref(program))
        with open(table, newline="") as f:
            rows = [[cell.strip() for cell in row] for row in csv.reader(f)]
    return wall, {row[1]: float(row[2]) for row in rows[1:] if len(row) == 4}, cubin.raw


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("manifest", nargs="?", help="specs, one a line (default: kiln's default set)")
    p.add_argument("--kiln", default=str(ROOT / "build/bin/kiln"))
    p.add_argument("--target", default="sm_90a")
    p.add_argument("--reps", type=int, default=3, help="compiles per spec; the fastest is shown")
    p.add_argument("--all", action="store_true", help="every spec, not one per kernel source")
    p.add_argument("--grep", default=None, help="only specs containing TEXT")
    p.add_argument("--extra", action="append", default=[],
                   help="an NVRTC option to time beside, as --extra=--Ofast-compile=mid; repeatable")
    args = p.parse_args()

    specs = (Path(args.manifest).read_text().splitlines() if args.manifest
             else default_specs(args.kiln, args.target))
    specs = [s for s in specs if s.strip() and (args.grep is None or args.grep in s)]
    if not args.all:
        first = {}
        for s in specs:
            first.setdefault(s.split(":", 1)[0], s)
        specs = list(first.values())

    nvrtc, cuda_include = load_nvrtc()
    options = [f"--gpu-architecture={args.target}", "-std=c++17", f"-I{cuda_include}",
               f"-I{ROOT / 'kernels_src'}", f"-I{ROOT / 'include'}", "-Xptxas=-v"]
    with tempfile.TemporaryDirectory() as cache_dir:
        print(f"{'kernel':58} {'front end':>9} {'NVVM':>7} {'ptxas':>7} {'wall ms':>8}")
        for spec in specs:
            unit = generated_unit(args.kiln, spec, cache_dir)
            entry = spec.split(":", 1)[1].split("<", 1)[0]
            name = spec.split(":", 1)[1].split("(")[0][:58]
            base = None
            for label, extra in [(name, [])] + ([("  " + " ".join(args.extra), args.extra)]
                                                 if args.extra else []):
                wall, phases, cubin = min(
                    (compile_once(nvrtc, unit, entry, options + extra) for _ in range(args.reps)),
                    key=lambda r: r[0])
                code = machine_code(cubin)
                same = "" if base is None else ("  same code" if code == base else
                                                "  code differs")
                base = code if base is None else base
                print(f"{label[:58]:58} {phases.get('CUDA C++ Frontend', -1):9.0f} "
                      f"{phases.get('NVVM Optimizer', -1):7.0f} "
                      f"{phases.get('PTX Translation', -1):7.0f} {wall:8.0f}{same}")


if __name__ == "__main__":
    main()
