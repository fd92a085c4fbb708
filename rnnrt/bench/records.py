"""Where records go and how they are named: one scheme for every command that writes one.

    experiments/results/<kind>/<stem>-<device slug>-<stamp>.<ext>

kind: one of KINDS (the folder); stem: what was measured (e.g. 'ladder-lstm-L4-H512-B64-
T100-fwd'); device slug: the device's name in lower case, each run of other characters a '-'
('NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3'); stamp: the record's 'created' time in
UTC, 'YYYYMMDDTHHMMSS'. ``python -m rnnrt.bench.index`` lists them in INDEX.md.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import tempfile
from pathlib import Path

import numpy as np

RESULTS = Path("experiments") / "results"
"""The results folder, relative to the working directory (the repository root)."""

KINDS = ("ladder", "sweep", "kernels", "trace", "training", "profiles", "logs")


def now_iso() -> str:
    """The current UTC time as a record's 'created' field (ISO 8601, seconds)."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def device_slug(name) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3' (the text before a first comma)."""
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
    base = Path(root) if root is not None else RESULTS
    return base / kind / f"{stem}-{device_slug(device)}-{stamp(created)}{ext}"


def write_json(record, path) -> Path:
    """Write ``record`` as indented JSON to ``path`` atomically (a temporary file in the same
    folder, then a rename), creating the folder; a crash never leaves half a record."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(record, indent=1, default=str) + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def versions(cp=None) -> dict:
    """rnnrt, NumPy, Python (and CuPy, CUDA, torch, cuDNN where present) versions."""
    from .. import __version__   # here: rnnrt/__init__ defines it after its imports
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
