"""Fixtures shared by the test files: for the GPU tests (marker gpu), CuPy and one GpuContext
per module, only requested by GPU tests, which skip without a GPU, so nothing here imports
CuPy on a machine without one; for the CPU tests of the CUDA sources, ``nvcc_sm90`` (each
file compiled once a session).

Shared helpers that are not fixtures live in tests/testkit.py; this file puts tests/ on
sys.path, so that the test modules in its subfolders can ``import testkit``.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)


@pytest.fixture(scope="module")
def cp():
    import cupy
    return cupy


@pytest.fixture(scope="module")
def ctx(cp):
    from rnnrt.exec.cuda_exec import GpuContext
    from rnnrt.kernels.library import KernelLibrary
    c = GpuContext(cp, KernelLibrary())
    yield c
    c.close()


@pytest.fixture(scope="session")
def nvcc_sm90(tmp_path_factory):
    """compile(file) -> (cubin, ptxas's report, PTX text) of cuda_src/``file`` compiled by
    nvcc for sm_90 once a session, strictly (-Werror all-warnings), with --resource-usage and
    the PTX kept (-keep: the very text -ptx gives). The compile test of every file, the
    resource-usage, PTX and SASS tests of the persistent kernels read this one compile: they
    made the same one up to four times, 11-18 s each on CI's machine. Skips where nvcc is not
    on PATH; a failed compile fails every test that asks for it."""
    from rnnrt.kernels import sources as S
    nvcc = shutil.which("nvcc")
    done = {}

    def compile(file):
        if nvcc is None:
            pytest.skip("nvcc is not on PATH")
        if file not in done:
            d = tmp_path_factory.mktemp("nvcc_sm90")
            cmd = [nvcc, "-arch=sm_90", "--cubin", "-std=c++17", "-Werror", "all-warnings",
                   "--resource-usage", "-keep", "-keep-dir", str(d), "-o", str(d / "k.cubin"),
                   str(S.cuda_src_dir() / file)]
            done[file] = (cmd, subprocess.run(cmd, capture_output=True, text=True,
                                              timeout=300), d)
        cmd, r, d = done[file]
        assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stdout}\n{r.stderr}"
        return d / "k.cubin", r.stdout + r.stderr, (d / (Path(file).stem + ".ptx")).read_text()
    return compile
