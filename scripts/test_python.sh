#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The Python package's tests (python/tests, pytest), as scripts/test.sh runs them: a virtual
# environment in build-python/venv with torch, transformers and pytest from PyPI, the package
# installed into it from this checkout (`pip install .`), then pytest, the slow packaging tests
# included. GPU tests skip without a GPU. `pip install .` builds libkiln, with what scripts/deps.sh installs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
venv="${VENV:-build-python/venv}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
# transformers: its tests of kiln.transformers run here too (tiny random models on the CPU, kiln
# stood in by the reference); without it they skip, and a change to kiln's calls went unseen.
# --no-cache-dir: torch and its CUDA libraries are several GB, and pip's cache would keep a second
# copy (CI once ran out of disk, "No space left on device", while installing them).
"$venv/bin/python" -m pip install -q --no-cache-dir "torch>=2.4" numpy pytest transformers
# The package's CMake build (in build-python/cmake, kept between runs) compiles through ccache
# when there is one.
if command -v ccache >/dev/null; then export CMAKE_CXX_COMPILER_LAUNCHER=ccache; fi
"$venv/bin/python" -m pip install -q --no-cache-dir .
# From the repository root, `import kiln` finds the installed package (python/ is not on the path).
"$venv/bin/python" -m pytest -q -rs python/tests
