"""`rnnrt plot` on the CPU (rnnrt/bench/plots.py): the figures from the committed H100 ladder
records (experiments/results/ladder/) and from synthetic sweep results (missing points, two
devices, a line cut short), from a CPU sweep, and the inputs it cannot use."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from testkit import tiny_sweep as tiny

from rnnrt.bench import plots
from rnnrt.bench import sweep as sw
from rnnrt.cells import forward_flops
from rnnrt.plan.switches import rung_names

RESULTS = Path(__file__).resolve().parents[2] / "experiments" / "results"
# the first H100 ladder records (of each length, the earliest stamp; they predate +persistent)
H100_RECORDS = [p for steps in (100, 1000) for p in sorted(
    (RESULTS / "ladder").glob(f"ladder-lstm-L4-H512-B64-T{steps}-fwd-nvidia-h100-*.json"))[:1]]


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


def test_a_folder_is_read_oldest_record_first_so_the_newest_row_wins(tmp_path):
    """The figures keep the last row read for a point: within a folder, files go by the stamp
    their names end with, not by name (a 0.4.0 sweep named 'sweep-wide-lstm-gru-...' sorted
    after a newer 'sweep-wide-h128-...' and its old rows were drawn)."""
    committed = Path(__file__).resolve().parents[2] / "experiments" / "results" / "sweep" / \
        "sweep-wide-h128-fwdbwd-lstm-gru-nvidia-h100-80gb-hbm3-20261127T173710.jsonl"
    lines = [json.loads(x) for x in committed.read_text().splitlines()]
    session = lines[0]
    auto = next(r for r in lines if r.get("rung") == "auto" and r.get("ratio_vs_cudnn"))
    point = (auto["cell"], auto["layers"], auto.get("pass", "fwd"))

    def row(ratio):
        return json.dumps(session) + "\n" + json.dumps({**auto, "ratio_vs_cudnn": ratio,
                                                         "schedule": "s"}) + "\n"
    old = tmp_path / "sweep-wide-z-old-nvidia-h100-20261124T150633.jsonl"
    new = tmp_path / "sweep-wide-a-new-nvidia-h100-20261127T173710.jsonl"
    old.write_text(row(0.5))
    new.write_text(row(2.0))
    grids = plots.auto_grids(plots.load_rows([tmp_path], note=lambda m: None))
    assert grids[point][(auto["hidden"], auto["batch"])] == (2.0, "s")
    assert [p.name for p in plots._expand([tmp_path])] == [old.name, new.name]
    # a newer run at another precision is not drawn over float32's (its ratio is against
    # cuDNN at that precision)
    (tmp_path / "sweep-wide-bf16-nvidia-h100-20261128T000000.jsonl").write_text(
        json.dumps(session) + "\n" + json.dumps({**auto, "ratio_vs_cudnn": 9.0,
                                                 "dtype": "bfloat16"}) + "\n")
    grids = plots.auto_grids(plots.load_rows([tmp_path], note=lambda m: None))
    assert grids[point][(auto["hidden"], auto["batch"])] == (2.0, "s")
