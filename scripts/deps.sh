#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs what kiln builds with, from Debian's packages (needs root). The CUDA toolkit (NVRTC,
# headers, cudart for the tests) is expected on the machine already. KILN_WITH_HIP=1 adds ROCm's
# hipRTC (with its LLVM, about 190 MB), which compiles for AMD targets: without it the build
# checks and warms NVIDIA targets alone, and the tests that need hipRTC skip, saying so.
set -euo pipefail
# python3 and its venv: the Python package's tests (scripts/test_python.sh) and README check;
# pkgconf: the test of the installed kiln.pc.
packages=(cmake ninja-build g++ pkgconf libfmt-dev libxxhash-dev nlohmann-json3-dev libcli11-dev
          catch2 python3 python3-venv)
if [ "${KILN_WITH_HIP:-0}" = 1 ]; then
  packages+=(libamdhip64-dev libhiprtc-builtins5)
fi
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if ! command -v nvcc >/dev/null 2>&1 && [ ! -e /usr/local/cuda/include/cuda_runtime_api.h ]; then
  echo "the CUDA toolkit is not installed (no nvcc, no /usr/local/cuda): kiln's tests need its" \
       "headers, NVRTC and cudart" >&2
  exit 1
fi
