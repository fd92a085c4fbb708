"""`rnnrt trace` on the CPU (rnnrt/bench/trace.py): one row per stream, the wavefront, the
drawing and the record; the kind labels; a training step (--backward: the forward, then the
backward, checked on y, dx and the weight gradients); the selector's schedules by name. The
GPU traces are marked gpu (skipped here; `pytest -m gpu` on the device)."""
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


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU with CuPy")
def test_gpu_trace_of_a_training_step(tmp_path):
    """--backward on the GPU: naive, the wavefront and the stack schedule with the persistent
    backward, each checked (y, dx, weight gradients); on each stream the ops in plan order,
    the backward's after the forward's end."""
    cfg = tr.TraceConfig(layers=2, hidden=64, batch=8, steps=6, input_batch=2, backward=True)
    rec = tr.run_trace(cfg, progress=lambda m: None, rungs=tr.traced_rungs(2),
                       schedules=("stack+pbwd",))
    assert [e["rung"] for e in rec["rungs"]][-1] == "stack+pbwd"
    for e in rec["rungs"]:
        assert e["check"]["ok"], e["check"]
        fwd, bwd = e["passes"]
        n_fwd = sum(1 for s in e["streams"] if not s.startswith("bwd "))
        f = _fields(e)
        last_end = {}
        for op in e["ops"]:
            s, t0, t1 = op[f["stream"]], op[f["t_start_ms"]], op[f["t_end_ms"]]
            assert -1e-3 <= t0 <= t1 <= e["total_ms"] + 1e-3
            assert t0 >= last_end.get(s, 0.0) - 1e-3
            last_end[s] = t1
            if s >= n_fwd:
                assert t0 >= bwd["t0_ms"] - 1e-3
            else:
                assert t1 <= bwd["t0_ms"] + 1e-3
    paths = tr.draw_trace(rec, tmp_path / "t.png")
    assert all(p.stat().st_size > 10_000 for p in paths)


def _fields(entry):
    return {n: i for i, n in enumerate(entry["op_fields"])}


def test_cpu_trace_of_a_training_step_forward_then_backward(tmp_path):
    """--backward: one timeline a rung, the forward's ops, then the backward's on streams of
    their own after the forward's end; the checks cover y, dx and the weight gradients."""
    cfg = tr.TraceConfig(cpu=True, layers=2, hidden=8, batch=3, steps=4, input_batch=2,
                         backward=True)
    rec = tr.run_trace(cfg, progress=lambda m: None)
    assert rec["pass"] == "fwd+bwd" and rec["config"]["backward"] is True
    for e in rec["rungs"]:
        assert e["check"]["ok"], e["check"]
        fwd, bwd = e["passes"]
        assert (fwd["pass"], bwd["pass"], fwd["t0_ms"]) == ("fwd", "bwd", 0.0)
        assert bwd["t0_ms"] == pytest.approx(fwd["ms"])
        assert e["total_ms"] == pytest.approx(fwd["ms"] + bwd["ms"])
        n_fwd = sum(1 for s in e["streams"] if not s.startswith("bwd "))
        assert 0 < n_fwd < len(e["streams"])
        assert e["streams"][n_fwd:] == [s for s in e["streams"] if s.startswith("bwd ")]
        f = _fields(e)
        kinds = {}
        for op in e["ops"]:
            backward = op[f["stream"]] >= n_fwd
            kinds.setdefault(backward, set()).add(op[f["kind"]])
            if backward:   # the backward runs after the forward has ended
                assert op[f["t_start_ms"]] >= bwd["t0_ms"] - 1e-9
            else:
                assert op[f["t_end_ms"]] <= bwd["t0_ms"] + 1e-9
        assert kinds[False] >= {"wx", "rh", "pointwise"}
        assert kinds[True] >= {"dh", "dx", "dw"}
        n_compute = sum(v for k, v in e["counts"].items() if k.startswith(("gemm", "kernel")))
        assert len(e["ops"]) == n_compute
    paths = tr.draw_trace(rec, tmp_path / "t.png")
    svg = paths[1].read_text()
    for label in ("One training step", "dh GEMM", "weight gradients", "bwd main"):
        assert label in svg, label
    assert tr.default_path(rec).name.startswith("trace-lstm-L2-H8-B3-T4-fwdbwd-")
    assert tr.figure_stem(cfg, "cpu").startswith("trace-lstm-L2-H8-B3-T4-fwdbwd-")


def test_a_wrong_weight_gradient_fails_the_trace_check(monkeypatch):
    """The training step's check is not only y's: a reference whose weight gradients are off
    by a little (y and dx right) is refused."""
    real = tr._reference

    def off(cfg, model, inputs):
        ref = real(cfg, model, inputs)
        ref["grads"] = ref["grads"] + 1e-3 * (1 + abs(ref["grads"]))
        return ref

    monkeypatch.setattr(tr, "_reference", off)
    cfg = tr.TraceConfig(cpu=True, layers=2, hidden=8, batch=3, steps=4, backward=True)
    rec = tr.run_trace(cfg, progress=lambda m: None, rungs=tr.traced_rungs(names=["naive"]))
    c = rec["rungs"][0]["check"]
    assert not c["ok"] and c["against"] == "grads vs float64 reference", c


def test_schedules_of_the_selector_are_traced_by_name():
    """--schedules: the selector's candidates for the trace's shape, in the order named; the
    stack schedule with the persistent backward runs its kernels (fits in the entry); a name
    that is not a candidate is refused, naming those that are."""
    cfg = tr.TraceConfig(cpu=True, layers=2, hidden=64, batch=4, steps=3, backward=True)
    scheds = tr.traced_schedules(cfg, ["stack+pbwd", "ib10"])
    assert [s.name for s in scheds] == ["stack+pbwd", "ib10"]
    with pytest.raises(ValueError, match=r"schedules: \['stack\+fast'\] not candidates.*ib10"):
        tr.traced_schedules(cfg, ["stack+fast"])
    rec = tr.run_trace(cfg, progress=lambda m: None, schedules=("stack+pbwd", "ib10"))
    stack, ib10 = rec["rungs"]
    assert (stack["rung"], stack["family"], stack["backward"]) == ("stack+pbwd", "stack",
                                                                  "persistent")
    assert "stack" in stack["fit"] and "backward" in stack["backward_fit"]
    f = _fields(stack)
    assert {op[f["kind"]] for op in stack["ops"]} >= {"persistent", "dw"}
    assert ib10["family"] is None and "fit" not in ib10
    assert ib10["check"]["ok"] and stack["check"]["ok"]
    assert ib10["check"]["against"].endswith("vs the first traced (stack+pbwd)")
