# SPDX-License-Identifier: Apache-2.0
"""The progress line of kiln.warmup(): a bar redrawn in place on stderr, with no dependency."""
import sys
import time

_WIDTH = 24


class Bar:
    """Draws `done/total` as a bar on `stream` with \\r, from kiln_warmup_with's progress
    callback (one call at a time, from any of kiln's threads); close() ends the line."""

    def __init__(self, stream):
        self.stream = stream
        self.start = time.monotonic()
        self.drawn = False

    def __call__(self, done, total):
        filled = _WIDTH * done // max(total, 1)
        bar = ("=" * filled + (">" if filled < _WIDTH else "")).ljust(_WIDTH)
        elapsed = time.monotonic() - self.start
        self.stream.write(f"\rkiln.warmup [{bar}] {done}/{total} kernels, {elapsed:.0f} s")
        self.stream.flush()
        self.drawn = True

    def close(self):
        if self.drawn:
            self.stream.write("\n")
            self.stream.flush()


def bar_for(progress):
    """The Bar that kiln.warmup(progress=...) asks for, or None: True draws on stderr, False
    does not, None draws when stderr is a terminal."""
    stream = sys.stderr
    if progress is None:
        progress = stream is not None and stream.isatty()
    return Bar(stream) if progress else None
