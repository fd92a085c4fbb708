"""GpuRunner's guards on the GPU (marker gpu; skipped without a GPU): a workspace that cannot
fit the device's free memory is refused (sizes.SizeError naming the shape, the need and what
is free) before any plan is built or buffer allocated, and the runner still works after;
flags must be bools; a tape must come from this runner; a first kernel compile says so on
stderr, once, and a compile found in CuPy's disk cache says nothing.

Run on the device: pytest -m gpu tests/gpu/test_gpu_guards.py
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rnnrt.device import gpu_available

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU with CuPy")]

import rnnrt  # noqa: E402
import rnnrt.gpu as gpu_mod  # noqa: E402
from rnnrt.check import FP32_ATOL, FP32_RTOL, assert_close  # noqa: E402
from rnnrt.gpu import GpuRunner  # noqa: E402
from rnnrt.sizes import SizeError  # noqa: E402
from testkit import Spy  # noqa: E402

WAVE = rnnrt.ladder()[6].switches
REPO = Path(__file__).resolve().parents[2]


def test_a_workspace_past_the_free_memory_is_refused_first(cp, monkeypatch):
    # unchunked: in chunks (rnnrt/chunked.py) this inference fits, its workspace a chunk's
    monkeypatch.setenv("RNNRT_CHUNK_STEPS", "0")
    m = rnnrt.LSTM(8, 2048, num_layers=4, seed=0)
    runner = GpuRunner(m, switches=WAVE, schedule_cache=False)
    x = np.random.default_rng(0).standard_normal((20000, 256, 8)).astype(np.float32)
    pool = cp.get_default_memory_pool()
    used = pool.used_bytes()
    spy = Spy("forward_plan")
    monkeypatch.setattr(gpu_mod, "forward_plan", spy)
    with pytest.raises(SizeError, match=r"workspace of LSTM input_size=8 hidden_size=2048 "
                                        r"num_layers=4, batch=256 steps=20000 needs .* GiB "
                                        r"of GPU memory; .* GiB available"):
        runner.forward(x)
    assert spy.calls == 0 and pool.used_bytes() == used
    monkeypatch.undo()
    small = x[:5, :3]                                   # the runner still works
    y, _ = runner.forward(small)
    ref, _ = m(small)
    assert_close(cp.asnumpy(y), ref, FP32_ATOL, FP32_RTOL, name="y after a refusal")


def test_flags_and_tapes_are_checked(cp):
    m = rnnrt.GRU(8, 16, num_layers=2, seed=0)
    a = GpuRunner(m, switches=WAVE, schedule_cache=False)
    b = GpuRunner(m, switches=WAVE, schedule_cache=False)
    x = np.random.default_rng(1).standard_normal((5, 3, 8)).astype(np.float32)
    with pytest.raises(TypeError, match="train"):
        a.forward(x, train="yes")
    y, _, tape = a.forward(x, train=True)
    dy = cp.ones_like(y)
    with pytest.raises(TypeError, match="accumulate"):
        a.backward(tape, dy, accumulate="no")
    grads_before = cp.asnumpy(b.grads).tobytes()
    with pytest.raises(ValueError, match="tape: it is not one of this runner's"):
        b.backward(tape, dy)
    assert cp.asnumpy(b.grads).tobytes() == grads_before
    g = a.backward(tape, dy)                            # the tape still works where it belongs
    assert g.dx.shape == x.shape


def _compile_once(cache_dir) -> str:
    code = ("from rnnrt.kernels.library import KernelLibrary; "
            "KernelLibrary().get('lstm_persistent_fwd')")
    env = dict(os.environ, CUPY_CACHE_DIR=str(cache_dir),
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       cwd=REPO, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stderr


def test_a_first_compile_says_so_once_and_a_cached_one_says_nothing(tmp_path):
    first = [ln for ln in _compile_once(tmp_path).splitlines() if ln.startswith("[rnnrt]")]
    assert len(first) == 1 and "persistent.cu" in first[0] and " s" in first[0], first
    again = [ln for ln in _compile_once(tmp_path).splitlines() if ln.startswith("[rnnrt]")]
    assert again == [], again


def test_a_new_workspace_is_poisoned_before_the_caller_loads_it(cp):
    """GpuSession.workspace poisons the buffers on the plan's first stream (non-blocking); a
    load right after it, on CuPy's current stream, must not be overwritten by that poison
    (a benchmark's inputs once read back NaN at LSTM H512 B64). A large workspace, so the
    poison runs long enough to race, and the load read back exactly."""
    from rnnrt.plan.forward import forward_plan
    m = rnnrt.LSTM(1024, 1024, num_layers=1, seed=0)
    runner = GpuRunner(m, switches=WAVE, schedule_cache=False)
    key = runner.new_key(100, 64, True, WAVE)
    plan = forward_plan(key)
    x = cp.asarray(np.random.default_rng(1).standard_normal((100, 64, 1024)),
                   dtype=cp.float32)
    for _ in range(3):
        ws = runner.session.workspace(plan, runner.params)
        ws.load(x=x)   # CuPy's current stream, right away
        cp.cuda.Device().synchronize()
        got = ws.read("x")
        assert not bool(cp.isnan(got).any()), "the poison overwrote the load"
        assert bool((got == x).all())
        del ws
    runner.close()
