"""`rnnrt sweep`: the ladder (every rung, verified then timed, beside cuDNN) at every point of
a grid over cell x layers x hidden x minibatch (x input-batching k), results appended as JSON
lines as each point finishes so that an interrupted sweep resumes where it stopped.

A point is one ladder run: (cell, layers, hidden, input_size, batch, steps, input_batch, pass,
dtype); a sweep runs at one precision (``dtype``, `--dtype`: every rung, auto and cuDNN at it;
the file name says it where it is not float32).
Defaults reproduce the paper's sweep (its Figure 1: 4-layer LSTM, hidden x minibatch) plus the
1-layer points that its "1 -> 4 layers can double throughput" claim needs:
  hidden 128 256 512 1024 2048 4096, minibatch 32 64 128 256, layers 1 4, LSTM;
  steps 100 (50 for hidden >= 2048, as the project's reference measurements did); the graph
  executor only (eager is host-bound and would cost the time budget many times over);
  median of 10 runs after 2 warm-ups per rung.
Points run cheapest first (by forward FLOPs), so a time budget finishes as many as it can and
the expensive tail resumes in the next call. The budget's estimate of a point leaves out the
kernel compiles the points before it paid (a file's first use, once a process): each row
records them as ``compile_s``, within its ``point_seconds``.

The JSON-lines file (schema 'rnnrt.sweep/1'), one object a line, three types:
  {"type": "session", ...}  written when a sweep (or a resumed one) starts: created, command,
        device {...}, versions {...}, ceiling {what, tflops, ...}, cpu, grid {...}
  {"type": "row", ...}      one per ladder row (each rung x executor, and the cuDNN row): the
        ladder's row fields (rung, executor, switches, ms_median, ms_min, ms_max, runs,
        tflops, speedup_vs_naive, ratio_vs_cudnn, share_of_ceiling, check, plan; 'refused'
        instead of timings when a rung's output disagreed) plus the point's configuration
        (cell, layers, hidden, input_size, batch, steps, input_batch, pass) and repeats,
        warmup, cpu, device (name), ceiling_tflops, flops_per_pass, point_seconds (wall
        time of the whole point), compile_s (the part of it spent compiling kernels), phase_s
        (where the point's time went: bench/ladder.py; the progress line names a phase that
        took most of it), session (its session's 'created'), created
  {"type": "error", ...}    a point that raised: its configuration, device, error (type and
        message), traceback (last lines), point_seconds
With ``processes`` > 1 (`--processes N`) each point's ladder runs in N fresh processes, pooled
(bench/processes.py: medians, each ratio within its process; the rows carry ``per_process``
and ``ratio_vs_cudnn_range``): cuDNN's time moves between processes by itself. With
``shard`` (k, n) (`--shard k/N`; `--gpus` runs the n shares at once, bench/shards.py) a sweep
runs only every n-th point from the k-th, in a file of its own.
A point is done when the file has a row or an error line for it (``--retry-errors`` redoes
the errors; ``--retry-refused`` the points whose last run has a refused row: a check may have
changed since, as the float32 second opinion of large 16-bit points did; a point's later rows
win in `rnnrt plot`). Reading goes through recordio (the one loader of records): a damaged
line is skipped with a warning naming its file and line (its point runs again); a last line
cut short by a kill is skipped with a note.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import gc
import itertools
import json
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from ..cells import forward_flops, get_cell
from ..plan.switches import ALL, DEFAULT_INPUT_BATCH
from ..precision import get_precision
from . import ladder as ladder_mod
from .processes import ladder_argv, pool, run_processes
from .progress import CostModel, ProgressBar, hms
from .recordio import read_jsonl, valid_input_batch
from .records import device_slug, now_iso, record_path, results_root
from .second_opinion import SECOND_OPINION

SCHEMA = "rnnrt.sweep/1"
DEFAULT_HIDDEN = (128, 256, 512, 1024, 2048, 4096)
DEFAULT_BATCH = (32, 64, 128, 256)
DEFAULT_LAYERS = (1, 4)
LONG_STEPS_HIDDEN = 2048          # from this hidden size on, default steps are SHORT_STEPS
DEFAULT_STEPS, SHORT_STEPS = 100, 50
# `--quick`: the hidden sizes around the paper's 512 at the two small minibatches, where
# the rungs differ most; a few minutes on an H100.
QUICK = dict(hidden=(256, 512, 1024), batch=(32, 64), layers=(1, 4), cells=("lstm",),
             repeats=5, warmup=2)
# Named grids (`--preset NAME`): 'wide' is where rnnrt is judged against cuDNN: both cells, 1
# and 4 layers, hidden 128-2048 x batch 8-256, forward and forward+backward, 100 steps, only
# the auto row (the schedule selector's choice, as a user gets it) and cuDNN, timed in turn.
PRESETS = {
    "wide": dict(cells=("lstm", "gru"), layers=(1, 4), hidden=(128, 256, 512, 1024, 2048),
                 batch=(8, 32, 64, 128, 256), passes=("fwd", "fwd+bwd"), steps=100,
                 rungs=("auto",), interleave=True, repeats=10, warmup=2),
    "quick": QUICK,
}
# `--cpu`: the NumPy executor; sizes where one point takes a fraction of a second.
CPU_GRID = dict(hidden=(8, 16, 32), batch=(4, 8), layers=(1, 4), steps=8, repeats=3, warmup=1)
CPU_QUICK = dict(hidden=(8, 16), batch=(4,), layers=(1, 4), steps=6, repeats=2, warmup=1)
# stop after this many points in a row raised: a broken CUDA context fails every point, and
# marking the whole grid as errors would make --resume skip it
MAX_CONSECUTIVE_ERRORS = 3
# the time budget's margin on a point's estimated time
BUDGET_SAFETY = 1.15


@dataclass
class SweepConfig:
    """The grid and how each point is measured (see the module docstring for defaults)."""

    hidden: tuple = DEFAULT_HIDDEN
    batch: tuple = DEFAULT_BATCH
    layers: tuple = DEFAULT_LAYERS
    cells: tuple = ("lstm",)
    steps: int | None = None            # None: DEFAULT_STEPS, SHORT_STEPS for big hidden
    input_size: int | None = None       # None: = hidden at every point
    input_batch: tuple = (DEFAULT_INPUT_BATCH,)
    executors: tuple = ("graph",)
    repeats: int = 10
    warmup: int = 2
    cudnn: bool = True
    backward: bool = False              # time forward+backward (where the ladder supports it)
    passes: tuple | None = None         # ('fwd', 'fwd+bwd'): both; None: as ``backward`` says
    rungs: tuple | None = None          # the ladder's rows to run (None: every rung and auto)
    interleave: bool = False            # time each row and cuDNN one run each, in turn
    cpu: bool = False
    time_budget: float | None = None    # seconds; stop before a point that would not fit
    retry_errors: bool = False
    retry_refused: bool = False         # resume: run again the points with a refused row
    dtype: str = "float32"              # the precision of every point (precision.DTYPES)
    processes: int = 1                  # > 1: each point's ladder in that many fresh
                                        # processes, pooled (bench/processes.py)
    shard: tuple | None = None          # (k, n): only the k-th of n shares of the grid
                                        # (1-based; grid()); None: all of it
    seed: int = 0
    verbose: bool = False
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        for name in ("hidden", "batch", "layers"):
            vals = tuple(getattr(self, name))
            if not vals or any(isinstance(v, bool) or not isinstance(v, int) or v < 1
                               for v in vals):
                raise ValueError(f"SweepConfig.{name}: expected positive ints, got {vals!r}")
            setattr(self, name, vals)
        self.cells = tuple(self.cells)
        if not self.cells:
            raise ValueError("SweepConfig.cells: expected at least one cell")
        for c in self.cells:
            get_cell(c)
        self.input_batch = tuple(self.input_batch)
        for k in self.input_batch:
            if not valid_input_batch(k):
                raise ValueError(f"SweepConfig.input_batch: expected ints >= 1 or {ALL!r}, "
                                 f"got {k!r}")
        self.executors = tuple(self.executors)
        if self.time_budget is not None and self.time_budget <= 0:
            raise ValueError(f"SweepConfig.time_budget: expected seconds > 0, "
                             f"got {self.time_budget!r}")
        if self.passes is None:
            self.passes = ("fwd+bwd",) if self.backward else ("fwd",)
        self.passes = tuple(self.passes)
        if not self.passes or any(p not in ("fwd", "fwd+bwd") for p in self.passes):
            raise ValueError(f"SweepConfig.passes: expected 'fwd' and/or 'fwd+bwd', "
                             f"got {self.passes!r}")
        if self.rungs is not None:   # the ladder's own check names what it knows
            ladder_mod.LadderConfig(rungs=tuple(self.rungs))
            self.rungs = tuple(self.rungs)
        try:
            get_precision(self.dtype)
        except ValueError as e:
            raise ValueError(f"SweepConfig.{e}") from None
        p = self.processes
        if isinstance(p, bool) or not isinstance(p, int) or p < 1:
            raise ValueError(f"SweepConfig.processes: expected an int >= 1, got {p!r}")
        if self.shard is not None:
            sh = tuple(self.shard)
            if len(sh) != 2 or any(isinstance(v, bool) or not isinstance(v, int) for v in sh) \
                    or not 1 <= sh[0] <= sh[1]:
                raise ValueError(f"SweepConfig.shard: expected (k, n) with 1 <= k <= n, "
                                 f"got {self.shard!r}")
            self.shard = sh

    @property
    def pass_name(self) -> str:
        """The pass, for a sweep of one pass ('fwd', 'fwd+bwd' or 'fwd,fwd+bwd')."""
        return ",".join(self.passes)

    def steps_for(self, hidden: int) -> int:
        if self.steps is not None:
            return self.steps
        return SHORT_STEPS if hidden >= LONG_STEPS_HIDDEN else DEFAULT_STEPS


@dataclass(frozen=True)
class Point:
    """One point of the grid: one ladder run."""

    cell: str
    layers: int
    hidden: int
    input_size: int
    batch: int
    steps: int
    input_batch: int | str
    pass_: str = "fwd"
    dtype: str = "float32"

    def key(self) -> tuple:
        """Identity in the results file (input_batch as text: 10 and '10' are one point)."""
        return (self.cell, self.layers, self.hidden, self.input_size, self.batch, self.steps,
                str(self.input_batch), self.pass_, self.dtype)

    def as_dict(self) -> dict:
        return {"cell": self.cell, "layers": self.layers, "hidden": self.hidden,
                "input_size": self.input_size, "batch": self.batch, "steps": self.steps,
                "input_batch": self.input_batch, "pass": self.pass_, "dtype": self.dtype}

    @property
    def flops(self) -> int:
        f = forward_flops(self.cell, self.input_size, self.hidden, self.layers, self.batch,
                          self.steps)
        return 3 * f if self.pass_ != "fwd" else f

    def label(self) -> str:
        return (f"{self.cell} L{self.layers} H{self.hidden} B{self.batch} T{self.steps}"
                + (f" I{self.input_size}" if self.input_size != self.hidden else "")
                + (f" k{self.input_batch}" if self.input_batch != DEFAULT_INPUT_BATCH else "")
                + (f" {self.pass_}" if self.pass_ != "fwd" else "")
                + (f" {self.dtype}" if self.dtype != "float32" else ""))

    def ladder_config(self, cfg: SweepConfig) -> "ladder_mod.LadderConfig":
        kw = dict(cell=self.cell, layers=self.layers, hidden=self.hidden,
                  input_size=self.input_size, batch=self.batch, steps=self.steps,
                  repeats=cfg.repeats, warmup=cfg.warmup, input_batch=self.input_batch,
                  executors=cfg.executors, cpu=cfg.cpu, cudnn=cfg.cudnn, seed=cfg.seed,
                  backward=self.pass_ == "fwd+bwd", rungs=cfg.rungs,
                  interleave=cfg.interleave, dtype=self.dtype)
        return ladder_mod.LadderConfig(**kw)


def key_of(line: dict) -> tuple:
    """The point key of a row or error line (see Point.key)."""
    return (line["cell"], line["layers"], line["hidden"], line["input_size"], line["batch"],
            line["steps"], str(line["input_batch"]), line.get("pass", "fwd"),
            line.get("dtype", "float32"))


def grid(cfg: SweepConfig) -> list[Point]:
    """Every point of the grid, cheapest (fewest FLOPs) first; with ``cfg.shard`` (k, n)
    every n-th of them from the k-th (dealt like cards: each share holds small and large
    points alike; bench/shards.py)."""
    pts = []
    for cell, layers, hidden, batch, k, pass_ in itertools.product(
            cfg.cells, cfg.layers, cfg.hidden, cfg.batch, cfg.input_batch, cfg.passes):
        inp = hidden if cfg.input_size is None else cfg.input_size
        pts.append(Point(cell, layers, hidden, inp, batch, cfg.steps_for(hidden), k, pass_,
                         cfg.dtype))
    pts = sorted(pts, key=lambda p: (p.flops, p.key()))
    if cfg.shard is not None:
        k, n = cfg.shard
        pts = pts[k - 1::n]
    return pts


# --------------------------------------------------------------------------------------------
# The results file

def read_lines(path, warn=None, note=None, missing_ok: bool = True) -> list[dict]:
    """Every valid line of a results file (recordio.read_jsonl: parsed, checked); each
    damaged line is skipped with a warning naming it (``warn``, default stderr), so its point
    runs again; a last line cut short by a kill is skipped with a note (``note``, default
    ``warn``). A file that does not exist has no lines (missing_ok=False: FileNotFoundError,
    as for `rnnrt plot`)."""
    path = Path(path)
    if missing_ok and not path.exists():
        return []
    warn = warn or (lambda m: print(f"[sweep] warning: {m}", file=sys.stderr))
    loaded = read_jsonl(path)
    for msg in loaded.problems:
        warn(msg)
    if loaded.torn:
        (note or warn)(loaded.torn)
    return loaded.objects()


def done_keys(lines, retry_errors: bool = False, retry_refused: bool = False) -> set:
    """Point keys that the file already has results for: a row, or an error line unless
    ``retry_errors``; with ``retry_refused`` rows count only where the point's last run has
    no refused row (``last_run_refused``), so a point that passed when run again is done."""
    errors = set() if retry_errors else {key_of(ln) for ln in lines
                                         if ln.get("type") == "error"}
    return errors | {k for k, refused in last_run_refused(lines).items()
                     if not (retry_refused and refused)}


def last_run_refused(lines) -> dict:
    """Point key -> whether the point's last run has a refused row, for every point with a
    row. A run is the point's rows in a row of lines: one write per point, a session line
    opening every sweep (two sweeps may share a 'created' second, so stamps cannot tell)."""
    refused, prev = {}, None
    for ln in lines:
        k = key_of(ln) if ln.get("type") == "row" else None
        if k is not None:
            # the first row of a run: the point's earlier runs no longer decide
            refused[k] = (refused[k] if k == prev else False) or "refused" in ln
        prev = k
    return refused


class JsonlWriter:
    """Appends lines to the results file, flushed and fsynced after each point so that a
    kill loses at most the point in flight."""

    def __init__(self, path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # a line cut short by a kill has no newline: start the next one on a line of its own
        needs_nl = False
        if self.path.exists() and self.path.stat().st_size > 0:
            with self.path.open("rb") as f:
                f.seek(-1, os.SEEK_END)
                needs_nl = f.read(1) != b"\n"
        self.f = self.path.open("a")
        if needs_nl:
            self.f.write("\n")

    def write(self, objs):
        self.f.write("".join(json.dumps(o, default=str) + "\n" for o in objs))
        self.f.flush()
        os.fsync(self.f.fileno())

    def close(self):
        self.f.close()


# --------------------------------------------------------------------------------------------
# The sweep

@dataclass
class SweepResult:
    path: Path
    total: int                 # points in the grid
    skipped: int               # already in the file (resume)
    done: int                  # finished in this run (rows written)
    errors: int                # raised in this run (error lines written)
    remaining: int             # not started (time budget, errors in a row, interrupt)
    stopped: str | None        # why the sweep stopped early, None if it ran to the end
    seconds: float


def _free_gpu(cp):
    """Give the point's device memory back: the next point may be 30x larger."""
    gc.collect()
    if cp is not None:
        cp.get_default_memory_pool().free_all_blocks()
        cp.get_default_pinned_memory_pool().free_all_blocks()
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except Exception:  # noqa: BLE001 - freeing is best effort
            pass


