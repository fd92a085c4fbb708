"""Progress on long work: a cost model of what a point takes (fitted to the points done) and
a one-line progress bar with the estimated time left -- the sweep's (bench/sweep.py)."""
from __future__ import annotations

import itertools
import sys
import time


class CostModel:
    """Seconds a point takes, fitted to finished points: t ~ a + b * (layers * steps) +
    c * FLOPs with a, b, c >= 0 (a fixed cost per point; a cost per cell of the (layer, step)
    grid, which is what plan building, graph capture and host issue scale with; a cost per
    FLOP). With n finished points at most n - 1 of the three terms are used, so one point
    gives its own time (the mean), two a proportional model, and so on; the fit is the
    least-squares one over every allowed subset of terms with non-negative coefficients."""

    def __init__(self):
        self.xs, self.ts = [], []
        self._coef = None

    @staticmethod
    def features(p):   # a sweep.Point: layers, steps, flops
        return (1.0, float(p.layers * p.steps), float(p.flops))

    def add(self, p: Point, seconds: float):
        self.xs.append(self.features(p))
        self.ts.append(float(seconds))
        self._coef = None

    def __len__(self):
        return len(self.ts)

    def _fit(self):
        import numpy as np
        X, t = np.array(self.xs), np.array(self.ts)
        scale = X.max(axis=0)
        scale[scale == 0] = 1.0
        Xs = X / scale
        best, best_err = None, np.inf
        max_terms = max(1, len(t) - 1)
        for r in range(1, min(3, max_terms) + 1):
            for cols in itertools.combinations(range(3), r):
                sol, *_ = np.linalg.lstsq(Xs[:, cols], t, rcond=None)
                if np.any(sol < 0):
                    continue
                err = float(np.sum((Xs[:, cols] @ sol - t) ** 2))
                if err < best_err - 1e-12:
                    coef = np.zeros(3)
                    coef[list(cols)] = sol
                    best, best_err = coef / scale, err
        if best is None:                    # nothing non-negative: the mean
            best = np.array([float(np.mean(t)), 0.0, 0.0])
        self._coef = best

    def estimate(self, p: Point) -> float | None:
        """Estimated seconds for ``p``; None before any point has finished."""
        if not self.ts:
            return None
        if self._coef is None:
            self._fit()
        return float(sum(c * x for c, x in zip(self._coef, self.features(p))))


def hms(seconds) -> str:
    """Seconds as h:mm:ss (or m:ss); None as '?'."""
    if seconds is None:
        return "?"
    s = int(round(seconds))
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class ProgressBar:
    """A one-line progress bar on ``stream``: points done / total, elapsed, estimated time
    left, and what runs now. On a terminal it redraws in place with '\\r'; elsewhere (a log
    file, a captured stream) it writes one line per finished point instead."""

    def __init__(self, total: int, stream=None, width: int = 24, tty: bool | None = None,
                 clock=time.monotonic):
        self.total, self.width = total, width
        self.stream = sys.stderr if stream is None else stream
        if tty is None:
            isatty = getattr(self.stream, "isatty", None)
            tty = bool(isatty and isatty())
        self.tty, self.clock = tty, clock
        self.t0 = clock()
        self.done, self.eta, self.current = 0, None, ""
        self._last_len = 0

    def render(self) -> str:
        frac = self.done / self.total if self.total else 1.0
        fill = int(round(frac * self.width))
        bar = "#" * fill + "." * (self.width - fill)
        text = (f"[{bar}] {self.done}/{self.total} points {100 * frac:3.0f}%  "
                f"elapsed {hms(self.clock() - self.t0)}  ETA {hms(self.eta)}")
        return text + (f"  | {self.current}" if self.current else "")

    def _draw(self):
        import shutil
        # one terminal line at most: a wrapped line cannot be redrawn in place
        cols = shutil.get_terminal_size(fallback=(120, 24)).columns - 1
        text = self.render()[:max(20, cols)]
        pad = max(0, self._last_len - len(text))
        self.stream.write("\r" + text + " " * pad)
        self.stream.flush()
        self._last_len = len(text)

    def update(self, done=None, eta=..., current=None):
        """New state; on a terminal redraw, elsewhere write a line when ``done`` grows."""
        grew = done is not None and done != self.done
        if done is not None:
            self.done = done
        if eta is not ...:
            self.eta = eta
        if current is not None:
            self.current = current
        if self.tty:
            self._draw()
        elif grew:
            self.stream.write(self.render() + "\n")
            self.stream.flush()

    def message(self, text: str):
        """A line of its own above the bar."""
        if self.tty:
            self.stream.write("\r" + " " * self._last_len + "\r" + text + "\n")
            self._draw()
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self):
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
