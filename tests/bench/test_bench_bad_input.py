"""Bad input through every command (ladder, sweep, plot, trace, demo): each case must exit
with the documented status (2 for a wrong invocation, 1 for a failure while running) after
printing ONE line, `rnnrt <command>: error: ...`, that names the flag; before any work (spies
on the run functions must not run); with every file in the working folder byte-for-byte
unchanged and nothing new written. Damaged records of every kind through `rnnrt plot` and
`rnnrt sweep --resume`. Sizes are judged against a 1 GiB host (RNNRT_HOST_BYTES). The
examples of issue 21 are marked (issue)."""
from __future__ import annotations

import json

import pytest
from testkit import Spy, tree_state

from rnnrt import cli, reference
from rnnrt.bench import ladder as lb
from rnnrt.bench import plots
from rnnrt.bench import sweep as sw
from rnnrt.bench import trace as tr
from rnnrt.device import gpu_available

ROW = {"type": "row", "cell": "lstm", "layers": 1, "hidden": 8, "input_size": 8, "batch": 4,
       "steps": 8, "input_batch": 10, "pass": "fwd", "rung": "naive", "executor": "numpy",
       "ms_median": 1.5, "tflops": 0.01, "device": "CPU (x86_64), NumPy executor",
       "cpu": True}
REAL_PLOT_ALL = plots.plot_all
SESSION = {"type": "session", "schema": "rnnrt.sweep/1", "created": "2026-11-25T00:00:00+00:00"}


