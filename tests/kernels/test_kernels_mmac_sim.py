"""The tensor-core cluster kernels' .cu itself (cuda_src/persistent_mmac.cu, bf16 and fp16) on
CPU threads (tests/kernels/persistent_host_sim.cpp, PK_SIM_MMAC: the tensor-core main with
clusters of 8 blocks, mma.sync emulated over the warp's exchange buffer by the PTX ISA's
fragment layout, the pushes into the cluster's blocks and its barrier as the other cluster
kernels' sims run them; PK_SIM_MMAC16: the kernels of clusters of 16; PK_SIM_MMACG: their
grid form, persistent_mmag.cu, its grid barrier and its staging of h_t from global memory as
the grid kernels' sims run them), without a GPU. Every cell x {bfloat16, float16} (both
precisions in each form's first case, alternating after it: testkit.alternating_runs) equals
the float64 rounding-aware reference within the precision's tolerance (not bit-exactly: the
tensor core's summation order), at clusters of 8 and of 16, one and several clusters (the
last one short), one and several parts of the k16 steps, a hidden size that is not whole k16
steps and one whose last block owns fewer units (or none); the grid form at one to four n8
tiles, in pairs (clusters of 2) staging h_t by multicast bulk copies on the sim's model of
the mbarrier, and by 2-byte loads, its counters back at zero after each launch; outputs
poisoned before each of two launches, h0 left as it was. A kernel whose A fragment reads rows
g and g + 8 the wrong way round is refused, and so are a grid form that stages h_{t-1} in
place of h_t (either staging), a pair whose copies land in one block only (its wait traps)
and a wide form whose two h buffers overlap.
"""
from __future__ import annotations

import re
import shutil

import numpy as np
import pytest
from test_kernels_mma_sim import check_outputs, mma_case, run_sim

from rnnrt.kernels import mmac as MC
from rnnrt.kernels import sources as S
from testkit import CELLS, alternating_runs, build_host_sim


WIDE = "w"   # the host_sim key of the wide form (clusters of 8, several n8 tiles)


def build(tmp_path_factory, src_dir, cluster=8):
    define = {8: "PK_SIM_MMAC", MC.GRID_FORM: "PK_SIM_MMACG", WIDE: "PK_SIM_MMACW"}.get(
        cluster, f"PK_SIM_MMAC{cluster}")
    exe = tmp_path_factory.mktemp("simmmac") / f"persistent_host_sim_{define.lower()}"
    file = {MC.GRID_FORM: "persistent_mmag.cu", WIDE: "persistent_mmacw.cu"}.get(
        cluster, "persistent_mmac.cu")
    return build_host_sim(exe, src_dir / file, define=define)


def build_planted(tmp_path_factory, tag, good, bad, cluster=8):
    """The sim of ``cluster``'s form built from a copy of cuda_src whose persistent_mmac.cuh
    has ``good`` (found exactly once) replaced by ``bad``: a planted fault."""
    folder = tmp_path_factory.mktemp(tag)
    for f in S.cuda_src_dir().iterdir():
        shutil.copy(f, folder / f.name)
    path = folder / "persistent_mmac.cuh"
    text = path.read_text()
    assert text.count(good) == 1, good
    path.write_text(text.replace(good, bad))
    return build(tmp_path_factory, folder, cluster)


@pytest.fixture(scope="module")
def host_sim(tmp_path_factory):
    return {cn: build(tmp_path_factory, S.cuda_src_dir(), cn) for cn in MC.MMAC_FORMS + (WIDE,)}


# (H, B, T, k_parts, cluster): H 40 (U 5: the last block 5 units, 3 k16 steps, the last
# partly past H) B 5 one cluster, 2 parts; H 30 (U 4, the last block owns 2) B 11: two
# clusters of 6 and 5 batches, 1 part; H 64 B 8, 4 parts of 4 whole k16 steps; clusters of
# 16: H 40 (U 3, the last two blocks own 1 and none) B 9 (two clusters of 5 and 4), 2 parts;
# H 72 one part of 5 k16 steps: PK_MMAC_UNROLL steps loaded together, then the rest
SIM_CASES = [(40, 5, 3, 2, 8), (30, 11, 3, 1, 8), (64, 8, 2, 4, 8), (40, 9, 2, 2, 16),
             (72, 6, 2, 1, 8)]


SIM_RUNS = alternating_runs(SIM_CASES, MC.MMA_DTYPES)


