"""Test helpers for the persistent kernels (the kernel test modules share them), split from
testkit.py by concept; testkit re-exports them, so test modules import from testkit as before:
the kernel lists, made-up device properties (``H100``, ``SMALL``), nvcc's resource usage and
typed instantiations, one layer's data and reference forward / backward (``layer_case``,
``bwd_layer_case``), the cancelling k-group case, the host simulation's build.

Nothing here imports CuPy at import time.
"""
from __future__ import annotations

import os
import re

import numpy as np

from rnnrt import reference
from rnnrt.cells import get_cell
from rnnrt.check import FP32_ATOL, FP32_RTOL, assert_close
from rnnrt.kernels.registry import REGISTRY
from rnnrt.kernels.stack import STACK_KERNEL

CELLS = ("lstm", "gru", "rnn_tanh", "rnn_relu")


def alternating_runs(cases, dtypes, cells=CELLS):
    """[(case, cell, dtype)] for a 16-bit kernel's sim test: every cell at every dtype in the
    first case; in the others each cell at one dtype, the dtypes taking turns, so that each
    cell still meets each dtype at several shapes. bf16 and fp16 are both 2-byte storage: the
    layouts, staging and indexing a shape exercises are the same at either, and only the
    conversions differ (those the first case covers for every cell). Halves the runs (CI
    time: each is a few hundred CPU threads)."""
    dtypes = tuple(dtypes)
    return ([(cases[0], c, d) for c in cells for d in dtypes]
            + [(case, c, dtypes[(i + n) % len(dtypes)])
               for n, case in enumerate(cases[1:]) for i, c in enumerate(cells)])

# --- the persistent kernels -----------------------------------------------------------------

# the per-layer persistent forward kernels (the stack kernel, all layers in one launch, has
# its own arguments and tests: tests/kernels/test_kernels_stack.py)
PERSISTENT = [k.name for k in REGISTRY if k.persistent and k.name != STACK_KERNEL
              and k.file == "persistent.cu"]
# the persistent backward kernels (persistent_bwd.cu: their own tests, *_persistent_bwd*)
BWD_KERNELS = [k.name for k in REGISTRY if k.file == "persistent_bwd.cu"]
GRID_KERNELS = [n for n in PERSISTENT if "_cluster" not in n]      # the grid barrier kernels
CLUSTER_KERNELS = [n for n in PERSISTENT if "_cluster" in n]

# cupy.cuda.runtime.getDeviceProperties of an H100 80GB HBM3 (the keys the fit reads)
H100 = dict(multiProcessorCount=132, sharedMemPerBlockOptin=232448,
            sharedMemPerMultiprocessor=233472, reservedSharedMemPerBlock=1024,
            maxThreadsPerBlock=1024, maxThreadsPerMultiProcessor=2048,
            regsPerMultiprocessor=65536, regsPerBlock=65536)
# a small made-up GPU: 6 SMs, 48 KB of shared memory a block, half the registers
SMALL = dict(multiProcessorCount=6, sharedMemPerBlockOptin=49152,
             sharedMemPerMultiprocessor=65536, reservedSharedMemPerBlock=1024,
             maxThreadsPerBlock=512, maxThreadsPerMultiProcessor=1024,
             regsPerMultiprocessor=32768, regsPerBlock=32768)