def _session_line(cfg, info, vers, ceiling, created):
    g = dataclasses.asdict(cfg)
    g.pop("extra", None)
    return {"type": "session", "schema": SCHEMA, "created": created,
            "command": " ".join(["rnnrt"] + sys.argv[1:]) if sys.argv else "",
            "cpu": cfg.cpu, "device": info, "versions": vers, "ceiling": ceiling, "grid": g}


def _row_lines(point, cfg, record, seconds, session_created, compile_s=0.0):
    """The ladder record's rows as JSON lines: row + point configuration + device + pass;
    point_seconds the point's wall time, compile_s the part of it spent compiling kernels
    (first uses in this process)."""
    base = {**point.as_dict(), "pass": record.get("pass", point.pass_),
            "repeats": cfg.repeats, "warmup": cfg.warmup, "cpu": cfg.cpu,
            "device": record["device"].get("device"),
            "ceiling_tflops": record["ceiling"].get("tflops"),
            "flops_per_pass": record["flops_per_pass"], "point_seconds": seconds,
            "compile_s": compile_s, "session": session_created,
            "created": record.get("created")}
    if record.get("phase_s"):
        base["phase_s"] = record["phase_s"]   # where the point's time went (bench/ladder.py)
    if "skipped" in record.get("cudnn", {}):
        base["cudnn_skipped"] = record["cudnn"]["skipped"]
    return [{"type": "row", "schema": SCHEMA, **r, **base} for r in record["rows"]]


