# SPDX-License-Identifier: Apache-2.0
"""Shared pytest fixtures: the repository root, tensors that kiln checks as a GPU's without one,
and the skip of GPU tests."""
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


def pytest_collection_modifyitems(config, items):
    import torch
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: torch.cuda.is_available() is False")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def as_gpu(monkeypatch):
    """CPU tensors sent to kiln as device 0's, and eager calls on them taking the direct path,
    as a GPU's would: kiln checks every shape, stride and dtype with its own messages, and a
    problem with an empty dim returns before any launch, so no GPU is needed."""
    import torch

    from kiln import _checks, ops
    monkeypatch.setattr(_checks, "cpu_device", (ops._GPU, 0))
    monkeypatch.setattr(ops, "eager", lambda t: type(t) is torch.Tensor
                        and not ops._is_compiling())
