"""`rnnrt precision` on the CPU (rnnrt/bench/precision_error.py): the relative error's
definition, the goal's verdict (and that it fails on a planted error), the record and its
name, and (with the plans' dtype merged) every precision through the NumPy executor with
torch.nn on the CPU in the cuDNN role."""
from __future__ import annotations

import json

import numpy as np
import pytest
from testkit import record_name_match

from rnnrt import cli
from rnnrt.bench import precision_error as pe

pytest.importorskip("torch")
SMALL = ["precision", "--cpu", "--layers", "2", "--hidden", "8", "--batch", "3",
         "--steps", "5,12"]
OUTPUTS = {"y", "h_n", "c_n"}
GRADS = {"dx", "dh0", "dc0", "dweight_ih", "dweight_hh", "dbias_ih", "dbias_hh"}


def test_relative_error_is_plain_where_values_are_typical_and_scaled_near_zero():
    r = np.array([1.0, -1.0, 1e-9, 1.0])          # rms ~ 0.866
    a = r + np.array([1e-3, 0.0, 1e-9, 0.0])      # 0.1% on a typical value; 100% on ~0
    e = pe.rel_errors(a, r)
    rms = np.sqrt(np.mean(r * r))
    assert e["max_rel_err"] == pytest.approx(1e-3 / (1.0 + rms))
    assert e["max_rel_err"] < 1e-3                 # the 1e-9 element's error is not 100%
    assert e["mean_rel_err"] == pytest.approx((1e-3 / (1 + rms) + 1e-9 / (1e-9 + rms)) / 4)
    assert e["nonfinite"] == 0 and e["ref_rms"] == pytest.approx(rms)
    bad = pe.rel_errors(np.array([1.0, np.inf, np.nan, 0.0]), r)
    assert bad["nonfinite"] == 2 and bad["max_rel_err"] is None and bad["mean_rel_err"] is None
    with pytest.raises(ValueError, match="shape"):
        pe.rel_errors(np.zeros(3), np.zeros(4))


def _row(impl, mx, mean, dtype="bfloat16", what="y"):
    return {"dtype": dtype, "steps": 100, "what": what, "impl": impl, "max_rel_err": mx,
            "mean_rel_err": mean, "nonfinite": 0 if mx is not None else 1}


def test_goal_holds_at_2x_and_fails_past_it_or_on_nonfinite():
    ok = pe.goal([_row("rnnrt", 2e-2, 1e-3), _row("cudnn", 1e-2, 1e-3)], [])
    assert ok["ok"] and ok["checks"][0]["ok"]
    worse = pe.goal([_row("rnnrt", 2.1e-2, 1e-3), _row("cudnn", 1e-2, 1e-3)], [])
    assert not worse["ok"] and not worse["checks"][0]["ok_max_rel_err"]
    mean_worse = pe.goal([_row("rnnrt", 1e-2, 3e-3), _row("cudnn", 1e-2, 1e-3)], [])
    assert not mean_worse["ok"] and mean_worse["checks"][0]["ok_max_rel_err"]
    tiny = pe.goal([_row("rnnrt", 9e-7, 5e-8, "float32"), _row("cudnn", 1e-7, 1e-8, "float32")],
                   [])
    assert tiny["ok"]                              # fp32 noise under the floor
    nan = pe.goal([_row("rnnrt", None, None), _row("cudnn", 1e-2, 1e-3)], [])
    assert not nan["ok"]
    theirs_nan = pe.goal([_row("rnnrt", 1e-2, 1e-3), _row("cudnn", None, None)], [])
    assert theirs_nan["ok"]
    alone = pe.goal([_row("rnnrt", 1e-2, 1e-3)], [])
    assert not alone["ok"]                         # nothing to judge against: not met
    long_bad = pe.goal([_row("rnnrt", 1e-2, 1e-3), _row("cudnn", 1e-2, 1e-3)],
                       [{"ok": False}])
    assert not long_bad["ok"] and long_bad["long_ok"] is False


