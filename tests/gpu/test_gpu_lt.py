"""GEMMs with a chosen cuBLASLt algorithm (PlanKey.gemm 'lt'; exec/lt_gemms.py) on the GPU
(marker gpu; skipped without a GPU): the forward and the training step against the float64
reference, outputs poisoned first, with a cuBLASLt algorithm forced on every GEMM it can take
(so the path runs whatever the timings say) and with the default rule; the graph's capture
runs nothing; a run allocates nothing; the runner's selector times the '+lt' refinement.

Run on the device: pytest -m gpu tests/gpu/test_gpu_lt.py
"""
from __future__ import annotations

import numpy as np
import pytest

from rnnrt.device import gpu_available

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU with CuPy")]

from rnnrt.check import FP32_ATOL, FP32_RTOL  # noqa: E402
from rnnrt.kernels.gemm_algos import GemmAlgoChooser  # noqa: E402
from rnnrt.kernels.schedules import paper_schedule  # noqa: E402
from testkit import GPU_SHAPE, check_bwd_outputs, run_gpu_backward_case  # noqa: E402
from testkit import gpu_backward_case, gpu_forward_case  # noqa: E402
from testkit import gpu_plan_key as PlanKey  # noqa: E402
from testkit import assert_runs_allocate_nothing, run_gpu_forward_case  # noqa: E402

T, B, I, H = GPU_SHAPE
PAPER = paper_schedule("paper").switches   # every switch of the paper: cuBLAS GEMMs
EXECUTORS = ("eager", "graph")


@pytest.fixture
def forced(cp):
    """A context whose every eligible GEMM runs the last cuBLASLt algorithm that ran."""
    from rnnrt.exec.cuda_exec import GpuContext
    from rnnrt.kernels.library import KernelLibrary
    c = GpuContext(cp, KernelLibrary())
    c.lt(GemmAlgoChooser(pick=lambda ms: max(i for i, t in enumerate(ms) if t is not None)))
    yield c
    c.close()


def lt_choices(ex):
    """(labels of the GEMMs that ran a cuBLASLt algorithm, all choices)."""
    ch = ex.prepared.gemm_choices
    return [c for c in ch if c[2] != "cublasSgemm" and not c[2].startswith("declined")], ch


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("layers", [1, 4])
@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn_tanh"])
def test_forced_algorithms_forward(cp, forced, cell, layers, executor):
    key = PlanKey(cell, T, B, I, H, layers, True, PAPER, gemm="lt")
    ex = run_gpu_forward_case(cp, forced, key, executor, gpu_forward_case(cell, layers))
    chosen, every = lt_choices(ex)
    assert chosen and len(every) == sum(1 for op in ex.prepared.plan.ops
                                        if type(op).__name__ == "Gemm")


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_forced_algorithms_training_step(cp, forced, cell, executor):
    layers = 2
    key = PlanKey(cell, T, B, I, H, layers, True, PAPER, train=True, gemm="lt")
    data = gpu_backward_case(cell, layers)
    for got in run_gpu_backward_case(cp, forced, key, executor, data):
        check_bwd_outputs(got, data[0], data[4], f"{cell} lt {executor}", FP32_ATOL, FP32_RTOL)


def test_default_rule_at_the_paper_shape(cp, ctx):
    """The rule's own choices (whatever they are) at the paper's shape, shorter."""
    key = PlanKey("lstm", 20, 64, 512, 512, 4, True, PAPER, gemm="lt")
    ex = run_gpu_forward_case(cp, ctx, key, "graph", gpu_forward_case("lstm", 4, 20, 64, 512,
                                                                      512, seed=2))
    assert ex.prepared.gemm_choices and ctx.lt().chooser.summary()


def test_a_run_allocates_nothing(cp, forced):
    key = PlanKey("gru", T, B, I, H, 4, True, PAPER, gemm="lt")
    assert_runs_allocate_nothing(cp, run_gpu_forward_case(cp, forced, key, "graph",
                                                          gpu_forward_case("gru", 4)))


def test_the_runner_times_the_lt_refinement(cp, tmp_path):
    import rnnrt
    from rnnrt.gpu import GpuRunner
    from rnnrt.kernels.tuning import ScheduleCache
    m = rnnrt.LSTM(256, 256, num_layers=2, seed=0)
    r = GpuRunner(m, schedule_cache=ScheduleCache("test device", tmp_path / "s.json"))
    x = np.random.default_rng(0).standard_normal((16, 128, 256)).astype(np.float32)
    r.forward(x)
    sel = r.schedule(16, 128)
    assert sel.candidates[-1]["name"].endswith("+lt")
    assert sel.candidates[-1]["ms"] is not None, sel.candidates[-1]
    r.close()
