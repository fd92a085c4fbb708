"""The tensor-core grid kernels' .cu itself (cuda_src/persistent_mma.cu, bf16 and fp16) on CPU
threads (tests/kernels/persistent_host_sim.cpp, PK_SIM_MMA), without a GPU: mma.sync is
emulated over the warp's exchange buffer by the PTX ISA's fragment layout (each lane deposits
its A / B registers, gathers the warp's, computes its own D), so the kernel's fragment loads,
padding and partial-sum flushes run for real. Every cell x {bfloat16, float16} equals the
float64 rounding-aware reference (rnnrt.reference.forward(..., dtype)) within the
precision's tolerance -- not bit-exactly: the fp32 sums run in the tensor core's order, so a
16-bit store of h can round the other way -- with one group of register tiles and several,
one h tile and several, whole k16 steps and masked ones (every cell at both precisions in
the first case, alternating after it: testkit.alternating_runs); and a kernel whose A fragment has
two registers swapped (rows g+8 and columns 2c+8 exchanged) is refused.
"""
from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest

from rnnrt import reference
from rnnrt.cells import get_cell
from rnnrt.check import compare
from rnnrt.kernels import mma as MM
from rnnrt.kernels import sources as S
from rnnrt.precision import get_precision, round_to_storage
from testkit import CELLS, alternating_runs, build_host_sim

TS = {"bfloat16": "bf16", "float16": "fp16"}


def build(tmp_path_factory, src_dir, file="persistent_mma.cu", define="PK_SIM_MMA"):
    """The host simulation of cuda_src/``file`` (the forward's, or with PK_SIM_MMA_BWD the
    backward's tensor-core kernels) from ``src_dir``."""
    exe = tmp_path_factory.mktemp("simmma") / f"persistent_host_sim_{define.lower()}"
    return build_host_sim(exe, src_dir / file, define=define)


@pytest.fixture(scope="module")
def host_sim(tmp_path_factory):
    return build(tmp_path_factory, S.cuda_src_dir())


def mma_case(cell, T, B, H, dtype, seed=0):
    """One layer whose inputs are representable in ``dtype`` (gx, R, h0 rounded), and the
    rounding-aware float64 reference of it (gx as the input with an identity W_ih: the
    reference's input GEMM then reads gx exactly). -> (data, ref {h, c, act})."""
    rng = np.random.default_rng(seed)
    G = get_cell(cell).gates
    r = lambda *s: round_to_storage(rng.uniform(-0.6, 0.6, s), dtype)   # noqa: E731
    gx, R = r(T, B, G * H), r(G * H, H)
    bw, br = rng.uniform(-0.3, 0.3, G * H), rng.uniform(-0.3, 0.3, G * H)
    h0 = round_to_storage(0.5 * rng.standard_normal((B, H)), dtype)
    c0 = 0.5 * rng.standard_normal((B, H)) if cell == "lstm" else None
    p = {"weight_ih": np.eye(G * H), "weight_hh": R, "bias_ih": bw, "bias_hh": br}
    _, _, _, cache = reference.forward(cell, [p], gx, h0[None],
                                       None if c0 is None else c0[None], dtype=dtype)
    lc = cache.layers[0]
    data = dict(gx=gx, R=R, bw=bw, br=br, h0=h0, c0=c0)
    return data, {"h": lc.h, "c": lc.c, "act": lc.gates}


def run_sim(exe, work, cell, fit, data, T, dtype, launches=2):
    """The kernel on CPU threads over ``fit``'s cut -> (h [T+1, B, H], c, act)."""
    G, B, H = get_cell(cell).gates, fit.batch, fit.hidden
    h = np.full(((T + 1) * B, H), np.nan, np.float32)
    h[:B] = data["h0"]
    c = np.full(((T + 1) * B, H), np.nan, np.float32) if cell == "lstm" else np.zeros(0)
    if cell == "lstm":
        c[:B] = data["c0"]
    act = np.full((T * B, 4 * H), np.nan, np.float32) if G > 1 else np.zeros(0)
    arrays = dict(h=h, c=c, act=act, gx=data["gx"].reshape(T * B, G * H), w=data["R"],
                  bw=data["bw"], br=data["br"])
    for name, a in arrays.items():
        np.ascontiguousarray(a, np.float32).tofile(work / f"{name}.f32")
    args = [exe, cell, B, H, T, fit.units_per_block, fit.blocks, fit.threads, fit.smem_bytes,
            launches, work, fit.k_tile, TS[dtype]]
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"host simulation failed ({r.returncode}):\n{r.stderr}"
    out = {n: np.fromfile(work / f"{n}.out", np.float32) for n in ("h", "c", "act")}
    return (out["h"].reshape(T + 1, B, H),
            out["c"].reshape(T + 1, B, H) if cell == "lstm" else None,
            out["act"].reshape(T, B, 4 * H) if G > 1 else None)


