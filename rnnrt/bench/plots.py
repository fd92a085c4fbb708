"""`rnnrt plot RESULTS...`: figures from sweep results (JSON lines, rnnrt.sweep/1) and ladder
records (JSON, rnnrt.ladder/1), as PNG and SVG (matplotlib, Agg backend).

  1. fig1-tflops-vs-hidden-...  the paper's Figure 1 analogue: TFLOPS against hidden size
     (log2 axis), one line per rung plus cuDNN, one panel per minibatch, for one cell and
     layer count (default 4-layer LSTM), the GPU's fp32 GEMM ceiling drawn as a line.
  2. fig2-layers-ratio-...      throughput with 4 layers over throughput with 1 layer at the
     same (hidden, minibatch), per rung (the paper: up to 2x where parallelism is low).
  3. fig3-best-vs-...           a heatmap over hidden x minibatch of the best rung against
     cuDNN (cuDNN ms / best rung ms, > 1: faster than cuDNN), one panel per layer count,
     each cell naming its best rung. Without cuDNN rows (CPU results) it shows the best rung
     against naive instead, and says so.

Every input is first flattened to rows (a ladder row + its point's configuration + device),
the form the sweep writes. One set of figures per device found in the inputs. Missing points
are missing from the figures; nothing is interpolated. Where several configurations share a
(hidden, minibatch) — e.g. a 100-step and a 1000-step ladder record — one is chosen: forward
pass, input size = hidden, the default input-batching k, the sweep's default steps, then the
fewest steps; ``steps=`` / ``input_batch=`` pick others. For one (configuration, rung,
executor), the last row read wins.
"""
from __future__ import annotations

import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from ..plan.switches import DEFAULT_INPUT_BATCH, rung_names
from .recordio import check_ladder_record, read_json
from .records import figures_root
from .summary import summarize
from .sweep import read_lines

CUDNN = "cudnn"
CONFIG_FIELDS = ("cell", "layers", "hidden", "input_size", "batch", "steps", "input_batch",
                 "pass")


def series_names() -> tuple[str, ...]:
    """The lines of figures 1 and 2, in order: the ladder's rung names, then 'cudnn'."""
    return tuple(rung_names()) + (CUDNN,)


# --------------------------------------------------------------------------------------------
# Reading

def ladder_record_rows(record: dict) -> list[dict]:
    """A ladder record's rows in the sweep's flat form (row + configuration + device)."""
    c = record["config"]
    base = {"cell": c["cell"], "layers": c["layers"], "hidden": c["hidden"],
            "input_size": c.get("input_size") or c["hidden"], "batch": c["batch"],
            "steps": c["steps"], "input_batch": c.get("input_batch", DEFAULT_INPUT_BATCH),
            "pass": record.get("pass", "fwd"), "repeats": c.get("repeats"),
            "cpu": bool(c.get("cpu")), "device": record["device"].get("device"),
            "ceiling_tflops": (record.get("ceiling") or {}).get("tflops"),
            "flops_per_pass": record.get("flops_per_pass"), "created": record.get("created"),
            "dtype": record.get("dtype", "float32")}
    return [{"type": "row", **r, **base} for r in record["rows"]]


_STAMP = re.compile(r"-(\d{8}T\d{6})\.jsonl?$")


def _by_stamp(files):
    """``files`` oldest record first, by the stamp their names end with (records' naming
    scheme; names without one first, by name): a figure keeps the last row read for a point,
    which must be the newest run's, not the alphabetically last file's (a 0.4.0 sweep named
    'sweep-wide-lstm-gru-...' sorted after the newer 'sweep-wide-h128-...')."""
    def key(p):
        m = _STAMP.search(p.name)
        return (m.group(1) if m else "", p.name)
    return sorted(files, key=key)


def _expand(paths):
    for p in paths:
        p = Path(p)
        if p.is_dir():   # and its subfolders (results/<kind>/)
            yield from _by_stamp(p.rglob("*.jsonl"))
            yield from _by_stamp(p.rglob("ladder-*.json"))
        else:
            yield p


