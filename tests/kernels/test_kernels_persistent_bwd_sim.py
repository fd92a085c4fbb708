"""The persistent backward kernels' .cu itself on CPU threads
(tests/kernels/persistent_host_sim.cpp built with PK_SIM_BWD), without a GPU: every cell,
launched twice on one sync buffer with every output poisoned, equals the float64 reference
(dh0, dc0, and dx and every weight and bias gradient the written dg give) and the float32
emulation, writes no padding, stages dg with 16-byte loads exactly where it can, and leaves
the counters zero; the cases cover one tile and several, several output tiles a lane, two
cells a thread, one k-group a warp and an idle warp. Planted faults show the checks fail:
a dropped k-group (wrong sums, caught against the reference), and a grid barrier replaced by
a block barrier, or the cluster kernel's barrier removed (each caught by ThreadSanitizer as a
data race, while the kernels as written run race-free under it). The cluster kernels
likewise: one and several clusters, a short last cluster, a rank with no unit, several
output tiles a lane.
"""
from __future__ import annotations

import subprocess

import numpy as np
import pytest

from rnnrt.cells import get_cell
from rnnrt.kernels import emulate as E
from rnnrt.kernels import persistent_bwd as PB
from rnnrt.kernels import sources as S
from testkit import (CELLS, SIM_ENV, build_host_sim, bwd_layer_case, ceil,
                     check_bwd_against_reference, emulated)


@pytest.fixture(scope="module")
def bwd_sim(tmp_path_factory):
    """persistent_host_sim.cpp (PK_SIM_BWD) compiled with cuda_src/persistent_bwd.cu."""
    exe = tmp_path_factory.mktemp("sim") / "persistent_host_sim_bwd"
    return build_host_sim(exe, S.cuda_src_dir() / "persistent_bwd.cu", define="PK_SIM_BWD")


def run_bwd_sim(exe, tmp_path, cell, fit, data, launches=2, pad=3, dg_offset=0, cluster=None):
    """Lay one layer's backward out in padded float32 arrays (outputs NaN; every row padded
    by ``pad`` floats; dgx and dgh placed dg_offset floats past a 16-byte boundary), run the
    kernel on CPU threads ``launches`` times (``cluster``: the blocks a cluster, else
    ``fit.cluster``; the pair kernels' 2). -> ({"dgx" [T, B, G*H], "dgh" (GRU), "dh0",
    "dc0" (LSTM)}, the raw outputs (padding included), the staging loads {"ldcg128": n,
    "ldcg32": m})."""
    spec = get_cell(cell)
    G, B, H = spec.gates, fit.batch, fit.hidden
    T = data["dhin"].shape[0]
    ld = {"g": G * H + pad, "h": H + pad, "a": 4 * H + pad, "w": H + pad}

    def padded(a, width):
        out = np.full((a.shape[0], width), np.nan, np.float32)
        out[:, :a.shape[1]] = a
        return out

    def flat(a):
        return a.reshape(-1, a.shape[-1])

    gru, lstm = spec.name == "gru", spec.has_cell_state
    empty = np.zeros((0, 0), np.float32)
    arrays = {
        "dgx": np.full((T * B, ld["g"]), np.nan, np.float32),
        "dgh": np.full((T * B, ld["g"]), np.nan, np.float32) if gru else empty,
        "dh0": np.full((B, ld["h"]), np.nan, np.float32),
        "dc0": np.full((B, ld["h"]), np.nan, np.float32) if lstm else empty,
        "dhin": padded(flat(data["dhin"]), ld["h"]),
        "dhn": padded(data["dh_n"], ld["h"]),
        "dcn": padded(data["dc_n"], ld["h"]) if lstm else empty,
        "act": padded(flat(data["act"]), ld["a"]) if spec.saved_gates else empty,
        "st": padded(flat(data["st"]), ld["h"]),
        "w": padded(data["R"], ld["w"]),
    }
    for name, a in arrays.items():
        np.ascontiguousarray(a, np.float32).tofile(tmp_path / f"{name}.f32")
    args = [exe, cell, B, H, T, fit.units_per_block, fit.blocks, fit.threads, fit.smem_bytes,
            launches, tmp_path, ld["g"], ld["h"], ld["a"], ld["w"], fit.k_tile, dg_offset,
            fit.cluster if cluster is None else cluster]
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=600,
                       env=SIM_ENV)
    assert r.returncode == 0, f"host simulation failed ({r.returncode}):\n{r.stderr}"
    loads = dict(zip(r.stdout.split()[::2], map(int, r.stdout.split()[1::2])))
    raw = {name: np.fromfile(tmp_path / f"{name}.out", np.float32).reshape(arrays[name].shape)
           for name in ("dgx", "dgh", "dh0", "dc0")}
    out = {"dgx": raw["dgx"][:, :G * H].reshape(T, B, G * H),
           "dgh": raw["dgh"][:, :G * H].reshape(T, B, G * H) if gru else None,
           "dh0": raw["dh0"][:, :H], "dc0": raw["dc0"][:, :H] if lstm else None}
    return out, raw, loads


