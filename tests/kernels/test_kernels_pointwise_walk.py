"""The pointwise kernels' grid-stride walk (cuda_src/pointwise_common.cuh: element_walk,
for_each_element, for_each_element_batched), run on the CPU by
tests/kernels/pointwise_walk_sim.cpp (g++, the header compiled as is): every element once,
each thread's in the order of the flat-index loop it replaced, for odd sizes and grids larger
and smaller than the problem; the batched walk loads each element once before storing it;
the walk's (row, column) equals the flat index's past 2^32 elements. A walk that drops the
carry is caught (planted fault)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from rnnrt.kernels import sources as S

SIM = Path(__file__).resolve().parent / "pointwise_walk_sim.cpp"


def _build(tmp_path, source: Path):
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ is not on PATH")
    exe = tmp_path / "walk"
    cmd = [gxx, "-std=c++17", "-O2", "-Wall", "-Werror", "-Wno-unknown-pragmas", "-DPK_HOST_SIM",
           f'-DPW_SOURCE="{source}"', "-o", str(exe), str(SIM)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stderr}"
    return exe


def _run(exe):
    return subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)


def test_the_walk_visits_every_element_once_in_flat_order(tmp_path):
    r = _run(_build(tmp_path, S.cuda_src_dir() / "pointwise_common.cuh"))
    assert r.returncode == 0 and r.stdout.startswith("ok "), r.stdout + r.stderr
    assert int(r.stdout.split()[1]) > 200


def test_a_walk_without_its_carry_is_caught(tmp_path):
    """Planted fault: the step's carry into the next row dropped."""
    text = (S.cuda_src_dir() / "pointwise_common.cuh").read_text()
    carry = "            ++r;\n"
    assert text.count(carry) == 1
    for name in ("storage.cuh",):   # the header's own include, beside the copy
        (tmp_path / name).write_text((S.cuda_src_dir() / name).read_text())
    broken = tmp_path / "pointwise_common.cuh"
    broken.write_text(text.replace(carry, ""))
    r = _run(_build(tmp_path, broken))
    assert r.returncode == 1 and "FAIL" in r.stdout, r.stdout + r.stderr
