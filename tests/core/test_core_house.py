"""The house rules, checked on the tree itself: no source or test file over 700 lines, no
import of another module's private names, the layers import downwards only (nothing in
plan/ or kernels/ imports exec/, bench/ or nn/; exec/ imports neither bench/ nor nn/),
nothing cites a path outside the repository, and every .cu/.cuh opens with a header."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 700
SOURCE_DIRS = ("rnnrt", "cuda_src", "tests", "examples", "experiments/scripts")
SOURCE_EXT = {".py", ".cu", ".cuh", ".cpp", ".h"}


def _sources():
    out = [p for d in SOURCE_DIRS for p in (ROOT / d).rglob("*")
           if p.is_file() and p.suffix in SOURCE_EXT]
    assert len(out) > 50, "the source glob found too little: the check would pass vacuously"
    return sorted(out)


def _py(folder: str):
    return sorted((ROOT / folder).rglob("*.py"))


def test_no_file_over_the_limit():
    long = {str(p.relative_to(ROOT)): n for p in _sources()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"split these by concept (limit {MAX_LINES} lines): {long}"


def _imports(path: Path):
    """(module, names) of every `from X import a, b` in a file; module as written (dots)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            yield ("." * node.level) + (node.module or ""), [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, []


def test_no_private_names_imported():
    bad = []
    for d in ("rnnrt", "tests", "examples", "experiments/scripts"):
        for p in _py(d):
            for mod, names in _imports(p):
                if mod == "__future__":
                    continue
                bad += [f"{p.relative_to(ROOT)}: from {mod} import {n}" for n in names
                        if n.startswith("_") and not n.startswith("__")]
    assert not bad, bad


def _package_of(path: Path, mod: str) -> str | None:
    """The rnnrt subpackage (plan, kernels, exec, bench, nn) a `from mod import` in rnnrt/
    reaches, or None for a top-level module or an outside package."""
    if mod.startswith("."):
        level = len(mod) - len(mod.lstrip("."))
        base = path.parent
        for _ in range(level - 1):
            base = base.parent
        parts = list(base.relative_to(ROOT).parts) + [s for s in mod.lstrip(".").split(".") if s]
    else:
        parts = mod.split(".")
    if len(parts) >= 2 and parts[0] == "rnnrt" and (ROOT / "rnnrt" / parts[1]).is_dir():
        return parts[1]
    return None


LAYER_MAY_NOT_IMPORT = {
    "plan": {"exec", "bench", "nn"},
    "kernels": {"exec", "bench", "nn"},
    "exec": {"bench", "nn"},
}


def test_layers_import_downwards():
    bad = []
    for layer, banned in LAYER_MAY_NOT_IMPORT.items():
        files = _py(f"rnnrt/{layer}")
        assert files, layer
        for p in files:
            for mod, _ in _imports(p):
                if _package_of(p, mod) in banned:
                    bad.append(f"{p.relative_to(ROOT)} imports {mod}")
    assert not bad, bad


def test_package_of_resolves_relative_imports():
    p = ROOT / "rnnrt" / "kernels" / "choice.py"
    assert _package_of(p, "..exec.workspace") == "exec"
    assert _package_of(p, ".persistent") == "kernels"
    assert _package_of(p, "..cells") is None
    assert _package_of(p, "rnnrt.bench.sweep") == "bench"


def test_nothing_cites_outside_the_repository():
    pat = re.compile(r"\.\./shared|shared/reference")
    hits = []
    for p in [*_sources(), *ROOT.glob("*.md"), *(ROOT / "docs").glob("*.md")]:
        if p.name == "test_core_house.py":
            continue
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
            if pat.search(line):
                hits.append(f"{p.relative_to(ROOT)}:{i}")
    assert not hits, hits


def test_every_cuda_file_opens_with_a_header():
    files = sorted((ROOT / "cuda_src").glob("*.cu*"))
    assert len(files) >= 5
    for p in files:
        head = p.read_text(encoding="utf-8").lstrip()
        assert head.startswith("/*") or head.startswith("//"), p.name
        first = head[: head.find("*/")] if head.startswith("/*") else head[:400]
        assert p.name in first, f"{p.name}: its header should name the file and its kernels"