def check_sim(cell, fit, data, ref, out, raw, what, emulate=emulated):
    """The kernel's outputs against the float64 reference and the float32 emulation
    (``emulate(cell, fit, data)``: testkit.emulated, the k-group kernels'; the
    register-resident backward passes its own); the padding of every output row still NaN."""
    check_bwd_against_reference(out, data, ref, what)
    emu = emulate(cell, fit, data)
    for name in ("dgx", "dgh", "dh0", "dc0"):
        if emu[name] is None:
            assert out[name] is None
            continue
        np.testing.assert_allclose(out[name], emu[name], atol=1e-5, rtol=1e-5,
                                   err_msg=f"{what} {name} vs the emulation")
        width = out[name].shape[-1]
        assert np.isnan(raw[name][:, width:]).all(), f"{what}: {name} padding written"


# (H, B, T, U, threads, k_tile, pad): one tile (K = G*H), 4-byte staging (ld not a multiple
# of 4); several tiles, 16-byte staging; T = 1, two cells a thread, an idle warp (RNN: 5
# chunks, 4 warps of 2); U 70: two output tiles of rows a lane (LR 16), a last block of 5
# units; one k-group a warp (lanes 8 x 4 x 1), several tiles; B = 1
BWD_SIM_CASES = [(37, 3, 4, 5, 32, None, 3), (40, 5, 3, 6, 64, 12, 4),
                 (20, 33, 1, 7, 128, None, 4), (75, 3, 2, 70, 128, None, 4),
                 (40, 25, 2, 20, 256, 24, 4), (37, 1, 3, 7, 32, 8, 3)]


def test_sim_cases_cover_the_kernels_variants():
    """BWD_SIM_CASES run every path: one output tile a lane (sums kept in registers) and
    several, one cell a thread and PK_CPT, one k-group a warp and several, a warp with no
    chunk to stage, one tile and several, both staging paths, T = 1."""
    seen = {k: set() for k in ("out_tiles", "cpt", "lk1", "idle_warp", "tiles", "vec", "t1")}
    for H, B, T, U, threads, k_tile, pad in BWD_SIM_CASES:
        for cell in CELLS:
            f = PB.bwd_geometry(cell, H, B, U, threads, k_tile=k_tile)
            assert f.ok, f.reason
            lr, lb, lk = f.lanes
            seen["out_tiles"].add(ceil(f.rows, 4 * lr) * ceil(B, 8 * lb) > 1)
            seen["cpt"].add(f.cells_per_thread)
            seen["lk1"].add(lk == 1)
            seen["idle_warp"].add(any(all(len(E.k_columns(f, w * lk + i)) == 0
                                          for i in range(lk)) for w in range(f.warps)))
            seen["tiles"].add(f.tiles > 1)
            seen["vec"].add(pad % 4 == 0 and f.depth % 4 == 0)
            seen["t1"].add(T == 1)
    assert all(v == {False, True} for k, v in seen.items() if k != "cpt"), seen
    assert seen["cpt"] == {1, 2}, seen


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("H, B, T, U, threads, k_tile, pad", BWD_SIM_CASES)
def test_bwd_kernel_source_on_cpu_threads(bwd_sim, tmp_path, cell, H, B, T, U, threads, k_tile,
                                          pad):
    """The .cu on CPU threads, every block at once, launched twice with one sync buffer
    (the counters back at zero after each: checked inside): the reference's gradients, the
    emulation's dg, no padding written; dg staged with 16-byte loads exactly where every
    row of it is 16-byte aligned."""
    fit = PB.bwd_geometry(cell, H, B, U, threads, k_tile=k_tile)
    data, ref = bwd_layer_case(cell, T, B, H)
    out, raw, loads = run_bwd_sim(bwd_sim, tmp_path, cell, fit, data, pad=pad)
    check_sim(cell, fit, data, ref, out, raw, f"{cell} H{H} B{B} U{U}")
    if pad % 4 == 0 and fit.depth % 4 == 0:
        assert loads["ldcg128"] > 0 and loads["ldcg32"] == 0, loads
    else:
        assert loads["ldcg128"] == 0 and loads["ldcg32"] > 0, loads


