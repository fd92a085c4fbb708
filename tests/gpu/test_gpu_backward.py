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
from rnnrt.plan.switches import ALL, all_combinations, ladder  # noqa: E402
from testkit import gpu_plan_key as PlanKey  # noqa: E402 (plans for this GPU)
from testkit import check_bwd_outputs, run_gpu_backward_case  # noqa: E402
from testkit import gpu_backward_case as case  # noqa: E402

CELL_NAMES = ("lstm", "gru", "rnn_tanh", "rnn_relu")
EXECUTORS = ("eager", "graph")
T, B, I, H = 6, 4, 24, 40


def run_case(cp, ctx, key, executor, data):
    """Two backward runs on re-poisoned buffers (a graph proven to capture nothing), each
    against the reference in fp32 tolerance."""
    layout, ref = data[0], data[4]
    for i, got in enumerate(run_gpu_backward_case(cp, ctx, key, executor, data)):
        check_bwd_outputs(got, layout, ref,
                          f"{key.switches.label()} {executor}" + (" second run" if i else ""),
                          FP32_ATOL, FP32_RTOL)


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


SPLIT_RUNGS = [r for r in ladder(input_batch=4) if r.switches.grouped]


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("cell", CELL_NAMES)
def test_split_dh_gemm_backward(cp, ctx, cell, executor):
    """The recurrent backward GEMM split along K (cuBLAS strided-batched, then the ordered
    sum kernel; PlanKey.bwd_splits 2 and 5 of K = G*40), every grouped rung, against the
    reference; the two runs of each give the same bits (no atomics)."""
    import dataclasses
    data = case(cell, 4)
    for rung in SPLIT_RUNGS:
        for s in (2, 5):
            key = dataclasses.replace(PlanKey(cell, T, B, I, H, 4, True, rung.switches,
                                              train=True), bwd_splits=s)
            runs = run_gpu_backward_case(cp, ctx, key, executor, data)
            for i, got in enumerate(runs):
                check_bwd_outputs(got, data[0], data[4], f"{rung.name} S={s} {executor} {i}",
                                  FP32_ATOL, FP32_RTOL)
            for name in runs[0]:
                assert np.array_equal(runs[0][name], runs[1][name], equal_nan=True), \
                    f"{rung.name} S={s}: {name} differs between two runs"


@pytest.mark.parametrize("cell", CELL_NAMES)
def test_folded_split_sum_gives_the_sum_kernels_bits(cp, ctx, cell):
    """On the GPU, the plan whose pointwise kernels sum the split GEMM's partial products
    (*_bwd_split) gives bit for bit the gradients of the plan with the ordered sum kernel
    every step (``split_sums_unfolded``), both within the reference's tolerance."""
    from rnnrt.plan.backward import backward_plan, split_sums_unfolded
    from rnnrt.plan.ops import Kernel
    data = case(cell, 2)
    key = PlanKey(cell, T, B, I, H, 2, True, ladder(input_batch=4)[-1].switches, train=True,
                  bwd_splits=5)
    assert any(isinstance(op, Kernel) and op.name.endswith("_bwd_split")
               for op in backward_plan(key).ops)
    folded = run_gpu_backward_case(cp, ctx, key, "graph", data, runs=1)[0]
    with split_sums_unfolded():
        summed = run_gpu_backward_case(cp, ctx, key, "graph", data, runs=1)[0]
    check_bwd_outputs(folded, data[0], data[4], f"{cell} folded", FP32_ATOL, FP32_RTOL)
    for name in summed:
        assert np.array_equal(folded[name], summed[name], equal_nan=True), f"{cell}: {name}"


def test_split_rule_at_a_size_it_splits(cp, ctx):
    """Hidden 256, batch 8: the rule itself splits (K = 1024 or 768 into 16 slices)."""
    from rnnrt.kernels.gemm_split import dh_splits
    for cell in ("lstm", "gru"):
        key = PlanKey(cell, 5, 8, 256, 256, 2, True, ladder()[-2].switches, train=True)
        assert dh_splits(key) > 1
        data = case(cell, 2, 5, 8, 256, 256, seed=3)
        for got in run_gpu_backward_case(cp, ctx, key, "graph", data):
            check_bwd_outputs(got, data[0], data[4], f"{cell} rule S={dh_splits(key)}",
                              FP32_ATOL, FP32_RTOL)


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


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("cell", CELL_NAMES)
def test_weight_gradients_in_chunks(cp, ctx, cell, executor):
    """The weight gradients in chunks of 1 and 4 steps (PlanKey.wgrad_steps: GEMMs over each
    chunk's rows on streams of their own, added up in one order) and on one or two streams
    of their own (PlanKey.wgrad_streams 2, 3) after the per-step backward of every rung with
    streams, and after the cluster backward in launches of 2 steps; at one layer, the cluster
    backward in launches of the chunk (2 and 3 steps: each chunk's dx and weight GEMMs beside
    the rest of the chain); against the reference; the two runs of each give the same
    bits."""
    from rnnrt.plan.backward import backward_plan
    keys = [(f"{r.name} wgrad {k} streams {n}",
             PlanKey(cell, T, B, I, H, 4, True, r.switches, train=True, wgrad_steps=k,
                     wgrad_streams=n))
            for r in ladder(input_batch=2) if r.switches.streams
            for k, n in ((1, None), (4, None), (None, 2), (None, 3), (4, 3))]
    persistent = ladder(input_batch=2)[-1].switches
    for k, n in ((1, None), (None, 3)):
        keys.append((f"cluster wgrad {k} streams {n}",
                     PlanKey(cell, T, B, I, H, 4, True, persistent, train=True,
                             backward="cluster", wgrad_steps=k, wgrad_streams=n)))
    for k in (2, 3):
        key = PlanKey(cell, T, B, I, H, 1, True, persistent, train=True, backward="cluster",
                      wgrad_steps=k)
        plan = backward_plan(key)
        assert plan.fallback is None, plan.fallback
        assert sum(getattr(op, "kind", "") == "persistent" for op in plan.ops) == -(-T // k)
        keys.append((f"L1 cluster wgrad {k}", key))
    for what, key in keys:
        data = case(cell, key.num_layers)
        runs = run_gpu_backward_case(cp, ctx, key, executor, data)
        for i, got in enumerate(runs):
            check_bwd_outputs(got, data[0], data[4], f"{what} {executor} {i}", FP32_ATOL,
                              FP32_RTOL)
        for name in runs[0]:
            assert np.array_equal(runs[0][name], runs[1][name], equal_nan=True), \
                f"{what}: {name} differs between two runs"
