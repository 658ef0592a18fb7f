#!/usr/bin/env bash
# One GPU session's worth of checks and measurements, in one command (the lent GPU is scarce):
# the [gpu] tests, the demo, the runtime benchmarks, then peers.py and the attention and decode
# benchmarks in the same run so their ratios compare. BUILD is a build tree made on another
# machine with its source at /work/main (KILN_SOURCE_DIR is baked into the tests), so that path
# is linked to this checkout first. PEERS points at shared/peers/peers.py (copied beside the
# checkout).
set -uo pipefail
build="${BUILD:-build-dev}"
out="${OUT:-/tmp}"
[ "$PWD" = /work/main ] || { mkdir -p /work && ln -sfn "$PWD" /work/main; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
export KILN_CACHE_DIR="$(mktemp -d)"
status=0
step() { echo "== $*"; "$@" || { echo "!! failed: $*"; status=1; }; }
step "$build/bin/kiln_tests" --require-gpu "[gpu]" ${GPU_TESTS:+"$GPU_TESTS"}
step "$build/bin/kiln_demo"
BUILD="$build" step bash bench/runtime.sh
if [ -n "${PEERS:-}" ]; then step python3 "$PEERS"; fi
KILN_LIB="$build" step python3 bench/attention.py ${ATTENTION_ARGS:-}
KILN_LIB="$build" step python3 bench/decode.py ${DECODE_ARGS:-}
exit $status