# the cluster kernels: (H, B, T, threads, clusters, pad): 3 clusters of 7, 7 and 5 batches;
# one cluster of 8; 2 clusters of 2 and 1 with rank 7 owning no unit (U 3, H 20); H 520
# (U 65: two output tiles of rows a lane, LR 16) in one cluster
CLUSTER_SIM_CASES = [(37, 19, 3, 64, 3, 3), (40, 8, 4, 128, 1, 4), (20, 3, 2, 32, 2, 3),
                     (520, 3, 2, 128, 1, 4)]


def test_cluster_sim_cases_cover_the_variants():
    seen = {k: set() for k in ("clusters", "short_last", "idle_rank", "out_tiles")}
    for H, B, T, threads, clusters, pad in CLUSTER_SIM_CASES:
        for cell in CELLS:
            f = PB.bwd_geometry(cell, H, B, ceil(H, 8), threads, clusters=clusters)
            assert f.ok, f.reason
            lr, lb, _ = f.lanes
            seen["clusters"].add(clusters > 1)
            seen["short_last"].add(len(f.batches(f.blocks - 1)) < f.batch_per_block)
            seen["idle_rank"].add(any(len(f.units(x)) == 0 for x in range(f.blocks)))
            seen["out_tiles"].add(ceil(f.rows, 4 * lr) * ceil(f.batch_per_block, 8 * lb) > 1)
    assert all(v == {False, True} for v in seen.values()), seen


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("H, B, T, threads, clusters, pad", CLUSTER_SIM_CASES)
def test_cluster_kernel_source_on_cpu_threads(bwd_sim, tmp_path, cell, H, B, T, threads,
                                              clusters, pad):
    """The cluster kernels, every block at once on CPU threads (the cluster barrier a
    std::barrier over each cluster's threads, the pushes into the other blocks' shared
    memory real stores there), launched twice: the reference's gradients, the emulation's
    dg, no padding written, nothing staged from L2, the (unused) counters zero."""
    fit = PB.bwd_geometry(cell, H, B, ceil(H, 8), threads, clusters=clusters)
    assert fit.kernel.endswith("_persistent_cluster_bwd")
    data, ref = bwd_layer_case(cell, T, B, H)
    out, raw, loads = run_bwd_sim(bwd_sim, tmp_path, cell, fit, data, pad=pad)
    check_sim(cell, fit, data, ref, out, raw, f"{cell} H{H} B{B} {clusters} clusters")
    assert loads == {"ldcg128": 0, "ldcg32": 0}, loads


def test_misaligned_dg_is_staged_with_4_byte_loads(bwd_sim, tmp_path):
    """Rows of whole float4s, but dg not 16-byte aligned: 4-byte loads (the simulator
    aborts on a misaligned 16-byte one), the same results."""
    fit = PB.bwd_geometry("lstm", 40, 5, 6, 64, k_tile=12)
    data, ref = bwd_layer_case("lstm", 3, 5, 40)
    out, raw, loads = run_bwd_sim(bwd_sim, tmp_path, "lstm", fit, data, pad=4, dg_offset=1)
    check_sim("lstm", fit, data, ref, out, raw, "misaligned dg")
    assert loads["ldcg128"] == 0 and loads["ldcg32"] > 0, loads


def test_the_fit_runs_on_cpu_threads(bwd_sim, tmp_path):
    """What persistent_bwd_fit chooses for a small made-up GPU (its U, block, tiles) runs."""
    small = dict(multiProcessorCount=6, sharedMemPerBlockOptin=18600,
                 sharedMemPerMultiprocessor=65536, reservedSharedMemPerBlock=1024,
                 maxThreadsPerBlock=512, maxThreadsPerMultiProcessor=1024,
                 regsPerMultiprocessor=65536, regsPerBlock=65536)
    fit = PB.persistent_bwd_fit("gru", 21, 4, small)
    assert fit.ok and fit.tiles > 1 and fit.blocks <= 6, fit.describe()
    data, ref = bwd_layer_case("gru", 3, 4, 21)
    out, raw, _ = run_bwd_sim(bwd_sim, tmp_path, "gru", fit, data)
    check_sim("gru", fit, data, ref, out, raw, "the fit's geometry")


def assert_race_reported(run, tries=3):
    """``run`` (a sim under ThreadSanitizer with a barrier removed) reports a data race in
    one of ``tries`` runs. TSan keeps a bounded history of each word's accesses, so on a
    loaded machine one run's interleaving can evict the racing pair (seen once in a full
    local suite; alone it reports every time)."""
    for _ in range(tries):
        try:
            run()
        except AssertionError as e:
            assert "ThreadSanitizer: data race" in str(e), e
            return
    pytest.fail(f"no data race reported in {tries} runs")


