#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The main job: installs, builds, then with a GPU runs the demo (gelu checked against the CPU);
# without one warms the default kernels (attention and decode) for sm_90a, and for gfx90a where
# hipRTC is installed (KILN_WITH_HIP=1), and prints the report. Kernels go to ./cache
# (git-ignored), not the default ~/.cache/kiln; the last line says where and how much.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
bash scripts/build.sh
build="${BUILD:-build}"
export KILN_CACHE_DIR="$PWD/cache"
if "$build/bin/kiln" info --json | python3 -c 'import json,sys; d=json.load(sys.stdin); sys.exit(0 if any(b["devices"] for b in d["backends"]) else 1)'; then
  "$build/bin/kiln_demo"
else
  # shellcheck disable=SC2207  # the targets are words: --target sm_90a --target gfx90a
  targets=($(cmake -DKILN="$build/bin/kiln" -P cmake/warm_targets.cmake))
  echo "no GPU here: warming the default kernels (${targets[*]}) into $KILN_CACHE_DIR"
  "$build/bin/kiln" warm "${targets[@]}"
fi
# Other programs see these kernels only when pointed here: say so, with what is here, counted as
# `kiln cache ls` counts it ("138 entries, 21.4 MiB in DIR").
held=$("$build/bin/kiln" cache ls | grep -E "^[0-9]+ entries, ")
echo "$held: not the default cache ~/.cache/kiln;" \
  "\`$build/bin/kiln cache ls --cache-dir cache\` lists them"
