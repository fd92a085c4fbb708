"""Whether the ladder's float64 NumPy reference runs is one decision (bench/ladder.py
reference_runs), taken the same way by the size check before the run and by the run: above
REFERENCE_FLOP_LIMIT cuDNN's output replaces it only where cuDNN really runs — the size
check used to assume it whenever --cudnn was on, so a machine without a CUDA torch ran a
reference it had not counted."""
from __future__ import annotations

import pytest

from rnnrt import sizes
from rnnrt.bench import ladder
from rnnrt.cells import forward_flops


def _big():
    cfg = ladder.LadderConfig(layers=4, hidden=2048, batch=64, steps=200, rungs=("naive",))
    assert forward_flops("lstm", 2048, 2048, 4, 64, 200) > ladder.REFERENCE_FLOP_LIMIT
    return cfg


@pytest.mark.parametrize("why", [None, "torch has no CUDA"])
def test_the_size_check_counts_the_reference_where_cudnn_does_not_run(monkeypatch, why):
    cfg = _big()
    monkeypatch.setattr(ladder, "cudnn_missing", lambda c: why)
    assert ladder.reference_runs(cfg) == (why is not None)
    c, T, B, I, H, L = cfg.cell, cfg.steps, cfg.batch, cfg.inp, cfg.hidden, cfg.layers
    io = T * B * I + 2 * L * B * H + T * B * H
    without = sizes.model_bytes(c, I, H, L, True, 4) + 4 * io
    monkeypatch.setenv("RNNRT_HOST_BYTES", str(without))   # room for all but the reference
    if why is None:
        ladder.check_sizes(cfg)
    else:
        with pytest.raises(sizes.SizeError, match="the ladder of LSTM"):
            ladder.check_sizes(cfg)


def test_the_run_decides_from_its_own_cudnn(monkeypatch):
    """The run passes what cudnn_bench gave: a reason (a string) means the reference runs,
    whatever cudnn_missing would say now; small or CPU ladders always run it."""
    cfg = _big()
    monkeypatch.setattr(ladder, "cudnn_missing", lambda c: None)
    assert ladder.reference_runs(cfg, "disabled (--no-cudnn)")
    assert not ladder.reference_runs(cfg, object())          # a CudnnBench
    assert not ladder.reference_runs(cfg)
    small = ladder.LadderConfig(layers=1, hidden=8, batch=2, steps=3)
    cpu = ladder.LadderConfig(layers=4, hidden=2048, batch=64, steps=200, cpu=True)
    assert ladder.reference_runs(small, object()) and ladder.reference_runs(cpu, object())