def _broken(tmp_path, old, new, count=1):
    text = S.source("persistent_bwd.cu")   # self-contained: the copy compiles from anywhere
    assert text.count(old) == count, old
    path = tmp_path / "persistent_bwd_broken.cu"
    path.write_text(text.replace(old, new))
    return path


def test_a_dropped_k_group_is_caught(tmp_path):
    """Planted fault: the sum over the k-groups' partial sums leaves the last one out; the
    same check as above fails (so it can)."""
    src = _broken(tmp_path, "for (int k = 1; k < g.NKG; ++k) v += p[k * kstride];",
                  "for (int k = 1; k < g.NKG - 1; ++k) v += p[k * kstride];",
                  count=2)   # the forward template's copy (inlined, unused here) too
    exe = build_host_sim(tmp_path / "sim_broken", src, define="PK_SIM_BWD")
    fit = PB.bwd_geometry("lstm", 40, 25, 20, 256)   # 8 warps, one k-group each
    assert len(E.k_columns(fit, fit.k_split - 1)) > 0   # the last k-group sums something
    data, ref = bwd_layer_case("lstm", 2, 25, 40)
    out, raw, _ = run_bwd_sim(exe, tmp_path, "lstm", fit, data, pad=4)
    with pytest.raises(AssertionError, match=r"^dropped k-group (dh0|dc0|dx|weight_\w+|"
                                             r"bias_\w+): MISMATCH"):
        check_sim("lstm", fit, data, ref, out, raw, "dropped k-group")


def test_barrier_protocol_has_no_data_race(tmp_path):
    """ThreadSanitizer over the backward kernels on CPU threads: the writes of dg_t and the
    next step's staged reads of them are ordered by the grid barrier (no report), with
    either staging path, one tile or several, one warp or several, and the cluster kernel's
    pushes by its cluster barrier; with the grid barrier replaced by a block barrier, or
    the cluster barrier removed, it reports a data race (the checker is not vacuous)."""
    src = S.cuda_src_dir() / "persistent_bwd.cu"
    exe = build_host_sim(tmp_path / "sim_tsan", src, tsan=True, define="PK_SIM_BWD")
    for cell, H, B, U, threads, k_tile, pad in (("lstm", 37, 3, 5, 32, None, 3),
                                                ("gru", 40, 3, 6, 64, 12, 4),
                                                ("rnn_relu", 20, 4, 7, 64, None, 4)):
        fit = PB.bwd_geometry(cell, H, B, U, threads, k_tile=k_tile)
        data, ref = bwd_layer_case(cell, 3, B, H)
        work = tmp_path / cell
        work.mkdir()
        out, raw, _ = run_bwd_sim(exe, work, cell, fit, data, launches=1, pad=pad)
        check_sim(cell, fit, data, ref, out, raw, f"{cell} under TSan")
    cfit = PB.bwd_geometry("gru", 20, 5, 3, 32, clusters=2)
    cdata, cref = bwd_layer_case("gru", 3, 5, 20)
    work = tmp_path / "cluster"
    work.mkdir()
    out, raw, _ = run_bwd_sim(exe, work, "gru", cfit, cdata, launches=1)
    check_sim("gru", cfit, cdata, cref, out, raw, "gru cluster kernel under TSan")
    src = _broken(tmp_path, "if (!CL) grid_barrier(sync, (unsigned int)s * gridDim.x);",
                  "__syncthreads();")
    exe = build_host_sim(tmp_path / "sim_tsan_broken", src, tsan=True, define="PK_SIM_BWD")
    fit = PB.bwd_geometry("lstm", 37, 3, 5, 32)
    data, _ = bwd_layer_case("lstm", 3, 3, 37)
    work = tmp_path / "broken"
    work.mkdir()
    assert_race_reported(lambda: run_bwd_sim(exe, work, "lstm", fit, data, launches=1))
    # the cluster kernel without its barrier at the end of each step (arrive and wait)
    text = S.source("persistent_bwd.cu")
    for a, b in (("            pk_cluster_arrive();\n            store();\n",
                  "            store();\n"),
                 ("            if (t > 0) prefetch(t - 1);\n            pk_cluster_wait();\n",
                  "            if (t > 0) prefetch(t - 1);\n")):
        assert text.count(a) == 1, a
        text = text.replace(a, b, 1)
    broken = tmp_path / "persistent_bwd_no_cluster_sync.cu"
    broken.write_text(text)
    exe = build_host_sim(tmp_path / "sim_tsan_cluster_broken", broken, tsan=True,
                         define="PK_SIM_BWD")
    work = tmp_path / "broken_cluster"
    work.mkdir()
    assert_race_reported(lambda: run_bwd_sim(exe, work, "gru", cfit, cdata, launches=1))
