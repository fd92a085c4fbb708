"""`rnnrt sweep | plot | trace` on the CPU: the sweep's JSON lines and their fields, resuming
after an error, a time budget or Ctrl-C without repeating a point, the progress bar, the
figures from the committed H100 ladder records and from synthetic sweep results, the CPU
trace (one row per stream) and its drawing, the CLI's flags and messages. GPU versions of the
sweep and the trace are marked gpu (skipped here; `pytest -m gpu` on the device)."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from rnnrt import cli, plots
from rnnrt.bench import ladder as lb
from rnnrt.bench import sweep as sw
from rnnrt.bench import trace as tr
from rnnrt.cells import forward_flops
from rnnrt.device import gpu_available
from rnnrt.switches import PAPER_RUNGS, rung_names

RESULTS = Path(__file__).resolve().parent.parent / "experiments" / "results"
H100_RECORDS = sorted(RESULTS.glob("ladder-lstm-L4-H512-B64-T*-fwd-h100-2026-11-21.json"))
LADDER_ROW_FIELDS = ("rung", "executor", "switches", "ms_median", "ms_min", "ms_max", "runs",
                     "tflops", "speedup_vs_naive", "ratio_vs_cudnn", "share_of_ceiling",
                     "check", "plan")
POINT_FIELDS = ("cell", "layers", "hidden", "input_size", "batch", "steps", "input_batch",
                "pass", "device", "cpu", "repeats", "ceiling_tflops", "flops_per_pass",
                "point_seconds", "session")


def tiny(**kw) -> sw.SweepConfig:
    """A 2 x 2 grid (hidden x minibatch) that the NumPy executor runs in a second."""
    base = dict(hidden=(6, 8), batch=(2, 3), layers=(2,), cells=("lstm",), steps=3,
                repeats=1, warmup=0, cpu=True)
    base.update(kw)
    return sw.SweepConfig(**base)


def rows_of(path):
    return [ln for ln in sw.read_lines(path) if ln["type"] == "row"]


def point_keys(path, types=("row", "error")):
    """Point key -> how many times a point's lines were written (one write per point)."""
    seen = {}
    for ln in sw.read_lines(path):
        if ln["type"] in types:
            seen.setdefault(sw.key_of(ln), set()).add((ln["type"], ln.get("session")))
    return {k: len(v) for k, v in seen.items()}


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def counting_ladder(monkeypatch, before=None):
    """Wrap the ladder the sweep calls: counts the points run; ``before(point_cfg)`` may
    raise or advance a fake clock."""
    calls = []
    real = lb.run_ladder

    def run(cfg, progress=lb._progress, session=None):
        calls.append((cfg.hidden, cfg.batch, cfg.layers))
        if before is not None:
            before(cfg)
        return real(cfg, progress, session)

    monkeypatch.setattr(sw.ladder_mod, "run_ladder", run)
    return calls


# --------------------------------------------------------------------------------------------
# sweep

def test_cpu_sweep_writes_a_row_per_rung_with_every_field(tmp_path):
    path = tmp_path / "s.jsonl"
    err = io.StringIO()
    res = sw.run_sweep(tiny(), path, stream=err)
    assert (res.total, res.done, res.errors, res.skipped, res.stopped) == (4, 4, 0, 0, None)
    lines = sw.read_lines(path)
    assert lines[0]["type"] == "session" and lines[0]["schema"] == sw.SCHEMA
    assert lines[0]["cpu"] is True and "CPU" in lines[0]["device"]["device"]
    rows = rows_of(path)
    assert len(rows) == 4 * len(rung_names())
    for r in rows:
        for f in LADDER_ROW_FIELDS + POINT_FIELDS:
            assert f in r, f
        assert r["pass"] == "fwd" and r["executor"] == "numpy" and r["check"]["ok"]
        assert r["flops_per_pass"] == forward_flops("lstm", r["input_size"], r["hidden"],
                                                    r["layers"], r["batch"], r["steps"])
        assert r["session"] == lines[0]["created"]
    by_point = {}
    for r in rows:
        by_point.setdefault(sw.key_of(r), []).append(r["rung"])
    assert sorted(by_point) == sorted(p.key() for p in sw.grid(tiny()))
    assert all(names == list(rung_names()) for names in by_point.values())
    # the progress bar: one line per finished point when not on a terminal
    out = err.getvalue()
    assert "4/4 points 100%" in out and "ETA" in out and "elapsed" in out
    assert "\r" not in out


