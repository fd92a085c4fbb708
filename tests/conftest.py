"""Fixtures shared by the GPU test files (marker gpu): CuPy and one GpuContext per module.
They are only requested by GPU tests, which skip without a GPU, so nothing here imports CuPy
on a machine without one."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def cp():
    import cupy
    return cupy


@pytest.fixture(scope="module")
def ctx(cp):
    from rnnrt.exec.cuda_exec import GpuContext
    from rnnrt.kernels import KernelLibrary
    c = GpuContext(cp, KernelLibrary())
    yield c
    c.close()


def gpu_plan_key(*args, **kw):
    """rnnrt.plan.PlanKey for the GPU the tests run on (its limits, which the persistent
    switch's fit reads)."""
    import cupy

    from rnnrt.limits import DeviceLimits
    from rnnrt.plan import PlanKey
    return PlanKey(*args, device=DeviceLimits.from_device(cupy), **kw)
