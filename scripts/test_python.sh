#!/usr/bin/env bash
# The Python package's tests (python/tests, pytest), as scripts/test.sh runs them: a virtual
# environment in build-python/venv with torch and pytest from PyPI, the package installed into it
# from this checkout (`pip install .`), then pytest, the slow packaging tests included. GPU tests
# skip without a GPU. Needs python3 with venv (installed from Debian's packages when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
  echo "installing: python3-venv"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
fi
venv="${VENV:-build-python/venv}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q "torch>=2.4" pytest
# The package's CMake build (in build-python/cmake, kept between runs) compiles through ccache
# when there is one, as scripts/build.sh's builds do.
if command -v ccache >/dev/null; then export CMAKE_CXX_COMPILER_LAUNCHER=ccache; fi
"$venv/bin/python" -m pip install -q .
# From the repository root, `import kiln` finds the installed package (python/ is not on the path).
"$venv/bin/python" -m pytest -q -rs python/tests
