"""The verdict of a grid of points against cuDNN, read from records (`rnnrt summary`).

What the wide grid's figures show as colours, as numbers: for every device and precision in
the inputs (never mixed: a ratio is only ever taken within one run, and two devices' or two
precisions' ratios are not one population), from the newest row of switches='auto' at each
point and pass (a point: cell, layers, hidden, input size, batch, steps; newest by the row's
``created``, so a point re-timed later, e.g. pooled over processes, replaces its old row):

  - per pass: the points timed, the geometric mean of cuDNN ms / auto ms, the points below
    1.0 and the points whose newest auto row was refused (its check failed: no ratio);
  - over both passes: the geometric mean of every ratio;
  - where a point has both passes: whether the training step (fwd+bwd) is at least the
    forward's ratio, and for each miss what it would take -- the share of the precision's
    GEMM ceiling the training step would need to reach the forward's ratio (its share now
    x forward ratio / fwd+bwd ratio: the same run's cuDNN time, so no cross-run ratio);
  - where both passes of a point come from one run (the rows' ``session``): the backward
    alone (the training step less the forward) against cuDNN's backward alone, cuDNN ms /
    ours, its geometric mean and the points below 1.0 (a training step below its forward's
    ratio is a slow backward only where this is below 1.0: else cuDNN's forward is slow);
  - for each point below 1.0 timed in more than one run, cuDNN's own time across those runs
    (the auto rows' ms x ratio: min - max over n runs). The verdict stays the newest run's;
    the spread says how much of a miss is cuDNN's run-to-run variation.

Rows come through ``plots.load_rows`` (sweep .jsonl files, ladder records, folders of them,
read by recordio with damaged lines skipped and named). ``summarize(rows)`` -> list of
``GridSummary``; ``GridSummary.text()`` the lines `rnnrt summary` prints, ``as_dict()`` its
``--json`` record.
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from .ladder import AUTO
from .recordio import PASSES

POINT = ("cell", "layers", "hidden", "input_size", "batch", "steps")
"""A point's fields (a row's configuration but the pass and the input-batching k)."""


def point_of(row: dict) -> tuple:
    """(cell, layers, hidden, input size, batch, steps) of a row; input size None -> hidden."""
    p = {f: row.get(f) for f in POINT}
    if p["input_size"] is None:
        p["input_size"] = p["hidden"]
    return tuple(p[f] for f in POINT)


def point_label(p: tuple) -> str:
    cell, L, H, I, B, T = p
    return f"{cell} L{L} H{H}{'' if I == H else f' I{I}'} B{B} T{T}"


def number(v) -> float | None:
    """``v`` as a float where it is a finite number > 0 (a ratio, a share), else None:
    records are data, and recordio does not check these fields."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        return None
    return float(v)


def geomean(values) -> float | None:
    """Geometric mean of positive numbers, None for none."""
    vals = [float(v) for v in values]
    if not vals:
        return None
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


@dataclass
class Miss:
    """A point whose training step's ratio is below its forward's: both ratios, the
    schedules chosen, the share of the ceiling the training step has and would need, and
    the backward's time per forward time, ours and cuDNN's (from each row's ms and ratio:
    the training step's ratio reaches the forward's exactly where ours is at most cuDNN's)."""

    point: tuple
    fwd: float
    fwdbwd: float
    schedule: str
    share_now: float | None
    share_needed: float | None
    bwd_per_fwd: float | None = None
    cudnn_bwd_per_fwd: float | None = None

    def as_dict(self) -> dict:
        return {"point": dict(zip(POINT, self.point)), "ratio_fwd": self.fwd,
                "ratio_fwdbwd": self.fwdbwd, "schedule": self.schedule,
                "share_of_ceiling": self.share_now, "share_needed": self.share_needed,
                "backward_per_forward": self.bwd_per_fwd,
                "cudnn_backward_per_forward": self.cudnn_bwd_per_fwd}


def backward_per_forward(fwd_row: dict, fb_row: dict) -> tuple:
    """(ours, cuDNN's) backward time per forward time at one point, from its forward and
    training-step rows (ms_median and ratio_vs_cudnn each: cuDNN's ms = ours x the ratio);
    None where a number is missing or not positive. The training step's ratio is at least
    the forward's exactly where ours <= cuDNN's."""
    t_f, t_fb = number(fwd_row.get("ms_median")), number(fb_row.get("ms_median"))
    r_f, r_fb = number(fwd_row.get("ratio_vs_cudnn")), number(fb_row.get("ratio_vs_cudnn"))
    if None in (t_f, t_fb, r_f, r_fb):
        return None, None
    c_f, c_fb = t_f * r_f, t_fb * r_fb
    return (t_fb - t_f) / t_f, (c_fb - c_f) / c_f


