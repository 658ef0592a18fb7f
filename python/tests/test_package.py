# SPDX-License-Identifier: Apache-2.0
"""The package as pip builds it: `pip wheel .` gives one py3-none wheel holding the Python
sources, a Release libkiln and the licences alone, and `pip install .` into a fresh virtual
environment (no torch) imports, with the version of libkiln and of CMakeLists.txt's project;
scripts/wheel.sh makes a manylinux wheel of it that installs with no compiler. Slow: it builds."""
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


LICENSES = ["LICENSE", "NOTICE", "include/kiln/third_party/dlpack/LICENSE"]


def check_contents(wheel):
    """The wheel holds the Python sources, libkiln without debug info, and the licences."""
    archive = zipfile.ZipFile(wheel)
    names = [n for n in archive.namelist() if not n.endswith("/")]  # auditwheel adds folders
    info = f"kiln-{PROJECT_VERSION}.dist-info/"
    package = sorted(n for n in names if not n.startswith(info))
    sources = sorted(p.name for p in (REPO / "python" / "kiln").glob("*.py"))
    assert package == sorted([f"kiln/{s}" for s in sources] + ["kiln/libkiln.so"])
    assert b".debug_info" not in archive.read("kiln/libkiln.so")
    for name in LICENSES:
        assert archive.read(f"{info}licenses/{name}") == (REPO / name).read_bytes()
    metadata = archive.read(f"{info}METADATA").decode()
    assert "License-Expression: Apache-2.0" in metadata


def test_pip_wheel_holds_the_sources_a_release_libkiln_and_the_licences(tmp_path):
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", tmp_path, REPO, cwd=tmp_path)
    wheels = list(tmp_path.glob("kiln-*.whl"))
    assert [w.name for w in wheels] == [f"kiln-{PROJECT_VERSION}-py3-none-linux_x86_64.whl"]
    check_contents(wheels[0])


def test_wheel_sh_makes_a_manylinux_wheel_that_installs_with_no_compiler(tmp_path):
    run("bash", REPO / "scripts" / "wheel.sh", tmp_path / "dist", cwd=REPO)
    wheels = list((tmp_path / "dist").glob("kiln-*.whl"))
    assert len(wheels) == 1
    assert re.fullmatch(rf"kiln-{PROJECT_VERSION}-py3-none-manylinux_2_[0-9]+_x86_64\.whl",
                        wheels[0].name)
    check_contents(wheels[0])
    # A fresh environment whose PATH has its own Python and nothing else: no compiler, no cmake.
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    python = venv / "bin" / "python"
    env = {"PATH": str(venv / "bin"), "HOME": str(tmp_path)}
    done = subprocess.run([python, "-m", "pip", "install", "-q", "--no-index", wheels[0]],
                          cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    done = subprocess.run([python, "-c", "import kiln, kiln._capi as c; print(kiln.__version__, "
                           "c.path)"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    version, library = done.stdout.split()
    assert version == PROJECT_VERSION and library.startswith(str(venv))


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