# (H, B, T, U, threads, k_tile): one group of tiles and one h tile (partial k16 steps: H 40,
# 4 warps of 3 chunks); LSTM/GRU M 48/36 > 32 rows and B 20 (3 n8 tiles): 2 groups of
# register tiles, k_tile 16 (3 tiles, a warp one chunk of each: masked steps); H 64 k_tile 64
# with 2 warps: whole k16 steps (CPW 8)
SIM_CASES = [(40, 9, 3, 5, 128, None), (48, 20, 3, 12, 128, 16), (64, 5, 2, 8, 64, 64)]


def check_outputs(cell, dtype, got, ref, what):
    """A sim's (h, c, act) against the rounding-aware reference ``ref`` within ``dtype``'s
    tolerance (also the tensor-core cluster kernels' sim test's check)."""
    p = get_precision(dtype)
    for name, g, r in zip(("h", "c", "act"), got, (ref["h"], ref["c"], ref["act"])):
        if r is None:
            continue
        c = compare(g, r, p.atol, p.rtol, name=f"{what} {name}")
        assert c.ok, str(c)


RUNS = alternating_runs(SIM_CASES, MM.MMA_DTYPES)


@pytest.mark.parametrize("case, cell, dtype", RUNS,
                         ids=[f"H{c[0]}B{c[1]}U{c[3]}-{cell}-{d}" for c, cell, d in RUNS])
def test_mma_kernel_on_cpu_threads(host_sim, tmp_path, case, cell, dtype):
    H, B, T, U, threads, k_tile = case
    fit = MM.mma_geometry(cell, H, B, U, threads, k_tile)
    assert fit.ok, fit.reason
    data, ref = mma_case(cell, T, B, H, dtype)
    got = run_sim(host_sim, tmp_path, cell, fit, data, T, dtype)
    check_outputs(cell, dtype, got, ref, f"{cell} {dtype} H{H} B{B} sim")
    assert np.array_equal(got[0][0], data["h0"].astype(np.float32)), "h0 changed"


def test_sim_cases_cover_the_paths():
    seen = {(MM.mma_geometry(c, H, B, U, t, k).tile_groups > 1,
             MM.mma_geometry(c, H, B, U, t, k).tiles > 1,
             MM.mma_geometry(c, H, B, U, t, k).whole_steps)
            for H, B, T, U, t, k in SIM_CASES for c in CELLS}
    assert {g for g, _, _ in seen} == {False, True}
    assert {n for _, n, _ in seen} == {False, True}
    assert {w for _, _, w in seen} == {False, True}


def swapped_fragment(tmp_path_factory, first, second):
    """A copy of cuda_src/ whose persistent_mma.cuh loads fragment register ``first`` (e.g.
    'a[mt][1]') with what ``second`` should hold and ``second`` with ``first``'s: one
    register holds what the other should. -> the folder."""
    bad = tmp_path_factory.mktemp("bad_src")
    for f in S.cuda_src_dir().iterdir():
        shutil.copy(f, bad / f.name)
    path = bad / "persistent_mma.cuh"
    text = path.read_text()
    a, b = (re.search(rf"{re.escape(r)} = [^;]*;", text)[0] for r in (first, second))
    assert text.count(a) == 1 and text.count(b) == 1, (a, b)
    text = text.replace(a, "@SWAP@").replace(b, a.replace(first, second, 1))
    path.write_text(text.replace("@SWAP@", b.replace(second, first, 1)))
    return bad


def test_a_wrong_fragment_layout_is_refused(tmp_path_factory, tmp_path):
    """a1 and a2 swapped in the kernel's A fragment (rows g+8, columns 2c..: one register
    holds what the other should): the emulated mma multiplies the wrong elements, and the
    result is refused."""
    exe = build(tmp_path_factory, swapped_fragment(tmp_path_factory, "a[mt][1]", "a[mt][2]"))
    H, B, T, U, threads, k_tile = SIM_CASES[2]   # whole k16 steps, rows g+8 live (M 32)
    fit = MM.mma_geometry("lstm", H, B, U, threads, k_tile)
    assert fit.whole_steps and fit.rows > 16
    data, ref = mma_case("lstm", T, B, H, "bfloat16")
    got = run_sim(exe, tmp_path, "lstm", fit, data, T, "bfloat16")
    with pytest.raises(AssertionError):
        check_outputs("lstm", "bfloat16", got, ref, "planted")
