"""The tensor-core backward grid kernels' .cu itself (cuda_src/persistent_mma_bwd.cu, bf16 and
fp16) on CPU threads (tests/kernels/persistent_host_sim.cpp, PK_SIM_MMA_BWD), without a GPU:
mma.sync is emulated over the warp's exchange buffer by the PTX ISA's fragment layout (each
lane deposits its A / B registers, gathers the warp's, computes its own D), so the kernel's
fragment loads of the R^T slice and the dg tile, their padding and the partial-sum flushes
run for real. Every cell x {bfloat16, float16}, launched twice on one sync buffer with every
output poisoned (NaN) before each, against the float64 rounding-aware reference
(rnnrt.reference.backward(..., dtype): dh0, dc0, and dx and every weight and bias gradient
the written dg give) within the precision's tolerance -- not bit-exactly: the fp32 sums run
in the tensor core's order, so a 16-bit store of dg can round the other way -- and against
the kernel's NumPy twin (the registry's, emulate_bwd over mma_bwd's cut); with one group of
register tiles and several, one dg tile and several, whole k16 steps and masked ones. A
kernel whose B fragment has its two registers swapped (k 2c.. and 2c+8.. exchanged) is
refused.
"""
from __future__ import annotations

import subprocess

import numpy as np
import pytest
from test_kernels_mma_sim import TS
from test_kernels_mma_sim import build as build_mma
from test_kernels_mma_sim import swapped_fragment
from testkit import CELLS, alternating_runs, bwd_gradients

from rnnrt import reference
from rnnrt.cells import get_cell
from rnnrt.check import assert_close, reduction_atol
from rnnrt.kernels import mma_bwd as MB
from rnnrt.kernels import sources as S
from rnnrt.kernels.emulate_bwd import emulate_bwd
from rnnrt.precision import get_precision, round_to_storage


def build(tmp_path_factory, src_dir):
    return build_mma(tmp_path_factory, src_dir, "persistent_mma_bwd.cu", "PK_SIM_MMA_BWD")


@pytest.fixture(scope="module")
def host_sim(tmp_path_factory):
    return build(tmp_path_factory, S.cuda_src_dir())


def mma_bwd_case(cell, T, B, H, dtype, I=5, seed=0):
    """One layer's backward as the kernel takes it, its inputs representable in ``dtype`` (x,
    W, R, h0 rounded: the reference's stores of them are then the identity, and the
    gradients the kernel's dg give are the reference's formulas), and the float64
    rounding-aware reference. -> (data, ref): data as testkit.bwd_layer_case's (float64)."""
    rng = np.random.default_rng(seed)
    spec = get_cell(cell)
    G = spec.gates
    r = lambda *s: round_to_storage(rng.uniform(-0.6, 0.6, s), dtype)   # noqa: E731
    p = {"weight_ih": r(G * H, I), "weight_hh": r(G * H, H),
         "bias_ih": rng.uniform(-0.3, 0.3, G * H), "bias_hh": rng.uniform(-0.3, 0.3, G * H)}
    x = round_to_storage(rng.standard_normal((T, B, I)), dtype)
    h0 = round_to_storage(0.5 * rng.standard_normal((1, B, H)), dtype)
    c0 = 0.5 * rng.standard_normal((1, B, H)) if spec.has_cell_state else None
    _, _, _, cache = reference.forward(cell, [p], x, h0, c0, dtype=dtype)
    dy = rng.standard_normal((T, B, H)).astype(np.float32).astype(np.float64)
    dhn = rng.standard_normal((1, B, H)).astype(np.float32).astype(np.float64)
    dcn = (rng.standard_normal((1, B, H)).astype(np.float32).astype(np.float64)
           if spec.has_cell_state else None)
    g = reference.backward(cell, [p], cache, dy, dhn, dcn, dtype=dtype)
    lc = cache.layers[0]
    data = dict(dhin=dy, dh_n=dhn[0], dc_n=None if dcn is None else dcn[0], act=lc.gates,
                st=lc.c if spec.has_cell_state else lc.h, R=p["weight_hh"], x=x,
                W=p["weight_ih"], h=lc.h)
    ref = dict(dx=g["dx"], dh0=g["dh0"][0], dc0=None if g["dc0"] is None else g["dc0"][0],
               **g["params"][0])
    return data, ref


def run_sim(exe, work, cell, fit, data, dtype, launches=2):
    """The kernel on CPU threads over ``fit``'s cut -> {"dgx" [T, B, G*H], "dgh" (GRU),
    "dh0", "dc0" (LSTM)}."""
    spec = get_cell(cell)
    G, B, H = spec.gates, fit.batch, fit.hidden
    T = data["dhin"].shape[0]
    empty = np.zeros(0)
    arrays = dict(dhin=data["dhin"], dhn=data["dh_n"],
                  dcn=data["dc_n"] if spec.has_cell_state else empty,
                  act=data["act"] if spec.saved_gates else empty, st=data["st"], w=data["R"])
    for name, a in arrays.items():
        np.ascontiguousarray(a, np.float32).tofile(work / f"{name}.f32")
    args = [exe, cell, B, H, T, fit.units_per_block, fit.blocks, fit.threads, fit.smem_bytes,
            launches, work, fit.k_tile, TS[dtype]]
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"host simulation failed ({r.returncode}):\n{r.stderr}"
    out = {n: np.fromfile(work / f"{n}.out", np.float32) for n in ("dgx", "dgh", "dh0", "dc0")}
    return {"dgx": out["dgx"].reshape(T, B, G * H),
            "dgh": out["dgh"].reshape(T, B, G * H) if spec.name == "gru" else None,
            "dh0": out["dh0"].reshape(B, H),
            "dc0": out["dc0"].reshape(B, H) if spec.has_cell_state else None}


