"""The commands' output paths, checked before any work: an hours-long sweep must not find out
at its end that it cannot write.

Rules (every command that writes follows them):
  - an empty name, or a file where a folder is wanted (or a folder where a file is), is an
    OutputError naming the flag;
  - a missing parent folder is created at once (so a name that cannot be created fails now);
  - an existing file is refused unless ``--overwrite`` (a sweep's ``--resume`` continues it);
  - files are written atomically (recordio.write_text_atomic: a temporary file, then a
    rename), and a command's figures are drawn into a staging folder inside the target and
    moved in together (``StagedDir``), so a failure leaves no half-written set.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


class OutputError(ValueError):
    """An output path that cannot be used; the message names the flag and what was wrong."""


def _usable_dir(folder: Path, flag: str) -> None:
    """Create ``folder`` (and its parents) and check it is a writable directory."""
    if folder.exists() and not folder.is_dir():
        raise OutputError(f"{flag}: {folder} is a file, expected a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(f"{flag}: cannot create the folder {folder} ({e.strerror or e})") \
            from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputError(f"{flag}: the folder {folder} is not writable")


def check_file(path, flag: str = "--out", overwrite: bool = False,
               existing_ok: bool = False) -> Path:
    """The output file ``path``, checked (see the module docstring); its folder is created.

    overwrite: an existing file may be replaced; existing_ok: an existing file is fine (a
    resumed sweep appends to it)."""
    if path is None or str(path).strip() == "":
        raise OutputError(f"{flag}: an empty name; expected a file path")
    p = Path(path)
    if p.is_dir() or str(path).endswith(("/", os.sep)):
        raise OutputError(f"{flag}: {p} is a folder, expected a file name (e.g. "
                          f"{p / ('record' + (p.suffix or '.json'))})")
    if p.exists() and not (overwrite or existing_ok):
        raise OutputError(f"{flag}: {p} already exists; pass --overwrite to replace it")
    _usable_dir(p.parent, flag)
    return p


def check_dir(path, flag: str = "--out-dir") -> Path:
    """The output folder ``path``, created if missing and checked writable."""
    if path is None or str(path).strip() == "":
        raise OutputError(f"{flag}: an empty name; expected a folder")
    p = Path(path)
    _usable_dir(p, flag)
    return p


def clashes(paths, overwrite: bool, flag: str) -> None:
    """OutputError listing the ``paths`` that already exist, unless ``overwrite``."""
    if overwrite:
        return
    there = [str(p) for p in paths if Path(p).exists()]
    if there:
        more = f" and {len(there) - 3} more" if len(there) > 3 else ""
        raise OutputError(f"{flag}: {', '.join(there[:3])}{more} already exist(s); pass "
                          f"--overwrite to replace them")


class StagedDir:
    """Write a set of files into ``folder`` all or nothing: ``with StagedDir(folder, ...) as
    tmp:`` write into ``tmp`` (a hidden folder inside ``folder``), then ``commit()`` moves
    every file in, refusing (before moving any) names that exist unless ``overwrite``. Left
    without commit (an error), the staging folder is removed and ``folder`` is unchanged."""

    def __init__(self, folder, overwrite: bool = False, flag: str = "--out-dir"):
        self.folder, self.overwrite, self.flag = Path(folder), overwrite, flag
        self.tmp: Path | None = None

    def __enter__(self) -> Path:
        self.tmp = Path(tempfile.mkdtemp(dir=self.folder, prefix=".rnnrt-staging-"))
        return self.tmp

    def commit(self, written) -> list[Path]:
        """Move ``written`` (paths inside the staging folder) into the folder; -> new paths."""
        final = [self.folder / Path(p).relative_to(self.tmp) for p in written]
        clashes(final, self.overwrite, self.flag)
        for src, dst in zip(written, final):
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.replace(src, dst)
        return final

    def __exit__(self, *exc):
        shutil.rmtree(self.tmp, ignore_errors=True)
        return False
