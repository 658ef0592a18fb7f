#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The test command: installs dependencies, builds, runs every test through ctest and the Python
# package's pytest suite (scripts/test_python.sh); then builds again with AddressSanitizer and
# UndefinedBehaviorSanitizer and runs the ctest tests once more. With no GPU the [gpu] tests
# report "skipped" with the reason.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
bash scripts/build.sh
ctest --test-dir "${BUILD:-build}" --output-on-failure -j 2
bash scripts/test_python.sh

# The sanitized build checks no kernels ahead and builds no benchmark or example; it has no
# tests of the installed kiln (a consumer would have to link the sanitizers too).
sanitized="${BUILD_SANITIZE:-build-sanitize}"
BUILD="$sanitized" bash scripts/build.sh -DCMAKE_BUILD_TYPE=Debug -DKILN_SANITIZE=ON \
  -DKILN_CHECK_KERNELS=OFF -DKILN_BUILD_BENCH=OFF -DKILN_BUILD_EXAMPLES=OFF
# use_sigaltstack=0: a thread that compiled with hipRTC (LLVM, which handles signals of its own)
# otherwise ends with ASan failing to unmap its alternate signal stack ("unable to unmap").
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1:use_sigaltstack=0"
# use_tls=0: LeakSanitizer's tracer reads the dynamic TLS of every library loaded at run time,
# and after a hipRTC compile (LLVM's libraries) one entry of it is garbage; reading it crashed the
# tracer ("Tracer caught signal 11" after "DTLS 11 at 0x...2743-0x...3845") on every hipRTC test.
# Scanning fewer roots can only report more leaks, never hide one.
export LSAN_OPTIONS="suppressions=$PWD/scripts/lsan.supp:print_suppressions=0:use_tls=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
# A test whose process exits cleanly can still abort when LeakSanitizer's own tracer crashes
# ("Tracer caught signal 11", "LeakSanitizer has encountered a fatal error"), seen under load on
# tests whose assertions all passed; a test that fails is run once more, so that a leak or an
# error, which happens every time, still fails the run.
ctest --test-dir "$sanitized" --output-on-failure -j 2 --repeat until-pass:2
