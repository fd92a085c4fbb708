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

from rnnrt.check import assert_close  # noqa: E402
from rnnrt.plan.switches import ladder  # noqa: E402
from rnnrt.precision import get_precision  # noqa: E402

CELLS = ("lstm", "gru", "rnn_tanh", "rnn_relu")
DTYPES = ("tf32", "bfloat16", "float16")
PERSISTENT = ladder(input_batch=4)[-1].switches
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
            for name in ("y", "h_n", "c_n", "dx", "dh0", "dc0"):
                if name in got and ref[name] is not None:
                    assert_close(got[name], ref[name], p.atol, p.rtol, name=f"{what} {name}")
            if "grads" in got:
                for e in layout.entries:
                    assert_close(got["grads"][e.offset:e.end], ref["grads"][e.offset:e.end],
                                 p.atol, p.rtol, name=f"{what} {e.name}")
            if p.rounds:
                check_rounded(f"{what} y", got["y"], dtype)