def _main_phase(phases) -> str:
    """'; the reference 140.2' where one phase of a point took most of its time (``phases``:
    its record's phase_s), else ''."""
    if not phases:
        return ""
    name, sec = max(phases.items(), key=lambda kv: kv[1])
    total = sum(phases.values())
    return f"; {PHASE_NAMES.get(name, name)} {sec:.1f}" if sec > 0.5 * total else ""


PHASE_NAMES = {"reference": "the reference", "rows": "the rungs", "cudnn_setup": "cuDNN's setup",
               "precompile": "compiling", "cudnn_time": "cuDNN's timing"}


def _error_line(point, cfg, device, exc, seconds, session_created):
    tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
    return {"type": "error", "schema": SCHEMA, **point.as_dict(), "cpu": cfg.cpu,
            "device": device, "error": f"{type(exc).__name__}: {exc}",
            "traceback": "".join(tb[-3:])[-2000:], "point_seconds": seconds,
            "session": session_created,
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}


def _best(record) -> str:
    rows = [r for r in record["rows"] if "ms_median" in r and r["rung"] != "cudnn"]
    if not rows:
        return "no rung timed"
    b = min(rows, key=lambda r: r["ms_median"])
    s = f"best {b['rung']} {b['executor']} {b['ms_median']:.3g} ms {b['tflops']:.3g} TFLOPS"
    if b.get("ratio_vs_cudnn"):
        s += f" ({b['ratio_vs_cudnn']:.2f}x cuDNN)"
    refused = [r["rung"] for r in record["rows"] if "refused" in r]
    second = [r["rung"] for r in rows if (r.get("check") or {}).get("accepted_by") ==
              SECOND_OPINION]
    return (s + (f"; accepted by the {SECOND_OPINION}: {', '.join(second)}" if second else "")
            + (f"; REFUSED: {', '.join(refused)}" if refused else ""))


