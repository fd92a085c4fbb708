"""`rnnrt trace` on the CPU (rnnrt/bench/trace.py): one row per stream, the wavefront, the
drawing and the record; the kind labels. The GPU trace is marked gpu (skipped here; `pytest
-m gpu` on the device)."""
from __future__ import annotations

import json

import pytest

from rnnrt.bench import trace as tr
from rnnrt.device import gpu_available
from rnnrt.plan.switches import PAPER_RUNGS, rung_names


def test_cpu_trace_one_row_per_stream_and_the_drawing(tmp_path):
    cfg = tr.TraceConfig(cpu=True, layers=3, hidden=8, batch=2, steps=5, input_batch=2)
    rec = tr.run_trace(cfg, progress=lambda m: None)
    assert rec["schema"] == "rnnrt.trace/1"
    naive, last = rec["rungs"]
    assert (naive["rung"], last["rung"]) == (rung_names()[0], rung_names()[PAPER_RUNGS - 1])
    assert len(naive["streams"]) == 1 and len(last["streams"]) == 2 * cfg.layers
    for e in rec["rungs"]:
        assert e["check"]["ok"], e["check"]
        rows = tr.rows_by_stream(e)
        assert sorted(rows) == list(range(len(e["streams"])))
        assert all(rows[s] for s in rows)                       # every stream did work
        f = {n: i for i, n in enumerate(e["op_fields"])}
        n_compute = sum(v for k, v in e["counts"].items() if k.startswith(("gemm", "kernel")))
        assert len(e["ops"]) == n_compute
        for op in e["ops"]:
            assert 0 <= op[f["t_start_ms"]] <= op[f["t_end_ms"]] <= e["total_ms"] + 1e-6
        assert {tr.kind_label(op[f["kind"]]) for op in e["ops"]} >= {"W·x GEMM", "R·h GEMM",
                                                                    "pointwise"}
        # program order on the CPU: ops one after another
        starts = [op[f["t_start_ms"]] for op in e["ops"]]
        assert starts == sorted(starts)
    # the wavefront: layer l's recurrence stream starts after layer l-1's did
    f = {n: i for i, n in enumerate(last["op_fields"])}
    first = {}
    for op in last["ops"]:
        if op[f["kind"]] == "rh":
            first.setdefault(op[f["layer"]], op[f["t_start_ms"]])
    assert [first[layer] for layer in range(cfg.layers)] == sorted(first.values())
    paths = tr.draw_trace(rec, tmp_path / "t.png")
    assert [p.suffix for p in paths] == [".png", ".svg"]
    assert all(p.stat().st_size > 10_000 for p in paths)
    svg = paths[1].read_text()
    for label in ("W·x GEMM", "R·h GEMM", "pointwise", "time since the pass started (ms)",
                  "rec2", "main"):
        assert label in svg, label
    j = tr.write_record(rec, tmp_path / "t.json")
    assert json.loads(j.read_text())["rungs"][1]["streams"] == last["streams"]


def test_trace_kind_labels():
    assert tr.kind_label("wx") == "W·x GEMM" and tr.kind_label("rh") == "R·h GEMM"
    assert tr.kind_label("pointwise") == "pointwise"
    assert tr.kind_label("transpose") == tr.kind_label("something new") == tr.KIND_STYLE[-1][0]


# --------------------------------------------------------------------------------------------
# GPU (pytest -m gpu on the device)

@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU with CuPy")
@pytest.mark.parametrize("hold", [True, False])
def test_gpu_trace_events_are_ordered_per_stream(tmp_path, hold):
    cfg = tr.TraceConfig(layers=3, hidden=64, batch=8, steps=6, input_batch=2, hold=hold)
    rec = tr.run_trace(cfg, progress=lambda m: None)
    for e in rec["rungs"]:
        assert e["check"]["ok"], e["check"]
        f = {n: i for i, n in enumerate(e["op_fields"])}
        last_end = {}
        for op in e["ops"]:                   # plan order is stream order on each stream
            s, t0, t1 = op[f["stream"]], op[f["t_start_ms"]], op[f["t_end_ms"]]
            assert -1e-3 <= t0 <= t1 <= e["total_ms"] + 1e-3
            assert t0 >= last_end.get(s, 0.0) - 1e-3
            last_end[s] = t1
        assert sorted(last_end) == list(range(len(e["streams"])))
    paths = tr.draw_trace(rec, tmp_path / "t.png")
    assert all(p.stat().st_size > 10_000 for p in paths)
