"""README.md works as written for a newcomer: every Python block runs (in a fresh namespace,
from an empty folder), every `rnnrt ...` command it shows parses with the real CLI, no
documented command writes into the repository's tracked folders, and the CI blocks exist.

Blocks after a `<!-- needs: gpu -->` line need CuPy and a CUDA device: on a machine without
one they are skipped (and reported as such), and `pytest -m gpu` runs them on the device, so
they are tested as written too rather than kept as untested prose."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from rnnrt import cli
from rnnrt.bench.records import DEFAULT_OUT
from rnnrt.device import gpu_available

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
GPU_MARK = "<!-- needs: gpu -->"
BLOCK = re.compile(r"(?P<mark><!-- needs: gpu -->\n)?```python\n(?P<code>.*?)```", re.S)


def _blocks():
    out = []
    for i, m in enumerate(BLOCK.finditer(README)):
        marks = [pytest.mark.gpu, pytest.mark.skipif(not gpu_available(),
                                                     reason="needs a CUDA GPU with CuPy")] \
            if m["mark"] else []
        out.append(pytest.param(m["code"], id=f"block{i}{'-gpu' if m['mark'] else ''}",
                                marks=marks))
    return out


BLOCKS = _blocks()


def test_the_readme_has_python_blocks_and_marks_gpu_ones():
    assert len(BLOCKS) >= 4
    assert README.count(GPU_MARK) == sum(1 for b in BLOCKS if "gpu" in b.id)
    assert "<!-- ci:install -->" in README and "<!-- ci:test -->" in README
    assert len(README.splitlines()) <= 220, "the README is for users: keep it short"


@pytest.mark.parametrize("code", BLOCKS)
def test_python_block_runs_as_written(code, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {"__name__": "__readme__"})
    assert capsys.readouterr().out.strip(), "each block prints what it shows"
    assert not (tmp_path / "experiments").exists()


def _commands():
    """Every `rnnrt ...` the README shows: indented command lines and inline code."""
    found = []
    for line in README.splitlines():
        if line.startswith("    rnnrt "):
            found.append(line.strip().split("  #")[0].split(" # ")[0].strip())
    found += re.findall(r"`(rnnrt (?:--|[a-z])[^`]*)`", README)
    return sorted({c for c in found if "<" not in c and "..." not in c})


def test_every_documented_command_parses():
    cmds = _commands()
    assert any(c.startswith("rnnrt plot") for c in cmds) and "rnnrt --version" in cmds
    for cmd in cmds:
        argv = shlex.split(cmd)[1:]
        try:
            a = cli.build_parser().parse_args(argv)
        except SystemExit as e:
            assert e.code == 0 and argv == ["--version"], f"{cmd!r} does not parse"
            continue
        # nothing documented writes into the repository's tracked folders
        for attr in ("out", "out_dir"):
            target = getattr(a, attr, None)
            assert target is None or not str(target).startswith("experiments"), cmd


def test_outputs_default_to_one_ignored_folder(tmp_path, monkeypatch, capsys):
    from rnnrt.bench.records import figures_root, results_root
    assert f"/{DEFAULT_OUT}/" in (ROOT / ".gitignore").read_text().splitlines()
    monkeypatch.delenv("RNNRT_OUT", raising=False)
    assert results_root() == Path(DEFAULT_OUT) / "results"
    assert figures_root() == Path(DEFAULT_OUT) / "figures"
    monkeypatch.setenv("RNNRT_OUT", "experiments")   # how the repository's records are made
    assert results_root() == Path("experiments") / "results"
    monkeypatch.chdir(tmp_path)
    assert cli.main(["demo"]) == 0 and "|dx|" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []          # the demo writes nothing


def test_version(capsys):
    import rnnrt
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"rnnrt {rnnrt.__version__}"
