# SPDX-License-Identifier: Apache-2.0
"""What the torch benchmarks (attention.py, decode.py, python_host.py) share: the start of a
run, the kiln package, warm-up until fast, CUDA-event medians with the backends taking turns,
table cells, results to $OUT."""
import datetime
import glob
import importlib.util
import json
import os
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def start(args, header_lines):
    """Seeds torch, imports the kiln package (its libkiln from args.lib, else $KILN_LIB) and
    prints the run's header lines, header_lines(kiln, args); returns (kiln, header)."""
    torch.manual_seed(0)
    kiln = load_kiln(args.lib)
    header = header_lines(kiln, args)
    for line in header:
        print(line)
    return kiln, header


def load_kiln(where=None):
    """The kiln package: the installed one, else the source tree's (python/). Its libkiln comes
    from `where` or $KILN_LIB, a build dir or the library itself (the package takes only the
    library), else, for the source tree's package, from ./build; an installed package without
    either uses the libkiln it bundles."""
    where = where or os.environ.get("KILN_LIB")
    installed = importlib.util.find_spec("kiln") is not None
    if not installed:
        sys.path.insert(0, os.path.join(ROOT, "python"))
        where = where or os.path.join(ROOT, "build")
    if where:
        os.environ["KILN_LIB"] = find_library(where)
    import kiln

    return kiln


def find_library(where):
    """Path of libkiln.so: `where` itself, or where a build (or install) dir puts it."""
    if os.path.isfile(where):
        return where
    # The build tree mirrors the install tree, so the library sits in <dir>/lib (or a
    # multiarch subdir of it); a dir holding the .so directly works too.
    for pattern in ("libkiln.so", "lib/libkiln.so", "lib64/libkiln.so", "lib/*/libkiln.so"):
        hits = sorted(glob.glob(os.path.join(where, pattern)))
        if hits:
            return hits[0]
    raise FileNotFoundError(
        f"no libkiln.so in {where!r}: set KILN_LIB (or --lib) to the build dir or the library"
    )


def device_line():
    """The header line of the GPU and the torch, CUDA and cuDNN that ran."""
    p = torch.cuda.get_device_properties(0)
    return (f"device {p.name} ({p.multi_processor_count} SMs), torch {torch.__version__}, "
            f"CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}")


def library_line(kiln):
    """The header line of which kiln ran, when: its version, library and the commit the library
    was built from (not this checkout's, which a copy of the tree may not share)."""
    info = kiln.info()
    return (f"kiln {info['version']} ({info['library']}) built from {info['build']}, "
            f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")


def save_results(name, results):
    """Writes results as JSON to $OUT/name when $OUT is set, and says where."""
    if os.environ.get("OUT"):
        path = os.path.join(os.environ["OUT"], name)
        with open(path, "w") as f:
            json.dump(results, f, indent=1)
        print(f"results: {path}")


# ------------------------------------------------------------------------------------- timing
def wall_ms(fn):
    """Host wall time of one call until the GPU is done: for calls that may compile."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def warm_until_fast(fn, min_calls=3, max_calls=50):
    """Calls fn until a call is about as fast as the best before it; returns the first's time.

    kiln compiles (or loads from its cache) on the first call and cuDNN builds a plan, so a
    fixed count of warm-up calls could leave a slow call inside the timed ones.
    """
    times = [wall_ms(fn)]
    while len(times) < max_calls:
        times.append(wall_ms(fn))
        if len(times) >= min_calls and times[-1] <= 1.25 * min(times[:-1]):
            break
    return times[0]


def warm_up(calls, errors):
    """warm_until_fast for every call; returns each first call's ms. A call that raises is
    dropped, its message kept in errors."""
    first_ms = {}
    for name in list(calls):
        try:
            first_ms[name] = warm_until_fast(calls[name])
        except Exception as ex:
            errors[name] = describe(ex)
            del calls[name]
    return first_ms


def time_interleaved(calls, reps, errors, per_sample=1, sleep_cycles=0):
    """Median ms per call of each call: CUDA events around each sample of `per_sample` calls,
    `reps` samples, the backends taking turns sample by sample.

    Taking turns exposes all of them alike to clock and thermal drift. The events are recorded
    back to back with one sync at the end, so the GPU queue stays full and host overhead
    (ctypes, SDPA dispatch) is not counted unless it exceeds the kernel. For kernels shorter
    than that overhead, sleep_cycles > 0 spins the GPU before each sample, so the host has
    queued the whole sample by the time its first event fires. A backend that raises is dropped
    from the row, its message kept in errors.
    """
    calls = dict(calls)
    events = {n: [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(reps)] for n in calls}
    for _ in range(2):  # untimed: the queue has work before the first timed event
        run_each(calls, errors)
    for i in range(reps):
        for name in list(calls):
            start, end = events[name][i]
            if sleep_cycles:
                torch.cuda._sleep(sleep_cycles)
            start.record()
            if all(run_one(calls, name, errors) for _ in range(per_sample)):
                end.record()
    torch.cuda.synchronize()
    return {n: statistics.median(s.elapsed_time(e) for s, e in events[n]) / per_sample
            for n in calls}


def run_one(calls, name, errors):
    """Calls calls[name]; on an exception keeps its message in errors and drops the call."""
    if name not in calls:
        return False
    try:
        calls[name]()
        return True
    except Exception as ex:  # an unsupported shape, a kiln error: this cell becomes n/a
        errors[name] = describe(ex)
        del calls[name]
        return False


def run_each(calls, errors):
    for name in list(calls):
        run_one(calls, name, errors)


def describe(ex):
    return f"{type(ex).__name__}: {ex}".strip()


# ----------------------------------------------------------------------------------- printing
def ratio(values, a, b):
    """values[a] / values[b], or None when either is missing."""
    return values[a] / values[b] if values.get(a) and values.get(b) else None


def cell(x, fmt):
    return format(x, fmt) if x is not None else format("n/a", ">" + fmt.split(".")[0])