def check_against_reference(out, data, ref, dtype, what):
    """dh0, dc0 and the gradients the dg give against the rounding-aware reference, within
    the precision's tolerance (the weight gradients' absolute part grows with the T*B terms
    they sum, reduction_atol); no output element left NaN."""
    p = get_precision(dtype)
    T, B, _ = data["dhin"].shape
    for name in ("dgx", "dgh", "dh0", "dc0"):
        if out[name] is not None:
            assert not np.isnan(out[name]).any(), f"{what}: {name} has unwritten elements"
    assert_close(out["dh0"], ref["dh0"], p.atol, p.rtol, name=f"{what} dh0")
    if ref["dc0"] is not None:
        assert_close(out["dc0"], ref["dc0"], p.atol, p.rtol, name=f"{what} dc0")
    got = bwd_gradients(data, out["dgx"], out["dgh"])
    assert_close(got["dx"], ref["dx"], p.atol, p.rtol, name=f"{what} dx")
    for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
        assert_close(got[name], ref[name], reduction_atol(T * B, p.atol), p.rtol,
                     name=f"{what} {name}")


# (H, B, T, U, threads, k_tile): LSTM K 160 in one tile, 4 warps of 10 chunks (halves of 20
# columns: masked k16 steps), two cells a thread; U 34 (3 m16 tiles: 2 groups of register
# tiles, a last block of 6 units) and k_tile 16 (several tiles, a warp one chunk of each);
# H 64 k_tile 64 with 2 warps: whole k16 steps (CPW 8), several tiles for G > 1
SIM_CASES = [(40, 9, 3, 5, 128, None), (40, 9, 2, 34, 256, 16), (64, 5, 2, 8, 64, 64)]
RUNS = alternating_runs(SIM_CASES, TS)


@pytest.mark.parametrize("case, cell, dtype", RUNS,
                         ids=[f"H{c[0]}B{c[1]}U{c[3]}-{cell}-{d}" for c, cell, d in RUNS])
def test_mma_bwd_kernel_on_cpu_threads(host_sim, tmp_path, case, cell, dtype):
    H, B, T, U, threads, k_tile = case
    fit = MB.mma_bwd_geometry(cell, H, B, U, threads, k_tile)
    assert fit.ok, fit.reason
    data, ref = mma_bwd_case(cell, T, B, H, dtype)
    out = run_sim(host_sim, tmp_path, cell, fit, data, dtype)
    what = f"{cell} {dtype} H{H} B{B} U{U} sim"
    check_against_reference(out, data, ref, dtype, what)
    # the twin (float32, the kernel's cut; the tensor core's order inside a k16 step aside)
    p = get_precision(dtype)
    f32 = {k: None if v is None else np.asarray(v, np.float32) for k, v in data.items()}
    emu = emulate_bwd(cell, fit, f32["dhin"], f32["dh_n"], f32["R"], f32["act"], f32["st"],
                      f32["dc_n"], dtype=dtype)
    for name in ("dgx", "dgh", "dh0", "dc0"):
        if emu[name] is not None:
            assert_close(out[name], emu[name], p.atol, p.rtol, name=f"{what} {name} vs twin")


def test_sim_cases_cover_the_paths():
    seen = {(MB.mma_bwd_geometry(c, H, B, U, t, k).tile_groups > 1,
             MB.mma_bwd_geometry(c, H, B, U, t, k).tiles > 1,
             MB.mma_bwd_geometry(c, H, B, U, t, k).whole_steps,
             MB.mma_bwd_geometry(c, H, B, U, t, k).cells_per_thread)
            for H, B, T, U, t, k in SIM_CASES for c in CELLS}
    assert {g for g, _, _, _ in seen} == {False, True}
    assert {n for _, n, _, _ in seen} == {False, True}
    assert {w for _, _, w, _ in seen} == {False, True}
    assert {c for _, _, _, c in seen} == {1, 2}


def test_a_wrong_fragment_layout_is_refused(tmp_path_factory, tmp_path):
    """b0 and b1 swapped in the B fragment (the dg tile's columns 2c.. and 2c+8.. of a k16
    step: one register holds what the other should): the emulated mma multiplies the wrong
    elements, and the result is refused."""
    exe = build(tmp_path_factory, swapped_fragment(tmp_path_factory, "b[nt][0]", "b[nt][1]"))
    H, B, T, U, threads, k_tile = SIM_CASES[2]   # whole k16 steps: columns 2c+8.. live
    fit = MB.mma_bwd_geometry("gru", H, B, U, threads, k_tile)
    assert fit.whole_steps
    data, ref = mma_bwd_case("gru", T, B, H, "bfloat16")
    out = run_sim(exe, tmp_path, "gru", fit, data, "bfloat16")
    with pytest.raises(AssertionError, match="MISMATCH"):
        check_against_reference(out, data, ref, "bfloat16", "planted")
