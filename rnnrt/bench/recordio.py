"""The one reader (and the atomic writer) of records: sweep results (JSON lines, schema
'rnnrt.sweep/1') and ladder records (JSON, 'rnnrt.ladder/1'). `rnnrt plot`, `rnnrt sweep
--resume` and the results index (``index.py``) all read through it.

Records are data: parsed as JSON (never executed or unpickled) and checked field by field
before anything uses them. What the reader does with a damaged record (documented here, and
in the README):

  - a damaged line of a JSON-lines file — bytes that are not UTF-8, text that is not JSON, a
    value that is not an object, an unknown line type, a row missing a field or with a field
    of the wrong type (a negative batch, a cell nobody knows, a time that is not a number) —
    is SKIPPED, and reported as ``file:line: what is wrong`` (``Loaded.problems``; the
    commands print each as a warning). A sweep resuming such a file runs those points again.
  - the last line of a file cut short by a kill (no newline at its end, not JSON) is the
    normal end of an interrupted sweep: skipped and noted (``Loaded.torn``), not a problem.
  - a ladder record that is damaged is skipped whole, with its ``file: what is wrong``.
  - a file that cannot be read at all (a folder, no permission) is a RecordError.

Standard library only (like ``index.py``, which must list results without NumPy). The cell
names below are ``rnnrt.cells.CELLS``'s (a test holds them equal).
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

CELL_NAMES = ("gru", "lstm", "rnn_relu", "rnn_tanh")
PASSES = ("fwd", "fwd+bwd")
POINT_FIELDS = ("cell", "layers", "hidden", "input_size", "batch", "steps", "input_batch")
LINE_TYPES = ("session", "row", "error")


class RecordError(ValueError):
    """A record file that cannot be read at all, or (``strict``) a damaged one."""


@dataclass
class Loaded:
    """What a read gave: ``lines`` [(line number, object)] that passed the checks,
    ``damaged`` [(line number, what is wrong)] for each damaged line skipped (``problems``:
    the same as 'file:line: what is wrong'), ``torn`` the note for a last line cut short (or
    None)."""

    path: Path
    lines: list = field(default_factory=list)
    damaged: list = field(default_factory=list)
    torn: str | None = None

    @property
    def problems(self) -> list[str]:
        return [f"{self.path}:{n}: {why}" for n, why in self.damaged]

    def objects(self) -> list[dict]:
        return [obj for _, obj in self.lines]


def write_text_atomic(path, text: str, overwrite: bool = True) -> Path:
    """Write ``text`` (UTF-8) to ``path`` through a temporary file in the same folder and a
    rename, creating the folder: a crash leaves the old file or the new one, never half.
    ``overwrite=False``: FileExistsError when ``path`` exists (checked again at the rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        if overwrite:
            os.replace(tmp, path)
        else:
            _link_new(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _link_new(tmp: str, path: Path) -> None:
    """Rename ``tmp`` to ``path`` only if ``path`` does not exist (FileExistsError if it does):
    a hard link fails atomically on an existing name; where links are not supported, a
    check then a rename."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise FileExistsError(f"{path}: already exists (pass --overwrite to replace it)") \
            from None
    except OSError:
        if path.exists():
            raise FileExistsError(f"{path}: already exists (pass --overwrite to replace it)") \
                from None
        os.replace(tmp, path)
        return
    os.unlink(tmp)


def _what(obj) -> str:
    """What a JSON value is, in words."""
    return {list: "a list", str: "a string", bool: "a boolean", type(None): "null",
            dict: "an object"}.get(type(obj), "a number")


def _count(obj: dict, name: str, required: bool = True) -> str | None:
    """Why ``obj[name]`` is not a positive int (None when it is, or absent and optional)."""
    if name not in obj:
        return f"no field {name!r}" if required else None
    v = obj[name]
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        return f"{name!r} is {v!r}, expected a positive integer"
    return None


def valid_input_batch(k) -> bool:
    """Whether ``k`` is an input batching k: an int >= 1 (not a bool) or 'all' (the bench
    configurations and a record's points check it here; plan.switches.Switches, below
    bench/, checks its own)."""
    return k == "all" or (isinstance(k, int) and not isinstance(k, bool) and k >= 1)


def check_point(obj: dict) -> str | None:
    """Why a row or error line's point configuration is damaged, or None."""
    cell = obj.get("cell")
    if cell not in CELL_NAMES:
        return f"'cell' is {cell!r}, expected one of {list(CELL_NAMES)}"
    for name in ("layers", "hidden", "input_size", "batch", "steps"):
        why = _count(obj, name)
        if why:
            return why
    k = obj.get("input_batch", "missing")
    if not valid_input_batch(k):
        return f"'input_batch' is {k!r}, expected a positive integer or 'all'"
    if obj.get("pass", "fwd") not in PASSES:
        return f"'pass' is {obj.get('pass')!r}, expected one of {list(PASSES)}"
    return None


def _number(obj: dict, name: str, positive: bool) -> str | None:
    if name not in obj or obj[name] is None:
        return None
    v = obj[name]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
            or (v <= 0 if positive else v < 0):
        return f"{name!r} is {v!r}, expected a finite number {'> 0' if positive else '>= 0'}"
    return None


def check_row(obj: dict) -> str | None:
    """Why a ladder row (the fields every reader uses) is damaged, or None."""
    if not isinstance(obj.get("rung"), str):
        return f"'rung' is {obj.get('rung')!r}, expected a name"
    if "executor" in obj and not isinstance(obj["executor"], str):
        return f"'executor' is {obj['executor']!r}, expected a name"
    for name, positive in (("ms_median", True), ("ms_min", True), ("ms_max", True),
                           ("tflops", False)):
        why = _number(obj, name, positive)
        if why:
            return why
    return None


def check_line(obj) -> str | None:
    """Why one parsed line of a sweep file is damaged, or None."""
    if not isinstance(obj, dict):
        return f"{_what(obj)}, expected an object"
    t = obj.get("type")
    if t not in LINE_TYPES:
        return f"'type' is {t!r}, expected one of {list(LINE_TYPES)}"
    if t == "session":
        return None
    why = check_point(obj)
    if why is None and t == "row":
        why = check_row(obj)
    if why is None and t == "error" and not isinstance(obj.get("error"), str):
        why = "an error line without its 'error' text"
    if why is None and "device" in obj and not isinstance(obj["device"], (str, type(None))):
        why = f"'device' is {_what(obj['device'])}, expected a name"
    return why


def _read_bytes(path: Path) -> bytes:
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or directory")
    try:
        return path.read_bytes()
    except OSError as e:
        raise RecordError(f"{path}: cannot be read ({type(e).__name__}: {e.strerror or e})") \
            from None


def read_jsonl(path, check=check_line) -> Loaded:
    """The lines of a JSON-lines file, each parsed and checked by ``check`` (default: a
    sweep line); damaged lines skipped and listed (see the module docstring)."""
    path = Path(path)
    data = _read_bytes(path)
    out = Loaded(path)
    raw = data.split(b"\n")
    ends_clean = data.endswith(b"\n") or not data
    for n, chunk in enumerate(raw, 1):
        if not chunk.strip():
            continue
        last = n == len(raw)
        try:
            text = chunk.decode("utf-8")
        except UnicodeDecodeError as e:
            out.damaged.append((n, f"not UTF-8 text (byte {chunk[e.start]:#04x} at column "
                                   f"{e.start + 1})"))
            continue
        try:
            obj = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as e:
            if last and not ends_clean:
                out.torn = (f"{path}:{n}: the last line is cut short (an interrupted write); "
                            f"skipped")
            else:
                msg = e.msg if isinstance(e, json.JSONDecodeError) else "nested too deeply"
                out.damaged.append((n, f"not JSON ({msg})"))
            continue
        why = check(obj)
        if why:
            out.damaged.append((n, why))
            continue
        out.lines.append((n, obj))
    return out


def check_ladder_record(rec) -> str | None:
    """Why a ladder record is damaged (the fields readers use), or None."""
    if not isinstance(rec, dict):
        return f"{_what(rec)}, expected a ladder record (an object)"
    if not str(rec.get("schema", "")).startswith("rnnrt.ladder/"):
        return f"schema {rec.get('schema')!r}, expected 'rnnrt.ladder/1'"
    c = rec.get("config")
    if not isinstance(c, dict):
        return "no 'config' object"
    why = check_point({"input_size": c.get("hidden"), "input_batch": "all",
                       **{k: v for k, v in c.items() if v is not None}})
    if why:
        return f"config: {why}"
    if rec.get("pass", "fwd") not in PASSES:
        return f"'pass' is {rec.get('pass')!r}, expected one of {list(PASSES)}"
    dev = rec.get("device")
    if not isinstance(dev, dict) or not isinstance(dev.get("device"), (str, type(None))):
        return "no 'device' object with the device's name"
    rows = rec.get("rows")
    if not isinstance(rows, list):
        return "no 'rows' list"
    for i, r in enumerate(rows):
        if not isinstance(r, dict):
            return f"rows[{i}] is {_what(r)}, expected an object"
        why = check_row(r)
        if why:
            return f"rows[{i}]: {why}"
    return None


def read_json(path, named: bool = True) -> tuple[object | None, str | None]:
    """(parsed JSON, None), or (None, 'file: what is wrong') for bytes that are not UTF-8
    or text that is not JSON ('file:line: ...' where JSON names a line; named=False: 'what
    is wrong', or 'line N: ...', for a caller that shows the file itself). RecordError for
    a file that cannot be read."""
    path = Path(path)
    data = _read_bytes(path)
    line = None
    try:
        return json.loads(data.decode("utf-8")), None
    except UnicodeDecodeError as e:
        why = f"not UTF-8 text (byte {data[e.start]:#04x} at offset {e.start})"
    except json.JSONDecodeError as e:
        line, why = e.lineno, f"not JSON ({e.msg})"
    except RecursionError:
        why = "not JSON (nested too deeply)"
    if named:
        return None, f"{path}:{line}: {why}" if line else f"{path}: {why}"
    return None, f"line {line}: {why}" if line else why