def test_grid_defaults_order_and_steps():
    cfg = sw.SweepConfig()
    pts = sw.grid(cfg)
    assert len(pts) == 6 * 4 * 2
    assert [p.flops for p in pts] == sorted(p.flops for p in pts)      # cheapest first
    steps = {p.hidden: p.steps for p in pts}
    assert steps == {128: 100, 256: 100, 512: 100, 1024: 100, 2048: 50, 4096: 50}
    assert cfg.executors == ("graph",)
    assert len({p.key() for p in pts}) == len(pts)
    quick = sw.grid(sw.SweepConfig(**sw.QUICK))
    assert len(quick) == 12 and {p.hidden for p in quick} == {256, 512, 1024}
    assert sw.grid(sw.SweepConfig(steps=7, hidden=(4096,), batch=(1,), layers=(1,)))[0].steps == 7
    two_k = sw.grid(sw.SweepConfig(hidden=(64,), batch=(2,), layers=(1,), input_batch=(1, "all")))
    assert {p.input_batch for p in two_k} == {1, "all"}


def test_a_point_that_raises_is_recorded_and_the_sweep_resumes(tmp_path, monkeypatch):
    path = tmp_path / "s.jsonl"

    def oom(cfg):
        if (cfg.hidden, cfg.batch) == (8, 2):
            raise MemoryError("out of memory (injected)")

    calls = counting_ladder(monkeypatch, oom)
    res = sw.run_sweep(tiny(), path, stream=io.StringIO())
    assert (res.done, res.errors, res.stopped) == (3, 1, None) and len(calls) == 4
    errors = [ln for ln in sw.read_lines(path) if ln["type"] == "error"]
    assert len(errors) == 1 and "MemoryError" in errors[0]["error"]
    assert (errors[0]["hidden"], errors[0]["batch"]) == (8, 2)
    # resume: every point is in the file (the error counts as done): nothing runs
    calls.clear()
    res = sw.run_sweep(tiny(), path, resume=True, stream=io.StringIO())
    assert calls == [] and res.skipped == 4 and res.done == 0
    # retry the errors: only the failed point runs, now successfully
    monkeypatch.undo()
    calls = counting_ladder(monkeypatch)
    res = sw.run_sweep(tiny(retry_errors=True), path, resume=True, stream=io.StringIO())
    assert calls == [(8, 2, 2)] and res.done == 1 and res.skipped == 3
    counts = point_keys(path, types=("row",))
    assert len(counts) == 4 and set(counts.values()) == {1}      # no point's rows twice


def test_time_budget_stops_before_a_point_that_would_not_fit_then_resumes(tmp_path,
                                                                           monkeypatch):
    path = tmp_path / "s.jsonl"
    clock = FakeClock()

    def ten_seconds(cfg):
        clock.t += 10.0

    calls = counting_ladder(monkeypatch, ten_seconds)
    # 10 s a point: after two points (20 s) a third (~11.5 s with the margin) would end past 25
    res = sw.run_sweep(tiny(time_budget=25.0), path, stream=io.StringIO(), clock=clock)
    assert res.done == 2 and res.remaining == 2 and len(calls) == 2
    assert res.stopped and res.stopped.startswith("time budget")
    calls.clear()
    res = sw.run_sweep(tiny(), path, resume=True, stream=io.StringIO(), clock=clock)
    assert res.done == 2 and res.skipped == 2 and res.stopped is None and len(calls) == 2
    counts = point_keys(path)
    assert len(counts) == 4 and set(counts.values()) == {1}


