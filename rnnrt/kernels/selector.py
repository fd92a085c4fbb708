"""The schedule selector: which schedule ``switches='auto'`` runs for a shape, timed once and
remembered.

``Selector.select(shape)`` answers from memory (least recently used evicted past
MEMORY_ENTRIES), else from the disk cache (``tuning.ScheduleCache``), else by timing the
candidates ``choice.candidates`` lists (the best paper rung, input-batching variants and every
persistent family that fits; for training shapes those with the persistent backward kernel)
through a timer the caller gives -- the GPU runner builds and times the plans, tests pass a
fake -- within TUNE_BUDGET_S, keeping the fastest. With timing off (``RNNRT_AUTOTUNE=0``) it
takes ``choice.heuristic``'s deterministic choice. ``Shape`` is what a choice is keyed on
(lengths bucketed: ``bucket_steps``); ``Selection`` what it answers, with each candidate's time
or why it has none. Which kernels exist and fit is ``choice.py``'s question, not this module's.
"""
from __future__ import annotations

import os
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from .choice import candidates, heuristic
from .occupancy import ClusterCap, derived_cap
from .schedules import Schedule, with_lt




def bucket_steps(steps: int) -> int:
    """The steps bucket a length belongs to: the next power of two (at least 16), so that
    variable-length data tunes once per bucket, not once per length."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps: expected a positive int, got {steps!r}")
    b = 16
    while b < steps:
        b *= 2
    return b


@dataclass(frozen=True)
class Shape:
    """What a schedule is chosen for: the model's shape and the pass (lengths bucketed)."""

    cell: str
    layers: int
    input_size: int
    hidden: int
    batch: int
    steps: int            # the steps of the call; ``key()`` keys on its bucket
    train: bool = False   # forward + backward (a training step) rather than inference
    bias: bool = True
    dtype: str = "float32"
    executor: str = "graph"
    varlen: bool = False  # a per-step active batch (packed sequences of different lengths)

    def key(self) -> str:
        """The cache key: every field but the exact length (its bucket instead)."""
        return (f"{self.cell}|L{self.layers}|I{self.input_size}|H{self.hidden}|B{self.batch}"
                f"|T{bucket_steps(self.steps)}|{'fwd+bwd' if self.train else 'fwd'}"
                f"|{'bias' if self.bias else 'nobias'}|{self.dtype}|{self.executor}"
                + ("|varlen" if self.varlen else ""))


def _cached_candidates(rows) -> list:
    """A cache entry's candidate rows, checked: [{name: str, ms: number >= 0 | None, ...}]."""
    if not isinstance(rows, list):
        raise ValueError(f"candidates: expected a list, got {type(rows).__name__}")
    for r in rows:
        ms = r.get("ms") if isinstance(r, dict) else None
        if (not isinstance(r, dict) or not isinstance(r.get("name"), str)
                or not (ms is None or (isinstance(ms, (int, float)) and not isinstance(ms, bool)
                                       and ms >= 0))):
            raise ValueError(f"candidates: a damaged row {r!r}")
    return rows


