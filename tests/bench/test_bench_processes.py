"""`rnnrt ladder --processes N` (rnnrt/bench/processes.py): the ladder in N fresh processes,
pooled -- medians over the processes, each ratio taken within its process, a row any
process refused refused; end to end on the CPU (two real child processes)."""
from __future__ import annotations

import copy
import json

import pytest

from rnnrt import cli
from rnnrt.bench import processes as P


def test_child_argv_drops_the_parents_flags(tmp_path):
    argv = ["ladder", "--processes", "3", "--cpu", "--out", "x.json", "--repeats=2",
            "--overwrite", "--processes=4", "--out=y.json", "--rungs", "naive"]
    assert P.child_argv(argv, tmp_path / "c.json") == [
        "ladder", "--cpu", "--repeats=2", "--rungs", "naive", "--out", str(tmp_path / "c.json")]


def _record(ms, ratio, cudnn_ms, created, refused=False):
    row = {"rung": "+fused", "executor": "graph", "ms_median": ms, "ms_min": ms * 0.9,
           "ms_max": ms * 1.1, "runs": 10, "tflops": 1.0, "speedup_vs_naive": 2.0,
           "ratio_vs_cudnn": ratio, "share_of_ceiling": 0.5, "check": {"ok": True}}
    if refused:
        row = {"rung": "+fused", "executor": "graph", "refused": "y: worst element 3.0"}
    cud = {"rung": "cudnn", "executor": "torch.nn", "ms_median": cudnn_ms,
           "ms_min": cudnn_ms, "ms_max": cudnn_ms, "runs": 10, "ms_median_per_timing":
           [cudnn_ms, cudnn_ms], "tflops": 1.0, "speedup_vs_naive": None, "ratio_vs_cudnn": 1.0,
           "share_of_ceiling": 0.3, "check": {"ok": True}, "dtype": "float32"}
    return {"kind": "ladder", "created": created, "config": {"cell": "lstm", "layers": 4},
            "dtype": "float32", "flops_per_pass": 2e9, "ceiling": {"tflops": 50.0},
            "cudnn": cud, "rows": [row, cud], "device": {"device": "X"}}


def test_pool_takes_medians_over_processes_and_keeps_each():
    recs = [_record(1.0, 2.0, 2.0, "a"), _record(1.2, 3.0, 3.6, "b"),
            _record(1.1, 2.5, 2.75, "c")]
    out = P.pool(recs, "rnnrt ladder --processes 3")
    row, cud = out["rows"]
    assert row["ms_median"] == 1.1 and row["ratio_vs_cudnn"] == 2.5
    assert row["ratio_vs_cudnn_range"] == [2.0, 3.0]
    assert [p["ratio_vs_cudnn"] for p in row["per_process"]] == [2.0, 3.0, 2.5]
    assert row["ms_min"] == pytest.approx(0.9) and row["ms_max"] == pytest.approx(1.32)
    assert row["runs"] == 30 and row["tflops"] == pytest.approx(2e9 / 1.1e-3 / 1e12)
    assert cud["ms_median"] == 2.75 and cud["ms_median_per_timing"] == [2.0, 3.6, 2.75]
    assert out["cudnn"] is cud and cud["pooled_over_processes"]
    assert out["processes"] == 3 and out["process_records"] == ["a", "b", "c"]
    assert out["ceiling"]["tflops_per_process"] == [50.0] * 3
    assert out["compile_s"] == 0.0                  # none of the records compiled
    assert recs[0]["rows"][0]["ms_median"] == 1.0   # the inputs are left as they were


def test_pool_adds_up_the_processes_compile_seconds():
    """The first fresh process of a machine pays the kernels' compiles, the rest load them
    from CuPy's disk cache: the pooled record's compile_s is their sum (what a sweep's time
    budget leaves out of the point)."""
    recs = [dict(_record(1.0, 2.0, 2.0, "a"), compile_s=95.0),
            dict(_record(1.0, 2.0, 2.0, "b"), compile_s=0.5), _record(1.0, 2.0, 2.0, "c")]
    assert P.pool(recs)["compile_s"] == 95.5
    recs[0]["phase_s"] = {"reference": 30.0, "rows": 4.0}
    recs[1]["phase_s"] = {"reference": 29.0, "rows": 5.0, "precompile": 1.0}
    assert P.pool(recs)["phase_s"] == {"reference": 59.0, "rows": 9.0, "precompile": 1.0}


