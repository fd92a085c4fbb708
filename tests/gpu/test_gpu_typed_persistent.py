"""GPU (marker gpu), issue 24 step 1: the persistent kernels' typed instantiations -- every
cell x family (grid, cluster forward; grid, cluster backward) x {tf32, bfloat16, float16},
forward and forward + backward, on the graph executor, against the rounding-aware float64
reference of the same precision within precision.get_precision(dtype).atol / rtol, every
buffer poisoned (NaN) first, the worst element reported (rnnrt.check); the plans say which
family ran (no fallback) and the 16-bit stored outputs are exactly representable. Two
shapes: the small one of test_gpu_precision.py (T 6, B 4, I 24, H 40, L 2) and H 128 B 8
(whole float4 rows, the 4-byte typed staging path over several k tiles).

About 1-2 minutes on an H100 (24 instantiations compiled). Run:
  pytest -m gpu tests/gpu/test_gpu_typed_persistent.py
"""
from __future__ import annotations

import pytest

from rnnrt.device import gpu_available

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU with CuPy")]

from test_gpu_precision import check_rounded, reference_case, run_graph  # noqa: E402
from testkit import gpu_plan_key as PlanKey  # noqa: E402 (plans for this GPU)

from rnnrt.check import compare  # noqa: E402
from rnnrt.plan.switches import ladder  # noqa: E402
from rnnrt.precision import get_precision  # noqa: E402

CELLS = ("lstm", "gru", "rnn_tanh", "rnn_relu")
DTYPES = ("tf32", "bfloat16", "float16")
PERSISTENT = ladder(input_batch=4)[-1].switches
RUNG = ladder(input_batch=4)[-2].switches   # +wavefront: the cuBLAS schedule without it
RUNG_FACTOR = 1.5
"""Where a persistent result is outside the precision's tolerance, it must still be within
RUNG_FACTOR x the cuBLAS rung's own error on the same case: the kernels' fp32 sums run in
another order than cuBLAS's and than the float64 reference's, so a 16-bit store can round the
other way (one ulp) and backpropagation through a chaotic recurrence spreads it (H100: rnn_tanh
fp16 H128 B8, the grid backward's weight_ih 0.0093 off, 6 of 16,384 elements past 4e-3 + 4e-3
|r|). The kernel is judged as accurate as the schedules it stands in for, not more."""


def close_as_the_rungs(got, ref, p, name, rung):
    """Assert ``got`` within ``p``'s tolerance of ``ref``, or within RUNG_FACTOR x the worst
    error of ``rung()`` (the cuBLAS rung's result of the same array, computed on demand)."""
    c = compare(got, ref, p.atol, p.rtol, name=name)
    if c.ok:
        return
    r = compare(rung(), ref, p.atol, p.rtol, name=f"{name} (cuBLAS rung)")
    assert c.max_abs_err <= RUNG_FACTOR * r.max_abs_err, f"{c}; {r}"
SHAPES = ((6, 4, 24, 40, 2), (12, 8, 128, 128, 1))   # T, B, I, H, L
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"H{s[3]}B{s[1]}")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cell", CELLS)
def test_typed_persistent_against_the_rounding_aware_reference(cp, ctx, cell, dtype, shape):
    from rnnrt.plan import forward_plan
    from rnnrt.plan.backward import backward_plan
    T, B, I, H, L = shape
    p = get_precision(dtype)
    case = reference_case(cell, dtype, shape)
    layout, ref = case[0], case[4]
    for family in ("grid", "cluster"):
        for train, backward in ((False, None), (True, family)):
            key = PlanKey(cell, T, B, I, H, L, True, PERSISTENT, train=train, dtype=dtype,
                          family=family, backward=backward)
            what = f"{cell} {dtype} H{H} B{B} {family}{' fwd+bwd' if train else ' fwd'}"
            fplan = forward_plan(key)
            assert fplan.fallback is None, f"{what}: fell back: {fplan.fallback}"
            ran = {op.name for op in fplan.ops if getattr(op, "kind", "") == "persistent"}
            assert ran == {f"{cell}_persistent{'_cluster' if family == 'cluster' else ''}_fwd"}, \
                f"{what}: ran {ran}"
            if train:
                bplan = backward_plan(key)
                assert bplan.fallback is None, f"{what}: backward fell back: {bplan.fallback}"
            got, ws, plan = run_graph(cp, ctx, key, case)
            rung_got = {}

            def rung(name, sl=slice(None)):
                if not rung_got:
                    rkey = PlanKey(cell, T, B, I, H, L, True, RUNG, train=train, dtype=dtype)
                    rung_got.update(run_graph(cp, ctx, rkey, case)[0])
                return rung_got[name][sl]
            for name in ("y", "h_n", "c_n", "dx", "dh0", "dc0"):
                if name in got and ref[name] is not None:
                    close_as_the_rungs(got[name], ref[name], p, f"{what} {name}",
                                       lambda n=name: rung(n))
            if "grads" in got:
                for e in layout.entries:
                    sl = slice(e.offset, e.end)
                    close_as_the_rungs(got["grads"][sl], ref["grads"][sl], p,
                                       f"{what} {e.name}", lambda sl=sl: rung("grads", sl))
            if p.rounds:
                check_rounded(f"{what} y", got["y"], dtype)
