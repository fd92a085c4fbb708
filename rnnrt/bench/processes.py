"""`rnnrt ladder --processes N`: the ladder in N fresh processes, one after another, pooled.

Why: a library's time at one shape moves between processes by itself. On the H100, six fresh
torch-only processes on an idle GPU timed cuDNN's LSTM at L1 H128 B64 (forward+backward)
from 0.80 to 1.34 ms, and at the paper's shape (L4 H512 B64 T100) from 16.98 to 20.64 ms
forward+backward, 6.07 to 8.51 ms forward, while rnnrt's times stayed within a few percent:
a ratio taken in one process lands anywhere in that spread.

Each process is a whole ladder run (rnnrt and cuDNN timed in the same process, every ratio
taken within it, as always; its record written to a scratch folder). The pooled record is
the first process's with, per row (rung, executor; and cuDNN's):
  ms_median            the median over the processes of each one's median
  ms_min, ms_max       the extremes over all of them; runs: their sum
  ratio_vs_cudnn       the median over the processes of each one's ratio (not a ratio of
                       pooled medians: each ratio is of two times from one process)
  speedup_vs_naive, share_of_ceiling   medians likewise; tflops from the pooled ms_median
  per_process          each process's (ms_median, ratio_vs_cudnn)
  ratio_vs_cudnn_range [min, max] over the processes
A row that any process refused (its output disagreed) is refused in the pooled record, with
that process's reason. The record says ``processes`` (N) and ``process_records`` (each
one's 'created'); `rnnrt plot` and the index read it like any ladder record.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from ..cells import tflops
from .records import now_iso

# the flags the parent takes for itself (with their values): each child gets its own --out
_PARENT_FLAGS = {"--processes": 1, "--out": 1, "--overwrite": 0}


def ladder_argv(cfg) -> list[str]:
    """`rnnrt ladder`'s arguments that make LadderConfig ``cfg`` (cli.ladder_config the other
    way; a test holds the two to each other): how a sweep point runs in processes of its own."""
    argv = ["ladder", "--cell", cfg.cell, "--layers", str(cfg.layers), "--hidden",
            str(cfg.hidden), "--input-size", str(cfg.inp), "--batch", str(cfg.batch),
            "--steps", str(cfg.steps), "--repeats", str(cfg.repeats), "--warmup",
            str(cfg.warmup), "--input-batch", str(cfg.input_batch), "--dtype", cfg.dtype,
            "--seed", str(cfg.seed)]
    if cfg.cpu:
        argv.append("--cpu")
    else:
        argv += ["--executor", "both" if len(set(cfg.executors)) > 1 else cfg.executors[0]]
    if cfg.rungs:
        argv += ["--rungs", ",".join(cfg.rungs)]
    flags = (("--no-cudnn", not cfg.cudnn), ("--backward", cfg.backward),
             ("--interleave", cfg.interleave))
    return argv + [flag for flag, on in flags if on]


def without_flags(argv: list[str], flags: dict) -> list[str]:
    """``argv`` without the ``flags`` (flag -> how many values follow it; '--flag=value'
    carries its own): what a parent process passes on to its children."""
    rest, skip = [], 0
    for a in argv:
        if skip:
            skip -= 1
            continue
        flag = a.split("=", 1)[0]
        if flag in flags:
            skip = 0 if "=" in a else flags[flag]
            continue
        rest.append(a)
    return rest


def child_argv(argv: list[str], out: Path) -> list[str]:
    """``argv`` (the parent's arguments after the program name, 'ladder' first) without
    --processes, --out, --overwrite (and their values), with --out ``out``."""
    return without_flags(argv, _PARENT_FLAGS) + ["--out", str(out)]


def run_processes(argv: list[str], n: int, run=subprocess.run, progress=print,
                  echo: bool = True) -> list[dict]:
    """The ladder of ``argv`` (``child_argv``'s input) in ``n`` fresh processes, one after
    another (``python -m rnnrt``); -> their records, in order. Each child's progress and
    errors (its stderr) show as they come (``echo``; else they are kept for an error
    message); its table (stdout) is not printed (the pooled one is). A process that wrote
    no record raises RuntimeError with the end of its output (one that refused a rung still
    wrote one: its exit status 1 is the pooled record's business)."""
    records = []
    with tempfile.TemporaryDirectory(prefix="rnnrt-processes-") as tmp:
        for i in range(n):
            out = Path(tmp) / f"process-{i}.json"
            cmd = [sys.executable, "-m", "rnnrt", *child_argv(argv, out)]
            progress(f"process {i + 1} of {n}: {' '.join(cmd[2:])}")
            r = run(cmd, stdout=subprocess.PIPE, stderr=None if echo else subprocess.PIPE,
                    text=True)
            if not out.exists():
                tail = ((r.stdout or "") + (r.stderr or ""))[-2000:]
                raise RuntimeError(f"process {i + 1} of {n} (exit status {r.returncode}) "
                                   f"wrote no record (its messages above):\n{tail}")
            records.append(json.loads(out.read_text()))
    return records


def _median(values):
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals and len(vals) == len(values) else None


def pool_rows(rows: list[dict], flops: float) -> dict:
    """One row (the same rung and executor, or cuDNN's) from each process -> the pooled row
    (module docstring)."""
    refused = next((r for r in rows if "refused" in r), None)
    per = [{"ms_median": r.get("ms_median"), "ratio_vs_cudnn": r.get("ratio_vs_cudnn")}
           for r in rows]
    if refused is not None:
        return {**refused, "per_process": per}
    out = dict(rows[0])
    ms = statistics.median(r["ms_median"] for r in rows)
    ratios = [r.get("ratio_vs_cudnn") for r in rows]
    out.update(ms_median=ms, ms_min=min(r["ms_min"] for r in rows),
               ms_max=max(r["ms_max"] for r in rows), runs=sum(r["runs"] for r in rows),
               tflops=tflops(flops, ms), ratio_vs_cudnn=_median(ratios),
               speedup_vs_naive=_median([r.get("speedup_vs_naive") for r in rows]),
               share_of_ceiling=_median([r.get("share_of_ceiling") for r in rows]),
               per_process=per,
               ratio_vs_cudnn_range=(None if None in ratios else [min(ratios), max(ratios)]))
    if "ms_median_per_timing" in out:   # cuDNN's: a median a process now
        out["ms_median_per_timing"] = [r["ms_median"] for r in rows]
        out["pooled_over_processes"] = True
    return out


def pool(records: list[dict], command: str = "") -> dict:
    """The records of one ladder run in several processes -> the pooled record (module
    docstring). ValueError where they are not runs of one configuration."""
    if not records:
        raise ValueError("pool: expected the records of at least one process, got none")
    first = records[0]
    for r in records[1:]:
        if r["config"] != first["config"] or r.get("dtype") != first.get("dtype"):
            raise ValueError("pool: the records are of different configurations")
    keys = [(r["rung"], r["executor"]) for r in first["rows"]]
    for r in records[1:]:
        if [(x["rung"], x["executor"]) for x in r["rows"]] != keys:
            raise ValueError("pool: the records have different rows")
    flops = first["flops_per_pass"]
    rows = [pool_rows([r["rows"][i] for r in records], flops) for i in range(len(keys))]
    out = dict(first)
    out.update(created=now_iso(), command=command or first.get("command", ""),
               processes=len(records), process_records=[r["created"] for r in records],
               rows=rows, compile_s=sum(r.get("compile_s", 0.0) for r in records))
    phases = {}   # where the processes' time went, added up (as compile_s)
    for r in records:
        for name, sec in (r.get("phase_s") or {}).items():
            phases[name] = phases.get(name, 0.0) + sec
    if phases:
        out["phase_s"] = phases
    cudnn = next((r for r in rows if r["rung"] == "cudnn"), None)
    if cudnn is not None:
        out["cudnn"] = cudnn
    out["ceiling"] = dict(first["ceiling"], tflops_per_process=[r["ceiling"]["tflops"]
                                                                 for r in records])
    return out


def spread_lines(record: dict) -> list[str]:
    """A line a rung of the pooled record: its ratio to cuDNN per process (the table shows
    their median)."""
    n = record.get("processes", 1)
    lines = [f"Pooled over {n} processes: each row's time and ratio to cuDNN are medians "
             f"over the processes (each ratio taken within its process)."]
    for r in record["rows"]:
        per = [p["ratio_vs_cudnn"] for p in r.get("per_process", [])]
        if r["rung"] == "cudnn":
            lines.append("  cuDNN ms per process: " + ", ".join(
                f"{p['ms_median']:.3f}" for p in r["per_process"]))
        elif per and None not in per:
            lines.append(f"  {r['rung']} ({r['executor']}): vs cuDNN per process "
                         + ", ".join(f"{v:.2f}" for v in per))
    return lines
