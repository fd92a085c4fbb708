"""GPU forward (marker gpu; skipped without a GPU): every switch combination x 4 cells x
{1, 4} layers x {eager, graph} against the NumPy reference in fp32 tolerance, outputs
poisoned with NaN before every run; graphs proven to have captured all their work; odd
sizes; the runner API; no allocation inside a run.

Run on the device: pytest -m gpu tests/gpu/test_gpu_forward.py
"""
from __future__ import annotations

import numpy as np
import pytest

from rnnrt.device import gpu_available

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU with CuPy")]

from rnnrt.check import assert_close  # noqa: E402
from rnnrt.plan.switches import ALL, all_combinations, ladder  # noqa: E402
from testkit import GPU_SHAPE, assert_runs_allocate_nothing  # noqa: E402
from testkit import gpu_forward_case as case  # noqa: E402
from testkit import gpu_plan_key as PlanKey  # noqa: E402 (plans for this GPU)
from testkit import run_gpu_forward_case as run_case  # noqa: E402

CELL_NAMES = ("lstm", "gru", "rnn_tanh", "rnn_relu")
EXECUTORS = ("eager", "graph")
T, B, I, H = GPU_SHAPE     # I != H; T not a multiple of the chunk 4


COMBOS = all_combinations(input_batches=(1, 4, ALL))


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("layers", [1, 4])
@pytest.mark.parametrize("cell", CELL_NAMES)
@pytest.mark.parametrize("sw", COMBOS, ids=[s.label() for s in COMBOS])
def test_every_combination(cp, ctx, sw, cell, layers, executor):
    key = PlanKey(cell, T, B, I, H, layers, True, sw)
    run_case(cp, ctx, key, executor, case(cell, layers))


ODD = [  # (steps, batch, hidden, input): hidden not a multiple of 32, batch 1 and 3, one step
    (1, 1, 33, 17), (1, 3, 33, 40), (7, 1, 17, 5), (9, 3, 65, 64), (3, 3, 100, 3)]


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("cell", CELL_NAMES)
@pytest.mark.parametrize("shape", ODD, ids=[f"T{a}B{b}H{c}I{d}" for a, b, c, d in ODD])
def test_odd_sizes_every_rung(cp, ctx, shape, cell, executor):
    steps, batch, hidden, inp = shape
    for rung in ladder(input_batch=2):
        for bias in (True, False):
            key = PlanKey(cell, steps, batch, inp, hidden, 2, bias, rung.switches)
            run_case(cp, ctx, key, executor,
                     case(cell, 2, steps, batch, hidden, inp, bias=bias, seed=1))


@pytest.mark.parametrize("executor", EXECUTORS)
def test_paper_size_last_rung(cp, ctx, executor):
    """The paper's default shape (shorter sequence) through the best rung."""
    key = PlanKey("lstm", 20, 64, 512, 512, 4, True, ladder()[-1].switches)
    run_case(cp, ctx, key, executor, case("lstm", 4, 20, 64, 512, 512, seed=2))


def test_run_allocates_nothing(cp, ctx):
    for executor in EXECUTORS:
        key = PlanKey("gru", T, B, I, H, 4, True, ladder()[-1].switches)
        assert_runs_allocate_nothing(cp, run_case(cp, ctx, key, executor, case("gru", 4)))


def test_runner_api_matches_model(cp):
    import rnnrt
    from rnnrt.gpu import GpuRunner
    for cls, kw in ((rnnrt.LSTM, {}), (rnnrt.GRU, {}), (rnnrt.RNN, {"nonlinearity": "relu"})):
        for batch_first in (False, True):
            m = cls(I, H, num_layers=3, batch_first=batch_first, seed=4, **kw)
            rng = np.random.default_rng(0)
            shape = (B, T, I) if batch_first else (T, B, I)
            x = rng.standard_normal(shape).astype(np.float32)
            y_ref, hx_ref = m.forward(x)
            for executor in EXECUTORS:
                r = GpuRunner(m, ladder()[-1].switches, executor=executor)
                y, hx = r.forward(x)
                y2, _ = r.forward(cp.asarray(x))      # second call reuses the plan
                assert len(r._states) == 1
                assert_close(y, y_ref, name=f"{cls.__name__} bf={batch_first} {executor} y")
                assert_close(y2, y_ref, name="second call y")
                if m.cell.has_cell_state:
                    assert_close(hx[0], hx_ref[0], name="h_n")
                    assert_close(hx[1], hx_ref[1], name="c_n")
                else:
                    assert_close(hx, hx_ref, name="h_n")
                r.close()


def test_runner_rejects_bad_input(cp):
    import rnnrt
    from rnnrt.gpu import GpuRunner
    m = rnnrt.GRU(I, H, seed=0)
    r = GpuRunner(m, executor="eager")
    x = np.ones((T, B, I), np.float32)
    with pytest.raises(TypeError, match="no cell state"):
        r.forward(x, (np.zeros((1, B, H), np.float32), np.zeros((1, B, H), np.float32)))
    with pytest.raises((ValueError, TypeError), match="x"):
        r.forward(x.astype(np.int32))
    with pytest.raises(ValueError, match="executor"):
        GpuRunner(m, executor="fast")
    with pytest.raises(ValueError, match="fp32"):
        GpuRunner(rnnrt.GRU(I, H, dtype=np.float64))
