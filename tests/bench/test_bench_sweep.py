"""`rnnrt sweep` on the CPU (rnnrt/bench/sweep.py): the sweep's JSON lines and their fields,
the grid, resuming after an error, a time budget or Ctrl-C without repeating a point, a line
cut short, the progress bar, the cost model, the config's checks. The GPU sweep is marked gpu
(skipped here; `pytest -m gpu` on the device)."""
from __future__ import annotations

import io
from pathlib import Path

import pytest
from testkit import example_module
from testkit import tiny_sweep as tiny

from rnnrt.bench import ladder as lb
from rnnrt.bench import progress
from rnnrt.bench import sweep as sw
from rnnrt.cells import forward_flops
from rnnrt.device import gpu_available
from rnnrt.plan.switches import rung_names

LADDER_ROW_FIELDS = ("rung", "executor", "switches", "ms_median", "ms_min", "ms_max", "runs",
                     "tflops", "speedup_vs_naive", "ratio_vs_cudnn", "share_of_ceiling",
                     "check", "plan")
POINT_FIELDS = ("cell", "layers", "hidden", "input_size", "batch", "steps", "input_batch",
                "pass", "device", "cpu", "repeats", "ceiling_tflops", "flops_per_pass",
                "point_seconds", "session")


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


def test_cpu_sweep_writes_a_row_per_rung_with_every_field(tmp_path):
    path = tmp_path / "s.jsonl"
    err = io.StringIO()
    res = sw.run_sweep(tiny(), path, stream=err)
    assert (res.total, res.done, res.errors, res.skipped, res.stopped) == (4, 4, 0, 0, None)
    lines = sw.read_lines(path)
    assert lines[0]["type"] == "session" and lines[0]["schema"] == sw.SCHEMA
    assert lines[0]["cpu"] is True and "CPU" in lines[0]["device"]["device"]
    rows = rows_of(path)
    assert len(rows) == 4 * (len(rung_names()) + 1)          # every rung, then the auto row
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
    assert all(names == [*rung_names(), "auto"] for names in by_point.values())
    # where each point's time went: the CPU ladder's two phases, within the point's wall time
    for r in rows:
        assert set(r["phase_s"]) == {"reference", "rows"}, r["phase_s"]
        assert all(v >= 0 for v in r["phase_s"].values())
        assert sum(r["phase_s"].values()) <= r["point_seconds"]
    # the progress bar: one line per finished point when not on a terminal
    out = err.getvalue()
    assert "4/4 points 100%" in out and "ETA" in out and "elapsed" in out
    assert "\r" not in out


def test_progress_line_names_the_phase_that_took_most_of_a_point():
    assert sw._main_phase({"cudnn_setup": 2.0, "reference": 140.2, "rows": 9.0}) == \
        "; the reference 140.2"
    assert sw._main_phase({"reference": 5.0, "rows": 5.0, "precompile": 1.0}) == ""
    assert sw._main_phase(None) == ""     # an error, or an older record: nothing said


def test_a_new_files_name_and_its_session_line_carry_one_time(tmp_path):
    """The CLI names a new file before the GPU opens (seconds earlier): default_path and
    run_sweep take the same 'created', so the stamp in the name is the record's own."""
    created = "2026-01-02T03:04:05+00:00"
    path = sw.default_path(tiny(hidden=(6,), batch=(2,)), "NVIDIA H100 80GB HBM3",
                           root=tmp_path, created=created)
    assert path.name.endswith("-nvidia-h100-80gb-hbm3-20260102T030405.jsonl"), path.name
    sw.run_sweep(tiny(hidden=(6,), batch=(2,)), path, stream=io.StringIO(), created=created)
    assert sw.read_lines(path)[0]["created"] == created


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


