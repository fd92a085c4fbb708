"""Where records go and how they are named: one scheme for every command that writes one.

    <out>/results/<kind>/<stem>-<device slug>-<stamp>.<ext>       records
    <out>/figures/                                                figures

<out>: the output folder, ``rnnrt-out`` in the current directory unless the RNNRT_OUT
environment variable names another (the repository's own records are written with
RNNRT_OUT=experiments: experiments/results/ and experiments/figures/). kind: one of KINDS (the
folder); stem: what was measured (e.g. 'ladder-lstm-L4-H512-B64-T100-fwd'); device slug: the
device's name in lower case, each run of other characters a '-' ('NVIDIA H100 80GB HBM3' ->
'nvidia-h100-80gb-hbm3'), 'cpu' for any CPU; stamp: the record's 'created' time in UTC,
'YYYYMMDDTHHMMSS'.
``python -m rnnrt.bench.index`` lists the repository's in experiments/results/INDEX.md.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
from pathlib import Path

import numpy as np

from .recordio import write_text_atomic

DEFAULT_OUT = "rnnrt-out"
"""The output folder when RNNRT_OUT is not set, relative to the working directory."""


def out_root(env=None) -> Path:
    """The output folder: $RNNRT_OUT, else ``rnnrt-out`` (relative to the working directory)."""
    env = os.environ if env is None else env
    return Path(env.get("RNNRT_OUT") or DEFAULT_OUT)


def results_root(env=None) -> Path:
    """Where records go by default: <out>/results (its kind folders below)."""
    return out_root(env) / "results"


def figures_root(env=None) -> Path:
    """Where figures go by default: <out>/figures."""
    return out_root(env) / "figures"

KINDS = ("ladder", "sweep", "kernels", "trace", "training", "long-sequence", "precision",
         "profiles", "logs")


def now_iso() -> str:
    """The current UTC time as a record's 'created' field (ISO 8601, seconds)."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def device_slug(name) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3' (the text before a first comma);
    every CPU name ('cpu', 'CPU (x86_64), NumPy executor', ...) -> 'cpu': one slug for the
    CPU runs of every command, the one the results index tells apart from a GPU's."""
    if str(name).lower().startswith("cpu"):
        return "cpu"
    s = re.sub(r"[^a-z0-9]+", "-", str(name).split(",")[0].lower()).strip("-")
    return s or "device"


def stamp(created: str) -> str:
    """A record's 'created' (ISO 8601, any offset) -> 'YYYYMMDDTHHMMSS' in UTC."""
    t = _dt.datetime.fromisoformat(created)
    if t.tzinfo is not None:
        t = t.astimezone(_dt.timezone.utc)
    return t.strftime("%Y%m%dT%H%M%S")


def record_path(kind: str, stem: str, device, created: str, ext: str = ".json",
                root: Path | None = None) -> Path:
    """The path of a record: ``root``/``kind``/``stem``-<device slug>-<stamp>``ext``."""
    if kind not in KINDS:
        raise ValueError(f"kind: expected one of {KINDS}, got {kind!r}")
    base = Path(root) if root is not None else results_root()
    return base / kind / f"{stem}-{device_slug(device)}-{stamp(created)}{ext}"


def write_json(record, path, overwrite: bool = True) -> Path:
    """Write ``record`` as indented JSON to ``path`` atomically (recordio.write_text_atomic:
    a temporary file in the same folder, then a rename), creating the folder; a crash never
    leaves half a record. ``overwrite=False``: FileExistsError if ``path`` exists."""
    return write_text_atomic(path, json.dumps(record, indent=1, default=str) + "\n",
                             overwrite=overwrite)


def versions(cp=None) -> dict:
    """rnnrt, NumPy, Python (and CuPy, CUDA, torch, cuDNN where present) versions."""
    from .. import __version__  # here: rnnrt/__init__ defines it after its imports
    v = {"rnnrt": __version__, "numpy": np.__version__, "python": platform.python_version()}
    if cp is not None:
        v["cupy"] = cp.__version__
        v["cuda_runtime"] = cp.cuda.runtime.runtimeGetVersion()
        v["cuda_driver"] = cp.cuda.runtime.driverGetVersion()
    try:
        import torch
        v["torch"] = torch.__version__
        if torch.cuda.is_available():
            v["cudnn"] = torch.backends.cudnn.version()
    except Exception:  # noqa: BLE001 - torch is optional
        pass
    return v