def test_cpu_report_float32_record_rows_name_and_goal(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert cli.main([*SMALL, "--dtypes", "float32", "--out", str(out)]) == 0
    rec = json.loads(out.read_text())
    assert rec["kind"] == "precision" and rec["goal"]["ok"]
    rows = rec["rows"]
    assert {r["kind"] for r in rows} == {"precision-error"}
    assert {r["impl"] for r in rows} == {"rnnrt", "cudnn"}
    assert {r["what"] for r in rows} == OUTPUTS | GRADS
    assert {r["steps"] for r in rows} == {5, 12}
    for r in rows:
        assert r["dtype"] == "float32" and r["device"] and "numpy" in r["versions"]
        assert (r["layers"], r["hidden"], r["batch"]) == (2, 8, 3)
        assert 0 <= r["mean_rel_err"] <= r["max_rel_err"] < 1e-5
    assert rec["long"] == []                       # float32 has no long 16-bit run
    assert "goal" in capsys.readouterr().out
    name = pe.default_path(rec).name
    assert name.startswith("precision-lstm-L2-H8-B3-T5-T12-cpu-")
    assert record_name_match("precision", name)


def test_a_planted_error_fails_the_goal(tmp_path, monkeypatch):
    real = pe._rnnrt_cpu

    def off(cfg, model, inputs, dtype, train=True):
        got = real(cfg, model, inputs, dtype, train)
        got["dweight_hh"] = got["dweight_hh"] * 1.001   # 0.1%: far past cuDNN's fp32 error
        return got

    monkeypatch.setattr(pe, "_rnnrt_cpu", off)
    out = tmp_path / "p.json"
    assert cli.main([*SMALL, "--dtypes", "float32", "--out", str(out)]) == 1
    g = json.loads(out.read_text())["goal"]
    assert not g["ok"]
    assert {c["what"] for c in g["checks"] if not c["ok"]} == {"dweight_hh"}


def test_bad_flags(capsys):
    with pytest.raises(SystemExit):
        cli.main(["precision", "--cpu", "--dtypes", "float32,fp8"])
    assert "fp8" in capsys.readouterr().err
    with pytest.raises(ValueError, match="PrecisionConfig.steps"):
        pe.PrecisionConfig(steps=())


def test_cpu_report_every_precision_meets_the_goal(tmp_path):
    """float32, bfloat16 and float16 (tf32 is the GPU's: torch's CPU LSTM, cuDNN's stand-in
    here, has no TF32 and would be held to fp32's error)."""
    out = tmp_path / "p.json"
    rc = cli.main([*SMALL, "--dtypes", "float32,bfloat16,float16", "--long-steps", "60",
                   "--out", str(out)])
    rec = json.loads(out.read_text())
    assert rc == 0 and rec["goal"]["ok"], [c for c in rec["goal"]["checks"] if not c["ok"]]
    worst = {d: max(r["max_rel_err"] for r in rec["rows"]
                    if r["dtype"] == d and r["impl"] == "rnnrt" and r["what"] in OUTPUTS)
             for d in ("float32", "bfloat16", "float16")}
    # the storage rounding shows: bf16 (8-bit mantissa) > fp16 (11) > fp32
    assert worst["bfloat16"] > worst["float16"] > worst["float32"]
    assert worst["bfloat16"] < 0.1
    assert {(r["dtype"], r["impl"]) for r in rec["long"]} == {
        (d, i) for d in ("bfloat16", "float16") for i in ("rnnrt", "cudnn")}
    assert all(r["finite"] and r["ok"] and r["steps"] == 60 for r in rec["long"])


def test_the_gpu_path_through_gpurunner_names_every_array(monkeypatch):
    """_rnnrt_gpu (GpuRunner, what the GPU report runs) on testkit.CpuSession, and the cuDNN
    role's torch.nn, for a cell with and one without a cell state: the same arrays, by the
    same names, as the float64 reference, within fp32's error."""
    import sys

    from testkit import CpuSession, NumpyCupy

    import rnnrt.session
    monkeypatch.setitem(sys.modules, "cupy", NumpyCupy())
    monkeypatch.setattr(rnnrt.session, "GpuSession", CpuSession)
    monkeypatch.setenv("RNNRT_AUTOTUNE", "0")
    for cell in ("lstm", "gru"):
        cfg = pe.PrecisionConfig(cell=cell, layers=2, hidden=8, batch=3, steps=(5,), cpu=True)
        model, inputs = pe._model_inputs(cfg, 5)
        ref = pe._reference(cfg, model, inputs)
        got = pe._rnnrt_gpu(cfg, model, inputs, "float32")
        assert set(got) == set(ref) == (OUTPUTS | GRADS) - ({"c_n", "dc0"} if cell == "gru"
                                                            else set())
        for k in ref:
            assert pe.rel_errors(got[k], ref[k])["max_rel_err"] < 1e-5, k
        theirs = pe._torch_run(cfg, model, inputs, "float32", "cpu")   # the cuDNN role
        assert set(theirs) == set(ref)
        assert max(pe.rel_errors(theirs[k], ref[k])["max_rel_err"] for k in ref) < 1e-5
        fwd = pe._rnnrt_gpu(cfg, model, inputs, "float32", train=False)
        assert set(fwd) == OUTPUTS - ({"c_n"} if cell == "gru" else set())
        got = pe._rnnrt_gpu(cfg, model, inputs, "bfloat16")   # the 16-bit error shows
        worst = max(pe.rel_errors(got[k], ref[k])["max_rel_err"] for k in ref)
        assert 1e-4 < worst < 0.1, worst