def test_retry_refused_runs_again_only_points_whose_last_run_was_refused(tmp_path,
                                                                         monkeypatch):
    """A point with a refused row is done on --resume (and --retry-errors); --retry-refused
    runs it again, and again while its newest run is refused, never once that one passed."""
    path = tmp_path / "s.jsonl"
    refuse = {(8, 2)}

    def run(cfg, progress=lb._progress, session=None):
        calls.append((cfg.hidden, cfg.batch))
        record = real(cfg, progress, session)
        if (cfg.hidden, cfg.batch) in refuse:      # a row as the ladder writes a refusal
            row = record["rows"][1]
            record["rows"][1] = {"rung": row["rung"], "executor": row["executor"],
                                 "refused": "y vs naive rung: MISMATCH (planted)",
                                 "check": {**row["check"], "ok": False}}
        return record

    calls, real = [], lb.run_ladder
    monkeypatch.setattr(sw.ladder_mod, "run_ladder", run)
    out = io.StringIO()
    sw.run_sweep(tiny(), path, stream=out)
    assert len(calls) == 4 and "REFUSED" in out.getvalue()

    def resume(**kw):
        calls.clear()
        return sw.run_sweep(tiny(**kw), path, resume=True, stream=io.StringIO())

    assert resume().skipped == 4 and calls == []
    assert resume(retry_errors=True).skipped == 4 and calls == []
    res = resume(retry_refused=True)                # still refused when run again
    assert calls == [(8, 2)] and res.done == 1 and res.skipped == 3
    refuse.clear()                                  # the check mended: it passes now
    assert resume(retry_refused=True).done == 1 and calls == [(8, 2)]
    assert resume(retry_refused=True).skipped == 4 and calls == []
    last = sw.last_run_refused(sw.read_lines(path))
    assert len(last) == 4 and not any(last.values())
    assert sw.done_keys(sw.read_lines(path), retry_refused=True) == set(last)


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


def test_time_budget_does_not_count_a_first_use_compile_against_every_point(tmp_path,
                                                                            monkeypatch):
    """The first point pays the kernels' compiles (100 s, 90 of them compiling); the budget
    expects the next points to take their own 10 s, not 100 (before, a fresh machine's sweep
    stopped after one point), and the rows say how much of a point was compiling."""
    path = tmp_path / "s.jsonl"
    clock = FakeClock()
    calls, real = [], lb.run_ladder

    def first_compiles(cfg, progress=lb._progress, session=None):
        calls.append(cfg.hidden)
        first = len(calls) == 1
        clock.t += 100.0 if first else 10.0
        # a GPU run's record says how long it compiled (run_ladder: compile_s)
        return dict(real(cfg, progress, session), compile_s=90.0 if first else 0.0)

    monkeypatch.setattr(sw.ladder_mod, "run_ladder", first_compiles)
    # after 100 s, 10-15 s a point with the margin (the model scales a point's 10 s by the
    # square root of its FLOPs): points 2 and 3 fit in 130 s, 4 does not
    res = sw.run_sweep(tiny(time_budget=130.0), path, stream=io.StringIO(), clock=clock)
    assert res.done == 3 and res.remaining == 1, res
    assert res.stopped and "needs ~0:1" in res.stopped, res.stopped   # 10-19 s, not ~1:40
    rows = [r for r in sw.read_lines(path) if r["type"] == "row"]
    by_point = {}
    for r in rows:
        by_point.setdefault(r["point_seconds"], set()).add(r["compile_s"])
    assert by_point == {100.0: {90.0}, 10.0: {0.0}}, by_point
    # resumed, the file's points seed the estimate the same way: the last point fits in 16 s
    res = sw.run_sweep(tiny(time_budget=16.0), path, resume=True, stream=io.StringIO(),
                       clock=clock)
    assert res.done == 1 and res.skipped == 3 and res.stopped is None, res


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
    assert len(rows_of(path)) == len(rung_names()) + 1         # every rung and the auto row
    res = sw.run_sweep(tiny(hidden=(6, 8), batch=(2,)), path, resume=True,
                       stream=io.StringIO())
    assert res.done == 1 and res.skipped == 1
    assert len(rows_of(path)) == 2 * (len(rung_names()) + 1)