def test_ctrl_c_leaves_a_resumable_file(tmp_path, monkeypatch):
    path = tmp_path / "s.jsonl"

    def interrupt(cfg):
        if len(calls) == 3:
            raise KeyboardInterrupt

    calls = counting_ladder(monkeypatch, interrupt)
    res = sw.run_sweep(tiny(), path, stream=io.StringIO())
    assert res.stopped == "interrupted" and res.done == 2
    res = sw.run_sweep(tiny(), path, resume=True, stream=io.StringIO())
    assert res.done == 2 and res.skipped == 2
    assert set(point_keys(path).values()) == {1} and len(point_keys(path)) == 4


def test_errors_in_a_row_stop_the_sweep(tmp_path, monkeypatch):
    def broken(cfg):
        raise RuntimeError("CUDA error: an illegal memory access (injected)")

    counting_ladder(monkeypatch, broken)
    res = sw.run_sweep(tiny(), tmp_path / "s.jsonl", stream=io.StringIO())
    assert res.errors == sw.MAX_CONSECUTIVE_ERRORS and res.remaining == 1
    assert "in a row" in res.stopped


def test_a_line_cut_short_is_skipped_and_the_next_starts_on_its_own_line(tmp_path):
    path = tmp_path / "s.jsonl"
    sw.run_sweep(tiny(hidden=(6,), batch=(2,)), path, stream=io.StringIO())
    with path.open("a") as f:
        f.write('{"type": "row", "cell": "ls')          # a kill mid-write
    assert len(rows_of(path)) == len(rung_names())
    res = sw.run_sweep(tiny(hidden=(6, 8), batch=(2,)), path, resume=True,
                       stream=io.StringIO())
    assert res.done == 1 and res.skipped == 1
    assert len(rows_of(path)) == 2 * len(rung_names())


def test_an_existing_file_needs_resume_or_overwrite(tmp_path):
    path = tmp_path / "s.jsonl"
    sw.run_sweep(tiny(hidden=(6,), batch=(2,)), path, stream=io.StringIO())
    with pytest.raises(FileExistsError, match="--resume"):
        sw.run_sweep(tiny(hidden=(6,), batch=(2,)), path, stream=io.StringIO())
    res = sw.run_sweep(tiny(hidden=(6,), batch=(2,)), path, overwrite=True,
                       stream=io.StringIO())
    assert res.done == 1 and len(rows_of(path)) == len(rung_names())


def test_progress_bar_on_a_terminal_redraws_in_place():
    out = io.StringIO()
    clock = FakeClock()
    bar = sw.ProgressBar(5, out, width=10, tty=True, clock=clock)
    clock.t = 75
    bar.update(done=2, eta=125.0, current="lstm L4 H512 B64 T100")
    bar.message("[sweep] a line of its own")
    bar.close()
    text = out.getvalue()
    assert text.startswith("\r[####......] 2/5 points  40%  elapsed 1:15  ETA 2:05")
    assert "lstm L4 H512 B64 T100" in text and "\r[sweep] a line of its own\n\r[####" in text
    assert bar.render().startswith("[####......] 2/5 points")
    assert sw._hms(3725) == "1:02:05" and sw._hms(None) == "?"


def test_cost_model_fits_fixed_plus_per_flop_costs():
    m = sw.CostModel()
    pts = sw.grid(sw.SweepConfig(hidden=(128, 256, 512, 1024), batch=(64,), layers=(4,)))
    assert m.estimate(pts[0]) is None
    m.add(pts[0], 2.0)
    assert m.estimate(pts[-1]) == pytest.approx(2.0)           # one point: its time
    for p in pts[1:3]:
        m.add(p, 1.0 + p.flops / 1e11)
    m.add(pts[0], 1.0 + pts[0].flops / 1e11)
    est = m.estimate(pts[-1])
    assert est == pytest.approx(1.0 + pts[-1].flops / 1e11, rel=0.35)
    assert all(m.estimate(p) >= 0 for p in pts)


