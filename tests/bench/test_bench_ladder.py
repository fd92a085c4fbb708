"""`rnnrt ladder` on the CPU: the record's fields, rung order from the one ladder, the
verification that refuses a rung whose output disagrees, and the no-GPU message."""
from __future__ import annotations

import dataclasses
import json
import math

import pytest

from rnnrt import cli
from rnnrt.bench import ladder as lb
from rnnrt.bench import ladder_report as lr
from rnnrt.device import gpu_available
from rnnrt.plan.switches import PAPER_RUNGS, ladder, rung_names


def small_cfg(**kw):
    base = dict(cell="gru", layers=2, hidden=8, input_size=5, batch=3, steps=4, repeats=2,
                warmup=0, cpu=True, input_batch=2)
    base.update(kw)
    return lb.LadderConfig(**base)


def test_cpu_ladder_record(tmp_path):
    rec = lb.run_ladder(small_cfg(), progress=lambda m: None)
    rows = rec["rows"]
    # every rung in ladder order, then the schedule selector's choice (the auto row)
    assert [r["rung"] for r in rows] == [*rung_names(), "auto"]
    for r in rows:
        for field in ("rung", "executor", "ms_median", "tflops", "speedup_vs_naive",
                      "ratio_vs_cudnn"):
            assert field in r
        assert r["check"]["ok"]
        assert r["ms_min"] <= r["ms_median"] <= r["ms_max"]
    assert rows[0]["speedup_vs_naive"] == 1.0
    # the selector's '+lt' refinement (cuBLASLt kernels) is not timed on the NumPy executor
    names = [c["name"] for c in rows[-1]["selection"]["candidates"]]
    assert names and not any(n.endswith("+lt") for n in names), names
    assert rec["pass"] == "fwd" and "CPU" in rec["device"]["device"]
    assert rec["flops_per_pass"] == 2 * 3 * 8 * 3 * ((5 + 8) + (8 + 8)) * 4
    path = lr.write_record(rec, tmp_path / "r.json")
    assert json.loads(path.read_text())["config"]["input_size"] == 5
    table = lr.markdown_table(rec)
    for name in rung_names()[:PAPER_RUNGS]:
        assert f"| {name} |" in table
    for name in rung_names()[PAPER_RUNGS:]:
        assert f"| {name} (beyond the paper) |" in table
    # the small CPU size fits the (example H100) device: the persistent rung ran its kernel
    last = rows[-2]   # the ladder's last rung (the auto row follows it)
    assert last["rung"] == "+persistent" and "fallback" not in last
    # cluster kernels with the wavefront: one launch per layer per input_batch chunk
    cfg = small_cfg()
    assert last["plan"]["counts"]["kernel:persistent"] == cfg.layers * math.ceil(
        cfg.steps / cfg.input_batch)
    assert "launches of 2 steps" in last["plan"]["fit"]
    assert "fits" in last["fit"]


def test_cpu_ladder_persistent_fallback_is_recorded(monkeypatch):
    """A device too small for the layer: the persistent rung runs the fused schedule, its row
    and the table say so, and it still matches the naive rung."""
    tiny = dataclasses.replace(lb.H100_SXM, name="tiny GPU", smem_per_block_optin=16)
    monkeypatch.setattr(lb, "H100_SXM", tiny)
    rec = lb.run_ladder(small_cfg(), progress=lambda m: None)
    last = rec["rows"][-2]   # the ladder's last rung (the auto row follows it)
    assert last["rung"] == "+persistent" and last["check"]["ok"]
    assert "tiny GPU" in last["fallback"] and "shared memory" in last["fallback"]
    assert "kernel:persistent" not in last["plan"]["counts"]
    table = lr.markdown_table(rec)
    assert "| +persistent (beyond the paper) (fell back) |" in table
    assert "+persistent: persistent declined on tiny GPU" in table


def test_cpu_ladder_backward_record():
    rec = lb.run_ladder(small_cfg(cell="lstm", backward=True), progress=lambda m: None)
    assert rec["pass"] == "fwd+bwd"
    assert rec["flops_per_pass"] == 3 * 2 * 4 * 8 * 3 * ((5 + 8) + (8 + 8)) * 4
    rows = rec["rows"]
    assert [r["rung"] for r in rows] == [*rung_names(), "auto"]
    assert all(r["check"]["ok"] for r in rows)
    assert rows[0]["check"]["against"].startswith(("y", "dx", "grads"))
    assert rows[-2]["plan"]["counts"]["gemm:dw"] == 2 * 2   # the ladder's last rung


