"""Fixtures shared by the GPU test files (marker gpu): CuPy and one GpuContext per module.
They are only requested by GPU tests, which skip without a GPU, so nothing here imports CuPy
on a machine without one.

Shared helpers that are not fixtures live in tests/testkit.py; this file puts tests/ on
sys.path, so that the test modules in its subfolders can ``import testkit``.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)


@pytest.fixture(scope="module")
def cp():
    import cupy
    return cupy


@pytest.fixture(scope="module")
def ctx(cp):
    from rnnrt.exec.cuda_exec import GpuContext
    from rnnrt.kernels.library import KernelLibrary
    c = GpuContext(cp, KernelLibrary())
    yield c
    c.close()
