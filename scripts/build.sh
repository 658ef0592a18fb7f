#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Configures and builds kiln into ./build (BUILD overrides), warnings as errors. Arguments go to
# cmake's configure step (scripts/test.sh adds -DKILN_SANITIZE=ON for its second build).
set -euo pipefail
cd "$(dirname "$0")/.."
build="${BUILD:-build}"
export PATH="$PATH:/usr/local/cuda/bin"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKILN_WERROR=ON "$@"
cmake --build "$build" -j "$(nproc)"
