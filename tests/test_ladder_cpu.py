"""`rnnrt ladder` on the CPU: the record's fields, rung order from the one ladder, the
verification that refuses a rung whose output disagrees, and the no-GPU message."""
from __future__ import annotations

import dataclasses
import json

import pytest

from rnnrt import cli
from rnnrt.bench import ladder as lb
from rnnrt.device import gpu_available
from rnnrt.switches import ladder, rung_names


def small_cfg(**kw):
    base = dict(cell="gru", layers=2, hidden=8, input_size=5, batch=3, steps=4, repeats=2,
                warmup=0, cpu=True, input_batch=2)
    base.update(kw)
    return lb.LadderConfig(**base)


def test_cpu_ladder_record(tmp_path):
    rec = lb.run_ladder(small_cfg(), progress=lambda m: None)
    rows = rec["rows"]
    assert [r["rung"] for r in rows] == list(rung_names())
    for r in rows:
        for field in ("rung", "executor", "ms_median", "tflops", "speedup_vs_naive",
                      "ratio_vs_cudnn"):
            assert field in r
        assert r["check"]["ok"]
        assert r["ms_min"] <= r["ms_median"] <= r["ms_max"]
    assert rows[0]["speedup_vs_naive"] == 1.0
    assert rec["pass"] == "fwd" and "CPU" in rec["device"]["device"]
    assert rec["flops_per_pass"] == 2 * 3 * 8 * 3 * ((5 + 8) + (8 + 8)) * 4
    path = lb.write_record(rec, tmp_path / "r.json")
    assert json.loads(path.read_text())["config"]["input_size"] == 5
    table = lb.markdown_table(rec)
    for name in rung_names():
        assert f"| {name} |" in table


def test_cpu_ladder_backward_record():
    rec = lb.run_ladder(small_cfg(cell="lstm", backward=True), progress=lambda m: None)
    assert rec["pass"] == "fwd+bwd"
    assert rec["flops_per_pass"] == 3 * 2 * 4 * 8 * 3 * ((5 + 8) + (8 + 8)) * 4
    rows = rec["rows"]
    assert [r["rung"] for r in rows] == list(rung_names())
    assert all(r["check"]["ok"] for r in rows)
    assert rows[0]["check"]["against"].startswith(("y", "dx", "grads"))
    assert rows[-1]["plan"]["counts"]["gemm:dw"] == 2 * 2


def test_a_disagreeing_rung_is_refused(monkeypatch):
    """Break one rung's math (its fused GRU kernel's twin): the ladder must refuse to time it."""
    from rnnrt.kernels import KERNELS
    info = KERNELS["gru_fwd"]
    real = info.numpy_fn

    def broken(rows, cols, outs, ins):
        real(rows, cols, outs, ins)
        outs[0][...] += 1e-2

    monkeypatch.setitem(KERNELS, "gru_fwd", dataclasses.replace(info, numpy_fn=broken))
    rec = lb.run_ladder(small_cfg(), progress=lambda m: None)
    by = {r["rung"]: r for r in rec["rows"]}
    assert "refused" not in by["naive"] and "ms_median" in by["+grouped"]
    fused_rungs = [r.name for r in ladder() if r.switches.fused]
    for name in fused_rungs:
        assert "refused" in by[name] and "ms_median" not in by[name]


@pytest.mark.skipif(gpu_available(), reason="checks the message shown without a GPU")
def test_ladder_without_gpu_says_how(capsys):
    assert cli.main(["ladder"]) == 2
    err = capsys.readouterr().err
    assert "--cpu" in err and "rnnrt[cuda12]" in err


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