def test_a_row_one_process_refused_is_refused():
    recs = [_record(1.0, 2.0, 2.0, "a"), _record(1.0, 2.0, 2.0, "b", refused=True)]
    row = P.pool(recs)["rows"][0]
    assert row["refused"] == "y: worst element 3.0" and len(row["per_process"]) == 2


def test_pool_refuses_records_of_different_runs():
    a, b = _record(1.0, 2.0, 2.0, "a"), _record(1.0, 2.0, 2.0, "b")
    b2 = copy.deepcopy(b)
    b2["config"]["layers"] = 1
    with pytest.raises(ValueError, match="different configurations"):
        P.pool([a, b2])
    b3 = copy.deepcopy(b)
    b3["rows"] = b3["rows"][1:]
    with pytest.raises(ValueError, match="different rows"):
        P.pool([a, b3])
    with pytest.raises(ValueError, match="at least one"):
        P.pool([])


def test_a_process_that_writes_nothing_is_named(tmp_path):
    class Done:
        returncode, stdout, stderr = 3, "boom: no device", None
    with pytest.raises(RuntimeError, match=r"(?s)process 1 of 2 \(exit status 3\).*boom"):
        P.run_processes(["ladder", "--cpu"], 2, run=lambda *a, **k: Done(), progress=lambda s: None)


def test_the_ladder_in_two_processes_on_the_cpu(tmp_path, capsys):
    out = tmp_path / "pooled.json"
    status = cli.main(["ladder", "--cpu", "--processes", "2", "--repeats", "1", "--warmup",
                       "0", "--layers", "1", "--hidden", "8", "--input-size", "8", "--batch",
                       "2", "--steps", "3", "--rungs", "naive,+fused", "--out", str(out)])
    assert status == 0
    rec = json.loads(out.read_text())
    assert rec["processes"] == 2 and len(set(rec["process_records"])) == 2
    assert [r["rung"] for r in rec["rows"]] == ["naive", "+fused"]
    for r in rec["rows"]:
        assert len(r["per_process"]) == 2 and r["check"]["ok"]
        assert r["ms_min"] <= r["ms_median"] <= r["ms_max"]
    text = capsys.readouterr().out
    assert "Pooled over 2 processes" in text and "| +fused |" in text


def test_a_sweep_points_ladder_arguments_make_its_ladder_config():
    """ladder_argv of a point's LadderConfig, parsed by `rnnrt ladder`, gives that config back
    (so a point pooled over processes is the same measurement)."""
    from rnnrt.bench import sweep as sw
    cfgs = [sw.SweepConfig(**{**sw.PRESETS["wide"], "hidden": (128, 2048), "batch": (8,)}),
            sw.SweepConfig(hidden=(64,), batch=(3,), layers=(2,), cells=("gru",),
                           input_size=17, input_batch=("all",), rungs=("naive", "auto"),
                           cudnn=False, executors=("eager", "graph"), dtype="bfloat16",
                           seed=4, repeats=3, warmup=1)]
    n = 0
    for cfg in cfgs:
        for point in sw.grid(cfg):
            lc = point.ladder_config(cfg)
            assert cli.ladder_config(cli.parse(P.ladder_argv(lc))) == lc, point.label()
            n += 1
    assert n == 2 * 2 * 2 * 1 * 2 + 1   # wide: cells x layers x hidden x batch x passes; 1


def test_a_sweep_in_two_processes_a_point_on_the_cpu(tmp_path):
    out = tmp_path / "s.jsonl"
    status = cli.main(["sweep", "--cpu", "--processes", "2", "--hidden", "8", "--batch", "2",
                       "--layers", "1", "--steps", "3", "--repeats", "1", "--warmup", "0",
                       "--rungs", "naive", "--out", str(out)])
    assert status == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    got = [r for r in rows if r["type"] == "row"]
    assert [r["rung"] for r in got] == ["naive"] and len(got[0]["per_process"]) == 2
    assert rows[0]["type"] == "session" and rows[0]["grid"]["processes"] == 2
