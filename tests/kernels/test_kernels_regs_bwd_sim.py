"""The register-resident cluster backward kernels' .cu itself on CPU threads
(tests/kernels/persistent_host_sim.cpp built with PK_SIM_REGS_BWD: the backward main with
persistent_regs_bwd.cu's kernels; warp shuffles through a per-warp exchange buffer between
warp barriers, the cluster barrier a std::barrier, the pushes real stores into the other
blocks' shared memory), without a GPU: launched twice with every output poisoned, equals the
float64 reference (dh0, dc0, and dx and every weight and bias gradient the written dg give)
and the float32 emulation over the kernel's (UW, BB) bodies, one and several clusters, a last
cluster with fewer batches, a block without units, two cells a lane; a chunked run (the
plan's launches along the reverse wavefront) equals one launch bit for bit; ThreadSanitizer
finds no race; a cell read from the wrong group gives wrong results the check catches; a
launch whose geometry disagrees with its arguments traps.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from test_kernels_persistent_bwd_sim import check_sim, run_bwd_sim
from testkit import CELLS, build_host_sim, bwd_layer_case, check_bwd_against_reference

from rnnrt.kernels import regs_bwd as RB
from rnnrt.kernels import sources as S
from rnnrt.kernels.emulate_regs import emulate_regs_bwd

DEFINE = "PK_SIM_REGS_BWD"
FILE = "persistent_regs_bwd.cu"


@pytest.fixture(scope="module")
def rbwd_sim(tmp_path_factory):
    exe = tmp_path_factory.mktemp("regs_bwd_sim") / "regs_bwd_host_sim"
    return build_host_sim(exe, S.cuda_src_dir() / FILE, define=DEFINE)


def emulated(cell, fit, data):
    return emulate_regs_bwd(cell, fit, data["dhin"], data["dh_n"], data["R"], data["act"],
                            data["st"], data["dc_n"])


def check(cell, fit, data, ref, out, raw, what):
    """The reference's gradients, the float32 emulation's dg (emulate_regs_bwd), no padding
    written (test_kernels_persistent_bwd_sim.check_sim)."""
    check_sim(cell, fit, data, ref, out, raw, what, emulate=emulated)


# (H, B, T, threads, clusters): U 5 on 3 warps (UW 2, the last warp's second unit dead), one
# cluster of 5 batches (BB 8), lanes past H 37 zeros; U 3 on 2 warps, 2 clusters of 2
# and 1 (BB 2, NR 8), rank 7 without units; UW 1 BB 8 in one cluster of 8; U 2 on one warp
# (UW 2, BB 8, NR 2) with 32 batches: two cells a lane
SIM_CASES = [(37, 5, 2, 96, 1), (20, 3, 2, 64, 2), (16, 8, 3, 64, 1), (16, 32, 2, 32, 1)]


def test_sim_cases_cover_the_bodies_and_the_cuts():
    seen = {"uw": set(), "bb": set(), "cpl": set(), "idle_rank": set(), "short_last": set(),
            "several": set()}
    for H, B, T, threads, clusters in SIM_CASES:
        for cell in CELLS:
            f = RB.regs_bwd_geometry(cell, H, B, threads, clusters)
            assert f.ok, (cell, H, B, f.reason)
            seen["uw"].add(f.units_per_warp)
            seen["bb"].add(f.batch_group)
            seen["cpl"].add(f.cells_per_thread)
            seen["idle_rank"].add(any(len(f.units(x)) == 0 for x in range(f.blocks)))
            seen["short_last"].add(len(f.batches(f.blocks - 1)) < f.batch_per_block)
            seen["several"].add(f.clusters > 1)
    assert seen == {"uw": {1, 2}, "bb": {2, 8}, "cpl": {1, 2}, "idle_rank": {False, True},
                    "short_last": {False, True}, "several": {False, True}}, seen


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("H, B, T, threads, clusters", SIM_CASES)
def test_regs_bwd_kernel_source_on_cpu_threads(rbwd_sim, tmp_path, cell, H, B, T, threads,
                                               clusters):
    """Launched twice (outputs re-poisoned): the reference's gradients (fp32 tolerance), the
    float32 emulation's dg, no padding written, nothing staged from L2."""
    fit = RB.regs_bwd_geometry(cell, H, B, threads, clusters)
    data, ref = bwd_layer_case(cell, T, B, H)
    out, raw, loads = run_bwd_sim(rbwd_sim, tmp_path, cell, fit, data, pad=3)
    check(cell, fit, data, ref, out, raw, f"{cell} H{H} B{B} {clusters} clusters")
    assert loads == {"ldcg128": 0, "ldcg32": 0}, loads