def _cached_seconds(v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
        raise ValueError(f"tune_s: expected seconds >= 0, got {v!r}")
    return float(v)


@dataclass
class Selection:
    """What the selector chose for a shape and why: the schedule, where the choice came from
    ('tuned', 'cache' or 'heuristic'), each candidate's median ms (or why it has none), the
    seconds tuning took, and the reason when it did not time."""

    schedule: Schedule
    source: str
    candidates: list = field(default_factory=list)   # [{name, ms | None, status}]
    tune_s: float = 0.0
    note: str = ""

    def as_dict(self) -> dict:
        return {"schedule": self.schedule.name, "family": self.schedule.family,
                "clusters": self.schedule.clusters,
                "switches": self.schedule.switches.as_dict(), "source": self.source,
                "candidates": self.candidates, "tune_s": self.tune_s, "note": self.note}


TUNE_BUDGET_S = 2.0
"""Seconds of timing a new key may take (compiling kernels and capturing graphs excepted:
the timer reports those apart)."""
CLEARLY_SLOWER = 1.3
"""A candidate whose first timed run is this many times the best so far is not run again."""
TUNE_REPEATS = 3
TUNE_RUN_MS = 60.0
"""About how long one timed run of a candidate may take: longer sequences are tuned on a
shorter prefix (``tuning_steps``), so a new key costs about the budget whatever its size."""
TUNE_MIN_STEPS = 32
TUNE_ASSUMED_TFLOPS = 30.0
"""The rate ``tuning_steps`` assumes to estimate a run's time from its FLOPs (fp32, H100)."""
LT_MIN_GAIN = 0.01
"""How much faster the winner's '+lt' form must be to replace it."""
MEMORY_ENTRIES = 1024
"""Choices a selector keeps in memory (the disk cache keeps its own bound)."""


def tuning_steps(shape: "Shape") -> int:
    """The steps a candidate is timed over: the shape's own, cut so that one run takes about
    TUNE_RUN_MS at TUNE_ASSUMED_TFLOPS (never below TUNE_MIN_STEPS): every step costs the
    same, so a prefix ranks the schedules as the whole sequence does, and seven candidates
    of a 400 ms training step no longer take 15 s to tune (the wide sweep's largest point
    did before this rule)."""
    from ..cells import forward_flops
    flops = forward_flops(shape.cell, shape.input_size, shape.hidden, shape.layers,
                          shape.batch, shape.steps) * (3 if shape.train else 1)
    est_ms = flops / (TUNE_ASSUMED_TFLOPS * 1e9)
    if est_ms <= TUNE_RUN_MS:
        return shape.steps
    return max(min(TUNE_MIN_STEPS, shape.steps), int(shape.steps * TUNE_RUN_MS / est_ms))


def autotune_enabled(env=None) -> bool:
    """False when RNNRT_AUTOTUNE is '0', 'false', 'no' or 'off' (heuristic choice only)."""
    v = (os.environ if env is None else env).get("RNNRT_AUTOTUNE", "1")
    return v.strip().lower() not in ("0", "false", "no", "off")


class Selector:
    """Chooses and remembers the schedule of each shape.

    Variable lengths (``Shape.varlen``): a key of its own (steps bucketed like any), whose
    candidates are the cuBLAS schedules alone (``varlen_schedules``: no persistent kernel
    takes a per-step batch); the timer times them on one representative pattern of the
    key (``plan.packing.staircase``: lengths falling evenly, as random lengths bucket), a
    stand-in for every pattern of the key: timing each pattern would build and capture a
    plan per pattern (a new one most steps of a training loop).

    timer: ``timer(schedule, shape, repeats) -> list of ms`` (one per timed run, after the
    timer's own warm-up; it raises to say a candidate cannot run). device: the
    DeviceLimits the fits read. cache: a tuning.ScheduleCache (or None: memory only).
    autotune: None reads RNNRT_AUTOTUNE. clock: seconds (tests pass a fake).
    candidates_fn: ``candidates_fn(shape, device) -> schedules`` to time (default: this
    module's ``candidates``; a benchmark passes fewer to measure a choice without some).
    cluster_cap: ``cluster_cap(fit, dtype) -> occupancy.ClusterCap``, the co-resident cap of
    the cluster kernel's fit (its instantiation at precision ``dtype``) that bounds the cluster counts timed (the GPU runner queries the
    driver for the compiled kernel, ``occupancy.cluster_cap``); None: derived from the
    device properties. The cap a tuning used is in its Selection's note. try_lt: after the
    candidates, time the fastest again with its GEMMs' kernels chosen by timing
    (``schedules.with_lt``, fp32 shapes; it wins where faster).
    """

    def __init__(self, timer, device, cache=None, autotune: bool | None = None,
                 budget_s: float = TUNE_BUDGET_S, clock=time.perf_counter, log=None,
                 candidates_fn=None, cluster_cap=None, try_lt: bool = True):
        self.timer, self.device, self.cache = timer, device, cache
        self.try_lt = bool(try_lt)
        self.candidates_fn = candidates_fn
        self.cluster_cap = cluster_cap
        self.autotune = autotune_enabled() if autotune is None else bool(autotune)
        self.budget_s, self.clock = float(budget_s), clock
        self.log = log or (lambda msg: None)
        self._memory: OrderedDict[str, Selection] = OrderedDict()

    def select(self, shape: Shape) -> Selection:
        """The schedule for ``shape``: from memory, else the disk cache, else tuned (or the
        heuristic with timing off), remembered in both."""
        k = shape.key()
        if k in self._memory:
            self._memory.move_to_end(k)
            return self._memory[k]
        sel = None
        if self.autotune and self.cache is not None:
            entry = self.cache.get(k)
            if entry is not None:
                try:
                    sel = Selection(Schedule.from_dict(entry["schedule"]), "cache",
                                    _cached_candidates(entry.get("candidates", [])),
                                    _cached_seconds(entry.get("tune_s", 0.0)))
                except (KeyError, TypeError, ValueError) as e:
                    self.cache.warn(f"entry {k!r} is damaged ({e}); tuning it again")
        if sel is None:
            sel = self.tune(shape) if self.autotune else Selection(
                heuristic(shape, self.device), "heuristic", note="RNNRT_AUTOTUNE=0")
            if sel.source == "tuned" and self.cache is not None:
                self.cache.put(k, {"schedule": sel.schedule.as_dict(),
                                   "candidates": sel.candidates, "tune_s": sel.tune_s})
        self._memory[k] = sel
        while len(self._memory) > MEMORY_ENTRIES:   # bounded: least recently used go first
            self._memory.popitem(last=False)
        return sel

    def tune(self, shape: Shape) -> Selection:
        """Time every candidate (most promising first) within the budget; the fastest."""
        t0 = self.clock()
        best, best_ms, rows = None, float("inf"), []
        caps: dict[str, ClusterCap] = {}   # kernel -> the cap of its rule's count's fit

        def cap_of(fit, dtype="float32"):
            c = (self.cluster_cap(fit, dtype) if self.cluster_cap is not None
                 else derived_cap(fit, self.device.props()))
            caps.setdefault(fit.kernel, c)
            return c

        scheds = (candidates(shape, self.device, cap_of) if self.candidates_fn is None
                  else self.candidates_fn(shape, self.device))
        def time_one(sched):
            """Time ``sched`` into ``rows``; its ms, or None where it could not run."""
            try:
                first = self.timer(sched, shape, 1)
                ms = first[0]
                status = "timed"
                left = self.budget_s - (self.clock() - t0)
                if ms > CLEARLY_SLOWER * best_ms:
                    status = f"stopped early: {ms / best_ms:.2f}x the best"
                elif (TUNE_REPEATS - 1) * ms / 1e3 > left:
                    status = "timed once: the budget leaves no time for more runs"
                else:
                    ms = _median(first + self.timer(sched, shape, TUNE_REPEATS - 1))
            except Exception as e:  # noqa: BLE001 - a candidate that cannot run loses
                rows.append({"name": sched.name, "ms": None, "status": f"failed: {e}"})
                return None
            rows.append({"name": sched.name, "ms": ms, "status": status})
            return ms

        for sched in scheds:
            spent = self.clock() - t0
            if best is not None and spent > self.budget_s:
                rows.append({"name": sched.name, "ms": None,
                             "status": f"skipped: tuning budget {self.budget_s:g} s spent"})
                continue
            ms = time_one(sched)
            if ms is not None and ms < best_ms:
                best, best_ms = sched, ms
        # the winner again with its GEMMs' kernels chosen by timing (PlanKey.gemm 'lt'):
        # the same plan, so it is timed whatever the budget left (one candidate more); it
        # wins only by LT_MIN_GAIN (a plan with no GEMM it changes must not win by noise)
        if (best is not None and self.try_lt and shape.dtype == "float32"
                and best.gemm == "cublas"):
            lt = with_lt(best)
            ms = time_one(lt)
            if ms is not None and ms * (1.0 + LT_MIN_GAIN) <= best_ms:
                best, best_ms = lt, ms
        tune_s = self.clock() - t0
        # the caps the cluster counts were bounded by (each family's rule's count's fit: the
        # register-resident kernel's blocks may share an SM, the cluster kernel's not), or why
        # the rule's cap stood in for the device's
        cap = ("cluster counts: " + "; ".join(f"{k} {c.describe()}" for k, c in caps.items())
               if caps else "")
        if best is None:   # nothing ran: the heuristic, and say so
            return Selection(heuristic(shape, self.device), "heuristic", rows, tune_s,
                             note="; ".join(x for x in ("no candidate could be timed", cap)
                                            if x))
        self.log(f"tuned {shape.key()}: {best.name} {best_ms:.3f} ms of "
                 f"{', '.join(r['name'] for r in rows)} in {tune_s:.2f} s")
        return Selection(best, "tuned", rows, tune_s, note=cap)


def _median(xs):
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])