def test_sweep_config_rejects_bad_values():
    for kw in (dict(hidden=()), dict(hidden=(0,)), dict(batch=(2.5,)), dict(cells=("xlstm",)),
               dict(input_batch=(0,)), dict(time_budget=0), dict(layers=(True,))):
        with pytest.raises((ValueError, TypeError)):
            sw.SweepConfig(**kw)


# --------------------------------------------------------------------------------------------
# plot

def synthetic_lines(hiddens=(128, 256, 512, 1024, 2048, 4096), batches=(32, 64, 128, 256),
                    layers=(1, 4), device="NVIDIA H100 80GB HBM3", ceiling=51.6,
                    missing=((4, 4096, 256), (1, 128, 32))):
    """Sweep lines shaped like the real ones: more layers, hidden and batch -> more TFLOPS;
    each rung better than the one before; a couple of points missing."""
    out = [{"type": "session", "schema": sw.SCHEMA, "device": {"device": device}}]
    names = list(rung_names()) + ["cudnn"]
    for L in layers:
        for h in hiddens:
            for b in batches:
                if (L, h, b) in missing:
                    continue
                T = 50 if h >= 2048 else 100
                f = forward_flops("lstm", h, h, L, b, T)
                par = min(1.0, h * b * (1 + 0.5 * (L - 1)) / (4096 * 128))
                for i, r in enumerate(names):
                    tf = ceiling * par ** 0.5 * (0.6 if r == "cudnn" else 0.08 + 0.1 * i)
                    out.append({"type": "row", "rung": r,
                                "executor": "torch.nn" if r == "cudnn" else "graph",
                                "ms_median": f / (tf * 1e12) * 1e3, "tflops": tf,
                                "cell": "lstm", "layers": L, "hidden": h, "input_size": h,
                                "batch": b, "steps": T, "input_batch": 10, "pass": "fwd",
                                "repeats": 10, "cpu": False, "device": device,
                                "ceiling_tflops": ceiling, "flops_per_pass": f})
    return out


def write_jsonl(path, lines):
    path.write_text("".join(json.dumps(ln) + "\n" for ln in lines))
    return path


def assert_figures(paths, prefixes):
    got = {p.name.split("-")[0] for p in paths}
    assert got == set(prefixes), got
    for p in paths:
        assert p.exists() and p.stat().st_size > 10_000, p
    for p in paths:
        if p.suffix == ".png":
            assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
            assert p.with_suffix(".svg") in paths


def test_plots_from_the_committed_h100_ladder_records(tmp_path):
    assert len(H100_RECORDS) == 2, "the committed H100 ladder records moved"
    notes = []
    paths = plots.plot_all(H100_RECORDS, tmp_path, note=notes.append)
    # one (hidden, minibatch) point and one layer count: figures 1 and 3, not 2
    assert_figures(paths, {"fig1", "fig3"})
    assert any("figure 2" in n for n in notes)
    svg = next(p for p in paths if p.name.startswith("fig1") and p.suffix == ".svg").read_text()
    # the records predate the +persistent rung: every series they hold is drawn
    held = {r["rung"] for p in H100_RECORDS for r in json.loads(p.read_text())["rows"]}
    for name in plots.series_names():
        if name in held or name == plots.CUDNN:
            assert f">{name}<" in svg, name
    assert "TFLOPS (fp32, GEMM FLOPs only)" in svg and "hidden size H (log2 axis)" in svg
    assert "H100" in svg and "fp32 GEMM ceiling: 51.6 TFLOPS" in svg
    # the 100-step record is the one drawn (the 1000-step one shares its point)
    rows = plots.load_rows(H100_RECORDS)
    sel = plots.select(rows, "lstm", 4, "graph")
    assert list(sel) == [(512, 64)] and sel[(512, 64)]["naive"]["steps"] == 100
    metric, grid = plots.best_grid(rows, "lstm", 4, "graph")
    assert metric == "cudnn" and grid[(512, 64)][1] == "+wavefront"
    assert grid[(512, 64)][0] == pytest.approx(1.35, abs=0.01)


