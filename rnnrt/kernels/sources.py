"""The CUDA sources: where cuda_src/ is (the checkout's, or the installed package data), each
file's text, and the kernel headers every file opens with (a test holds registry, headers and
code to each other).
"""
from __future__ import annotations

import importlib.resources
import re
from pathlib import Path

from .registry import REGISTRY


def cuda_src_dir() -> Path:
    """The cuda_src folder: the checkout's (repo root / cuda_src), else the installed
    package data ``rnnrt.cuda_src``."""
    checkout = Path(__file__).resolve().parents[2] / "cuda_src"
    if (checkout / REGISTRY[0].file).is_file():
        return checkout
    try:
        res = importlib.resources.files("rnnrt.cuda_src")
        # iterdir, not str(res): without __init__.py the package is a namespace package and
        # files() gives a MultiplexedPath, whose entries are plain Paths.
        hit = next((p for p in res.iterdir() if p.name == REGISTRY[0].file), None)
    except (ModuleNotFoundError, FileNotFoundError):
        hit = None
    if not isinstance(hit, Path):
        raise FileNotFoundError(f"cuda_src: {REGISTRY[0].file} is neither in {checkout} nor "
                                f"in the package data rnnrt.cuda_src")
    return hit.parent


_LOCAL_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]+"([^"]+)"[ \t]*$', re.M)


def source(file: str) -> str:
    """The text of cuda_src/``file``, its local includes (``#include "x.cuh"``, files of
    cuda_src/) inlined where they stand, each once: a self-contained text that NVRTC compiles
    without include paths, and that names every byte it depends on (the compile cache is
    keyed on it). A file that includes itself (directly or not) is an error."""
    return _expand(cuda_src_dir(), file, set(), ())


def _expand(folder: Path, file: str, seen: set, chain: tuple) -> str:
    if file in chain:
        raise ValueError(f"cuda_src: {' -> '.join(chain + (file,))}: includes itself")
    text = (folder / file).read_text()

    def inline(m):
        name = m[1]
        if name in seen:   # included once, as an include guard would
            return f"// {name}: already inlined above"
        seen.add(name)
        return (f"// ---- {name} (inlined by rnnrt.kernels.sources) ----\n"
                f"{_expand(folder, name, seen, chain + (file,))}\n// ---- end of {name} ----")

    seen.add(file)
    return _LOCAL_INCLUDE.sub(inline, text)


_HEADER_KERNEL = re.compile(r"^\s*\*\s*kernel\s+([A-Za-z_]\w*)")
_HEADER_ARG = re.compile(r"^\s*\*\s+(out|in)\s+([A-Za-z_]\w*)\s+\[")
_HEADER_SCALAR = re.compile(r"^\s*\*\s+int\s+([A-Za-z_]\w*)\b")


def _parse_header_full(text: str) -> dict[str, tuple[list, list, list]]:
    m = re.match(r"\s*/\*(.*?)\*/", text, re.S)
    if not m:
        raise ValueError("kernel source does not open with a /* ... */ header comment")
    kernels: dict[str, tuple[list, list, list]] = {}
    current = None
    for line in m[1].splitlines():
        if km := _HEADER_KERNEL.match(line):
            if km[1] in kernels:
                raise ValueError(f"header lists kernel {km[1]} twice")
            current = kernels[km[1]] = ([], [], [])
        elif (am := _HEADER_ARG.match(line)) and current is not None:
            current[0 if am[1] == "out" else 1].append(am[2])
        elif (sm := _HEADER_SCALAR.match(line)) and current is not None:
            current[2].append(sm[1])
    return kernels


def parse_header(text: str) -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
    """{kernel: (output names, input names)} as the file's opening comment lists them
    (lines ' * kernel NAME...', each followed by its ' *   out NAME [...]' and
    ' *   in NAME [...]' lines)."""
    return {k: (tuple(o), tuple(i)) for k, (o, i, _) in _parse_header_full(text).items()}


def parse_header_scalars(text: str) -> dict[str, tuple[str, ...]]:
    """{kernel: scalar names} as the header lists them (' *   int NAME ...' lines after the
    kernel's line); () for kernels without scalars."""
    return {k: tuple(s) for k, (_, _, s) in _parse_header_full(text).items()}


def header_kernels(file: str) -> list[str]:
    """The kernel names that cuda_src/``file``'s header lists, in order."""
    return list(parse_header(source(file)))
