"""rnnrt.nn's test fixtures: ``cuda_on_cpu``, the CUDA backend (rnnrt/nn/cuda.py) end to end
on the CPU (CuPy replaced by NumPy, GpuRunner's session by testkit.CpuSession)."""
from __future__ import annotations

import contextlib
import sys

import numpy as np
import pytest
from testkit import CpuSession, NumpyCupy

torch = pytest.importorskip("torch")


@pytest.fixture
def cuda_on_cpu(monkeypatch):
    """-> the CudaBackend that every CPU float32 call goes through (CuPy = NumPy)."""
    import rnnrt.nn.cuda as nn_cuda
    import rnnrt.nn.inputs
    import rnnrt.session
    fake = NumpyCupy()
    fake.from_dlpack = np.from_dlpack
    fake.ascontiguousarray = np.ascontiguousarray
    fake.cuda.Device = lambda *a: contextlib.nullcontext()
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(rnnrt.session, "GpuSession", CpuSession)
    monkeypatch.setenv("RNNRT_AUTOTUNE", "0")
    monkeypatch.setattr(torch.cuda, "device", lambda *a: contextlib.nullcontext())
    monkeypatch.setattr(nn_cuda, "_current_stream", lambda cp, device: contextlib.nullcontext())
    backend = nn_cuda.CudaBackend()
    real = rnnrt.nn.inputs.backend_for
    monkeypatch.setattr(rnnrt.nn.inputs, "backend_for", lambda device, dtype: (
        backend if (device.type, dtype) == ("cpu", torch.float32) else real(device, dtype)))
    return backend
