#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One GPU session's worth of checks and measurements, in one command (the lent GPU is scarce):
# the [gpu] tests, compute-sanitizer's four tools over them, the demo, the runtime benchmarks,
# then peers.py and the attention and decode benchmarks in the same run so their ratios compare.
# BUILD is a build tree made on another machine with its source at /work/main (KILN_SOURCE_DIR
# is baked into the tests), so that path is linked to this checkout first. PEERS points at
# shared/peers/peers.py (copied beside the checkout). SANITIZERS picks the tools (empty: none);
# STEPS picks what else runs (default: "tests demo runtime attention decode").
set -uo pipefail
build="${BUILD:-build-dev}"
out="${OUT:-/tmp}"
[ "$PWD" = /work/main ] || { mkdir -p /work && ln -sfn "$PWD" /work/main; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
export KILN_CACHE_DIR="$(mktemp -d)"
status=0
step() { echo "== $*"; "$@" || { echo "!! failed: $*"; status=1; }; }
steps=" ${STEPS:-tests demo runtime attention decode} "
runs() { [[ "$steps" == *" $1 "* ]]; }
tests=("$build/bin/kiln_tests" --require-gpu "[gpu]" ${GPU_TESTS:+"$GPU_TESTS"})
if runs tests; then step "${tests[@]}"; fi
# Each tool over the same tests, from the cache the plain run filled; any finding fails the step.
# API errors are not reported: the tests make failing driver calls on purpose (a corrupt binary
# must fail to load and be rebuilt).
for tool in ${SANITIZERS-memcheck racecheck synccheck initcheck}; do
  step compute-sanitizer --tool "$tool" --report-api-errors no --error-exitcode 99 \
    --print-limit 20 "${tests[@]}"
done
if runs demo; then step "$build/bin/kiln_demo"; fi
if runs runtime; then BUILD="$build" step bash bench/runtime.sh; fi
if [ -n "${PEERS:-}" ]; then step python3 "$PEERS"; fi
if runs attention; then KILN_LIB="$build" step python3 bench/attention.py ${ATTENTION_ARGS:-}; fi
if runs decode; then KILN_LIB="$build" step python3 bench/decode.py ${DECODE_ARGS:-}; fi
exit $status