def test_a_disagreeing_rung_is_refused(monkeypatch):
    """Break one rung's math (its fused GRU kernel's twin: the ladder's inference pass runs
    gru_fwd_noact): the ladder must refuse to time it."""
    from rnnrt.kernels.registry import KERNELS
    info = KERNELS["gru_fwd_noact"]
    real = info.numpy_fn

    def broken(rows, cols, outs, ins):
        real(rows, cols, outs, ins)
        outs[0][...] += 1e-2

    monkeypatch.setitem(KERNELS, "gru_fwd_noact", dataclasses.replace(info, numpy_fn=broken))
    rec = lb.run_ladder(small_cfg(), progress=lambda m: None)
    by = {r["rung"]: r for r in rec["rows"]}
    assert "refused" not in by["naive"] and "ms_median" in by["+grouped"]
    fused_rungs = [r.name for r in ladder() if r.switches.fused and not r.switches.persistent]
    for name in fused_rungs:
        assert "refused" in by[name] and "ms_median" not in by[name]
    # the persistent rung runs its own kernel, not gru_fwd_noact: held to naive, it agrees
    assert "ms_median" in by["+persistent"] and by["+persistent"]["check"]["ok"]


@pytest.mark.skipif(gpu_available(), reason="checks the message shown without a GPU")
def test_ladder_without_gpu_says_how(capsys):
    assert cli.main(["ladder"]) == 2
    err = capsys.readouterr().err
    assert "--cpu" in err and "pip install -e '.[cuda12]'" in err


def test_cli_cpu_ladder_and_demo(tmp_path, capsys):
    out = tmp_path / "l.json"
    assert cli.main(["ladder", "--cpu", "--steps", "3", "--hidden", "6", "--repeats", "1",
                     "--out", str(out)]) == 0
    assert "+wavefront" in capsys.readouterr().out and out.exists()
    assert cli.main(["demo"]) == 0
    assert "|dx|" in capsys.readouterr().out


def test_cli_rejects_bad_flags():
    for argv in (["ladder", "--input-batch", "0"], ["ladder", "--hidden", "-1"],
                 ["ladder", "--cell", "xlstm"]):
        with pytest.raises(SystemExit):
            cli.main(argv)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU with CuPy")
@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "fwd+bwd"])
def test_gpu_ladder_small_with_cudnn(backward):
    """The GPU ladder end to end at a small size, cuDNN row included when torch has CUDA
    (its outputs, and with --backward its gradients in rnnrt's flat layout, checked against
    the float64 reference): every rung verified, the persistent rung ran its kernel."""
    torch = pytest.importorskip("torch")
    cfg = small_cfg(cell="lstm", cpu=False, executors=("graph",), backward=backward)
    rec = lb.run_ladder(cfg, progress=lambda m: None)
    rows = rec["rows"]
    assert all(r["check"]["ok"] for r in rows), [r["check"] for r in rows]
    last = next(r for r in rows if r["rung"] == "+persistent")
    # one launch a layer, or (cluster kernels, layers along the wavefront) one a chunk
    chunks = math.ceil(cfg.steps / cfg.input_batch) if "launches of" in last["plan"]["fit"] else 1
    assert "fallback" not in last
    assert last["plan"]["counts"]["kernel:persistent"] == cfg.layers * chunks
    if torch.cuda.is_available():
        assert rows[-1]["rung"] == "cudnn" and rows[-1]["check"]["ok"]


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU with CuPy")
@pytest.mark.parametrize("dtype", ["bfloat16", "tf32"])
def test_gpu_ladder_without_float64_asks_cudnn_at_float32(monkeypatch, dtype):
    """Where no float64 reference runs (every size past the limit here), a tf32 / 16-bit
    ladder builds cuDNN at float32: the rung held to cuDNN's output records the second
    opinion, the cuDNN row its own error against float32, and a tf32 run keeps TF32 on for
    its own cuDNN after the float32 one (bench/second_opinion.py)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    from rnnrt.bench import second_opinion as so
    monkeypatch.setattr(lb, "REFERENCE_FLOP_LIMIT", 0)
    cfg = small_cfg(cell="lstm", cpu=False, executors=("graph",), backward=True, dtype=dtype,
                    rungs=("naive", "auto"))
    said = []
    rows = {r["rung"]: r for r in lb.run_ladder(cfg, progress=said.append)["rows"]}
    naive = rows["naive"]["check"]
    assert naive["ok"] and naive["accepted_by"] in (so.SAME_PRECISION, so.SECOND_OPINION)
    assert naive["against"].endswith("vs cuDNN output (NumPy reference skipped: "
                                     f"{lb._flops(cfg):.2e} FLOPs)")
    opinion = naive["second_opinion"]
    assert opinion["against"] == so.AGAINST and set(opinion["arrays"]) == {"y", "dx", "grads"}
    assert "second_opinion" not in rows["auto"]["check"]          # held to the naive rung
    own = rows["cudnn"]["check"]["second_opinion"]["arrays"]
    assert set(own) == {"y", "dx", "grads"}
    assert all(math.isfinite(a["max_abs_err"]) for a in own.values())
    assert {n: a["peer_max_abs_err"] for n, a in opinion["arrays"].items()} == \
        {n: a["max_abs_err"] for n, a in own.items()}
    assert any("second opinion" in m for m in said)
    if dtype == "tf32":
        assert torch.backends.cudnn.allow_tf32 and torch.backends.cuda.matmul.allow_tf32
