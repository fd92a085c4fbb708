"""GPU backward (marker gpu): every switch combination x 4 cells x {1, 4} layers x {eager,
graph} gives the float64 reference gradients in fp32 tolerance, with every backward buffer
poisoned with NaN before each run; backward graphs proven captured; the runner's training
API (batch_first, accumulate, stale tapes).

Run on the device: pytest -m gpu tests/gpu/test_gpu_backward.py
"""
from __future__ import annotations

import numpy as np
import pytest

from rnnrt.device import gpu_available

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU with CuPy")]

from rnnrt.check import FP32_ATOL, FP32_RTOL, assert_close  # noqa: E402
from rnnrt.plan import forward_plan  # noqa: E402
from rnnrt.plan.backward import backward_plan  # noqa: E402
from rnnrt.plan.switches import ALL, all_combinations, ladder  # noqa: E402
from testkit import gpu_plan_key as PlanKey  # noqa: E402 (plans for this GPU)
from testkit import gpu_backward_case  # noqa: E402

CELL_NAMES = ("lstm", "gru", "rnn_tanh", "rnn_relu")
EXECUTORS = ("eager", "graph")
T, B, I, H = 6, 4, 24, 40


def case(cell, layers, steps=T, batch=B, hidden=H, inp=I, bias=True, seed=0):
    return gpu_backward_case(cell, layers, steps, batch, hidden, inp, bias, seed)


def check(ws, layout, ref, what):
    for name in ("dx", "dh0", "dc0"):
        if ref[name] is not None:
            assert_close(ws.read(name), ref[name], FP32_ATOL, FP32_RTOL, name=f"{what} {name}")
    got = ws.read("grads").get()
    for e in layout.entries:
        n = int(np.prod(e.shape))
        assert_close(got[e.offset:e.offset + n], ref["grads"][e.offset:e.offset + n],
                     FP32_ATOL, FP32_RTOL, name=f"{what} {e.name}")


def run_case(cp, ctx, key, executor, data):
    from rnnrt.exec.cuda_exec import EXECUTORS as EX
    from rnnrt.exec.workspace import Workspace
    layout, flat, (x, h0, c0), (dy, dhn, dcn), ref = data
    fplan, bplan = forward_plan(key), backward_plan(key)
    ws = Workspace(bplan, cp, np.float32, cp.asarray(flat))
    bwd_bufs = {b.name for b in bplan.buffers} - {b.name for b in fplan.buffers}
    fwd = EX[executor](fplan, ws, ctx)
    ws.poison()
    ws.load_inputs(x, h0, c0)
    fwd.run()
    bwd = EX[executor](bplan, ws, ctx, **({"capture": False} if executor == "graph" else {}))

    def load_grads():
        ws.poison(names=bwd_bufs - {"ones"})
        arrays = {"dy": dy, "dh_n": dhn}
        if dcn is not None:
            arrays["dc_n"] = dcn
        ws.load(**arrays)

    load_grads()
    cp.cuda.Device().synchronize()
    if executor == "graph":
        bwd.capture()
        cp.cuda.Device().synchronize()
        for name in ("dx", "dh0", "dc0", "grads"):   # capture ran nothing
            if name in bplan.outputs:
                assert bool(cp.isnan(ws.read(name)).all()), f"backward capture wrote {name}"
    bwd.run()
    cp.cuda.Device().synchronize()
    check(ws, layout, ref, f"{key.switches.label()} {executor}")
    load_grads()                      # a second run on re-poisoned buffers
    bwd.run()
    cp.cuda.Device().synchronize()
    check(ws, layout, ref, f"{key.switches.label()} {executor} second run")


COMBOS = all_combinations(input_batches=(1, 4, ALL))


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("layers", [1, 4])
@pytest.mark.parametrize("cell", CELL_NAMES)
@pytest.mark.parametrize("sw", COMBOS, ids=[s.label() for s in COMBOS])
def test_every_combination_backward(cp, ctx, sw, cell, layers, executor):
    key = PlanKey(cell, T, B, I, H, layers, True, sw, train=True)
    run_case(cp, ctx, key, executor, case(cell, layers))


ODD = [(1, 1, 33, 17), (7, 3, 17, 5), (9, 3, 65, 64)]


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("cell", CELL_NAMES)
@pytest.mark.parametrize("shape", ODD, ids=[f"T{a}B{b}H{c}I{d}" for a, b, c, d in ODD])
def test_odd_sizes_every_rung_backward(cp, ctx, shape, cell, executor):
    steps, batch, hidden, inp = shape
    for rung in ladder(input_batch=2):
        for bias in (True, False):
            key = PlanKey(cell, steps, batch, inp, hidden, 2, bias, rung.switches, train=True)
            run_case(cp, ctx, key, executor,
                     case(cell, 2, steps, batch, hidden, inp, bias=bias, seed=1))


def test_runner_training_api(cp):
    import rnnrt
    from rnnrt.gpu import GpuRunner
    for cls in (rnnrt.LSTM, rnnrt.GRU):
        for batch_first in (False, True):
            m = cls(I, H, num_layers=3, batch_first=batch_first, seed=5)
            rng = np.random.default_rng(1)
            shape = (B, T, I) if batch_first else (T, B, I)
            x = rng.standard_normal(shape).astype(np.float32)
            y_ref, hx_ref, tape_ref = m.forward(x, train=True)
            dy = rng.standard_normal(y_ref.shape).astype(np.float32)
            g_ref = m.backward(tape_ref, dy)
            for executor in EXECUTORS:
                r = GpuRunner(m, ladder()[-1].switches, executor=executor)
                y, hx, tape = r.forward(x, train=True)
                assert_close(y, y_ref, name="train forward y")
                g = r.backward(tape, cp.asarray(dy))
                assert_close(g.dx, g_ref.dx, name=f"{cls.__name__} bf={batch_first} dx")
                assert_close(g.dh0, g_ref.dh0, name="dh0")
                for name, arr in g_ref.params.items():
                    assert_close(g.params[name], arr, name=name)
                # accumulate: a second backward adds
                g2 = r.backward(tape, cp.asarray(dy), accumulate=True)
                for name, arr in g_ref.params.items():
                    assert_close(g2.params[name], 2 * arr, name=f"accumulated {name}")
                # a later training forward of the same shape keeps the old tape's
                # activations (its own workspace while the tape lives): both backwards right
                x2 = (0.5 * x).astype(np.float32)
                _, _, tape2 = r.forward(x2, train=True)
                g_old = r.backward(tape, cp.asarray(dy))
                assert_close(g_old.dx, g_ref.dx, name="old tape after a later forward: dx")
                g_new = r.backward(tape2, cp.asarray(dy))
                g2_ref = m.backward(m.forward(x2, train=True)[2], dy)
                assert_close(g_new.dx, g2_ref.dx, name="the later tape: dx")
                del tape2
                # inference after training still right, and params update reaches graphs
                y_inf, _ = r.forward(x)
                assert_close(y_inf, y_ref, name="inference y")
                r.params *= 0.5
                m2 = cls(I, H, num_layers=3, batch_first=batch_first, seed=5)
                m2.flat[...] = m.flat * 0.5
                assert_close(r.forward(x)[0], m2.forward(x)[0], name="after in-place update")
                r.close()