def backward_vs_cudnn(fwd_row: dict, fb_row: dict) -> float | None:
    """cuDNN's backward time / ours at one point, a backward being the training step less the
    forward (each from its row: ms_median, and cuDNN's = ours x ratio_vs_cudnn), where both
    rows come from one run (the same non-empty ``session``: cuDNN's two times are then of one
    process); None otherwise, or where a number is missing or a backward is not positive."""
    run = fwd_row.get("session")
    if not run or run != fb_row.get("session"):
        return None
    ours, theirs = backward_per_forward(fwd_row, fb_row)
    if ours is None or ours <= 0 or theirs <= 0:
        return None
    # each a backward per its own forward: cuDNN's forward is ours x the forward's ratio
    return theirs / ours * number(fwd_row.get("ratio_vs_cudnn"))


@dataclass
class GridSummary:
    """The verdict of one device at one precision (module docstring)."""

    device: str
    dtype: str
    executor: str
    rows: dict = field(default_factory=dict)   # (point, pass) -> newest auto row
    history: dict = field(default_factory=dict)   # (point, pass) -> every auto row timed

    def ratios(self, pass_: str) -> dict:
        """{point: cuDNN ms / auto ms} of the timed points of ``pass_``."""
        return {p: number(r.get("ratio_vs_cudnn")) for (p, ps), r in self.rows.items()
                if ps == pass_ and "refused" not in r}

    def refused(self, pass_: str) -> list:
        """The points of ``pass_`` whose newest auto row was refused (its check failed)."""
        return sorted(p for (p, ps), r in self.rows.items() if ps == pass_ and "refused" in r)

    def below_one(self, pass_: str) -> list:
        return sorted((p, v) for p, v in self.ratios(pass_).items() if v < 1.0)

    def cudnn_spread(self, point: tuple, pass_: str) -> tuple | None:
        """(fastest, slowest cuDNN ms, runs) of ``point``'s ``pass_`` over every auto row
        with a ratio (cuDNN ms = ours x ratio, each in its own run), or None where it was
        timed in fewer than two runs."""
        ms = []
        for r in self.history.get((point, pass_), ()):
            ours, ratio = number(r.get("ms_median")), number(r.get("ratio_vs_cudnn"))
            if ours is not None and ratio is not None and "refused" not in r:
                ms.append(ours * ratio)
        return (min(ms), max(ms), len(ms)) if len(ms) > 1 else None

    def _below(self, pass_: str) -> list:
        out = []
        for p, v in self.below_one(pass_):
            b = {"point": dict(zip(POINT, p)), "ratio": v}
            spread = self.cudnn_spread(p, pass_)
            if spread is not None:
                b["cudnn_ms"] = {"fastest": spread[0], "slowest": spread[1], "runs": spread[2]}
            out.append(b)
        return out

    def backward_ratios(self) -> dict:
        """{point: cuDNN's backward ms / ours} where both passes are timed in one run
        (``backward_vs_cudnn``)."""
        fwd, fb = self.ratios("fwd"), self.ratios("fwd+bwd")
        out = {}
        for p in sorted(set(fwd) & set(fb)):
            v = backward_vs_cudnn(self.rows[(p, "fwd")], self.rows[(p, "fwd+bwd")])
            if v is not None:
                out[p] = v
        return out

    def misses(self) -> tuple[int, list]:
        """(points with both passes timed, the Misses among them, worst first)."""
        fwd, fb = self.ratios("fwd"), self.ratios("fwd+bwd")
        both = sorted(set(fwd) & set(fb))
        out = []
        for p in both:
            if fb[p] >= fwd[p]:
                continue
            row = self.rows[(p, "fwd+bwd")]
            share = number(row.get("share_of_ceiling"))
            out.append(Miss(p, fwd[p], fb[p], str(row.get("schedule", "?")), share,
                            share * fwd[p] / fb[p] if share else None,
                            *backward_per_forward(self.rows[(p, "fwd")], row)))
        return len(both), sorted(out, key=lambda m: m.fwdbwd / m.fwd)

    def as_dict(self) -> dict:
        n_both, misses = self.misses()
        passes = {}
        for ps in PASSES:
            r = self.ratios(ps)
            passes[ps] = {"points": len(r), "geomean": geomean(r.values()),
                          "below_one": self._below(ps),
                          "refused": [dict(zip(POINT, p)) for p in self.refused(ps)]}
        every = [v for ps in PASSES for v in self.ratios(ps).values()]
        bwd = self.backward_ratios()
        return {"device": self.device, "dtype": self.dtype, "executor": self.executor,
                "passes": passes, "geomean_all": geomean(every), "rows": len(every),
                "both_passes": n_both, "fwdbwd_at_least_fwd": n_both - len(misses),
                "misses": [m.as_dict() for m in misses],
                "backward_alone": {"points": len(bwd), "geomean": geomean(bwd.values()),
                                   "below_one": [{"point": dict(zip(POINT, p)), "ratio": v}
                                                 for p, v in sorted(bwd.items())
                                                 if v < 1.0]}}

    def text(self, limit: int | None = None) -> list[str]:
        """The printed verdict; ``limit`` lists at most that many points a list."""
        d = self.as_dict()

        def cut(items):
            return items if limit is None else items[:limit]

        def more(items):
            n = 0 if limit is None else len(items) - limit
            return [f"      ... and {n} more"] if n > 0 else []

        lines = [f"{self.device}, {self.dtype}, {self.executor} executor: the newest "
                 f"'auto' row of {d['rows']} point-passes (cuDNN at the same precision, "
                 f"timed in the same run)"]
        gm = d["geomean_all"]
        lines.append(f"  geometric mean over both passes: "
                     f"{'-' if gm is None else f'{gm:.2f}x'} cuDNN")
        for ps in PASSES:
            info = d["passes"][ps]
            if not info["points"] and not info["refused"]:
                continue
            gm = info["geomean"]
            lines.append(f"  {ps:<8} {info['points']:>4} point{'' if info['points'] == 1 else 's'}"
                         f", geometric mean "
                         f"{'-' if gm is None else f'{gm:.2f}x'}, below 1.0 at "
                         f"{len(info['below_one'])}"
                         + (f", refused at {len(info['refused'])}" if info["refused"] else ""))
            for b in cut(info["below_one"]):
                p = tuple(b["point"][f] for f in POINT)
                spread = b.get("cudnn_ms")
                lines.append(f"      {point_label(p):<28} {b['ratio']:.2f}x" + (
                    "" if spread is None else
                    f"   (cuDNN {spread['fastest']:.3f}-{spread['slowest']:.3f} ms over "
                    f"{spread['runs']} runs)"))
            lines += more(info["below_one"])
            for p in cut(self.refused(ps)):
                lines.append(f"      {point_label(p):<28} refused (its check failed)")
            lines += more(self.refused(ps))
        n_both, misses = self.misses()
        if n_both:
            lines.append(f"  fwd+bwd at least the forward's ratio at {n_both - len(misses)} "
                         f"of {n_both} point{'' if n_both == 1 else 's'} with both passes")
            if misses:
                lines.append(f"      {'point':<28} {'fwd':>6} {'fwd+bwd':>8}  share of the "
                             f"ceiling now -> needed  bwd/fwd time vs cuDNN's  schedule")
            for m in cut(misses):
                share = ("-" if m.share_now is None
                         else f"{m.share_now:.2f} -> {m.share_needed:.2f}")
                per = ("-" if m.bwd_per_fwd is None
                       else f"{m.bwd_per_fwd:.2f} vs {m.cudnn_bwd_per_fwd:.2f}")
                lines.append(f"      {point_label(m.point):<28} {m.fwd:5.2f}x {m.fwdbwd:7.2f}x"
                             f"  {share:>27}  {per:>23}  {m.schedule}")
            lines += more(misses)
        bwd = d["backward_alone"]
        if bwd["points"]:
            lines.append(f"  backward alone (fwd+bwd less fwd, both passes of one run) vs "
                         f"cuDNN's: {bwd['points']} point{'' if bwd['points'] == 1 else 's'}, "
                         f"geometric mean {bwd['geomean']:.2f}x, below 1.0 at "
                         f"{len(bwd['below_one'])}")
            low = [(tuple(b["point"][f] for f in POINT), b["ratio"]) for b in bwd["below_one"]]
            for p, v in cut(low):
                lines.append(f"      {point_label(p):<28} {v:.2f}x")
            lines += more(low)
        return lines