def load_rows(paths, note=None) -> list[dict]:
    """Flat rows from sweep .jsonl files, ladder .json records and directories of them (a
    directory: its *.jsonl and ladder-*.json, subfolders included), read through
    recordio (the one loader of records). A damaged line or record is skipped with a warning
    through ``note`` naming its file and line; other JSON (a trace, test results) is skipped
    with a note. Raises FileNotFoundError for a path that does not exist, RecordError for
    one that cannot be read."""
    note = note or (lambda m: print(f"[plot] {m}", file=sys.stderr))
    rows = []
    for p in _expand(paths):
        if p.suffix == ".jsonl":
            lines = read_lines(p, lambda msg: note(f"warning: {msg}; skipped"), note,
                               missing_ok=False)
            rows += [ln for ln in lines if ln.get("type") == "row"]
            continue
        rec, why = read_json(p)
        if why is None and not (isinstance(rec, dict)
                                and str(rec.get("schema", "")).startswith("rnnrt.ladder/")):
            note(f"{p}: not a ladder record or sweep results (schema "
                 f"{rec.get('schema') if isinstance(rec, dict) else type(rec).__name__!r}); "
                 f"skipped")
            continue
        why = why or check_ladder_record(rec)
        if why:
            note(f"warning: {why if why.startswith(str(p)) else f'{p}: {why}'}; skipped")
            continue
        rows += ladder_record_rows(rec)
    return rows


# --------------------------------------------------------------------------------------------
# Selecting what a figure shows

def _config(r) -> tuple:
    return tuple(str(r.get(f)) if f == "input_batch" else r.get(f) for f in CONFIG_FIELDS)


def default_steps(hidden: int) -> int:
    from .sweep import SweepConfig
    return SweepConfig().steps_for(hidden)


def choose_executor(rows) -> str | None:
    """'graph' if any rung was timed with it, else 'numpy' (CPU), else 'eager'."""
    have = {r.get("executor") for r in rows if r.get("rung") != CUDNN}
    for e in ("graph", "numpy", "eager"):
        if e in have:
            return e
    return None


def select(rows, cell: str, layers: int, executor: str, steps=None, input_batch=None,
           pass_: str = "fwd") -> dict:
    """{(hidden, batch): {series name: row}} for one cell and layer count: timed rows of
    ``executor`` plus the cuDNN rows, one configuration per (hidden, batch) (see the module
    docstring for which)."""
    by_cfg = defaultdict(dict)
    for r in rows:
        if (r.get("cell") != cell or r.get("layers") != layers or r.get("pass", "fwd") != pass_
                or "ms_median" not in r or not r.get("tflops")):
            continue
        if steps is not None and r.get("steps") != steps:
            continue
        if input_batch is not None and str(r.get("input_batch")) != str(input_batch):
            continue
        if r.get("rung") == CUDNN:
            by_cfg[_config(r)][CUDNN] = r
        elif r.get("executor") == executor:
            by_cfg[_config(r)][r["rung"]] = r
    chosen = {}
    for cfg, series in by_cfg.items():
        if not any(name != CUDNN for name in series):
            continue                                   # cuDNN alone: no rung to compare
        _, _, hidden, inp, batch, st, ib, _ = cfg
        pref = (inp != hidden, ib != str(DEFAULT_INPUT_BATCH), st != default_steps(hidden), st)
        if (hidden, batch) not in chosen or pref < chosen[(hidden, batch)][0]:
            chosen[(hidden, batch)] = (pref, series)
    return {hb: series for hb, (_, series) in chosen.items()}


def _steps_note(sel) -> str:
    by_steps = defaultdict(set)
    for (h, _), series in sel.items():
        by_steps[next(iter(series.values()))["steps"]].add(h)
    if len(by_steps) == 1:
        return f"{next(iter(by_steps))} steps"
    parts = []
    for st, hs in sorted(by_steps.items(), key=lambda kv: min(kv[1])):
        hs = sorted(hs)
        span = str(hs[0]) if len(hs) == 1 else f"{hs[0]}–{hs[-1]}"
        parts.append(f"{st} steps at hidden {span}")
    return ", ".join(parts)