def test_plots_from_a_synthetic_sweep_with_missing_points(tmp_path):
    src = write_jsonl(tmp_path / "s.jsonl", synthetic_lines())
    with src.open("a") as f:
        f.write('{"type": "row", "cel')                        # cut short: ignored
    out = tmp_path / "figs"
    paths = plots.plot_all([src], out)
    assert_figures(paths, {"fig1", "fig2", "fig3"})
    assert all(p.parent == out for p in paths)
    rows = plots.load_rows([src])
    ratios = plots.layer_ratios(rows, "lstm", 4, 1, "graph")
    assert (4096, 256) not in ratios and (128, 32) not in ratios and len(ratios) == 22
    assert all(v >= 1 for r in ratios.values() for v in r.values())
    assert ratios[(128, 64)]["naive"] > 1.5
    fig2_svg = next(p for p in paths if p.name.startswith("fig2") and p.suffix == ".svg")
    assert "throughput, 4 layers / 1 layer (x)" in fig2_svg.read_text()
    fig3_svg = next(p for p in paths if p.name.startswith("fig3") and p.suffix == ".svg")
    assert "cuDNN ms / best rung ms (x)" in fig3_svg.read_text()
    assert "minibatch B" in fig3_svg.read_text()


def test_plots_of_two_devices_go_to_separate_files(tmp_path):
    lines = synthetic_lines(hiddens=(256, 512), batches=(32,), layers=(4,))
    lines += synthetic_lines(hiddens=(256, 512), batches=(32,), layers=(4,),
                             device="NVIDIA H200")
    paths = plots.plot_all([write_jsonl(tmp_path / "s.jsonl", lines)], tmp_path / "f",
                           formats=("png",))
    names = sorted(p.name for p in paths)
    assert any("nvidia-h200" in n for n in names) and any("nvidia-h100" in n for n in names)


def test_plot_from_a_cpu_sweep_labels_cpu_figures(tmp_path):
    path = tmp_path / "s.jsonl"
    sw.run_sweep(tiny(layers=(1, 2)), path, stream=io.StringIO())
    paths = plots.plot_all([path], tmp_path / "figs", layers=2)
    assert_figures(paths, {"fig1", "fig2", "fig3"})
    fig1 = next(p for p in paths if p.name.startswith("fig1") and p.suffix == ".svg")
    assert "CPU" in fig1.read_text()
    assert "numpy" in fig1.name
    assert any(p.name.startswith("fig3-best-vs-naive") for p in paths)   # no cuDNN on CPU


def test_plot_reports_inputs_it_cannot_use(tmp_path):
    with pytest.raises(FileNotFoundError):
        plots.load_rows([tmp_path / "nope.jsonl"])
    other = tmp_path / "trace.json"
    other.write_text(json.dumps({"schema": "rnnrt.trace/1"}))
    notes = []
    assert plots.load_rows([other], note=notes.append) == [] and "skipped" in notes[0]
    with pytest.raises(ValueError, match="no result rows"):
        plots.plot_all([other], tmp_path, note=notes.append)


# --------------------------------------------------------------------------------------------
# trace

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
# CLI

