"""GPU micro-check (marker gpu), issue 23: the cuBLAS rungs' forward at the paper shape (LSTM
L4 H512 B64 T100, I 512) in float32, tf32, bfloat16 and float16 on the graph executor: each
checked against its reference (the rounding-aware float64 one of its dtype)
within its precision's tolerance, then timed (CUDA events, median of 30 replays after 5).
Prints a table (run with -s); asserts correctness only: the timings are for the lead's
record, not a pass criterion. About 30 s on an H100.

Run: pytest -m gpu -s tests/gpu/test_gpu_precision_speed.py
"""
from __future__ import annotations

import numpy as np
import pytest

from rnnrt.device import gpu_available

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU with CuPy")]

from testkit import gpu_plan_key as PlanKey  # noqa: E402
from testkit import random_layer_stack  # noqa: E402

from rnnrt import reference  # noqa: E402
from rnnrt.check import assert_close  # noqa: E402
from rnnrt.kernels.choice import paper_schedule  # noqa: E402
from rnnrt.params import per_layer  # noqa: E402
from rnnrt.precision import get_precision  # noqa: E402
from rnnrt.session import time_events  # noqa: E402

CELL, L, H, B, T, I = "lstm", 4, 512, 64, 100, 512
DTYPES = ("float32", "tf32", "bfloat16", "float16")
SCHEDULES = ("paper", "ib10")


def test_paper_shape_forward_by_precision(cp, ctx):
    from rnnrt.exec.cuda_exec import EXECUTORS
    from rnnrt.exec.workspace import Workspace
    from rnnrt.plan import forward_plan
    layout, flat, x, h0, c0, _ = random_layer_stack(CELL, L, T, B, H, I)
    p64 = per_layer(flat.astype(np.float64), layout)
    d64 = lambda a: a.astype(np.float64)  # noqa: E731
    refs = {}
    rows = []
    for dtype in DTYPES:
        rdt = dtype
        if rdt not in refs:
            refs[rdt] = reference.forward(CELL, p64, d64(x), d64(h0), d64(c0), dtype=rdt)[0]
        p = get_precision(dtype)
        for name in SCHEDULES:
            key = PlanKey(CELL, T, B, I, H, L, True, paper_schedule(name).switches, dtype=dtype)
            plan = forward_plan(key)
            ws = Workspace(plan, cp, np.float32, cp.asarray(flat))
            ws.poison()
            ws.load_inputs(x, h0, c0)
            ex = EXECUTORS["graph"](plan, ws, ctx)
            ex.run()
            cp.cuda.Device().synchronize()
            c = assert_close(ws.read("y").get(), refs[rdt], p.atol, p.rtol,
                             name=f"{dtype} {name} y")
            ms = float(np.median(time_events(cp, ex.run, ex.stream, repeats=30, warmup=5)))
            rows.append((dtype, name, ms, c))
            del ex, ws
    base = {name: ms for dtype, name, ms, _ in rows if dtype == "float32"}
    print(f"\nLSTM L{L} H{H} B{B} T{T} forward, graph executor, "
          f"{cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}")
    print(f"{'dtype':9} {'schedule':8} {'ms':>8} {'vs fp32':>8}  worst element vs reference")
    for dtype, name, ms, c in rows:
        print(f"{dtype:9} {name:8} {ms:8.3f} {ms / base[name]:8.2f}  {c}")