@pytest.mark.parametrize("case, cell, dtype", SIM_RUNS,
                         ids=[f"H{c[0]}B{c[1]}P{c[3]}C{c[4]}-{cell}-{d}"
                              for c, cell, d in SIM_RUNS])
def test_mmac_kernel_on_cpu_threads(host_sim, tmp_path, case, cell, dtype):
    H, B, T, k_parts, cluster = case
    fit = MC.mmac_layout(cell, H, B, k_parts, cluster=cluster)
    assert fit.ok, fit.reason
    data, ref = mma_case(cell, T, B, H, dtype, seed=3)
    got = run_sim(host_sim[cluster], tmp_path, cell, fit, data, T, dtype)
    check_outputs(cell, dtype, got, ref, f"{cell} {dtype} H{H} B{B} parts {k_parts} sim")
    assert np.array_equal(got[0][0], data["h0"].astype(np.float32)), "h0 changed"


@pytest.mark.parametrize("cell", ["gru", "rnn_tanh"])
def test_steps_past_the_registers_come_from_shared_memory(host_sim, tmp_path, cell):
    """H 528: one part of 33 k16 steps, PK_MMAC_KR held in registers, the last from the
    R slice in shared memory (clusters of 16)."""
    H, B, T = 528, 3, 2
    fit = MC.mmac_layout(cell, H, B, 1, cluster=16)
    assert fit.ok and len(fit.part_steps(0)) > MC.MMAC_KR, fit.describe()
    data, ref = mma_case(cell, T, B, H, "bfloat16", seed=4)
    got = run_sim(host_sim[16], tmp_path, cell, fit, data, T, "bfloat16")
    check_outputs(cell, "bfloat16", got, ref, f"{cell} H{H} sim")


# the grid form (H, B, T, U, k_parts): H 40 U 3 (14 blocks, the last owns 1) B 5, one n8 tile,
# 2 parts, multicast staging; H 30 U 4 B 27 (four n8 tiles, the last 3 batches), 2 parts,
# 2-byte staging (H % 8 != 0); H 64 U 8 B 20 (three tiles), 4 parts; H 360 U 5: one part of
# 23 k16 steps, PK_MMAG_KR in registers, the other 7 from shared memory (an unrolled group
# of PK_MMAC_UNROLL, a pair, a last one), B 11 (two tiles; 72 blocks: H 528 U 2 covered the
# same with 264 blocks, 75 s a cell in CI); H 40 U 8: 5 blocks of units and a sixth that
# owns none (whole pairs), B 9, 2 parts
GRID_CASES = [(40, 5, 3, 3, 2), (30, 27, 3, 4, 2), (64, 20, 2, 8, 4), (360, 11, 2, 5, 1),
              (40, 9, 2, 8, 2)]


# the long case (H 360) once a cell family (GRU: 3 gates, RNN: 1)
GRID_RUNS = [r for r in alternating_runs(GRID_CASES, MC.MMA_DTYPES)
             if r[0][0] != 360 or r[1] in ("gru", "rnn_tanh")]


@pytest.mark.parametrize("case, cell, dtype", GRID_RUNS,
                         ids=[f"H{c[0]}B{c[1]}U{c[3]}-{cell}-{d}" for c, cell, d in GRID_RUNS])
def test_grid_form_on_cpu_threads(host_sim, tmp_path, case, cell, dtype):
    H, B, T, U, k_parts = case
    fit = MC.mmac_layout(cell, H, B, k_parts, cluster=MC.GRID_FORM, units_per_block=U)
    assert fit.ok, fit.reason
    data, ref = mma_case(cell, T, B, H, dtype, seed=5)
    got = run_sim(host_sim[MC.GRID_FORM], tmp_path, cell, fit, data, T, dtype)
    check_outputs(cell, dtype, got, ref, f"{cell} {dtype} H{H} B{B} grid form sim")
    assert np.array_equal(got[0][0], data["h0"].astype(np.float32)), "h0 changed"


def test_every_cell_meets_every_dtype_in_each_form():
    """alternating_runs halves the runs; each form still has every (cell, dtype) pair, most
    of them at several shapes."""
    full = {(c, d) for c in CELLS for d in MC.MMA_DTYPES}
    for runs in (SIM_RUNS, GRID_RUNS, WIDE_RUNS):
        assert {(c, d) for _, c, d in runs} == full
    assert len(SIM_RUNS) == len(CELLS) * (len(MC.MMA_DTYPES) + len(SIM_CASES) - 1)


