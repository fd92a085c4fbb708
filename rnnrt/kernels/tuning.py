"""The schedule selector's memory on disk: one JSON file of tuned choices, per device.

Where: ``$RNNRT_CACHE_DIR/schedules.json``, else ``$XDG_CACHE_HOME/rnnrt/schedules.json``,
else ``~/.cache/rnnrt/schedules.json``. The file holds one section per *device key* — the
device's name, compute capability, driver, CUDA runtime, CuPy and rnnrt versions — so a
choice timed on one GPU or one software stack is never applied to another (a new version
tunes again). Each section maps a shape key (``selector.Shape.key``) to its entry
(schedule, candidates' times, tune seconds) with the time it was last used.

Nothing here can hurt the caller: the file is parsed as JSON (never executed), checked, and
a damaged file, a damaged entry, a file of another format version, or a folder that cannot be
written is ignored with ONE warning (Python's ``warnings``, category ``ScheduleCacheWarning``)
and the selector goes on in memory. Writes are atomic (a temporary file, then a rename), and
merge with what other processes wrote meanwhile. The file stays bounded: at most
``max_entries`` entries over all devices; the least recently used go first.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
import warnings
from pathlib import Path

FORMAT = "rnnrt.schedules/1"
MAX_ENTRIES = 2048
"""Entries kept over all devices (a few hundred bytes each: the file stays under ~1 MB)."""


class ScheduleCacheWarning(UserWarning):
    """The schedule cache could not be read or written; tuning goes on in memory."""


def default_path(env=None) -> Path:
    """The cache file's path (see the module docstring)."""
    env = os.environ if env is None else env
    if env.get("RNNRT_CACHE_DIR"):
        return Path(env["RNNRT_CACHE_DIR"]) / "schedules.json"
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rnnrt" / "schedules.json"


def device_key(info: dict) -> str:
    """The section key of a device: name, compute capability, driver, CUDA runtime, CuPy
    and rnnrt versions from ``info`` (session.device_info() plus 'rnnrt')."""
    parts = [str(info.get(k, "?")) for k in
             ("device", "compute_capability", "cuda_driver", "cuda_runtime", "cupy", "rnnrt")]
    return " | ".join(parts)


class ScheduleCache:
    """Tuned choices of one device on disk.

    path: the file (default ``default_path()``); device: the ``device_key`` of the GPU the
    entries are for; max_entries: the bound over the whole file; clock: seconds (tests).
    ``get(key)`` -> the entry dict or None; ``put(key, entry)`` writes it through.
    """

    def __init__(self, device: str, path: Path | None = None, max_entries: int = MAX_ENTRIES,
                 clock=time.time):
        self.path = Path(path) if path is not None else default_path()
        self.device, self.max_entries, self.clock = device, int(max_entries), clock
        self._warned = False
        self._entries = self._read().get(device, {})

    def warn(self, msg: str) -> None:
        """One warning per cache object, however many problems follow."""
        if not self._warned:
            self._warned = True
            warnings.warn(f"rnnrt schedule cache {self.path}: {msg}", ScheduleCacheWarning,
                          stacklevel=3)

    def _read(self) -> dict:
        """{device key: {shape key: entry}} from the file; {} (with a warning) when absent
        is fine, damaged or of another format is ignored."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except (FileNotFoundError, NotADirectoryError):   # nothing written yet (or can't be)
            return {}
        except (OSError, UnicodeDecodeError) as e:
            self.warn(f"unreadable ({type(e).__name__}: {e}); ignoring it")
            return {}
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            self.warn(f"not JSON ({e}); ignoring it and writing a new one")
            return {}
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            what = data.get("format") if isinstance(data, dict) else type(data).__name__
            self.warn(f"format {what!r}, expected {FORMAT!r}; ignoring it")
            return {}
        devices = data.get("devices")
        if not isinstance(devices, dict):
            self.warn("no 'devices' mapping; ignoring it")
            return {}
        out = {}
        for dev, entries in devices.items():
            if isinstance(entries, dict):
                out[dev] = {k: v for k, v in entries.items()
                            if isinstance(k, str) and isinstance(v, dict)}
        return out

    def get(self, key: str) -> dict | None:
        """The entry of ``key`` for this device, or None; marks it used."""
        e = self._entries.get(key)
        if e is not None:
            e["last_used"] = self.clock()
        return e

    def put(self, key: str, entry: dict) -> None:
        """Remember ``entry`` under ``key`` and write the file (merged with what is there,
        bounded to max_entries by last use). An unwritable file: one warning, memory only."""
        entry = dict(entry, last_used=self.clock())
        self._entries[key] = entry
        data = self._read()
        data.setdefault(self.device, {}).update(self._entries)
        flat = sorted(((e.get("last_used", 0), dev, k) for dev, es in data.items()
                       for k, e in es.items()), reverse=True)
        keep = {(dev, k) for _, dev, k in flat[:self.max_entries]}
        data = {dev: {k: e for k, e in es.items() if (dev, k) in keep}
                for dev, es in data.items()}
        data = {dev: es for dev, es in data.items() if es}
        self._entries = data.get(self.device, {})
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".schedules.",
                                       suffix=".tmp")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump({"format": FORMAT, "devices": data}, f, indent=1, sort_keys=True)
                os.replace(tmp, self.path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError as e:
            self.warn(f"cannot be written ({type(e).__name__}: {e}); keeping choices in "
                      f"memory only")

    def __len__(self) -> int:
        return len(self._entries)
