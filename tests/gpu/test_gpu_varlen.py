"""Variable-length plans on the GPU (marker gpu; skipped without a GPU): GpuRunner.forward_packed
and its backward against rnnrt.varlen in float64 (fp32 tolerance; every output and
gradient; workspaces start poisoned with NaN) for every cell, both directions, with and
without states, on the eager and the graph executor, for explicit rungs (naive: the selects;
fused: the masked kernels) and the selector's choice; bucketed patterns that freeze rows;
several patterns sharing one workspace; the masked kernels against their NumPy twins with
NaN in what a frozen row must not read.

Run on the device: pytest -m gpu tests/gpu/test_gpu_varlen.py
"""
from __future__ import annotations

import numpy as np
import pytest

from rnnrt.device import gpu_available

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU with CuPy")]

from testkit import check_runner_packed_step

import rnnrt
from rnnrt.check import FP32_ATOL, FP32_RTOL, assert_close
from rnnrt.gpu import GpuRunner
from rnnrt.kernels.tuning import ScheduleCache
from rnnrt.plan.packing import batch_sizes, bucket

I, H = 24, 40
BATCHES = ([9, 7, 7, 3, 1], [12, 12, 2, 2, 1], [3, 3, 3, 3, 3], [11, 1, 1, 1, 1],
           list(range(13, 0, -1)) + [1] * 7)   # 20 sequences: three row groups


def _model(cell, layers):
    if cell in ("lstm", "gru"):
        return getattr(rnnrt, cell.upper())(I, H, num_layers=layers, seed=2)
    return rnnrt.RNN(I, H, num_layers=layers, nonlinearity=cell.split("_")[1], seed=2)


@pytest.mark.parametrize("executor", ["eager", "graph"])
@pytest.mark.parametrize("rung", [0, 3, 6])   # naive, +fused, +wavefront (every switch)
@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn_tanh", "rnn_relu"])
def test_packed_runs_equal_the_reference(cp, cell, rung, executor):
    r = GpuRunner(_model(cell, 2), rnnrt.ladder(input_batch=2)[rung].switches,
                  executor=executor, schedule_cache=False)
    rng = np.random.default_rng(rung)
    for lengths in BATCHES:
        assert bucket(batch_sizes(lengths)) != batch_sizes(lengths) or lengths[0] == 3
        for reverse in (False, True):
            check_runner_packed_step(r, lengths, rng, reverse, with_states=not reverse,
                                     what=f"rung {rung} {executor}")
    r.close()


def test_the_selectors_choice_and_shared_workspaces(cp, tmp_path):
    """switches='auto': a varlen key of its own (cuBLAS candidates only); the batches of one
    batch size and steps bucket on one workspace; a batch repeated reuses its plans; three
    layers."""
    r = GpuRunner(_model("lstm", 3), schedule_cache=ScheduleCache("t", tmp_path / "s.json"))
    rng = np.random.default_rng(7)
    for lengths in BATCHES + BATCHES[:1]:
        check_runner_packed_step(r, lengths, rng, reverse=bool(rng.integers(2)))
    sel = r.schedule(16, 5, True, varlen=True)
    assert sel.schedule.family is None and all(c["name"] not in ("stack", "grid", "cluster")
                                               for c in sel.candidates)
    # one workspace a batch size: every batch here buckets to at most 16 steps
    assert len(r._states) == len({len(b) for b in BATCHES})
    r.close()


@pytest.mark.parametrize("name", ["lstm_fwd_mask", "gru_fwd_mask", "rnn_relu_fwd_mask",
                                  "lstm_bwd_mask", "gru_bwd_mask", "rnn_tanh_bwd_mask",
                                  "ew_select", "ew_copy", "lstm_fwd_mask_noact",
                                  "gru_fwd_mask_noact"])
def test_masked_kernels_equal_their_twins_and_skip_frozen_rows(cp, name):
    """One launch on random inputs (mask rows 1, 0, 1, 1, 0, ...), NaN in every input a frozen
    row must not read (all but h_prev / c_prev / dh_rec / dc_next, and ew_select's other
    side): the outputs equal the twin's (fp32), with no NaN."""
    from rnnrt.kernels.library import KernelLibrary
    from rnnrt.kernels.registry import KERNELS
    k = KERNELS[name]
    rows, cols = 7, 33
    outs_s, ins_s = k.arg_shapes(rows, cols)
    rng = np.random.default_rng(0)
    mask = (np.arange(rows) % 3 != 1).astype(np.float32)[:, None]
    passed = {"h_prev", "c_prev", "dh_rec", "dc_next", "mask", "a"}
    ins = []
    for (arg, _), shape in zip(k.ins, ins_s):
        a = (2 * rng.standard_normal(shape)).astype(np.float32)
        if arg == "mask":
            a = mask.copy()
        elif arg not in passed or (name == "ew_select" and arg == "b"):
            a[mask[:, 0] == 0 if name != "ew_select" else mask[:, 0] != 0] = np.nan
        ins.append(a)
    if name == "ew_select":   # frozen rows take b: a's NaN goes on them instead
        ins[1][mask[:, 0] == 0] = np.nan
    want = [np.full(s, np.nan, np.float32) for s in outs_s]
    k.numpy_fn(rows, cols, want, [a.copy() for a in ins])
    d_ins = [cp.asarray(a) for a in ins]
    d_outs = [cp.full(s, cp.nan, dtype=cp.float32) for s in outs_s]
    KernelLibrary().launch(name, rows, cols, [(o.data.ptr, o.shape[1]) for o in d_outs],
                           [(a.data.ptr, a.shape[1]) for a in d_ins])
    cp.cuda.Device().synchronize()
    for (arg, _), got, w in zip(k.outs, d_outs, want):
        assert not bool(cp.isnan(got).any()), f"{name} {arg}: NaN reached the output"
        # fp32 tolerance: the inputs are random, not activations (a "gate" of -3), so the
        # backward's products amplify tanhf's ulp against NumPy's tanh up to ~5e-5 relative
        # (seen on the H100 at lstm_bwd_mask); a wrong gate, mask or row is O(1) off
        assert_close(got, w, FP32_ATOL, FP32_RTOL, name=f"{name} {arg}")