def run_sweep(cfg: SweepConfig, path, resume: bool = False, overwrite: bool = False,
              stream=None, session=None, clock=time.monotonic,
              created: str | None = None) -> SweepResult:
    """Run every point of ``grid(cfg)`` not yet in ``path``; append its lines as it finishes.

    resume: skip the points the file has (else the file must be empty or absent, or
    ``overwrite`` given). session: a ladder.BenchSession to use (None: one is opened here for
    the whole sweep, and closed at the end; unused with cfg.cpu). stream: where the progress
    bar goes (default stderr). created: the session line's time (ISO 8601; default now): the
    stamp ``default_path`` put in a new file's name, so name and record agree. Stops early, leaving a resumable file, when the time budget
    would be exceeded, after MAX_CONSECUTIVE_ERRORS failing points in a row, or on Ctrl-C.
    """
    path = Path(path)
    t_start = clock()
    if path.exists() and path.stat().st_size > 0 and not (resume or overwrite):
        raise FileExistsError(f"{path} already has results: pass resume=True (--resume) to "
                              f"continue it or overwrite=True (--overwrite) to start again")
    if overwrite and path.exists():
        path.unlink()
    points = grid(cfg)
    lines = read_lines(path) if resume else []
    done = done_keys(lines, cfg.retry_errors, cfg.retry_refused)
    todo = [p for p in points if p.key() not in done]
    skipped = len(points) - len(todo)
    model = CostModel()
    by_key = {p.key(): p for p in points}
    seeded = set()
    for ln in lines:   # seed the time estimates with the points already measured
        if ln.get("type") == "row" and "point_seconds" in ln:
            k = key_of(ln)
            if k in by_key and k not in seeded:
                seeded.add(k)
                model.add(by_key[k], ln["point_seconds"] - ln.get("compile_s", 0.0))

    bar = ProgressBar(len(points), stream, clock=clock)
    bar.done = skipped
    say = bar.message
    if skipped:
        say(f"[sweep] {path}: {skipped} of {len(points)} points already done; "
            f"{len(todo)} to go")
    result = SweepResult(path, len(points), skipped, 0, 0, len(todo), None, 0.0)
    if not todo:
        bar.update()
        bar.close()
        result.seconds = clock() - t_start
        return result

    own_session = False
    cp = None
    if not cfg.cpu:
        if session is None:
            session = ladder_mod.BenchSession(progress=lambda m: say(f"[sweep] {m}"))
            own_session = True
        cp = session.cp
        info, vers = session.info, ladder_mod.versions(cp)
        ceiling = session.ceiling_for(cfg.dtype)
    else:
        info = {"device": cpu_device_name(), "note": "CPU figures: not GPU performance"}
        vers, ceiling = ladder_mod.versions(), None
    if created is None:
        created = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    writer = JsonlWriter(path)
    in_a_row = 0
    try:
        writer.write([_session_line(cfg, info, vers, ceiling, created)])
        for i, point in enumerate(todo):
            elapsed = clock() - t_start
            est = model.estimate(point)
            if cfg.time_budget is not None and est is not None and \
                    elapsed + BUDGET_SAFETY * est > cfg.time_budget:
                result.stopped = (f"time budget: {hms(elapsed)} used of {hms(cfg.time_budget)}"
                                  f", next point {point.label()} needs ~{hms(est)}")
                break
            bar.update(eta=_eta(model, todo[i:]), current=point.label())

            def progress(msg, _p=point):
                if cfg.verbose:
                    say(f"[{_p.label()}] {msg}")
                else:
                    bar.update(current=f"{_p.label()}: {' '.join(msg.split())[:60]}")

            t0 = clock()
            try:
                if cfg.processes > 1:   # the point's ladder in fresh processes, pooled
                    record = pool(run_processes(ladder_argv(point.ladder_config(cfg)),
                                                cfg.processes, progress=progress,
                                                echo=cfg.verbose))
                else:
                    record = ladder_mod.run_ladder(point.ladder_config(cfg), progress=progress,
                                                   session=session)
                seconds = clock() - t0
                # first-use kernel compiles (the record's: this process's, or the pooled
                # processes' together) are paid once, not by every point: the cost model
                # learns the point's time without them
                compile_s = min(seconds, max(0.0, float(record.get("compile_s") or 0.0)))
                out = _row_lines(point, cfg, record, seconds, created, compile_s)
                note, phases = _best(record), record.get("phase_s")
                in_a_row = 0
                result.done += 1
                model.add(point, seconds - compile_s)
            except KeyboardInterrupt:
                raise
            except Exception as e:  # noqa: BLE001 - recorded, and the sweep goes on
                seconds = clock() - t0
                out = [_error_line(point, cfg, info.get("device"), e, seconds, created)]
                note, phases = f"ERROR {type(e).__name__}: {str(e)[:200]}", None
                in_a_row += 1
                result.errors += 1
                del e
            _free_gpu(cp)
            writer.write(out)
            result.remaining = len(todo) - i - 1
            bar.update(done=skipped + result.done + result.errors,
                       eta=_eta(model, todo[i + 1:]), current="")
            say(f"[sweep] {point.label()}: {note} ({seconds:.1f} s{_main_phase(phases)})")
            if in_a_row >= MAX_CONSECUTIVE_ERRORS:
                result.stopped = (f"{in_a_row} points in a row raised (see the error lines); "
                                  f"fix the cause and resume with --retry-errors")
                break
    except KeyboardInterrupt:
        result.stopped = "interrupted"
    finally:
        writer.close()
        bar.close()
        if own_session:
            session.close()
    result.seconds = clock() - t_start
    return result