def _chunk(data, t0, t1, dh_n, dc_n):
    """The plan's view of steps [t0, t1) of a bwd_layer_case: dhin and act rows t0..t1, the
    state slots t0..t1 (inclusive), dh_n / dc_n the chunk after's dh0 / dc0."""
    out = dict(data, dhin=data["dhin"][t0:t1], st=data["st"][t0:t1 + 1], dh_n=dh_n,
               dc_n=dc_n)
    if data["act"] is not None:
        out["act"] = data["act"][t0:t1]
    return out


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_chunked_launches_equal_one_launch(rbwd_sim, tmp_path, cell):
    """The chain in launches of k steps, last chunk first (plan/backward_persistent.py: each
    chunk's dh0 / dc0 the next one's dh_n / dc_n): the same bits as one launch over all T
    (every sum's order is the step's own), and the reference's gradients."""
    H, B, T, k = 20, 5, 5, 2
    fit = RB.regs_bwd_geometry(cell, H, B, 64, 2)
    data, ref = bwd_layer_case(cell, T, B, H)
    (tmp_path / "one").mkdir()
    whole, _, _ = run_bwd_sim(rbwd_sim, tmp_path / "one", cell, fit, data, launches=1)
    dh_n, dc_n = data["dh_n"], data["dc_n"]
    parts = {}
    for t0 in reversed(range(0, T, k)):
        t1 = min(T, t0 + k)
        work = tmp_path / f"chunk{t0}"
        work.mkdir()
        out, _, _ = run_bwd_sim(rbwd_sim, work, cell, fit, _chunk(data, t0, t1, dh_n, dc_n),
                                launches=1)
        parts[t0] = out
        dh_n, dc_n = out["dh0"], out["dc0"]
    chunked = {"dh0": dh_n, "dc0": dc_n}
    for name in ("dgx", "dgh"):
        chunked[name] = (None if whole[name] is None else
                         np.concatenate([parts[t0][name] for t0 in sorted(parts)]))
    for name, v in whole.items():
        if v is None:
            assert chunked[name] is None
            continue
        np.testing.assert_array_equal(chunked[name], v, err_msg=f"{cell} chunked {name}")
    check_bwd_against_reference(chunked, data, ref, f"{cell} chunked")


def _broken(tmp_path, name, old, new, tsan=False):
    text = S.source(FILE)
    assert text.count(old) == 1, old
    src = tmp_path / f"persistent_regs_bwd_{name}.cu"
    src.write_text(text.replace(old, new, 1))
    return build_host_sim(tmp_path / f"sim_{name}", src, tsan=tsan, define=DEFINE)


def test_cluster_protocol_has_no_data_race(tmp_path):
    """ThreadSanitizer: the pushes of dg_t into the other blocks' buffers, their reads next
    step and the shuffles' exchange are ordered (no report). Without the cluster barrier at
    the end of each step (its arrive and its wait, "\n        pk_cluster_arrive();\n" and
    "\n        pk_cluster_wait();\n" removed) it reports a data race: planted once when this
    test was written (a second TSan build here would cost ~15 s of CI; the forward's
    test_kernels_regs_sim.py keeps that check on the same protocol)."""
    exe = build_host_sim(tmp_path / "sim_tsan", S.cuda_src_dir() / FILE, tsan=True,
                         define=DEFINE)
    fit = RB.regs_bwd_geometry("gru", 16, 3, 32, 1)   # one warp a block: UW 2, NR 8
    data, ref = bwd_layer_case("gru", 2, 3, 16)
    out, raw, _ = run_bwd_sim(exe, tmp_path, "gru", fit, data, launches=1)
    check("gru", fit, data, ref, out, raw, "gru under TSan")


@pytest.mark.parametrize("fault, old, new", [
    ("group_pick", "if (g2 == gi) v = sums[g2];", "if (g2 == (gi ^ 1)) v = sums[g2];"),
])
def test_a_planted_shuffle_fault_is_caught(tmp_path, fault, old, new):
    """The same source with each lane's dh_rec taken from the neighbouring group's sums runs
    to the end and gives results the reference check refuses. (The butterfly is the
    forward's, regs_common.cuh: test_kernels_regs_sim.py plants its fault.)"""
    exe = _broken(tmp_path, fault, old, new)
    fit = RB.regs_bwd_geometry("lstm", 20, 3, 64, 2)   # NR 8: groups 0 and 1 both exist
    data, ref = bwd_layer_case("lstm", 3, 3, 20)
    out, raw, _ = run_bwd_sim(exe, tmp_path, "lstm", fit, data, launches=1)
    with pytest.raises(AssertionError, match="MISMATCH"):
        check("lstm", fit, data, ref, out, raw, "planted fault")


@pytest.mark.parametrize("broken", ["none", "k_tile", "units", "smem", "uw"])
def test_kernel_traps_on_a_geometry_that_disagrees(rbwd_sim, tmp_path, broken):
    """k_tile other than RG_K, units that do not cover H, less shared memory than two dg
    buffers, more than two units a warp: a trap at once, not garbage."""
    fit = RB.regs_bwd_geometry("lstm", 20, 3, 64, 2)
    bad = {"none": fit, "k_tile": replace(fit, k_tile=64),
           "units": replace(fit, units_per_block=2),
           "smem": replace(fit, smem_tile=fit.smem_tile - 4),
           "uw": replace(fit, threads=32)}[broken]            # 3 units on one warp
    data, ref = bwd_layer_case("lstm", 2, 3, 20)
    if broken == "none":
        out, raw, _ = run_bwd_sim(rbwd_sim, tmp_path, "lstm", bad, data, launches=1)
        check("lstm", fit, data, ref, out, raw, "the good launch")
        return
    with pytest.raises(AssertionError, match=r"__trap\(\)"):
        run_bwd_sim(rbwd_sim, tmp_path, "lstm", bad, data, launches=1)
