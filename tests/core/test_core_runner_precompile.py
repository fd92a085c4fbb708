"""GpuRunner compiles every kernel file once before its first choice (kernels/library.py
``precompile``: the selector must time kernels, not compiles), on the CPU (testkit.CpuSession, a fake kernel library that behaves as
the real one does for the typed-only tensor-core kernels: ``get`` refuses them)."""
from __future__ import annotations

import types

import pytest

import rnnrt
from rnnrt.kernels import typed
from rnnrt.kernels.registry import REGISTRY, get_kernel
from testkit import CpuSession

MMA_KERNELS = {k.name for k in REGISTRY if k.file in typed.MMA_FILES}


class RecordingSession(CpuSession):
    """CpuSession whose kernel library records what is compiled, and refuses an fp32 ``get``
    of a typed-only kernel as kernels/library.py does."""

    def __init__(self):
        super().__init__()
        self.got, self.typed = [], []

        def get(name):
            if name in MMA_KERNELS:
                raise ValueError(f"{name}: no fp32 kernel")
            self.got.append(name)

        self.ctx = types.SimpleNamespace(kernels=types.SimpleNamespace(
            get=get, get_persistent=lambda name, dtype: self.typed.append((name, dtype)),
            with_shared=lambda name, smem_bytes: None))


@pytest.fixture
def session(monkeypatch):
    import rnnrt.session
    made = []

    def make():
        made.append(RecordingSession())
        return made[-1]

    monkeypatch.setattr(rnnrt.session, "GpuSession", make)
    monkeypatch.setenv("RNNRT_AUTOTUNE", "0")
    return made


def test_the_registry_has_typed_only_kernels():
    assert MMA_KERNELS   # else the tests below check nothing


@pytest.mark.parametrize("dtype", ["float32", "tf32", "bfloat16", "float16"])
def test_every_kernel_file_is_compiled_once_for_the_runners_precision(session, dtype):
    from rnnrt.gpu import GpuRunner
    r = GpuRunner(rnnrt.LSTM(8, 16, seed=0), schedule_cache=False, dtype=dtype)
    r.schedule(5, 4)   # the first choice compiles (a ValueError here was the GPU's failure)
    s = session[-1]
    fp32 = {k.name for k in REGISTRY} - MMA_KERNELS
    assert set(s.got) == fp32
    # one typed module a (persistent file, precision): the tensor-core file's at bf16 / fp16
    files = () if dtype == "float32" else typed.TYPED_PERSISTENT_FILES + (
        typed.MMA_FILES if dtype in typed.MMA_DTYPES else ())
    assert sorted(get_kernel(n).file for n, _ in s.typed) == sorted(files)
    assert all(d == dtype for _, d in s.typed)
    r.schedule(7, 4)   # once: a second shape compiles nothing more
    assert len(s.got) == len(fp32)
