"""How well the sweep's cost model (rnnrt.bench.progress.CostModel) foretells a sweep, replayed
on recorded sweeps: for each file, the points in the order they ran, the model taught the
points before each one (their point_seconds less compile_s, as the sweep teaches it), then
asked for (a) the time the rest of the sweep took, at 5%, 10%, 25%, 50% and 75% of the points
(the progress bar's ETA: estimate / actual), and (b) the next point alone (what
--time-budget decides by: the median |log(estimate / actual)|, and how often it was more than
2x off either way). CPU only; reads JSON-lines sweep files.

Usage: python experiments/scripts/eta_replay.py experiments/results/sweep/sweep-wide-*.jsonl
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rnnrt.bench.progress import CostModel  # noqa: E402
from rnnrt.bench.sweep import read_lines  # noqa: E402

FRACTIONS = (0.05, 0.10, 0.25, 0.50, 0.75)


class _Point:
    """What the cost model reads of a point."""

    def __init__(self, row):
        self.layers, self.steps, self.flops = row["layers"], row["steps"], row["flops_per_pass"]


def points(path) -> list[tuple]:
    """(point, seconds less compiles) of each point of ``path``, in the order they ran (one
    per point and session: a point's rows share its point_seconds)."""
    out, seen = [], set()
    for r in read_lines(path):
        if r.get("type") != "row" or "point_seconds" not in r:
            continue
        key = (r["cell"], r["layers"], r["hidden"], r["batch"], r["pass"], r.get("session"))
        if key not in seen:
            seen.add(key)
            out.append((_Point(r), r["point_seconds"] - (r.get("compile_s") or 0.0)))
    return out


def replay(pts) -> dict:
    """The remaining-time ratios at FRACTIONS and the next-point errors of ``pts``."""
    remaining, logs = [], []
    model = CostModel()
    for i, (p, t) in enumerate(pts[:-1]):
        model.add(p, t)
        rest = pts[i + 1:]
        actual = sum(s for _, s in rest)
        remaining.append(sum(model.estimate(q) for q, _ in rest) / max(actual, 1e-9))
        logs.append(math.log(model.estimate(rest[0][0]) / max(rest[0][1], 0.1)))
    at = {f: remaining[min(len(remaining) - 1, int(f * len(remaining)))] for f in FRACTIONS}
    return {"points": len(pts), "seconds": sum(t for _, t in pts), "remaining": at,
            "next_median_abs_log": statistics.median(abs(v) for v in logs),
            "next_off_2x": sum(abs(v) > math.log(2) for v in logs), "next_n": len(logs)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", help="sweep JSON-lines files")
    args = ap.parse_args(argv)
    print("file | points | seconds | remaining est/actual at " +
          ", ".join(f"{f:.0%}" for f in FRACTIONS) + " | next point: median |log| | >2x off")
    for f in args.files:
        pts = points(f)
        if len(pts) < 3:
            print(f"{Path(f).name} | {len(pts)} points: too few to replay")
            continue
        r = replay(pts)
        print(f"{Path(f).name} | {r['points']} | {r['seconds']:.0f} | " +
              " ".join(f"{v:.2f}" for v in r["remaining"].values()) +
              f" | {r['next_median_abs_log']:.2f} | {r['next_off_2x']} of {r['next_n']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