@pytest.fixture
def work(tmp_path, monkeypatch):
    """An empty working folder holding some files a careless flag could destroy, the host
    capped at 1 GiB, and spies on every command's work. -> (folder, spies)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RNNRT_OUT", raising=False)
    monkeypatch.delenv("RNNRT_DEBUG", raising=False)
    monkeypatch.setenv("RNNRT_HOST_BYTES", str(1 << 30))
    (tmp_path / "a.json").write_text('{"precious": true}\n')
    (tmp_path / "s.jsonl").write_text(json.dumps(SESSION) + "\n" + json.dumps(ROW) + "\n")
    (tmp_path / "afile").write_text("not a folder\n")
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "keep.txt").write_text("x")
    spies = {"ladder": Spy("run_ladder"), "sweep": Spy("run_sweep"), "trace": Spy("run_trace"),
             "plot": Spy("plot_all"), "reference": Spy("reference.forward")}
    monkeypatch.setattr(lb, "run_ladder", spies["ladder"])
    monkeypatch.setattr(sw, "run_sweep", spies["sweep"])
    monkeypatch.setattr(tr, "run_trace", spies["trace"])
    monkeypatch.setattr(plots, "plot_all", spies["plot"])
    monkeypatch.setattr(reference, "forward", spies["reference"])
    return tmp_path, spies


def run(argv, capsys):
    try:
        code = cli.main(argv)
    except SystemExit as e:   # argparse: usage errors
        code = e.code
    captured = capsys.readouterr()
    return code, captured.err


def refused(argv, code, words, work, capsys):
    folder, spies = work
    before = tree_state(folder)
    got, err = run(argv, capsys)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert got == code, (got, err)
    assert len(lines) == 1, f"expected one line, got {lines}"
    prog = "rnnrt" + (f" {argv[0]}" if argv and not argv[0].startswith("-")
                      and argv[0] in cli.COMMANDS else "")
    assert lines[0].startswith(f"{prog}: error: "), lines[0]
    for w in words:
        assert w in lines[0], (w, lines[0])
    assert tree_state(folder) == before, "files changed or were written"
    for s in spies.values():
        assert s.calls == 0, f"{s.name} ran"


CASES = [
    # ladder
    ("ladder-warmup (issue)", ["ladder", "--cpu", "--warmup", "-5"], 2, ["--warmup", ">= 0"]),
    ("ladder-cpu-graph (issue)", ["ladder", "--cpu", "--executor", "graph"], 2,
     ["--executor graph", "--cpu"]),
    ("ladder-out-exists (issue)", ["ladder", "--cpu", "--out", "a.json"], 2,
     ["--out", "a.json", "already exists", "--overwrite"]),
    ("ladder-out-empty (issue)", ["ladder", "--cpu", "--out", ""], 2, ["--out", "empty"]),
    ("ladder-out-folder (issue)", ["ladder", "--cpu", "--out", "dir"], 2,
     ["--out", "dir is a folder"]),
    ("ladder-out-under-a-file", ["ladder", "--cpu", "--out", "afile/x.json"], 2,
     ["--out", "afile is a file"]),
    ("ladder-batch-1e9 (issue)", ["ladder", "--cpu", "--batch", "1000000000"], 2,
     ["batch", "1000000000"]),
    ("ladder-hidden-1e5", ["ladder", "--cpu", "--hidden", "100000"], 2,
     ["hidden_size=100000", "GiB", "host memory"]),
    ("ladder-steps-1e7", ["ladder", "--cpu", "--steps", "10000000"], 2,
     ["steps=10000000", "GiB"]),
    ("ladder-rungs", ["ladder", "--cpu", "--rungs", "+turbo"], 2, ["rungs", "+turbo"]),
    ("ladder-repeats-0", ["ladder", "--cpu", "--repeats", "0"], 2, ["--repeats"]),
    ("ladder-input-batch-0", ["ladder", "--cpu", "--input-batch", "0"], 2, ["--input-batch"]),
    ("ladder-cell", ["ladder", "--cpu", "--cell", "xlstm"], 2, ["--cell", "xlstm"]),
    ("ladder-hidden-text", ["ladder", "--cpu", "--hidden", "big"], 2, ["--hidden", "'big'"]),
    ("ladder-unknown-flag", ["ladder", "--cpu", "--fast"], 2, ["--fast"]),
    # sweep
    ("sweep-cpu-graph", ["sweep", "--cpu", "--executor", "graph"], 2, ["--executor", "--cpu"]),
    ("sweep-quick-and-preset", ["sweep", "--cpu", "--quick", "--preset", "wide"], 2,
     ["--quick", "--preset wide"]),
    ("sweep-backward-and-pass", ["sweep", "--cpu", "--backward", "--pass", "fwd"], 2,
     ["--backward", "--pass fwd"]),
    ("sweep-retry-without-resume", ["sweep", "--cpu", "--retry-errors"], 2,
     ["--retry-errors", "--resume"]),
    ("sweep-resume-and-overwrite", ["sweep", "--cpu", "--resume", "--overwrite"], 2,
     ["--overwrite", "--resume"]),
    ("sweep-out-has-results", ["sweep", "--cpu", "--out", "s.jsonl"], 2,
     ["--out", "s.jsonl", "--resume", "--overwrite"]),
    ("sweep-out-folder", ["sweep", "--cpu", "--out", "dir"], 2, ["--out", "folder"]),
    ("sweep-out-empty", ["sweep", "--cpu", "--out", " "], 2, ["--out", "empty"]),
    ("sweep-out-under-a-file", ["sweep", "--cpu", "--out", "afile/s.jsonl"], 2,
     ["--out", "afile is a file"]),
    ("sweep-warmup", ["sweep", "--cpu", "--warmup", "-1"], 2, ["--warmup"]),
    ("sweep-budget-0", ["sweep", "--cpu", "--time-budget", "0"], 2, ["--time-budget"]),
    ("sweep-budget-text", ["sweep", "--cpu", "--time-budget", "soon"], 2, ["--time-budget"]),
    ("sweep-pass-unknown", ["sweep", "--cpu", "--pass", "bwd"], 2, ["passes", "'bwd'"]),
    ("sweep-rungs", ["sweep", "--cpu", "--rungs", "+turbo"], 2, ["rungs"]),
    ("sweep-hidden-list", ["sweep", "--cpu", "--hidden", "8,x"], 2, ["--hidden", "'x'"]),
    ("sweep-empty-list", ["sweep", "--cpu", "--batch", ","], 2, ["--batch"]),
    ("sweep-huge-point", ["sweep", "--cpu", "--hidden", "100000", "--layers", "2"], 2,
     ["hidden_size=100000", "GiB"]),
    # plot
    ("plot-missing", ["plot", "missing.jsonl"], 2, ["RESULTS", "missing.jsonl", "no such"]),
    ("plot-out-dir-is-a-file", ["plot", "s.jsonl", "--out-dir", "afile"], 2,
     ["--out-dir", "afile is a file"]),
    ("plot-out-dir-empty", ["plot", "s.jsonl", "--out-dir", ""], 2, ["--out-dir", "empty"]),
    ("plot-formats", ["plot", "s.jsonl", "--formats", "gif"], 2, ["--formats", "gif"]),
    ("plot-layers-0", ["plot", "s.jsonl", "--layers", "0"], 2, ["--layers"]),
    ("plot-cpu-is-no-flag (issue)", ["plot", "s.jsonl", "--cpu"], 2, ["--cpu"]),
    ("plot-no-results", ["plot"], 2, ["RESULTS"]),
    # trace
    ("trace-cpu-no-hold", ["trace", "--cpu", "--no-hold"], 2, ["--no-hold", "--cpu"]),
    ("trace-out-exists (issue)", ["trace", "--cpu", "--out", "a.json"], 2,
     ["--out", "already exists"]),
    ("trace-out-folder", ["trace", "--cpu", "--out", "dir"], 2, ["--out", "folder"]),
    ("trace-out-dir-file", ["trace", "--cpu", "--out-dir", "afile"], 2,
     ["--out-dir", "afile is a file"]),
    ("trace-rungs", ["trace", "--cpu", "--rungs", "+fused,+fast"], 2, ["rungs", "'+fast'"]),
    ("trace-schedules", ["trace", "--cpu", "--backward", "--schedules", "ib10,stack+fast"], 2,
     ["--schedules", "'stack+fast'", "not candidates", "ib2"]),
    ("trace-steps-0", ["trace", "--cpu", "--steps", "0"], 2, ["--steps"]),
    ("trace-batch-1e9", ["trace", "--cpu", "--batch", "1000000000"], 2, ["batch"]),
    ("trace-cell", ["trace", "--cpu", "--cell", "xlstm"], 2, ["--cell"]),
    # demo and the program
    ("demo-hidden-1e5 (issue)", ["demo", "--hidden", "100000"], 2,
     ["hidden_size=100000", "GiB", "host memory"]),
    ("demo-batch-1e8", ["demo", "--batch", "100000000"], 2, ["batch=100000000", "GiB"]),
    ("demo-steps-0", ["demo", "--steps", "0"], 2, ["--steps"]),
    ("demo-layers-text", ["demo", "--layers", "two"], 2, ["--layers"]),
    ("no-command", [], 2, ["required"]),
    ("unknown-command", ["train"], 2, ["'train'"]),
]


@pytest.mark.parametrize("argv, code, words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_command_refuses(argv, code, words, work, capsys):
    refused(argv, code, words, work, capsys)


@pytest.mark.skipif(gpu_available(), reason="checks the message shown without a GPU")
@pytest.mark.parametrize("cmd", ["ladder", "sweep", "trace"])
def test_without_a_gpu_the_commands_say_how(cmd, work, capsys):
    refused([cmd], 2, ["no usable GPU", f"rnnrt {cmd} --cpu", "pip install -e '.[cuda13]'"],
            work, capsys)


def test_existing_figures_are_kept_and_nothing_half_written(work, capsys, monkeypatch):
    """plot draws aside and moves the set in only when no name is taken (or --overwrite)."""
    folder, spies = work
    monkeypatch.setattr(plots, "plot_all", lambda paths, out_dir, **kw: [
        _fig(out_dir, "fig1.png"), _fig(out_dir, "fig2.png")])
    (folder / "figs").mkdir()
    (folder / "figs" / "fig2.png").write_bytes(b"the old figure")
    before = tree_state(folder)
    code, err = run(["plot", "s.jsonl", "--out-dir", "figs"], capsys)
    assert code == 2 and "fig2.png" in err and "--overwrite" in err
    assert tree_state(folder) == before                  # fig1 was not moved in either
    code, err = run(["plot", "s.jsonl", "--out-dir", "figs", "--overwrite"], capsys)
    assert code == 0
    assert (folder / "figs" / "fig2.png").read_bytes() == b"new"
    assert sorted(p.name for p in (folder / "figs").iterdir()) == ["fig1.png", "fig2.png"]


def _fig(out_dir, name):
    p = out_dir / name
    p.write_bytes(b"new")
    return p


def test_trace_keeps_an_existing_figure(work, capsys):
    folder, _ = work
    cfg = tr.TraceConfig(cpu=True, **tr.CPU_DEFAULT)
    fig = folder / "rnnrt-out" / "figures" / (tr.figure_stem(cfg, tr.device_name(True)) + ".svg")
    fig.parent.mkdir(parents=True)
    fig.write_text("<svg>old</svg>")
    refused(["trace", "--cpu"], 2, ["--out-dir", fig.name, "--overwrite"], work, capsys)


def test_debug_shows_the_traceback(work, monkeypatch):
    monkeypatch.setenv("RNNRT_DEBUG", "1")
    with pytest.raises(Exception, match="already exists"):
        cli.main(["ladder", "--cpu", "--out", "a.json"])


def test_a_failure_while_running_exits_1_in_one_line(work, capsys, monkeypatch):
    def broken(cfg, progress=None, session=None):
        raise RuntimeError("the device fell off the bus\nsecond line")
    monkeypatch.setattr(lb, "run_ladder", broken)
    code, err = run(["ladder", "--cpu", "--out", "new.json"], capsys)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 1 and len(lines) == 1
    assert lines[0].startswith("rnnrt ladder: error: RuntimeError: the device fell off")
    assert "RNNRT_DEBUG=1" in lines[0] and not (work[0] / "new.json").exists()


# --------------------------------------------------------------------------- damaged records

DAMAGED = [
    ("a-number (issue)", "7", "a number, expected an object"),
    ("a-list (issue)", "[1, 2]", "a list, expected an object"),
    ("a-string", '"row"', "a string"),
    ("null", "null", "null"),
    ("not-json", '{"type": "row", cell: lstm}', "not JSON"),
    ("unknown-type", json.dumps({**ROW, "type": "rowx"}), "'type' is 'rowx'"),
    ("missing-field (issue)", json.dumps({k: v for k, v in ROW.items() if k != "hidden"}),
     "no field 'hidden'"),
    ("negative-batch", json.dumps({**ROW, "batch": -4}), "'batch' is -4"),
    ("bool-layers", json.dumps({**ROW, "layers": True}), "'layers' is True"),
    ("unknown-cell", json.dumps({**ROW, "cell": "xlstm"}), "'cell' is 'xlstm'"),
    ("input-batch-0", json.dumps({**ROW, "input_batch": 0}), "'input_batch' is 0"),
    ("pass-unknown", json.dumps({**ROW, "pass": "bwd"}), "'pass' is 'bwd'"),
    ("time-negative", json.dumps({**ROW, "ms_median": -1.0}), "'ms_median' is -1.0"),
    ("time-text", json.dumps({**ROW, "ms_median": "fast"}), "'ms_median' is 'fast'"),
    ("rung-missing", json.dumps({k: v for k, v in ROW.items() if k != "rung"}), "'rung'"),
    ("device-object", json.dumps({**ROW, "device": {"x": 1}}), "'device' is an object"),
    ("error-without-text", json.dumps({**ROW, "type": "error"}), "'error' text"),
]


@pytest.mark.parametrize("line, why", [c[1:] for c in DAMAGED], ids=[c[0] for c in DAMAGED])
def test_plot_skips_a_damaged_line_naming_file_and_line(line, why, work, capsys, monkeypatch):
    folder, _ = work
    monkeypatch.setattr(plots, "plot_all", REAL_PLOT_ALL)
    path = folder / "d.jsonl"
    path.write_text(json.dumps(SESSION) + "\n" + line + "\n")
    data = path.read_bytes()
    code, err = run(["plot", "d.jsonl", "--out-dir", "figs"], capsys)
    assert code == 1, err                        # nothing left to draw: a failure, one line
    (named,) = [ln for ln in err.splitlines() if "d.jsonl:2: " in ln]
    assert why in named and "warning" in named, err
    assert err.splitlines()[-1].startswith("rnnrt plot: error: ")
    assert path.read_bytes() == data and not any((folder / "figs").iterdir())


def test_bytes_that_are_not_utf8_are_named(work, capsys, monkeypatch):
    folder, _ = work
    monkeypatch.setattr(plots, "plot_all", REAL_PLOT_ALL)
    path = folder / "d.jsonl"
    path.write_bytes(json.dumps(SESSION).encode() + b"\n\xff\xfe{}\n")
    code, err = run(["plot", "d.jsonl", "--out-dir", "figs"], capsys)
    assert code == 1 and "d.jsonl:2: not UTF-8 text (byte 0xff" in err, err


@pytest.mark.parametrize("text, why", [
    ("[1, 2]", "not a ladder record"),
    ('{"schema": "rnnrt.ladder/1", "rows": []}', "no 'config' object"),
    ('{"schema": "rnnrt.ladder/1", "config": {"cell": "lstm", "layers": 4, "hidden": 8, '
     '"batch": -1, "steps": 3}, "device": {"device": "x"}, "rows": []}', "'batch' is -1"),
    ('{"schema": "rnnrt.ladder/1", "config": {"cell": "lstm", "layers": 4, "hidden": 8, '
     '"batch": 1, "steps": 3}, "device": {"device": "x"}, "rows": [3]}', "rows[0] is a number"),
    ('{"schema": "rnnrt.ladder/1", "con', "not JSON"),
], ids=["list", "no-config", "bad-config", "bad-row", "torn"])
def test_plot_skips_a_damaged_ladder_record(text, why, work, capsys, monkeypatch):
    folder, _ = work
    monkeypatch.setattr(plots, "plot_all", REAL_PLOT_ALL)
    (folder / "ladder-x.json").write_text(text)
    code, err = run(["plot", "ladder-x.json", "--out-dir", "figs"], capsys)
    assert code == 1 and "ladder-x.json" in err and why in err, err


def test_resume_skips_damaged_lines_with_a_warning_and_keeps_the_file(tmp_path, capsys,
                                                                       monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = ["sweep", "--cpu", "--hidden", "6", "--batch", "2", "--layers", "1,2", "--steps",
            "3", "--repeats", "1", "--warmup", "0", "--rungs", "naive", "--out", "r.jsonl"]
    assert cli.main(argv) == 0
    path = tmp_path / "r.jsonl"
    lines = path.read_text().splitlines()
    rows = [i for i, ln in enumerate(lines) if json.loads(ln)["type"] == "row"]
    lines[rows[0]] = "42"                                  # a damaged point: run again
    damaged = "\n".join(lines) + "\n" + '{"type": "row", "cel'   # and a torn last line
    path.write_text(damaged)
    capsys.readouterr()
    assert cli.main(argv + ["--resume"]) == 0
    cap = capsys.readouterr()
    assert f"r.jsonl:{rows[0] + 1}: a number, expected an object" in cap.err
    assert "cut short" in cap.err
    assert "1 points done" in cap.out and "1 were already there" in cap.out
    assert path.read_text().startswith(damaged)           # appended to, never rewritten

