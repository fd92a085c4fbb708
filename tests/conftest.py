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


def random_layer_stack(cell, layers, steps, batch, hidden, inp, bias=True, seed=0):
    """Random fp32 weights (uniform in +-1/sqrt(hidden), the flat torch layout) and inputs
    (x [steps, batch, inp], h0 [layers, batch, hidden], c0 likewise for LSTM, else None),
    never zero. -> (layout, flat, x, h0, c0, rng): rng continues the same stream, for
    whatever else a test draws (the backward's dy, dh_n, dc_n)."""
    import numpy as np

    from rnnrt.params import make_layout
    rng = np.random.default_rng(seed)
    layout = make_layout(cell, inp, hidden, layers, bias)
    flat = np.zeros(layout.size, np.float32)
    bound = 1 / np.sqrt(hidden)
    for e in layout.entries:
        n = int(np.prod(e.shape))
        flat[e.offset:e.offset + n] = rng.uniform(-bound, bound, n)
    f32 = np.float32
    x = rng.standard_normal((steps, batch, inp)).astype(f32)
    h0 = (0.5 * rng.standard_normal((layers, batch, hidden))).astype(f32)
    c0 = (0.5 * rng.standard_normal((layers, batch, hidden))).astype(f32) \
        if cell == "lstm" else None
    return layout, flat, x, h0, c0, rng