def _eta(model: CostModel, remaining) -> float | None:
    if not remaining:
        return 0.0
    if not len(model):
        return None
    return sum(model.estimate(p) for p in remaining)


def cpu_device_name() -> str:
    """How CPU sweeps name their device (records and file names)."""
    import platform
    return f"CPU ({platform.processor() or platform.machine()}), NumPy executor"


def default_stem(cfg: SweepConfig, quick: bool = False, preset: str | None = None) -> str:
    """'sweep[-<preset>][-bwd][-<dtype>]-<cells>[-shard<k>of<n>]': what a sweep file holds,
    before its device and stamp (``quick``: the 'quick' preset; the dtype where it is not
    float32; the share of the grid, where it is one)."""
    from .dtypes import dtype_suffix
    preset = "quick" if quick and preset is None else preset
    return ("sweep" + (f"-{preset}" if preset else "")
            + ("-bwd" if cfg.passes == ("fwd+bwd",) else "") + dtype_suffix(cfg.dtype)
            + "-" + "-".join(cfg.cells)
            + (f"-shard{cfg.shard[0]}of{cfg.shard[1]}" if cfg.shard else ""))


def default_path(cfg: SweepConfig, device: str, quick: bool = False,
                 root: Path | None = None, preset: str | None = None,
                 created: str | None = None) -> Path:
    """A new results file: results/sweep/<stem>-<device>-<stamp>.jsonl, the stamp of
    ``created`` (ISO 8601; default now: pass the same to run_sweep)."""
    return record_path("sweep", default_stem(cfg, quick, preset), device,
                       created or now_iso(), ext=".jsonl", root=root)


def latest_path(cfg: SweepConfig, device: str, quick: bool = False,
                root: Path | None = None, preset: str | None = None) -> Path | None:
    """The newest existing results file of this grid and device (what --resume continues),
    or None."""
    folder = (Path(root) if root is not None else results_root()) / "sweep"
    prefix = f"{default_stem(cfg, quick, preset)}-{device_slug(device)}-"
    found = sorted(p for p in folder.glob(prefix + "*.jsonl")
                   if p.name[len(prefix):-len(".jsonl")].replace("T", "").isdigit())
    return found[-1] if found else None
