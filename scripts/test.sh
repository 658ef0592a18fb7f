#!/usr/bin/env bash
# The test command: installs dependencies, builds, runs every test through ctest. With no GPU
# the [gpu] tests report "skipped" with the reason.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
bash scripts/build.sh
ctest --test-dir "${BUILD:-build}" --output-on-failure -j 2