def test_grid_cases_cover_the_paths():
    fits = [MC.mmac_layout(c, H, B, k, cluster=MC.GRID_FORM, units_per_block=U)
            for H, B, _, U, k in GRID_CASES for c in CELLS]
    assert {MC.ceil_div(f.batch, 8) for f in fits} == set(range(1, MC.MMAG_NT + 1))
    assert {f.hidden % 8 == 0 for f in fits} == {False, True}
    assert {f.k_parts > 1 for f in fits} == {False, True}
    assert any(len(f.part_steps(0)) > MC.MMAG_KR for f in fits)
    assert any(f.blocks * f.units_per_block > f.hidden for f in fits)
    assert any(f.blocks > MC.ceil_div(f.hidden, f.units_per_block) for f in fits)   # a pair
    assert all(f.blocks % MC.MMAG_CLUSTER == 0 for f in fits)                      # rounds up


@pytest.mark.parametrize("H, staging", [(64, "mmag_stage_mc"), (60, "mmag_stage")],
                         ids=["multicast", "2-byte"])
def test_grid_form_staging_another_step_is_refused(tmp_path_factory, tmp_path, H, staging):
    """The sim can fail the grid form's exchange: a kernel that stages h_{t-1} from global
    memory in place of h_t gives wrong sums, by the pairs' multicast copies (rows 16-byte
    aligned) and by the 2-byte loads (H % 8 != 0)."""
    exe = build_planted(tmp_path_factory, f"bad_{staging}",
                        f"{staging}(hs, g.SRH, h + (long long)t * S * ldh,",
                        f"{staging}(hs, g.SRH, h + (long long)(t > 0 ? t - 1 : 0) * S * ldh,",
                        MC.GRID_FORM)
    B, T, U = 8, 4, 2
    fit = MC.mmac_layout("rnn_tanh", H, B, 1, cluster=MC.GRID_FORM, units_per_block=U)
    data, ref = mma_case("rnn_tanh", T, B, H, "bfloat16", seed=6)
    got = run_sim(exe, tmp_path, "rnn_tanh", fit, data, T, "bfloat16")
    with pytest.raises(AssertionError):
        check_outputs("rnn_tanh", "bfloat16", got, ref, "h_{t-1} staged")


def test_grid_form_multicast_to_one_block_never_completes(tmp_path_factory, tmp_path,
                                                          monkeypatch):
    """A pair whose copies land only in the issuing block: each block's barrier expects all
    B rows, gets half, and its wait traps (the sim models the mbarrier's phases and byte
    counts, not a wait that always passes)."""
    exe = build_planted(tmp_path_factory, "bad_mask",
                        "(unsigned short)((1u << PK_MMAG_CLUSTER) - 1u));",
                        "(unsigned short)(1u << rank));", MC.GRID_FORM)
    monkeypatch.setenv("PK_SIM_MBAR_WAIT_S", "2")
    H, B, T, U = 64, 8, 2, 8
    fit = MC.mmac_layout("rnn_tanh", H, B, 1, cluster=MC.GRID_FORM, units_per_block=U)
    data, _ = mma_case("rnn_tanh", T, B, H, "bfloat16", seed=6)
    with pytest.raises(AssertionError, match="never completed"):
        run_sim(exe, tmp_path, "rnn_tanh", fit, data, T, "bfloat16")


# the wide form (H, B, T, k_parts, clusters): H 40 B 20 one cluster of three n8 tiles (the last
# 4 batches), 2 parts; H 30 B 27 two clusters of 14 and 13 batches (two tiles each), 1 part;
# H 64 B 32 one cluster of four whole tiles, 4 parts; H 48 B 25 four tiles, the last one
# batch, 3 parts of one k16 step; H 264 B 11: one part of 17 k16 steps, PK_MMAG_KR in
# registers, the last from shared memory (GRU only: LSTM's 9 m16 tiles exceed the launch
# bound, and an RNN's 3 tiles have too few threads for the cells)
WIDE_CASES = [(40, 20, 3, 2, 1), (30, 27, 3, 1, 2), (64, 32, 2, 4, 1), (48, 25, 2, 3, 1),
              (264, 11, 2, 1, 1)]


# the long case (H 264) for GRU only (see WIDE_CASES)
WIDE_RUNS = [r for r in alternating_runs(WIDE_CASES, MC.MMA_DTYPES)
             if r[0][0] != 264 or r[1] == "gru"]


@pytest.mark.parametrize("case, cell, dtype", WIDE_RUNS,
                         ids=[f"H{c[0]}B{c[1]}N{c[4]}-{cell}-{d}" for c, cell, d in WIDE_RUNS])
