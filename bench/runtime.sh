#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs the runtime benchmarks in order, each from an empty cache; BUILD defaults to ./build.
set -euo pipefail
bench="${BUILD:-build}/bin/kiln_bench_runtime"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "== cold compile (ms)"
"$bench" cold "$work/cold"
echo "== first launch from a disk hit, fresh process"
"$bench" first-launch "$work/first" >/dev/null || true  # compiles into the cache
for i in 1 2 3; do "$bench" first-launch "$work/first"; done
echo "== memory-hit dispatch overhead"
"$bench" dispatch "$work/dispatch"
echo "== warm-up of the default specs for sm_90a"
"$bench" warmup "$work/warmup"
