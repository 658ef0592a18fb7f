# SPDX-License-Identifier: Apache-2.0
"""README.md's Python blocks: compiled here (ctest's readme_code_blocks compiles them too), run
on a GPU."""
import re

import pytest

from conftest import REPO


def blocks():
    text = (REPO / "README.md").read_text()
    return [(text[:m.start()].count("\n") + 2, m.group(1))
            for m in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M)]


def test_the_readme_has_a_python_example():
    assert blocks()


@pytest.mark.parametrize("line, source", blocks())
def test_readme_python_block_compiles(line, source):
    compile(source, f"README.md:{line}", "exec")


@pytest.mark.gpu
@pytest.mark.parametrize("line, source", blocks())
def test_readme_python_block_runs(line, source):
    exec(compile(source, f"README.md:{line}", "exec"), {})
