"""The package as pip builds it: `pip wheel .` gives one py3-none wheel holding the Python
sources and libkiln alone, and `pip install .` into a fresh virtual environment (no torch)
imports, with the version of libkiln and of CMakeLists.txt's project. Slow: it builds."""
import re
import subprocess
import sys
import zipfile

import pytest

from conftest import REPO

pytestmark = pytest.mark.slow

PROJECT_VERSION = re.search(r"project\(kiln VERSION ([0-9.]+)",
                            (REPO / "CMakeLists.txt").read_text()).group(1)


def run(*command, cwd):
    done = subprocess.run([str(c) for c in command], cwd=cwd, capture_output=True, text=True)
    assert done.returncode == 0, f"{command} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_pip_wheel_holds_the_sources_and_libkiln_alone(tmp_path):
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", tmp_path, REPO, cwd=tmp_path)
    wheels = list(tmp_path.glob("kiln-*.whl"))
    assert [w.name for w in wheels] == [f"kiln-{PROJECT_VERSION}-py3-none-linux_x86_64.whl"]
    names = zipfile.ZipFile(wheels[0]).namelist()
    package = sorted(n for n in names if not n.startswith(f"kiln-{PROJECT_VERSION}.dist-info/"))
    sources = sorted(p.name for p in (REPO / "python" / "kiln").glob("*.py"))
    assert package == sorted([f"kiln/{s}" for s in sources] + ["kiln/libkiln.so"])


def test_pip_install_into_a_fresh_venv_imports_without_torch(tmp_path):
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    python = venv / "bin" / "python"
    run(python, "-m", "pip", "install", "-q", REPO, cwd=tmp_path)
    out = run(python, "-c", "import importlib.metadata as m, kiln, kiln._capi as c; "
              "print(kiln.__version__, m.version('kiln'), c.path)", cwd=tmp_path)
    version, distribution, library = out.split()
    assert version == distribution == PROJECT_VERSION
    assert library.startswith(str(venv)) and library.endswith("/kiln/libkiln.so")
    # The calls need torch, and say so.
    out = run(python, "-c", "import kiln\ntry:\n kiln.flash_attn_func\nexcept ImportError as e:"
              "\n print(e)", cwd=tmp_path)
    assert "kiln.flash_attn_func needs PyTorch" in out
