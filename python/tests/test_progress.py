# SPDX-License-Identifier: Apache-2.0
"""kiln.warmup()'s progress bar: on stderr when asked or when stderr is a terminal, else quiet."""
import os
import pty
import subprocess
import sys

import kiln

# A warm-up in which nothing compiles (KILN_JIT=off, an empty cache): every kernel fails at
# once, and is reported to the progress bar as it fails, so that the bar is drawn in a second.
SCRIPT = """
import kiln
try:
    kiln.warmup(target="sm_90a"{progress})
except kiln.KilnError:
    pass
"""


def _environment(tmp_path):
    env = {name: value for name, value in os.environ.items() if not name.startswith("KILN_")}
    # The kiln this test imported, with its library.
    env.update(KILN_JIT="off", KILN_CACHE_DIR=str(tmp_path / "cache"), KILN_LOG="error",
               PYTHONPATH=os.path.dirname(os.path.dirname(kiln.__file__)))
    if "KILN_LIB" in os.environ:
        env["KILN_LIB"] = os.environ["KILN_LIB"]
    return env


def _warmup_stderr(tmp_path, progress):
    """What warmup(progress=...) writes to stderr when stderr is a pipe."""
    done = subprocess.run([sys.executable, "-c", SCRIPT.format(progress=progress)],
                          env=_environment(tmp_path), capture_output=True, timeout=300)
    # NOTE: bytes, as text mode would read the bar's \r as a line end.
    assert done.returncode == 0, done.stderr
    return done.stderr.decode()


def test_progress_true_draws_a_bar_on_stderr(tmp_path):
    err = _warmup_stderr(tmp_path, ", progress=True")
    assert err.startswith("\rkiln.warmup [")
    total = err.rsplit("/", 1)[1].split()[0]
    assert f"] {total}/{total} kernels, " in err and err.endswith("\n")


def test_warmup_is_quiet_when_stderr_is_no_terminal(tmp_path):
    assert _warmup_stderr(tmp_path, "") == ""
    assert _warmup_stderr(tmp_path, ", progress=False") == ""


def test_warmup_draws_the_bar_when_stderr_is_a_terminal(tmp_path):
    terminal, device = pty.openpty()
    child = subprocess.Popen([sys.executable, "-c", SCRIPT.format(progress="")],
                             env=_environment(tmp_path), stderr=device,
                             stdout=subprocess.DEVNULL)
    os.close(device)
    shown = b""
    try:
        # NOTE: read while it runs, so that a full terminal never blocks it; EIO once it has
        # exited and all is read.
        while chunk := os.read(terminal, 4096):
            shown += chunk
    except OSError:
        pass
    finally:
        os.close(terminal)
    assert child.wait(timeout=300) == 0
    assert b"\rkiln.warmup [" in shown
