"""Loading and launching the kernels (rnnrt/kernels/library.py) without a GPU: importing it
needs no CuPy; with a stand-in for CuPy, each file compiles once per process (per options),
kernels load by name, a launch gets the registry's geometry and arguments."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rnnrt.kernels import library as L
from rnnrt.kernels import registry as K
from rnnrt.kernels import typed
from testkit import FakeCupy

REPO = Path(L.__file__).resolve().parents[2]


def test_import_needs_no_cupy():
    code = "import sys, rnnrt.kernels.library as k; k.KernelLibrary(); assert 'cupy' not in sys.modules"
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stderr



def test_library_compiles_each_file_once(monkeypatch):
    fake = FakeCupy()
    monkeypatch.setitem(sys.modules, "cupy", fake)
    L.compile_module.cache_clear()
    try:
        lib1, lib2 = L.KernelLibrary(), L.KernelLibrary()
        for name in K.KERNELS:
            if K.KERNELS[name].file in typed.MMA_FILES:   # typed only: no fp32 kernel
                with pytest.raises(ValueError, match="no fp32 kernel"):
                    lib1.get(name)
                continue
            assert lib1.get(name) is lib1.get(name)
            lib2.get(name)
        files = [f for f in K.kernel_files() if f not in typed.MMA_FILES]
        assert len(fake.compiled) == len(files)
        assert all(opts == ("-std=c++17",) for _, opts in fake.compiled)
        L.KernelLibrary(options=("-std=c++17", "-lineinfo")).get("lstm_fwd")
        assert len(fake.compiled) == len(files) + 1

        lib1.launch("ew_add", 64, 1024, [(4096, 1024)], [(8192, 1024), (16384, 0)])
        name, grid, block, args = fake.launches[-1]
        assert (name, grid, block) == ("ew_add", (256, 1, 1), (256, 1, 1)) and len(args) == 8
        with pytest.raises(ValueError, match="expected one of"):
            lib1.get("lstm_bwd2")
    finally:
        L.compile_module.cache_clear()
