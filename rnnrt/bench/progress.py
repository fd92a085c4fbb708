"""Progress on long work: a cost model of what a point takes (fitted to the points done) and
a one-line progress bar with the estimated time left -- the sweep's (bench/sweep.py)."""
from __future__ import annotations

import statistics
import sys
import time


class CostModel:
    """Seconds a point takes, from the finished points: t ~ s * sqrt(FLOPs), s the median of
    their t / sqrt(FLOPs). Over whole wide grids (H100 fp32 and bfloat16, H200 float16 and
    fp32) a point's seconds grow about as the square root of its FLOPs: ~0.3 s at 3e8, 1 s at
    1e10, 17 s at 1e12, 49 s at 1e13 (small points are the ladder's fixed costs: tuning,
    capture, the check; big ones the timed runs). The grid runs from the smallest point up,
    so a fit that extrapolates a per-FLOP cost from the small points overshoots (a least-
    squares a + b * layers * steps + c * FLOPs said 169 hours for a sweep of minutes); the
    median keeps one slow point (a first compile) from moving it. Replayed over those grids
    (experiments/scripts/eta_replay.py): the time left, estimated after 10%, 25% or 50% of
    the points, within 0.6-1.6x of what it was (the least-squares fit: 0.09-4.2x), the next
    point's within 2x at 82-90% of points (58-87%)."""

    def __init__(self):
        self.ratios = []     # each finished point's seconds / sqrt(FLOPs)

    def add(self, p, seconds: float):
        """Learn from a finished point ``p`` (a sweep.Point) that took ``seconds``."""
        self.ratios.append(max(0.0, float(seconds)) / max(1.0, float(p.flops)) ** 0.5)

    def __len__(self):
        return len(self.ratios)

    def estimate(self, p) -> float | None:
        """Estimated seconds for ``p``; None before any point has finished."""
        if not self.ratios:
            return None
        return statistics.median(self.ratios) * max(1.0, float(p.flops)) ** 0.5


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