def test_wide_form_on_cpu_threads(host_sim, tmp_path, case, cell, dtype):
    H, B, T, k_parts, clusters = case
    fit = MC.mmac_layout(cell, H, B, k_parts, clusters=clusters)
    assert fit.ok and fit.wide and fit.kernel.endswith("_mmacw_fwd"), fit.describe()
    data, ref = mma_case(cell, T, B, H, dtype, seed=7)
    got = run_sim(host_sim[WIDE], tmp_path, cell, fit, data, T, dtype)
    check_outputs(cell, dtype, got, ref, f"{cell} {dtype} H{H} B{B} wide form sim")
    assert np.array_equal(got[0][0], data["h0"].astype(np.float32)), "h0 changed"


def test_wide_cases_cover_the_paths():
    fits = [MC.mmac_layout(c, H, B, k, clusters=n) for H, B, _, k, n in WIDE_CASES
            for c in CELLS]
    fits = [f for f in fits if f.ok]
    assert {f.n_tiles for f in fits} == set(range(2, MC.MMAC_WNT + 1))
    assert {f.clusters > 1 for f in fits} == {False, True}
    assert {f.k_parts > 1 for f in fits} == {False, True}
    assert any(f.batch_per_block % 8 for f in fits)
    assert any(f.batch % f.clusters for f in fits)
    assert any(len(f.part_steps(0)) > MC.MMAG_KR for f in fits)


def test_a_wide_form_reading_the_wrong_buffer_is_refused(tmp_path_factory, tmp_path):
    """The sim can fail the wide form's exchange: a kernel whose buffers are one n8 tile apart
    (the one-tile kernels' stride) reads batches of the other buffer."""
    exe = build_planted(tmp_path_factory, "bad_mmacw",
                        "TS* const hnext = hs + ((t + 1) & 1) * 8 * g.NT * g.SRH;",
                        "TS* const hnext = hs + ((t + 1) & 1) * 8 * g.SRH;", WIDE)
    H, B, T = 40, 20, 3
    fit = MC.mmac_layout("gru", H, B, 2, clusters=1)
    assert fit.ok and fit.n_tiles == 3, fit.describe()
    data, ref = mma_case("gru", T, B, H, "bfloat16", seed=8)
    got = run_sim(exe, tmp_path, "gru", fit, data, T, "bfloat16")
    with pytest.raises(AssertionError):
        check_outputs("gru", "bfloat16", got, ref, "buffers one tile apart")


def test_sim_cases_cover_the_paths():
    fits = [MC.mmac_layout(c, H, B, k, cluster=cn) for H, B, _, k, cn in SIM_CASES
            for c in CELLS]
    assert {f.clusters > 1 for f in fits} == {False, True}
    assert {f.k_parts > 1 for f in fits} == {False, True}
    assert {f.hidden % 16 == 0 for f in fits} == {False, True}
    assert {f.cluster for f in fits} == set(MC.MMAC_CLUSTERS)
    assert any(f.hidden % f.units_per_block for f in fits)
    assert any(f.batch % f.clusters for f in fits)
    assert any(f.cluster * f.units_per_block - f.hidden >= f.units_per_block for f in fits)
    unroll = int(re.search(r"#define PK_MMAC_UNROLL (\d+)", S.source("persistent_mmac.cu"))[1])
    assert any(len(f.part_steps(0)) > unroll and len(f.part_steps(0)) % 2 for f in fits)


def test_a_fragment_with_its_rows_swapped_is_refused(tmp_path_factory, tmp_path):
    """The sim can fail: rows g and g + 8 of the A fragment exchanged give wrong sums."""
    exe = build_planted(tmp_path_factory, "bad_mmac",
                        "ar[u][0] = in ? pk_ld_pair(a_lo + k) : 0u;\n"
                        "        ar[u][1] = in ? pk_ld_pair(a_hi + k) : 0u;",
                        "ar[u][0] = in ? pk_ld_pair(a_hi + k) : 0u;\n"
                        "        ar[u][1] = in ? pk_ld_pair(a_lo + k) : 0u;")
    H, B, T = 40, 5, 3
    fit = MC.mmac_layout("lstm", H, B, 2)
    data, ref = mma_case("lstm", T, B, H, "bfloat16", seed=3)
    got = run_sim(exe, tmp_path, "lstm", fit, data, T, "bfloat16")
    with pytest.raises(AssertionError):
        check_outputs("lstm", "bfloat16", got, ref, "swapped rows")