def test_cli_cpu_sweep_resume_plot_and_trace(tmp_path, capsys):
    out = tmp_path / "s.jsonl"
    argv = ["sweep", "--cpu", "--hidden", "6,8", "--batch", "2", "--layers", "1,2",
            "--steps", "3", "--repeats", "1", "--warmup", "0", "--out", str(out)]
    assert cli.main(argv) == 0
    assert "4 points done" in capsys.readouterr().out
    assert cli.main(argv) == 2                                   # exists: needs --resume
    assert "--resume" in capsys.readouterr().err
    assert cli.main(argv + ["--resume"]) == 0
    assert "4 were already there" in capsys.readouterr().out
    assert cli.main(argv + ["--dry-run"]) == 0
    assert "4 points, 4 done" in capsys.readouterr().out
    figs = tmp_path / "figs"
    assert cli.main(["plot", str(out), "--out-dir", str(figs), "--layers", "2"]) == 0
    printed = capsys.readouterr().out.split()
    assert len(printed) == 6 and all(Path(p).exists() for p in printed)
    assert cli.main(["trace", "--cpu", "--layers", "2", "--hidden", "8", "--batch", "2",
                     "--steps", "4", "--out", str(tmp_path / "t.json"), "--fig-dir",
                     str(figs)]) == 0
    o = capsys.readouterr().out
    assert "+wavefront" in o and (tmp_path / "t.json").exists()
    assert len(list(figs.glob("trace-*.png"))) == 1 and len(list(figs.glob("trace-*.svg"))) == 1
    assert cli.main(["trace", "--cpu", "--layers", "2", "--hidden", "8", "--batch", "2",
                     "--steps", "4", "--rungs", "+pretranspose, +fused", "--out",
                     str(tmp_path / "t2.json"), "--fig-dir", str(figs)]) == 0
    o = capsys.readouterr().out
    assert [ln.split()[0] for ln in o.splitlines()[:2]] == ["+fused", "+pretranspose"]
    assert cli.main(["trace", "--cpu", "--rungs", "+fused,+fast"]) == 2
    assert "'+fast'" in capsys.readouterr().err


def test_cli_rejects_bad_flags(tmp_path, capsys):
    for argv in (["sweep", "--hidden", "0"], ["sweep", "--hidden", "a,b"],
                 ["sweep", "--batch", ","], ["sweep", "--cell", "lstm,xlstm"],
                 ["sweep", "--input-batch", "0"], ["sweep", "--time-budget", "0"],
                 ["sweep", "--time-budget", "soon"], ["sweep", "--executor", "fast"],
                 ["sweep", "--resume", "--overwrite"], ["plot"],
                 ["plot", "x.jsonl", "--layers", "0"], ["trace", "--steps", "0"],
                 ["trace", "--cell", "xlstm"]):
        with pytest.raises(SystemExit):
            cli.main(argv)
    assert cli.main(["sweep", "--cpu", "--retry-errors", "--out",
                     str(tmp_path / "a.jsonl")]) == 2
    assert "--resume" in capsys.readouterr().err
    assert cli.main(["plot", str(tmp_path / "missing.jsonl")]) == 2
    assert "no such file" in capsys.readouterr().err


@pytest.mark.skipif(gpu_available(), reason="checks the message shown without a GPU")
def test_sweep_and_trace_without_gpu_say_how(tmp_path, capsys):
    for cmd in ("sweep", "trace"):
        extra = ["--out", str(tmp_path / f"{cmd}.out")]
        assert cli.main([cmd] + extra) == 2
        err = capsys.readouterr().err
        assert f"rnnrt {cmd} --cpu" in err and "rnnrt[cuda12]" in err


# --------------------------------------------------------------------------------------------
# GPU (pytest -m gpu on the device)

@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU with CuPy")
def test_gpu_sweep_two_points_through_one_session(tmp_path):
    cfg = sw.SweepConfig(hidden=(64, 128), batch=(8,), layers=(2,), steps=6, repeats=2,
                         warmup=1)
    path = tmp_path / "g.jsonl"
    res = sw.run_sweep(cfg, path, stream=io.StringIO())
    assert res.done == 2 and res.errors == 0, sw.read_lines(path)[-1]
    rows = rows_of(path)
    timed = [r for r in rows if r["rung"] != "cudnn"]
    assert len(timed) == 2 * len(rung_names())
    assert all(r["executor"] == "graph" and r["check"]["ok"] for r in timed)
    assert all(r["ceiling_tflops"] > 1 for r in rows)
    res = sw.run_sweep(cfg, path, resume=True, stream=io.StringIO())
    assert res.skipped == 2 and res.done == 0


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
