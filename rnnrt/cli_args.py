"""The command line's shared parts (rnnrt/cli.py): its usage error, the argument parser
with one-line errors, the flag types (each names what it expected), and the checks every
command that writes a record makes before any work (a GPU or --cpu, the output's place)."""
from __future__ import annotations

import argparse
import sys


class UsageError(ValueError):
    """The invocation cannot run as asked (exit status 2); the message names the flag."""


class Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line (`rnnrt ladder: error: ...`, exit status 2)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# -------------------------------------------------------------------------------- flag types

def int_flag(s: str, least: int, what: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {s!r}") from None
    if v < least:
        raise argparse.ArgumentTypeError(f"expected {what}, got {s!r}")
    return v


def positive(s: str) -> int:
    return int_flag(s, 1, "a positive int")


def nonneg(s: str) -> int:
    return int_flag(s, 0, "an int >= 0")


def input_batch_flag(s: str):
    return "all" if s == "all" else int_flag(s, 1, "a positive int or 'all'")


def seconds_flag(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {s!r}") from None
    if not v > 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {s!r}")
    return v


def shard_flag(s: str) -> tuple[int, int]:
    """argparse type: 'K/N' (1 <= K <= N) -> (K, N)."""
    parts = s.split("/")
    try:
        k, n = (int(x) for x in parts)
    except ValueError:
        k = n = 0
    if len(parts) != 2 or not 1 <= k <= n:
        raise argparse.ArgumentTypeError(f"expected K/N with 1 <= K <= N (the K-th of N "
                                         f"shares), got {s!r}")
    return k, n


def list_of(conv, what):
    """argparse type: a comma-separated list, each item through ``conv``."""
    def parse(s: str):
        items = [x.strip() for x in s.split(",") if x.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {what}, "
                                             f"got {s!r}")
        return tuple(conv(x) for x in items)
    return parse


def cell_flag(s: str) -> str:
    from .cells import CELLS
    if s not in CELLS:
        raise argparse.ArgumentTypeError(f"expected a cell out of {sorted(CELLS)}, got {s!r}")
    return s


SIZE_FLAGS = ("layers", "hidden", "batch", "steps")


def sizes_of(a, defaults: dict, names=SIZE_FLAGS) -> dict:
    """``defaults`` (a command's sizes) with each of ``names`` that the command line gives
    (not None) in its place."""
    return {**defaults, **{n: getattr(a, n) for n in names if getattr(a, n) is not None}}


def dtype_flag(s: str) -> str:
    from .precision import DTYPES
    if s not in DTYPES:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(DTYPES)}, got {s!r}")
    return s


def add_dtype(p, what: str) -> None:
    from .precision import DTYPES
    p.add_argument("--dtype", type=dtype_flag, default="float32",
                   help=f"precision of {what}: {', '.join(DTYPES)} (default float32; tf32: "
                        f"fp32 storage, TF32 GEMMs; bfloat16 / float16: 16-bit storage, fp32 "
                        f"accumulation); cuDNN runs at the same precision")


def path_flag(s: str) -> str:
    if not s.strip():
        raise argparse.ArgumentTypeError("expected a path, got an empty name")
    return s


def add_results(p) -> None:
    """The RESULTS operands of `rnnrt plot` / `rnnrt summary` (the records they read) and
    their --executor (whose timings)."""
    p.add_argument("results", nargs="+", metavar="RESULTS",
                   help="sweep .jsonl files, ladder .json records, or directories of them")
    p.add_argument("--executor", choices=["graph", "eager", "numpy"], default=None,
                   help="whose timings (default graph; numpy for CPU results)")


def check_results(paths) -> None:
    """UsageError naming the first of ``paths`` (RESULTS) that does not exist."""
    from pathlib import Path
    missing = [p for p in paths if not Path(p).exists()]
    if missing:
        raise UsageError(f"RESULTS: {missing[0]}: no such file or directory")


def no_gpu(cmd: str):
    """UsageError saying why there is no GPU and what to do (exit 2)."""
    from .device import INSTALL_HINT, gpu_status
    _, why = gpu_status()
    return UsageError(f"no usable GPU ({why}); either {INSTALL_HINT}, or run `rnnrt {cmd} "
                      f"--cpu` for the same pipeline on the NumPy executor at small sizes "
                      f"(CPU figures)")


def require_gpu(cmd: str, cpu: bool) -> None:
    from .device import gpu_status
    if not cpu and not gpu_status()[0]:
        raise no_gpu(cmd)


def record_out(a, kind: str):
    """The checked --out file of a command that writes one record, or None for its default
    name (a new, time-stamped file in <out>/results/<kind>/, whose folder is checked now)."""
    from .bench.outputs import check_dir, check_file
    from .bench.records import results_root
    if a.out is not None:
        return check_file(a.out, "--out", overwrite=a.overwrite)
    check_dir(results_root() / kind, "RNNRT_OUT (the output folder)")
    return None


def write_out(write, default_path, record, out, overwrite: bool) -> str:
    """Write ``record`` to ``out`` (checked at the start) or its default path. A file that
    appeared there meanwhile (another run) is kept: this record goes beside it, and a line
    says where — a long run's record is never lost at its end."""
    from .bench.records import now_iso, stamp
    target = out if out is not None else default_path(record)
    try:
        return str(write(record, target, overwrite=overwrite))
    except FileExistsError:
        alt = target.with_name(f"{target.stem}-{stamp(now_iso())}-2{target.suffix}")
        print(f"rnnrt: {target} was written meanwhile by another run; this record goes to "
              f"{alt}", file=sys.stderr)
        return str(write(record, alt, overwrite=False))
