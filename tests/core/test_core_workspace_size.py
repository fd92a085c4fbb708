"""sizes.workspace_elements is the builders' own buffer list summed, so the size GpuRunner
checks before it allocates is what the workspace then holds: a variable-length training key
(buffers sized for its capacity, dh_n / dc_n of its own), a persistent backward (its barrier
counters) and its fallback; and the runner refuses such a workspace by name, not by an
allocation failure."""
from __future__ import annotations

import numpy as np
import pytest
from testkit import CpuSession, draw32
from testkit import cpu_plan_key as PlanKey

from rnnrt import sizes
from rnnrt.exec.workspace import Workspace
from rnnrt.plan import backward_plan, forward_plan
from rnnrt.plan.packing import batch_sizes, bucket
from rnnrt.plan.switches import ladder


def _allocated(key) -> int:
    """Elements a Workspace of ``key``'s plan really allocates (NumPy, float32)."""
    plan = backward_plan(key) if key.train else forward_plan(key)
    flat = np.zeros(plan.buffer("params").size, np.float32)
    ws = Workspace(plan, np, np.float32, flat)
    return sum(int(a.size) for a in ws.bufs.values())


@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn_relu"])
@pytest.mark.parametrize("rung", [0, 6])
@pytest.mark.parametrize("train", [False, True])
def test_a_variable_length_key_sized_for_its_capacity(cell, rung, train):
    """Buffers for capacity (here 4x the steps), and dhn / dcn: the hand-written formula
    this replaces counted steps and left dhn / dcn out."""
    pattern = bucket(batch_sizes([9, 7, 7, 3, 1]))
    key = PlanKey(cell, len(pattern), pattern[0], 3, 5, 2, True, ladder()[rung].switches,
                  train=train, batch_sizes=pattern, capacity=4 * len(pattern))
    assert sizes.workspace_elements(key) == _allocated(key)


@pytest.mark.parametrize("backward", ["grid", "cluster"])
@pytest.mark.parametrize("batch", [4, 4096])
def test_a_persistent_backward_key_counts_its_barrier_counters(backward, batch):
    """Where the kernel runs, its bsync buffer is counted; where it declines (a batch too
    large for it), the per-step backward's buffers are."""
    key = PlanKey("lstm", 6, batch, 8, 16, 2, True, ladder()[6].switches, train=True,
                  backward=backward)
    plan = backward_plan(key)
    assert ("bsync" in {b.name for b in plan.buffers}) == (plan.fallback is None)
    assert sizes.workspace_elements(key) == sum(b.size for b in plan.buffers)


def test_the_runner_refuses_a_varlen_workspace_by_name(monkeypatch):
    """GpuRunner checks a variable-length training workspace against the free memory before
    it allocates: one byte short is a SizeError naming the workspace."""
    import rnnrt.session
    from rnnrt.gpu import GpuRunner
    monkeypatch.setattr(rnnrt.session, "GpuSession", CpuSession)
    monkeypatch.setenv("RNNRT_AUTOTUNE", "0")
    r = GpuRunner(rnnrt.LSTM(3, 5, num_layers=2, seed=0), schedule_cache=False)
    bs = batch_sizes([9, 7, 7, 3, 1])
    pattern = r.pattern(bs)
    r._seen.clear()
    need = _allocated(r.plan_key(len(pattern), bs[0], True, pattern)) * 4
    monkeypatch.setattr(r.cp.cuda.runtime, "memGetInfo", lambda: (need - 1, 80 << 30))
    x = draw32(np.random.default_rng(0), sum(bs), 3)
    with pytest.raises(sizes.SizeError, match=r"workspace of LSTM .*\(training\)"):
        r.forward_packed(x, bs, train=True)
    monkeypatch.setattr(r.cp.cuda.runtime, "memGetInfo", lambda: (need, 80 << 30))
    r.forward_packed(x, bs, train=True)