def test_an_existing_file_needs_resume_or_overwrite(tmp_path):
    path = tmp_path / "s.jsonl"
    sw.run_sweep(tiny(hidden=(6,), batch=(2,)), path, stream=io.StringIO())
    with pytest.raises(FileExistsError, match="--resume"):
        sw.run_sweep(tiny(hidden=(6,), batch=(2,)), path, stream=io.StringIO())
    res = sw.run_sweep(tiny(hidden=(6,), batch=(2,)), path, overwrite=True,
                       stream=io.StringIO())
    assert res.done == 1 and len(rows_of(path)) == len(rung_names()) + 1   # + the auto row


def test_progress_bar_on_a_terminal_redraws_in_place():
    out = io.StringIO()
    clock = FakeClock()
    bar = progress.ProgressBar(5, out, width=10, tty=True, clock=clock)
    clock.t = 75
    bar.update(done=2, eta=125.0, current="lstm L4 H512 B64 T100")
    bar.message("[sweep] a line of its own")
    bar.close()
    text = out.getvalue()
    assert text.startswith("\r[####......] 2/5 points  40%  elapsed 1:15  ETA 2:05")
    assert "lstm L4 H512 B64 T100" in text and "\r[sweep] a line of its own\n\r[####" in text
    assert bar.render().startswith("[####......] 2/5 points")
    assert progress.hms(3725) == "1:02:05" and progress.hms(None) == "?"


def test_cost_model_scales_the_median_point_by_the_square_root_of_flops():
    m = progress.CostModel()
    pts = sw.grid(sw.SweepConfig(hidden=(128, 256, 512, 1024), batch=(64,), layers=(4,)))
    assert m.estimate(pts[0]) is None and len(m) == 0
    m.add(pts[0], 2.0)
    assert m.estimate(pts[0]) == pytest.approx(2.0)           # one point: its own time
    root = (pts[-1].flops / pts[0].flops) ** 0.5                # 8 (H 8x: FLOPs 64x)
    assert m.estimate(pts[-1]) == pytest.approx(2.0 * root)
    # a first point slowed by compiles does not move the median of three
    m = progress.CostModel()
    for p, t in zip(pts[:3], (100.0, 1.0, 1.0)):
        m.add(p, t * (p.flops / pts[0].flops) ** 0.5)
    assert m.estimate(pts[-1]) == pytest.approx(root)
    assert all(m.estimate(p) >= 0 for p in pts)


def test_cost_model_foretells_a_recorded_wide_sweep():
    """Replayed on a whole recorded wide grid (H100 fp32, 200 points run from the smallest
    up): the time left after 10% of the points within 2x of what it was, and the next point
    within 2x at 80% of points or more. The least-squares a + b * layers * steps + c * FLOPs
    model it replaced said 0.09x and 87% here, and 1347x on the bfloat16 grid."""
    replay = example_module("eta_replay")
    root = Path(__file__).resolve().parents[2]
    for name in ("sweep-wide-lstm-gru-nvidia-h100-80gb-hbm3-20261124T150633.jsonl",
                 "sweep-wide-bfloat16-lstm-gru-nvidia-h100-80gb-hbm3-20261125T122252.jsonl"):
        r = replay.replay(replay.points(root / "experiments" / "results" / "sweep" / name))
        assert r["points"] >= 200, r
        assert 0.5 <= r["remaining"][0.10] <= 2.0, (name, r)
        assert r["next_off_2x"] <= 0.2 * r["next_n"], (name, r)


def test_sweep_config_rejects_bad_values():
    for kw in (dict(hidden=()), dict(hidden=(0,)), dict(batch=(2.5,)), dict(cells=("xlstm",)),
               dict(input_batch=(0,)), dict(time_budget=0), dict(layers=(True,))):
        with pytest.raises((ValueError, TypeError)):
            sw.SweepConfig(**kw)


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
    assert len(timed) == 2 * (len(rung_names()) + 1)                  # + the auto row
    assert all(r["executor"] == "graph" and r["check"]["ok"] for r in timed)
    assert all(r["ceiling_tflops"] > 1 for r in rows)
    res = sw.run_sweep(cfg, path, resume=True, stream=io.StringIO())
    assert res.skipped == 2 and res.done == 0