def nvcc_usage(text, tmp_path, functions=False):
    """Compile CUDA source ``text`` with nvcc for sm_90a (skipping the test where nvcc is not
    on PATH): [(entry, stack bytes, spill stores, spill loads, registers)] as -Xptxas -v
    reports them, strings. ``functions``: also [(function, stack bytes, spill stores, spill
    loads)] of every function ptxas reports, entries and the device functions they call (a
    called function's spills are not its caller's)."""
    import shutil
    import subprocess

    import pytest

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH")
    (tmp_path / "k.cu").write_text(text)
    r = subprocess.run([nvcc, "-arch=sm_90a", "--cubin", "-std=c++17", "-Xptxas", "-v",
                        "-o", str(tmp_path / "k.cubin"), str(tmp_path / "k.cu")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = r.stdout + r.stderr
    usage = re.findall(r"Compiling entry function '(\w+)'.*?(\d+) bytes stack frame, (\d+) "
                       r"bytes spill stores, (\d+) bytes spill loads.*?Used (\d+) registers",
                       out, re.S)
    if not functions:
        return usage
    return usage, re.findall(r"Function properties for (\w+)\s+(\d+) bytes stack frame, (\d+) "
                             r"bytes spill stores, (\d+) bytes spill loads", out)


def nvcc_instantiations(tmp_path, file, declarations):
    """Compile cuda_src/``file`` with the explicit instantiations ``declarations`` (each
    'K_t<TS, false>(parameter types)') for sm_90a, strictly (-Werror all-warnings), with
    --resource-usage, skipping the test where nvcc is not on PATH. -> ({entry: (registers,
    stack bytes, spill stores, spill loads)}, the PTX ptxas compiled)."""
    import shutil
    import subprocess

    import pytest

    from rnnrt.kernels import sources
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH")
    inst = [f'#include "{sources.cuda_src_dir() / file}"']
    inst += [f"template __global__ void {d};" for d in declarations]
    (tmp_path / "inst.cu").write_text("\n".join(inst) + "\n")
    # -keep leaves the PTX that ptxas compiled (the text -ptx gives): one compile, not two
    cmd = [nvcc, "-arch=sm_90a", "--cubin", "-std=c++17", "--resource-usage", "-Werror",
           "all-warnings", "-keep", "-keep-dir", str(tmp_path), "-o",
           str(tmp_path / "k.cubin"), str(tmp_path / "inst.cu")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    found = re.findall(r"Compiling entry function '(\w+)'.*?(\d+) bytes stack frame, (\d+) "
                       r"bytes spill stores, (\d+) bytes spill loads.*?Used (\d+) registers",
                       r.stdout + r.stderr, re.S)
    return ({m[0]: (int(m[4]), int(m[1]), int(m[2]), int(m[3])) for m in found},
            (tmp_path / "inst.ptx").read_text())


def check_no_spills(found, kernel_name, regs):
    """``found`` (nvcc_instantiations' entries) is every cell's kernel at bf16 and fp16, each
    without stack or spills and within the registers its fit assumes (``regs[cell]``, at
    most 255); ``kernel_name(cell)`` names a cell's kernel (its entries are mangled
    ``K_t<...>``)."""
    assert len(found) == 2 * len(CELLS), found
    for name, (n, stack, st, ld) in found.items():
        cell = next(c for c in CELLS if f"{len(kernel_name(c)) + 2}{kernel_name(c)}_t" in name)
        assert (stack, st, ld) == (0, 0, 0), f"{name}: stack/spills {stack}/{st}/{ld}"
        assert n <= regs[cell] <= 255, (name, n)


def ceil(a, b):
    """ceil(a / b) for positive ints (written here, not imported from the code under test)."""
    return -(-a // b)


def layer_case(cell, T, B, H, I=5, bias=True, seed=0, dtype=np.float64):
    """One layer's inputs as the kernel takes them (gx = W x without bias) and the
    reference's h [T+1, B, H], c, act."""
    rng = np.random.default_rng(seed)
    spec = get_cell(cell)
    G = spec.gates
    u = lambda *shape: rng.uniform(-0.6, 0.6, shape)   # noqa: E731 - out of the linear range
    p = {"weight_ih": u(G * H, I), "weight_hh": u(G * H, H),
         "bias_ih": u(G * H) if bias else None, "bias_hh": u(G * H) if bias else None}
    x = rng.standard_normal((T, B, I))
    h0 = 0.5 * rng.standard_normal((B, H))
    c0 = 0.5 * rng.standard_normal((B, H)) if spec.has_cell_state else None
    _, _, _, cache = reference.forward(cell, [p], x, h0[None],
                                       None if c0 is None else c0[None])
    lc = cache.layers[0]
    ref = {"h": lc.h, "c": lc.c, "act": lc.gates}
    gx = x @ p["weight_ih"].T
    cast = lambda a: None if a is None else np.asarray(a, dtype)   # noqa: E731
    return dict(gx=cast(gx), R=cast(p["weight_hh"]), bw=cast(p["bias_ih"]),
                br=cast(p["bias_hh"]), h0=cast(h0), c0=cast(c0)), ref


def bwd_layer_case(cell, T, B, H, I=5, seed=0, dtype=np.float32):
    """One layer's backward as the persistent backward kernel takes it, and the float64
    reference. -> (data, ref): data has dhin [T, B, H] (dy), dh_n, dc_n (LSTM) [B, H], act
    [T, B, 4H] (LSTM, GRU), st (c for LSTM, else h) [T+1, B, H], R [G*H, H] in ``dtype``,
    and x [T, B, I], W [G*H, I], h [T+1, B, H] in float64 (to turn the kernel's dg into the
    weight gradients); ref has dx, dh0, dc0 and the four parameter gradients (float64)."""
    rng = np.random.default_rng(seed)
    spec = get_cell(cell)
    G = spec.gates
    u = lambda *shape: rng.uniform(-0.6, 0.6, shape)   # noqa: E731 - out of the linear range
    p = {"weight_ih": u(G * H, I), "weight_hh": u(G * H, H), "bias_ih": u(G * H),
         "bias_hh": u(G * H)}
    x = rng.standard_normal((T, B, I))
    h0 = 0.5 * rng.standard_normal((1, B, H))
    c0 = 0.5 * rng.standard_normal((1, B, H)) if spec.has_cell_state else None
    _, _, _, cache = reference.forward(cell, [p], x, h0, c0)
    dy = rng.standard_normal((T, B, H))
    dhn = rng.standard_normal((1, B, H))
    dcn = rng.standard_normal((1, B, H)) if spec.has_cell_state else None
    g = reference.backward(cell, [p], cache, dy, dhn, dcn)
    lc = cache.layers[0]
    cast = lambda a: None if a is None else np.asarray(a, dtype)   # noqa: E731
    data = dict(dhin=cast(dy), dh_n=cast(dhn[0]), dc_n=None if dcn is None else cast(dcn[0]),
                act=cast(lc.gates), st=cast(lc.c if spec.has_cell_state else lc.h),
                R=cast(p["weight_hh"]), x=x, W=p["weight_ih"], h=lc.h)
    ref = dict(dx=g["dx"], dh0=g["dh0"][0], dc0=None if g["dc0"] is None else g["dc0"][0],
               **g["params"][0])
    return data, ref


def bwd_gradients(data, dgx, dgh):
    """The gradients a layer's dg gives (float64): dx = dgx W, weight_ih = sum_t dgx_t^T
    x_t, weight_hh = sum_t dgh_t^T h_t, bias_ih / bias_hh the sums of dgx / dgh (dgh is dgx
    for the cells without a separate R side); data from ``bwd_layer_case``."""
    dgx = np.asarray(dgx, np.float64)
    dgh = dgx if dgh is None else np.asarray(dgh, np.float64)
    return {"dx": dgx @ data["W"], "weight_ih": np.einsum("tbr,tbi->ri", dgx, data["x"]),
            "weight_hh": np.einsum("tbr,tbk->rk", dgh, data["h"][:-1]),
            "bias_ih": dgx.sum(axis=(0, 1)), "bias_hh": dgh.sum(axis=(0, 1))}


def check_bwd_against_reference(out, data, ref, what, atol=FP32_ATOL, rtol=FP32_RTOL):
    """``out`` ({"dgx", "dgh", "dh0", "dc0"}: a backward kernel's or its emulation's)
    against the float64 reference: dh0, dc0 and every gradient the dg give, to ``atol`` +
    ``rtol`` |ref| (fp32's by default; the weight gradients' absolute part grows with the
    T*B terms they sum, ``reduction_atol``)."""
    from rnnrt.check import reduction_atol
    T, B, _ = data["dhin"].shape
    assert_close(out["dh0"], ref["dh0"], atol, rtol, name=f"{what} dh0")
    if ref["dc0"] is not None:
        assert_close(out["dc0"], ref["dc0"], atol, rtol, name=f"{what} dc0")
    else:
        assert out["dc0"] is None
    got = bwd_gradients(data, out["dgx"], out["dgh"])
    assert_close(got["dx"], ref["dx"], atol, rtol, name=f"{what} dx")
    for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
        assert_close(got[name], ref[name], reduction_atol(T * B, atol), rtol,
                     name=f"{what} {name}")


def emulated(cell, fit, data, **kw):
    """rnnrt.kernels.emulate_bwd.emulate_bwd of ``fit`` on a ``bwd_layer_case``'s data
    (``kw``: its options, e.g. block_order)."""
    from rnnrt.kernels.emulate_bwd import emulate_bwd
    return emulate_bwd(cell, fit, data["dhin"], data["dh_n"], data["R"], data["act"],
                       data["st"], data["dc_n"], **kw)


def chunk_cols(*chunks):
    """The columns of float4 chunks (absolute: chunk c is columns 4c .. 4c+3)."""
    return [k for c in chunks for k in range(4 * c, 4 * c + 4)]


def cancelling_case():
    """rnn_tanh H 37, B 2, U 5, 64 threads, one tile of 40: lanes 2 x 1 x 16, 32 k-groups;
    warp 0 owns chunks 0..4, halves 0..2 and 3..4, so k-group 0 sums chunks 0 and 3 and
    k-group 1 chunks 1 and 4. Every row of R has 1e8, -1e8, 1 in columns 0, 4, 12 (chunks 0,
    1, 3) and 1e8, 1, -1e8 in columns 1, 5, 13 (the same chunks); h0 is 1 in the first three
    for batch 0 and in the second three for batch 1, 0 elsewhere. Batch 0: k-group 0 rounds
    1e8 + 1 to 1e8 in float32, k-group 1 cancels it: h_1 = tanh(0) = 0. Batch 1: k-group 0
    cancels exactly, k-group 1 adds 1: h_1 = tanh(1). Had chunk 3 been k-group 3's (lane
    groups running on through both halves), the two batches would swap; had R been
    ignored, both would be 0."""
    from rnnrt.kernels.persistent import geometry
    fit = geometry("rnn_tanh", 37, 2, 5, threads=64)
    R = np.zeros((37, 37), np.float32)
    R[:, [0, 4, 12]] = [1e8, -1e8, 1]
    R[:, [1, 5, 13]] = [1e8, 1, -1e8]
    h0 = np.zeros((2, 37), np.float32)
    h0[0, [0, 4, 12]] = 1
    h0[1, [1, 5, 13]] = 1
    data = dict(gx=np.zeros((1, 2, 37), np.float32), R=R, bw=None, br=None, h0=h0, c0=None)
    return fit, data


# for running a host simulation: a planted race's test needs TSan's first report only, and a
# binary that ran on after it took twice as long (a TSan-free binary ignores the variable)
SIM_ENV = {**os.environ,
           "TSAN_OPTIONS": (os.environ.get("TSAN_OPTIONS", "") + " halt_on_error=1").strip()}


_SIM_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels")
_PCH = {}   # the g++ flags -> the header beside its precompiled .gch (None: g++ made none)


def _precompiled_std(gxx, flags):
    """``-include`` arguments for persistent_host_sim_std.h precompiled with ``flags`` (the
    build's own: a PCH is used only with the flags it was made with), made once a process in
    a temporary folder removed at exit; [] where g++ cannot make one (the build then parses
    the headers itself: slower, the same binary). Each sim build took ~2.4 s here, ~1.1 of
    them the standard headers."""
    import atexit
    import shutil
    import subprocess
    import tempfile
    key = tuple(flags)
    if key not in _PCH:
        d = tempfile.mkdtemp(prefix="rnnrt-sim-pch-")
        atexit.register(shutil.rmtree, d, True)
        hdr = os.path.join(d, "persistent_host_sim_std.h")
        shutil.copy(os.path.join(_SIM_DIR, "persistent_host_sim_std.h"), hdr)
        r = subprocess.run([gxx, *flags, "-x", "c++-header", hdr, "-o", hdr + ".gch"],
                           capture_output=True, text=True, timeout=300)
        _PCH[key] = hdr if r.returncode == 0 else None
    return ["-include", _PCH[key]] if _PCH[key] else []


def build_host_sim(exe, src, tsan=False, define=None):
    """Compile tests/kernels/persistent_host_sim.cpp with the kernel source ``src``
    (g++ -std=c++20; ``define``: the main to build, e.g. 'PK_SIM_BWD'), with
    ThreadSanitizer when ``tsan``, its standard headers precompiled once a process;
    skips where the toolchain cannot."""
    import shutil
    import subprocess

    import pytest
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ is not on PATH")
    flags = ["-std=c++20", "-O1", "-pthread", "-fno-strict-aliasing", "-Wall", "-Werror",
             "-Wno-unknown-pragmas"]
    if tsan:   # TSan does not model fences: the seq_cst atomicAdd carries the release
        flags[:0] = ["-fsanitize=thread", "-g", "-Wno-tsan"]
    cmd = [gxx, *flags, *_precompiled_std(gxx, flags), "-DPK_HOST_SIM",
           f'-DPK_SOURCE="{src}"', *([f"-D{define}"] if define else []), "-o", str(exe),
           os.path.join(_SIM_DIR, "persistent_host_sim.cpp")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    # a missing local header (cuda_src's .cuh: the loader did not inline it) is the source's
    # fault, not the toolchain's: fail, do not skip
    local = re.search(r'fatal error: [\w./-]+\.cuh: No such file', r.stderr)
    if r.returncode != 0 and not local and ("No such file" in r.stderr
                                            or "cannot find" in r.stderr):
        pytest.skip(f"toolchain lacks what the simulator needs: {r.stderr[-300:]}")
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stderr}"
    return exe