def summarize(rows, executor: str | None = None) -> list[GridSummary]:
    """One GridSummary per (device, dtype) of the 'auto' rows in ``rows`` (flat rows, as
    plots.load_rows gives them) timed with ``executor`` (default: 'graph' where any row has
    it, else 'numpy', else 'eager'); each (point, pass) its newest row by ``created`` among those
    with a cuDNN ratio (a positive finite number) or refused (rows timed without cuDNN, or
    with a damaged ratio, have no say)."""
    autos = [r for r in rows if r.get("rung") == AUTO and r.get("type", "row") == "row"
             and ("refused" in r or number(r.get("ratio_vs_cudnn")) is not None)]
    if executor is None:
        have = {r.get("executor") for r in autos}
        executor = next((e for e in ("graph", "numpy", "eager") if e in have), "graph")
    groups, history = defaultdict(dict), defaultdict(lambda: defaultdict(list))
    for r in autos:
        if r.get("executor") != executor:
            continue
        g = (str(r.get("device") or "unknown device"), str(r.get("dtype", "float32")))
        k = (point_of(r), r.get("pass", "fwd"))
        history[g][k].append(r)
        old = groups[g].get(k)
        if old is None or str(r.get("created", "")) >= str(old.get("created", "")):
            groups[g][k] = r
    return [GridSummary(dev, dt, executor, groups[(dev, dt)], dict(history[(dev, dt)]))
            for dev, dt in sorted(groups)]
