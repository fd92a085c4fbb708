"""The register-resident cluster kernels' .cu itself on CPU threads
(tests/kernels/persistent_host_sim.cpp built with PK_SIM_REGS: warp shuffles through a
per-warp exchange buffer between warp barriers, the cluster barrier a std::barrier, the pushes
real stores into the other blocks' shared memory), without a GPU: equals the float64
reference and the emulation for every cell over the kernel's (UW, BB) bodies, one and several
clusters, a last cluster with fewer batches and a block without units; ThreadSanitizer finds
no race, and finds the one a removed cluster barrier leaves; a butterfly partner off by one
and a gather from the wrong lane give wrong results, which the check catches; a launch whose
geometry disagrees with the arguments traps.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from test_kernels_persistent_sim import run_host_sim
from testkit import CELLS, build_host_sim, layer_case

from rnnrt.check import FP32_ATOL, FP32_RTOL, assert_close
from rnnrt.kernels import regs as RG
from rnnrt.kernels import sources as S
from rnnrt.kernels.emulate_regs import emulate_regs

DEFINE = "PK_SIM_REGS"


@pytest.fixture(scope="module")
def regs_sim(tmp_path_factory):
    exe = tmp_path_factory.mktemp("regs_sim") / "regs_host_sim"
    return build_host_sim(exe, S.cuda_src_dir() / "persistent_regs.cu", define=DEFINE)


def _check(cell, fit, out, data, ref, emu_tol=1e-5):
    (h, c, act), raw, sent, loads = out
    emu = emulate_regs(cell, fit, **data)
    for name, got, r64, e32 in (("h", h, ref["h"], emu[0]), ("c", c, ref["c"], emu[1]),
                                ("act", act, ref["act"], emu[2])):
        if r64 is None or got is None:
            continue
        assert_close(got, r64, FP32_ATOL, FP32_RTOL, name=f"{cell} {name} vs reference")
        assert_close(got, e32, emu_tol, emu_tol, name=f"{cell} {name} vs emulation")
    B, H = fit.batch, fit.hidden
    np.testing.assert_array_equal(raw["h"][:B], sent["h"][:B], err_msg="h0 changed")
    assert np.isnan(raw["h"][:, H:]).all(), "h padding written"
    assert loads == {"ldcg128": 0, "ldcg32": 0}, loads


# (H, B, T, threads, clusters): UW 2 / BB 4 (LSTM, GRU: 8 and 6 rows of values), 2 clusters
# of 7 and 6 batches, lanes past H 37 zeros; UW 2 BB 2, 2 clusters of 2 and 1, rank 7 without
# units (U 3); UW 1 BB 8 (one unit a warp, 2 warps) in one cluster of 8; H 8 B 40: U 1,
# UW 1, BB 8, 5 groups in rounds of 4: two pointwise cells a lane (RNN: UW 2 BB 8, NR 2)
SIM_CASES = [(37, 13, 3, 128, 2), (20, 3, 2, 64, 2), (16, 8, 3, 64, 1), (8, 40, 2, 32, 1)]


def test_sim_cases_cover_the_bodies_and_the_cuts():
    seen = {"uw": set(), "bb": set(), "cpl": set(), "idle_rank": set(), "short_last": set(),
            "several": set()}
    for H, B, T, threads, clusters in SIM_CASES:
        for cell in CELLS:
            f = RG.regs_geometry(cell, H, B, threads, clusters)
            assert f.ok, (cell, H, B, f.reason)
            seen["uw"].add(f.units_per_warp)
            seen["bb"].add(f.batch_group)
            seen["cpl"].add(f.cells_per_thread)
            seen["idle_rank"].add(any(len(f.units(x)) == 0 for x in range(f.blocks)))
            seen["short_last"].add(len(f.batches(f.blocks - 1)) < f.batch_per_block)
            seen["several"].add(f.clusters > 1)
    assert seen == {"uw": {1, 2}, "bb": {2, 4, 8}, "cpl": {1, 2}, "idle_rank": {False, True},
                    "short_last": {False, True}, "several": {False, True}}, seen


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("H, B, T, threads, clusters", SIM_CASES)
def test_regs_kernel_source_on_cpu_threads(regs_sim, tmp_path, cell, H, B, T, threads,
                                           clusters):
    """Launched twice (outputs re-poisoned): equals the float64 reference (fp32 tolerance)
    and the float32 emulation, leaves h0 and the padding, loads nothing through staging."""
    fit = RG.regs_geometry(cell, H, B, threads, clusters)
    data, ref = layer_case(cell, T, B, H, dtype=np.float32)
    out = run_host_sim(regs_sim, tmp_path, cell, fit, data, T)
    _check(cell, fit, out, data, ref)


def _broken(tmp_path, name, old, new, tsan=False):
    text = S.source("persistent_regs.cu")
    assert text.count(old) == 1, old
    src = tmp_path / f"persistent_regs_{name}.cu"
    src.write_text(text.replace(old, new, 1))
    return build_host_sim(tmp_path / f"sim_{name}", src, tsan=tsan, define=DEFINE)


def test_cluster_protocol_has_no_data_race(tmp_path):
    """ThreadSanitizer: the pushes of h_{t+1} into the other blocks' buffers, their reads next
    step and the shuffles' exchange are ordered (no report); without the cluster barrier
    between steps (its arrive and its wait) it reports a data race."""
    exe = build_host_sim(tmp_path / "sim_tsan", S.cuda_src_dir() / "persistent_regs.cu",
                         tsan=True, define=DEFINE)
    fit = RG.regs_geometry("lstm", 20, 5, 64, 1)   # one cluster: its blocks push to each other
    data, ref = layer_case("lstm", 3, 5, 20, dtype=np.float32)
    (tmp_path / "ok").mkdir()
    (h, _, _), _, _, _ = run_host_sim(exe, tmp_path / "ok", "lstm", fit, data, 3, launches=1)
    assert_close(h, ref["h"], FP32_ATOL, FP32_RTOL, name="lstm h under TSan")
    text = S.source("persistent_regs.cu")
    for line in ("\n            pk_cluster_arrive();\n", "\n            pk_cluster_wait();\n"):
        assert text.count(line) == 1, line   # this kernel's (the cluster kernel's indent more)
        text = text.replace(line, "\n", 1)
    src = tmp_path / "persistent_regs_no_barrier.cu"
    src.write_text(text)
    exe = build_host_sim(tmp_path / "sim_tsan_broken", src, tsan=True, define=DEFINE)
    (tmp_path / "broken").mkdir()
    with pytest.raises(AssertionError, match="ThreadSanitizer: data race"):
        run_host_sim(exe, tmp_path / "broken", "lstm", fit, data, 3, launches=1)


@pytest.mark.parametrize("fault, old, new", [
    ("butterfly_partner", "v[i] = keep + __shfl_xor_sync(0xffffffffu, send, MASK);",
     "v[i] = keep + __shfl_xor_sync(0xffffffffu, send, MASK ^ 1);"),
    ("gather_lane", "src[q] = ((q * UW + cu) * BB + cbb) << SH;",
     "src[q] = (((q * UW + cu) * BB + cbb) << SH) + (1 << SH);"),
])
def test_a_planted_shuffle_fault_is_caught(tmp_path, fault, old, new):
    """The same source with a butterfly partner off by one lane, or each gate gathered from
    the next value's lane, runs to the end and gives results the reference check refuses."""
    exe = _broken(tmp_path, fault, old, new)
    fit = RG.regs_geometry("gru", 16, 8, 64, 1)
    data, ref = layer_case("gru", 2, 8, 16, dtype=np.float32)
    out = run_host_sim(exe, tmp_path, "gru", fit, data, 2, launches=1)
    with pytest.raises(AssertionError, match="vs reference"):
        _check("gru", fit, out, data, ref)


@pytest.mark.parametrize("broken", ["none", "k_tile", "units", "smem", "uw"])
def test_kernel_traps_on_a_geometry_that_disagrees(regs_sim, tmp_path, broken):
    """k_tile other than RG_K, units that do not cover H, less shared memory than two h
    buffers, more than two units a warp: a trap at once, not garbage."""
    fit = RG.regs_geometry("lstm", 20, 3, 64, 2)
    bad = {"none": fit, "k_tile": replace(fit, k_tile=64),
           "units": replace(fit, units_per_block=2),
           "smem": replace(fit, smem_tile=fit.smem_tile - 4),
           "uw": replace(fit, threads=32)}[broken]            # 3 units on one warp
    data, ref = layer_case("lstm", 2, 3, 20, dtype=np.float32)
    if broken == "none":
        (h, _, _), _, _, _ = run_host_sim(regs_sim, tmp_path, "lstm", bad, data, 2, launches=1)
        assert_close(h, ref["h"], FP32_ATOL, FP32_RTOL, name="the good launch")
        return
    with pytest.raises(AssertionError, match=r"__trap\(\)"):
        run_host_sim(regs_sim, tmp_path, "lstm", bad, data, 2, launches=1)
