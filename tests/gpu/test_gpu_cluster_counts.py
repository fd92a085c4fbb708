"""The cluster kernel's cluster count on the GPU (marker gpu; skipped without a GPU): the
driver's co-resident cap for the compiled kernel (kernels/occupancy.py) is a positive count
of at most SMs / 8 and at most the bound derived from the properties; a plan key naming a
count (PlanKey.clusters) launches exactly 8 x that many blocks and equals the float64
reference (outputs NaN-poisoned first, fp32 tolerance, worst element reported by
assert_close) for LSTM and GRU, one layer and chunked; the selector's own choice at GRU L1
H128 B256 (whatever count it picks) is correct and says which cap bounded the counts.

Run on the device: pytest -m gpu tests/gpu/test_gpu_cluster_counts.py
"""
from __future__ import annotations

import numpy as np
import pytest

from rnnrt.device import gpu_available

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU with CuPy")]

import rnnrt  # noqa: E402
from rnnrt.check import FP32_ATOL, FP32_RTOL, assert_close  # noqa: E402
from rnnrt.gpu import GpuRunner  # noqa: E402
from rnnrt.kernels import occupancy as O  # noqa: E402
from rnnrt.kernels import persistent as P  # noqa: E402
from rnnrt.kernels.schedules import cluster_schedule  # noqa: E402
from rnnrt.kernels.tuning import ScheduleCache  # noqa: E402
from rnnrt.plan import forward_plan  # noqa: E402
from testkit import gpu_forward_case as case  # noqa: E402
from testkit import gpu_plan_key as PlanKey  # noqa: E402 (plans for this GPU)
from testkit import run_gpu_forward_case as run_case  # noqa: E402


@pytest.fixture(scope="module")
def props(cp):
    return cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)


def _cap(props, ctx, fit):
    return O.cluster_cap(fit, props, ctx.kernels.with_shared(fit.kernel, fit.smem_bytes))


@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("batch", [32, 256])
def test_the_driver_cap_is_a_positive_count_within_the_sms(cp, ctx, props, cell, batch):
    fit = P.persistent_fit(cell, 128, batch, props, kind="cluster")
    assert fit.ok, fit.describe()
    c = _cap(props, ctx, fit)
    print(f"{cell} H128 B{batch} ({fit.threads} threads, {fit.smem_bytes} B): "
          f"{c.describe()}")
    assert c.source == "driver", c.note
    assert 1 <= c.clusters <= props["multiProcessorCount"] // P.PK_CLUSTER
    assert c.clusters <= O.derived_cap(fit, props).clusters


def _launch_grids(plan):
    return [op.launch[0] for op in plan.ops if getattr(op, "launch", None)]


CASES = [  # (cell, layers, steps, batch, clusters, family): one layer, chunked (2 layers)
    ("lstm", 1, 20, 256, 14, "cluster"), ("gru", 1, 20, 256, 14, "cluster"),
    ("lstm", 1, 20, 128, 10, "cluster"), ("gru", 1, 20, 128, 5, "cluster"),
    ("lstm", 2, 30, 64, 6, "cluster"), ("gru", 2, 30, 64, 3, "cluster"),
    ("gru", 1, 20, 256, 29, "regs"), ("lstm", 1, 20, 256, 22, "regs"),
    ("gru", 2, 30, 128, 9, "regs"), ("rnn_tanh", 1, 20, 64, 16, "regs")]


@pytest.mark.parametrize("case_", CASES, ids=[f"{c}-L{L}-T{T}-B{B}-{f}{n}"
                                             for c, L, T, B, n, f in CASES])
def test_an_explicit_count_runs_exactly_that_count_and_equals_the_reference(cp, ctx, case_):
    cell, layers, steps, batch, n, family = case_
    sched = cluster_schedule(n, family)
    key = PlanKey(cell, steps, batch, 128, 128, layers, True, sched.switches,
                  family=family, clusters=n)
    plan = forward_plan(key)
    assert plan.fallback is None, plan.fallback
    grids = _launch_grids(plan)
    assert grids and all(g == (P.PK_CLUSTER * n, 1, 1) for g in grids), grids
    assert f"{n} cluster{'' if n == 1 else 's'} of {P.PK_CLUSTER} blocks" in plan.fit, plan.fit
    run_case(cp, ctx, key, "graph", case(cell, layers, steps, batch, 128, 128))


def test_auto_at_gru_h128_b256_picks_a_count_and_is_correct(cp, tmp_path):
    T, B, H = 100, 256, 128
    m = rnnrt.GRU(H, H, num_layers=1, seed=3)
    x = np.random.default_rng(4).standard_normal((T, B, H)).astype(np.float32)
    y_ref, _ = m.forward(x)
    r = GpuRunner(m, schedule_cache=ScheduleCache("test device", tmp_path / "s.json"))
    y, _ = r.forward(x)
    assert_close(y, y_ref, FP32_ATOL, FP32_RTOL, name="gru auto B256 y")
    sel = r.schedule(T, B)
    rows = {c["name"]: c for c in sel.candidates}
    print(f"chose {sel.schedule.name} ({sel.note}): " + ", ".join(
        f"{k} {v['ms']:.3f}" if v["ms"] is not None else f"{k} ({v['status']})"
        for k, v in rows.items()))
    assert "cluster" in rows and "co-resident cap" in sel.note and "cuOccupancy" in sel.note
    assert any(k.startswith("cluster/") for k in rows)   # other counts were timed
    if sel.schedule.family == "cluster":
        key = r.plan_key(T, B)
        assert key.clusters == sel.schedule.clusters
        n = key.clusters or P.cluster_count(B, r.limits.sms)
        assert all(g == (P.PK_CLUSTER * n, 1, 1) for g in _launch_grids(forward_plan(key)))
    r.close()