def _ib_note(sel) -> str:
    ks = sorted({str(next(iter(s.values()))["input_batch"]) for s in sel.values()})
    return "input batching k = " + "/".join(ks)


def _pass_word(pass_: str) -> str:
    return "Forward" if pass_ == "fwd" else "Forward+backward (training)"


def _pass_tag(pass_: str) -> str:
    """File-name tag: nothing for the forward pass, '-fwdbwd' for forward+backward."""
    return "" if pass_ == "fwd" else "-" + pass_.replace("+", "")


def _slug(text) -> str:
    s = "".join(ch if ch.isalnum() else "-" for ch in str(text).split(",")[0]).lower()
    while "--" in s:
        s = s.replace("--", "-")
    return s.strip("-") or "device"


def _style():
    """{series: (colour, marker, linestyle)}: a distinct colour per rung, cuDNN in black."""
    import matplotlib
    cmap = matplotlib.colormaps["tab10"]
    markers = "ovs^D<>ph*"
    style = {name: (cmap(i % 10), markers[i % len(markers)], "-")
             for i, name in enumerate(rung_names())}
    style[CUDNN] = ("black", "X", "--")
    return style


def _log2_hidden_axis(ax, hiddens):
    from matplotlib.ticker import FixedLocator, NullLocator
    ax.set_xscale("log", base=2)
    hs = sorted(hiddens)
    ax.xaxis.set_major_locator(FixedLocator(hs))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([str(h) for h in hs])
    if len(hs) == 1:
        ax.set_xlim(hs[0] / 1.5, hs[0] * 1.5)
    else:
        ax.set_xlim(hs[0] / 1.25, hs[-1] * 1.25)
    ax.set_xlabel("hidden size H (log2 axis)")


def _pyplot():
    """pyplot on the Agg backend (files only; works without a display)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _title(fig, lines, fontsize=11):
    """A suptitle whose lines are wrapped to the figure's width (nothing cut off)."""
    import textwrap
    width = max(40, int(fig.get_figwidth() * 72 / (0.55 * fontsize)))
    text = "\n".join(textwrap.fill(line, width) for line in lines)
    fig.suptitle(text, fontsize=fontsize)


def _panels(n):
    plt = _pyplot()
    ncols = min(n, 4)
    nrows = -(-n // ncols)
    fig, axes = plt.subplots(nrows, ncols,
                             figsize=(max(9.0, 3.9 * ncols + 2.8), 3.7 * nrows + 1.3),
                             squeeze=False, sharey=True, layout="constrained")
    return fig, list(axes.ravel())


def _save(fig, out_dir: Path, stem: str, formats) -> list[Path]:
    import matplotlib
    plt = _pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    # SVG text stays text (searchable, editable), not glyph outlines
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        for fmt in formats:
            p = out_dir / f"{stem}.{fmt}"
            fig.savefig(p, dpi=130)
            paths.append(p)
    plt.close(fig)
    return paths


def _device_label(rows) -> tuple[str, bool]:
    dev = rows[0].get("device") or "unknown device"
    cpu = any(r.get("cpu") for r in rows) or str(dev).startswith("CPU")
    return str(dev), cpu


def _ceiling(rows) -> float | None:
    vals = [r["ceiling_tflops"] for r in rows if r.get("ceiling_tflops")]
    return statistics.median(vals) if vals else None


# --------------------------------------------------------------------------------------------
# The figures

def _series_panels(values, ylabel, decorate):
    """A panel per minibatch, a line per series (rung names + 'cudnn') against log2 hidden.

    values: {(hidden, batch): {series: y}}; decorate(ax) draws a panel's reference lines and
    returns {legend key: artist} for the legend. -> (fig, batches)."""
    style = _style()
    batches = sorted({b for _, b in values})
    hiddens = sorted({h for h, _ in values})
    fig, axes = _panels(len(batches))
    handles = {}
    for ax, b in zip(axes, batches):
        for name in series_names():
            pts = sorted((h, s[name]) for (h, bb), s in values.items() if bb == b and name in s)
            if not pts:
                continue
            col, mk, ls = style[name]
            (line,) = ax.plot([p[0] for p in pts], [p[1] for p in pts], color=col, marker=mk,
                              linestyle=ls, linewidth=1.6, markersize=5, label=name)
            handles.setdefault(name, line)
        for key, artist in decorate(ax).items():
            handles.setdefault(key, artist)
        _log2_hidden_axis(ax, hiddens)
        ax.set_title(f"minibatch {b}", fontsize=10)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    for ax in axes[len(batches):]:
        ax.set_visible(False)
    for ax in axes[::min(len(axes), 4)]:
        ax.set_ylabel(ylabel)
    fig.legend(handles=list(handles.values()), loc="outside right center", frameon=False,
               title="rung", fontsize=9)
    return fig, batches


def fig_tflops(rows, out_dir, cell="lstm", layers=4, executor=None, formats=("png", "svg"),
               steps=None, input_batch=None, pass_="fwd"):
    """Figure 1: TFLOPS against hidden size, a line per rung + cuDNN, a panel per minibatch.
    Returns the paths written ([] when there is nothing to draw)."""
    executor = executor or choose_executor(rows)
    sel = select(rows, cell, layers, executor, steps, input_batch, pass_)
    if not sel:
        return []
    dev, cpu = _device_label(rows)
    ceiling = _ceiling([r for s in sel.values() for r in s.values()])

    def decorate(ax):
        if not ceiling:
            return {}
        what = "CPU matmul ceiling (NumPy)" if cpu else "fp32 GEMM ceiling"
        return {"ceiling": ax.axhline(ceiling, color="dimgray", linestyle=":", linewidth=1.4,
                                      label=f"{what}: {ceiling:.3g} TFLOPS")}

    values = {hb: {n: r["tflops"] for n, r in s.items()} for hb, s in sel.items()}
    fig, _ = _series_panels(values, "TFLOPS (fp32, GEMM FLOPs only)", decorate)
    first = next(iter(next(iter(sel.values())).values()))
    _title(fig, [
        f"{_pass_word(pass_)} throughput by rung (the paper's Figure 1): {cell.upper()}, "
        f"{layers} layer{'s' if layers > 1 else ''}, fp32, {executor} executor — {dev}"
        f"{' (CPU figures, not GPU performance)' if cpu else ''}",
        f"{_steps_note(sel)}, input = hidden, {_ib_note(sel)}, median of "
        f"{first.get('repeats') or first.get('runs')} runs"])
    stem = f"fig1-tflops-vs-hidden-{cell}-L{layers}{_pass_tag(pass_)}-{executor}-{_slug(dev)}"
    return _save(fig, Path(out_dir), stem, formats)


def layer_ratios(rows, cell="lstm", hi=4, lo=1, executor=None, steps=None, input_batch=None,
                 pass_="fwd"):
    """{(hidden, batch): {series: tflops(hi layers) / tflops(lo layers)}} at the points where
    both layer counts were measured with the same configuration otherwise."""
    executor = executor or choose_executor(rows)
    sel_hi = select(rows, cell, hi, executor, steps, input_batch, pass_)
    sel_lo = select(rows, cell, lo, executor, steps, input_batch, pass_)
    out = {}
    for hb, s_hi in sel_hi.items():
        s_lo = sel_lo.get(hb)
        if s_lo is None:
            continue
        same = ("steps", "input_size", "input_batch")
        a, b = next(iter(s_hi.values())), next(iter(s_lo.values()))
        if any(str(a.get(f)) != str(b.get(f)) for f in same):
            continue
        ratios = {n: s_hi[n]["tflops"] / s_lo[n]["tflops"] for n in s_hi if n in s_lo}
        if ratios:
            out[hb] = ratios
    return out


def fig_layers_ratio(rows, out_dir, cell="lstm", hi=4, lo=1, executor=None,
                     formats=("png", "svg"), steps=None, input_batch=None, pass_="fwd"):
    """Figure 2: hi-layer over lo-layer throughput per point, a panel per minibatch."""
    executor = executor or choose_executor(rows)
    ratios = layer_ratios(rows, cell, hi, lo, executor, steps, input_batch, pass_)
    if not ratios:
        return []
    dev, cpu = _device_label(rows)

    def decorate(ax):
        ax.axhline(1.0, color="dimgray", linewidth=1.0)
        return {"2x": ax.axhline(2.0, color="dimgray", linestyle=":", linewidth=1.4,
                                 label="2x: the paper's gain where parallelism is low")}

    fig, _ = _series_panels(
        ratios, f"throughput, {hi} layers / {lo} layer{'s' if lo > 1 else ''} (x)", decorate)
    _title(fig, [
        f"What stacking layers buys: TFLOPS with {hi} layers over TFLOPS with {lo}, same "
        f"hidden, minibatch and steps — {cell.upper()}, {_pass_word(pass_).lower()}, "
        f"{executor} executor — {dev}"
        f"{' (CPU figures)' if cpu else ''}",
        "> 1: the deeper network keeps the device busier (the wavefront overlaps layers)"])
    stem = (f"fig2-layers-ratio-{cell}-L{hi}-over-L{lo}{_pass_tag(pass_)}-{executor}-"
            f"{_slug(dev)}")
    return _save(fig, Path(out_dir), stem, formats)


def best_grid(rows, cell="lstm", layers=4, executor=None, steps=None, input_batch=None,
              pass_="fwd"):
    """(metric, {(hidden, batch): (value, best rung name)}): metric 'cudnn' gives cuDNN ms
    over the fastest rung's ms at points with a cuDNN row; when no point has one, metric
    'naive' gives naive ms over the fastest rung's ms instead."""
    executor = executor or choose_executor(rows)
    sel = select(rows, cell, layers, executor, steps, input_batch, pass_)
    metric = "cudnn" if any(CUDNN in s for s in sel.values()) else "naive"
    out = {}
    for hb, s in sel.items():
        rungs = {n: r for n, r in s.items() if n != CUDNN}
        if metric not in s or not rungs:
            continue
        best = min(rungs, key=lambda n: rungs[n]["ms_median"])
        out[hb] = (s[metric]["ms_median"] / rungs[best]["ms_median"], best)
    return metric, out


def _heat_panel(ax, hiddens, batches, grid, norm, cmap):
    """One heatmap panel over hidden x minibatch: ``grid`` {(hidden, batch): (value, label)},
    each cell annotated with its value and label; missing points grey. -> the image."""
    data = np.full((len(batches), len(hiddens)), np.nan)
    for (h, b), (v, _) in grid.items():
        data[batches.index(b), hiddens.index(h)] = v
    im = ax.imshow(np.ma.masked_invalid(data), cmap=cmap, norm=norm, aspect="auto",
                   origin="lower")
    ax.set_facecolor("#e8e8e8")            # missing points: plain grey
    for (h, b), (v, name) in grid.items():
        shade = norm(v)
        colour = "white" if (shade < 0.2 or shade > 0.8) else "black"
        ax.text(hiddens.index(h), batches.index(b), f"{v:.2f}x\n{name}", ha="center",
                va="center", fontsize=7, color=colour)
    ax.set_xticks(range(len(hiddens)), [str(h) for h in hiddens])
    ax.set_yticks(range(len(batches)), [str(b) for b in batches])
    ax.set_xlabel("hidden size H (log2 spacing)")
    ax.set_ylabel("minibatch B")
    return im


def auto_grids(rows, executor="graph", dtype="float32") -> dict:
    """{(cell, layers, pass): {(hidden, batch): (cuDNN ms / auto ms, chosen schedule)}} from
    the rows of the 'auto' rung at precision ``dtype`` that have a cuDNN ratio (the wide
    sweep's; a bfloat16 row's ratio is against cuDNN's bf16, not to be drawn as fp32's): each
    point's row the one `rnnrt summary` judges it by (summary.summarize: the newest)."""
    out = defaultdict(dict)
    for g in summarize(rows, executor):
        if g.dtype != dtype:
            continue
        for ((cell, layers, hidden, _, batch, _), pass_), r in g.rows.items():
            if "refused" not in r:
                out[(cell, layers, pass_)][(hidden, batch)] = (r["ratio_vs_cudnn"],
                                                               r.get("schedule", "?"))
    return dict(out)


def fig_auto_heatmaps(rows, out_dir, executor="graph", formats=("png", "svg")) -> list[Path]:
    """Figure 4: the auto row (what switches='auto' runs) against cuDNN over hidden x
    minibatch, one panel per cell / layers / pass, each cell naming the chosen schedule."""
    from matplotlib.colors import TwoSlopeNorm
    plt = _pyplot()
    grids = auto_grids(rows, executor)
    if not grids:
        return []
    keys = sorted(grids, key=lambda k: (k[0], k[2], k[1]))
    hiddens = sorted({h for g in grids.values() for h, _ in g})
    batches = sorted({b for g in grids.values() for _, b in g})
    vals = [v for g in grids.values() for v, _ in g.values()]
    norm = TwoSlopeNorm(vcenter=1.0, vmin=min(min(vals), 0.95), vmax=max(max(vals), 1.05))
    ncol = len({k[1] for k in keys})
    nrow = -(-len(keys) // ncol)
    fig, axes = plt.subplots(nrow, ncol, squeeze=False, layout="constrained",
                             figsize=(1.3 * len(hiddens) * ncol + 2.5,
                                      (0.65 * len(batches) + 1.2) * nrow + 1.0))
    im = None
    for ax, k in zip(axes.flat, keys):
        im = _heat_panel(ax, hiddens, batches, grids[k], norm, "RdBu")
        cell, L, pass_ = k
        ax.set_title(f"{cell.upper()}, {L} layer{'s' if L > 1 else ''}, "
                     f"{_pass_word(pass_).lower()}", fontsize=10)
    for ax in list(axes.flat)[len(keys):]:
        ax.set_visible(False)
    fig.colorbar(im, ax=list(axes.flat), label="cuDNN ms / auto ms (x)", shrink=0.8)
    dev, cpu = _device_label(rows)
    _title(fig, [f"switches='auto' against cuDNN (> 1: faster; cuDNN fp32, TF32 off, timed in "
                 f"turn); each cell names the schedule chosen — {executor} executor — "
                 f"{dev}{' (CPU figures)' if cpu else ''}"])
    return _save(fig, Path(out_dir), f"fig4-auto-vs-cudnn-{executor}-{_slug(dev)}", formats)


def fig_best_heatmap(rows, out_dir, cell="lstm", layers=None, executor=None,
                     formats=("png", "svg"), steps=None, input_batch=None, pass_="fwd"):
    """Figure 3: heatmap over hidden x minibatch of the best rung against cuDNN (or naive),
    one panel per layer count (default: every layer count of ``cell`` in the rows)."""
    from matplotlib.colors import Normalize, TwoSlopeNorm
    plt = _pyplot()
    executor = executor or choose_executor(rows)
    if layers is None:
        layers = sorted({r["layers"] for r in rows if r.get("cell") == cell})
    grids = [(L, *best_grid(rows, cell, L, executor, steps, input_batch, pass_))
             for L in layers]
    grids = [g for g in grids if g[2]]
    if not grids:
        return []
    metric = "cudnn" if any(g[1] == "cudnn" for g in grids) else "naive"
    grids = [g for g in grids if g[1] == metric]
    dev, cpu = _device_label(rows)
    hiddens = sorted({h for g in grids for h, _ in g[2]})
    batches = sorted({b for g in grids for _, b in g[2]})
    vals = [v for g in grids for v, _ in g[2].values()]
    if metric == "cudnn":
        lo, hi = min(min(vals), 0.95), max(max(vals), 1.05)
        norm, cmap = TwoSlopeNorm(vcenter=1.0, vmin=lo, vmax=hi), "RdBu"
    else:
        norm, cmap = Normalize(vmin=min(1.0, min(vals)), vmax=max(max(vals), 1.01)), "Blues"
    n = len(grids)
    fig, axes = plt.subplots(1, n, figsize=(max(8.0, 1.25 * len(hiddens) * n + 2.6),
                                            0.8 * len(batches) + 2.8),
                             squeeze=False, layout="constrained")
    im = None
    for ax, (L, _, g) in zip(axes[0], grids):
        im = _heat_panel(ax, hiddens, batches, g, norm, cmap)
        ax.set_title(f"{cell.upper()}, {L} layer{'s' if L > 1 else ''}", fontsize=10)
    if metric == "cudnn":
        label = "cuDNN ms / best rung ms (x)"
        head = "Best rung against cuDNN (> 1: faster than cuDNN)"
    else:
        label = "naive ms / best rung ms (x)"
        head = "Best rung against naive (no cuDNN in these results)"
    fig.colorbar(im, ax=list(axes[0]), label=label, shrink=0.9)
    _title(fig, [f"{head}; each cell names the fastest rung — {executor} executor, fp32 "
                 f"{_pass_word(pass_).lower()} — {dev}{' (CPU figures)' if cpu else ''}"])
    stem = f"fig3-best-vs-{metric}-{cell}{_pass_tag(pass_)}-{executor}-{_slug(dev)}"
    return _save(fig, Path(out_dir), stem, formats)


def plot_all(paths_or_rows, out_dir=None, cell="lstm", layers=4,
             executor=None, formats=("png", "svg"), steps=None, input_batch=None,
             pass_="fwd", note=None) -> list[Path]:
    """The three figures for every device in the inputs (paths, or already-loaded rows), in
    ``out_dir`` (default records.figures_root(): rnnrt-out/figures). Returns the paths
    written; what could not be drawn is reported through ``note``."""
    out_dir = figures_root() if out_dir is None else out_dir
    _pyplot()
    note = note or (lambda m: print(f"[plot] {m}", file=sys.stderr))
    rows = (paths_or_rows if paths_or_rows and isinstance(paths_or_rows[0], dict)
            else load_rows(paths_or_rows, note))
    if not rows:
        raise ValueError("no result rows in the inputs (expected sweep .jsonl files or "
                         "ladder-*.json records)")
    # the figures' words and ceilings are float32's: rows of other precisions (issue 23's
    # --dtype) are left out, and said so, rather than drawn beside them
    other = sum(r.get("dtype", "float32") != "float32" for r in rows)
    if other:
        note(f"{other} rows of other precisions than float32 left out (the figures are "
             f"float32's)")
    by_device = defaultdict(list)
    for r in rows:
        if r.get("pass", "fwd") == pass_ and r.get("dtype", "float32") == "float32":
            by_device[r.get("device") or "unknown device"].append(r)
    if not by_device:
        note(f"no rows of pass {pass_!r} in the inputs (passes there: "
             f"{sorted({r.get('pass', 'fwd') for r in rows})})")
    written = []
    for dev, drows in by_device.items():
        kw = dict(executor=executor, formats=formats, steps=steps, input_batch=input_batch,
                  pass_=pass_)
        if not any(r.get("cell") == cell for r in drows):
            note(f"{dev}: no {cell} rows; nothing drawn")
            continue
        have_layers = sorted({r["layers"] for r in drows if r.get("cell") == cell})
        L = layers if layers in have_layers else have_layers[-1]
        if L != layers:
            note(f"{dev}: no {layers}-layer {cell} rows; figure 1 uses {L} layers")
        got = fig_tflops(drows, out_dir, cell, L, **kw)
        if not got:
            note(f"{dev}: figure 1: no timed {cell} rows with {L} layers")
        written += got
        lo = min(have_layers)
        got = fig_layers_ratio(drows, out_dir, cell, L, lo, **kw) if lo < L else []
        if not got:
            note(f"{dev}: figure 2 needs {cell} points measured with both {lo if lo < L else 1}"
                 f" and {L} layers at the same hidden, minibatch and steps; none here")
        written += got
        got = fig_best_heatmap(drows, out_dir, cell, None, **kw)
        if not got:
            note(f"{dev}: figure 3: no point with a baseline (cuDNN or naive) row")
        written += got
    for dev, drows in _by_device(rows).items():   # every cell and pass in one figure
        written += fig_auto_heatmaps(drows, out_dir, executor or "graph", formats)
    return written


def _by_device(rows) -> dict:
    out = defaultdict(list)
    for r in rows:
        out[r.get("device") or "unknown device"].append(r)
    return out
