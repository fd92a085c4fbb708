"""The per-layer persistent kernels' .cu itself on CPU threads
(tests/kernels/persistent_host_sim.cpp), without a GPU: equals the reference and the
emulation with 16-byte staging (cp.async) and with the 4-byte fallback (H or ldh not
multiples of 4, h misaligned), in one tile and in several, with several output tiles a lane
and two cells a thread; the cluster kernels likewise; on data where the grouping decides the
result it sums the k-groups ``k_columns`` says; ThreadSanitizer finds no race (and finds the
one a removed barrier leaves); a geometry that disagrees with the arguments (k_tile included)
traps.
"""
from __future__ import annotations

import subprocess

import numpy as np
import pytest

from rnnrt.cells import get_cell
from rnnrt.check import FP32_ATOL, FP32_RTOL, assert_close
from rnnrt.kernels import emulate as E
from rnnrt.kernels import persistent as P
from rnnrt.kernels import sources as S
from testkit import (CELLS, SIM_ENV, build_host_sim, cancelling_case, ceil, chunk_cols,
                     layer_case)


@pytest.fixture(scope="module")
def host_sim(tmp_path_factory):
    """tests/kernels/persistent_host_sim.cpp compiled with cuda_src/persistent.cu."""
    exe = tmp_path_factory.mktemp("sim") / "persistent_host_sim"
    return build_host_sim(exe, S.cuda_src_dir() / "persistent.cu")


@pytest.fixture(scope="module")
def tsan_sim(tmp_path_factory):
    """The same with ThreadSanitizer (the grid and the cluster protocol tests run it)."""
    exe = tmp_path_factory.mktemp("sim_tsan") / "persistent_host_sim_tsan"
    return build_host_sim(exe, S.cuda_src_dir() / "persistent.cu", tsan=True)


def run_host_sim(exe, tmp_path, cell, fit, data, T, launches=2, pad=3, h_offset=0):
    """Lay one layer out in padded float32 arrays (NaN outputs, biases ld 0; h's ld is
    H + pad, h placed h_offset floats past a 16-byte boundary), run the kernel on CPU
    threads ``launches`` times, return (h, c, act) as [T+1, B, H], ..., the raw arrays (to
    check the padding), what was sent, and the h staging loads {"ldcg128": n, "ldcg32": m}."""
    G, B, H = get_cell(cell).gates, fit.batch, fit.hidden
    ld = {"h": H + pad, "c": H + pad, "act": 4 * H + pad, "gx": G * H + pad, "w": H + pad}
    arrays = {}
    for name, rows in (("h", (T + 1) * B), ("c", (T + 1) * B), ("act", T * B)):
        used = name == "h" or (name == "c" and cell == "lstm") or (name == "act" and G > 1)
        arrays[name] = np.full((rows, ld[name]) if used else (0, 0), np.nan, np.float32)
    arrays["h"][:B, :H] = data["h0"]
    if cell == "lstm":
        arrays["c"][:B, :H] = data["c0"]
    arrays["gx"] = np.full((T * B, ld["gx"]), np.nan, np.float32)
    arrays["gx"][:, :G * H] = data["gx"].reshape(T * B, G * H)
    arrays["w"] = np.full((G * H, ld["w"]), np.nan, np.float32)
    arrays["w"][:, :H] = data["R"]
    for b in ("bw", "br"):   # ld 0: one row
        arrays[b] = np.zeros(G * H, np.float32) if data[b] is None else data[b].astype(np.float32)
    for name, a in arrays.items():
        np.ascontiguousarray(a, np.float32).tofile(tmp_path / f"{name}.f32")
    args = [str(exe), cell, B, H, T, fit.units_per_block, fit.blocks, fit.threads,
            fit.smem_bytes, launches,
            tmp_path, ld["h"], ld["c"], ld["act"], ld["gx"], ld["w"], 0, 0, fit.k_tile, h_offset,
            fit.cluster]
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=600,
                       env=SIM_ENV)
    assert r.returncode == 0, f"host simulation failed ({r.returncode}):\n{r.stderr}"
    loads = dict(zip(r.stdout.split()[::2], map(int, r.stdout.split()[1::2])))
    raw = {name: np.fromfile(tmp_path / f"{name}.out", np.float32).reshape(arrays[name].shape)
           for name in ("h", "c", "act")}
    h = raw["h"][:, :H].reshape(T + 1, B, H)
    c = raw["c"][:, :H].reshape(T + 1, B, H) if cell == "lstm" else None
    act = raw["act"][:, :4 * H].reshape(T, B, 4 * H) if G > 1 else None
    return (h, c, act), raw, arrays, loads


# (H, B, T, U, threads, k_tile, pad): last block partial, several k-groups a warp, one tile
# and several (the last partial), T = 1; M 76 (LSTM, GRU: U 19): 3 output tiles of rows a
# lane; H 20, B 33, U 7, 128 threads: 2 output tiles of batches (LSTM, GRU), 2 cells a
# thread, LK 1 (LSTM, GRU) and an idle warp (5 chunks, CPW 2); H 37 or pad 3 (ldh not a
# multiple of 4): 4-byte staging loads; H 40 or 20 with pad 4: 16-byte ones (cp.async)
SIM_CASES = [(37, 3, 5, 5, 32, None, 3), (150, 5, 3, 19, 96, 64, 3), (37, 1, 1, 7, 32, 8, 3),
             (40, 3, 4, 6, 64, None, 4), (40, 5, 3, 6, 64, 12, 4), (20, 33, 3, 7, 128, None, 4)]


def test_sim_cases_cover_the_kernels_variants():
    """SIM_CASES run every path of the kernel: one output tile a lane (sums kept in
    registers) and several, one cell a thread and PK_CPT, one k-group a warp (LK 1) and
    several, a warp with no chunk to stage, one h tile and several, both staging paths."""
    seen = {"out_tiles": set(), "cpt": set(), "lk1": set(), "idle_warp": set(),
            "tiles": set(), "vec": set()}
    for H, B, T, U, threads, k_tile, pad in SIM_CASES:
        for cell in CELLS:
            f = P.geometry(cell, H, B, U, threads, k_tile=k_tile)
            lr, lb, lk = f.lanes
            seen["out_tiles"].add(ceil(f.rows, P.PK_TM * lr) * ceil(B, P.PK_TB * lb) > 1)
            seen["cpt"].add(f.cells_per_thread)
            seen["lk1"].add(lk == 1)
            seen["idle_warp"].add(any(all(len(E.k_columns(f, w * lk + i)) == 0
                                          for i in range(lk)) for w in range(f.warps)))
            seen["tiles"].add(f.tiles > 1)
            seen["vec"].add(H % 4 == 0 and pad % 4 == 0)
    assert seen == {"out_tiles": {False, True}, "cpt": {1, P.PK_CPT}, "lk1": {False, True},
                    "idle_warp": {False, True}, "tiles": {False, True},
                    "vec": {False, True}}, seen


def _check_sim(cell, H, B, T, fit, data, ref, out):
    (h, c, act), raw, sent, _ = out
    emu = E.emulate(cell, fit, **data)
    for name, got, r64, e32 in (("h", h, ref["h"], emu[0]), ("c", c, ref["c"], emu[1]),
                                ("act", act, ref["act"], emu[2])):
        if r64 is None:
            assert got is None
            continue
        assert_close(got, r64, FP32_ATOL, FP32_RTOL, name=f"{cell} {name} vs reference")
        assert_close(got, e32, 1e-5, 1e-5, name=f"{cell} {name} vs emulation")
    np.testing.assert_array_equal(raw["h"][:B], sent["h"][:B], err_msg="h0 changed")
    for name in ("h", "c", "act"):
        if raw[name].size:
            width = 4 * H if name == "act" else H
            assert np.isnan(raw[name][:, width:]).all(), f"{name}: padding written"


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("H, B, T, U, threads, k_tile, pad", SIM_CASES)
def test_kernel_source_on_cpu_threads(host_sim, tmp_path, cell, H, B, T, U, threads, k_tile,
                                      pad, bias):
    """The .cu itself, every block at once on CPU threads, launched twice with one sync
    buffer: equals the float64 reference (fp32 tolerance) and the float32 emulation, writes
    no padding, leaves h0/c0, and the counters are zero after each launch (checked inside);
    its h staging used 16-byte loads exactly where H and ldh are multiples of 4."""
    fit = P.geometry(cell, H, B, U, threads, k_tile=k_tile)
    assert fit.ok
    assert (fit.tiles > 1) == (k_tile is not None)
    data, ref = layer_case(cell, T, B, H, bias=bias, dtype=np.float32)
    out = run_host_sim(host_sim, tmp_path, cell, fit, data, T, pad=pad)
    _check_sim(cell, H, B, T, fit, data, ref, out)
    loads = out[3]
    if H % 4 == 0 and pad % 4 == 0:
        assert loads["ldcg128"] > 0 and loads["ldcg32"] == 0, loads
    else:
        assert loads["ldcg128"] == 0 and loads["ldcg32"] > 0, loads


@pytest.mark.parametrize("pad, h_offset, vec", [(4, 0, True), (3, 0, False), (4, 1, False),
                                                (8, 2, False)],
                         ids=["aligned", "ldh-odd", "h-misaligned", "h-8-byte"])
def test_staging_falls_back_to_4_byte_loads(host_sim, tmp_path, pad, h_offset, vec):
    """H % 4 == 0, but ldh not a multiple of 4 or h not 16-byte aligned: the 16-byte loads
    would fault (the simulator aborts on a misaligned one), so the kernel stages with 4-byte
    loads, with the same results; aligned, it uses 16-byte loads only."""
    T, B, H = 3, 5, 40
    fit = P.geometry("lstm", H, B, 6, 64, k_tile=16)   # 16, 16, 8: several tiles
    data, ref = layer_case("lstm", T, B, H, dtype=np.float32)
    out = run_host_sim(host_sim, tmp_path, "lstm", fit, data, T, pad=pad, h_offset=h_offset)
    _check_sim("lstm", H, B, T, fit, data, ref, out)
    loads = out[3]
    assert (loads["ldcg128"] > 0, loads["ldcg32"] > 0) == (vec, not vec), loads


def test_barrier_protocol_has_no_data_race(tsan_sim, tmp_path):
    """ThreadSanitizer over the kernel on CPU threads: the writes of h_{t+1} and the next
    step's reads are ordered by the barrier (no report), with either staging path, with one
    tile or several, and with several warps a block (each stages and reads only its own
    columns of the h tile, ordered by __syncwarp; the partial sums by __syncthreads); and
    the checker is not vacuous: without the __syncthreads before thread 0 arrives, or
    without the __syncwarp after a half is multiplied (the next tile's half would land on
    columns other lanes still read), it reports a data race."""
    exe = tsan_sim
    T, B, U = 4, 3, 5
    # staging (pad 3: 4-byte loads, 4: 16-byte), tiles (one, several) and warps (one, two):
    # every pair of the three at both its values, in four runs (TSan runs are slow)
    for cell, H, pad, k_tile, nt in (("gru", 37, 3, 12, 32), ("rnn_tanh", 40, 4, None, 32),
                                     ("lstm", 40, 4, 16, 64), ("rnn_tanh", 37, 3, None, 64)):
        fit = P.geometry(cell, H, B, U, nt, k_tile=k_tile)
        assert fit.ok and (fit.warps > 1) == (nt > 32)
        data, ref = layer_case(cell, T, B, H, dtype=np.float32)
        work = tmp_path / f"{cell}-{nt}"
        work.mkdir()
        (h, _, _), _, _, loads = run_host_sim(exe, work, cell, fit, data, T, launches=1,
                                              pad=pad)
        assert_close(h, ref["h"], FP32_ATOL, FP32_RTOL, name=f"{cell} h under TSan")
        assert (loads["ldcg128"] > 0) == (pad == 4)

    text = S.source("persistent.cu")   # self-contained: the copy compiles from anywhere
    first_sync = "    __syncthreads();   // the whole block's writes of this step are issued\n"
    half_sync = ("            if (!CL) __syncwarp();   "
                 "// the half is read: the next tile's may land there\n")
    for name, line, H, pad, nt, k_tile in (("no_sync", first_sync, 37, 3, 32, None),
                                           ("no_syncwarp", half_sync, 40, 4, 64, 16)):
        assert line in text, line
        broken = tmp_path / f"persistent_{name}.cu"
        broken.write_text(text.replace(line, "", 1))
        exe = build_host_sim(tmp_path / f"sim_tsan_{name}", broken, tsan=True)
        fit = P.geometry("lstm", H, B, U, nt, k_tile=k_tile)
        data, _ = layer_case("lstm", T, B, H, dtype=np.float32)
        work = tmp_path / name
        work.mkdir()
        with pytest.raises(AssertionError, match="ThreadSanitizer: data race"):
            run_host_sim(exe, work, "lstm", fit, data, T, launches=1, pad=pad)


# the cluster kernels: (H, B, T, threads, clusters, pad): 3 clusters of 7, 7 and 5 batches;
# one cluster of 8; 2 clusters of 2 and 1 with rank 7 owning no unit (U 3, H 20); LSTM H 160
# (U 20, M 80: two output tiles of rows a lane, LR 16) in 2 clusters of 5
CLUSTER_SIM_CASES = [(37, 19, 3, 64, 3, 3), (40, 8, 4, 128, 1, 4), (20, 3, 2, 32, 2, 3),
                     (160, 10, 2, 64, 2, 4)]


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("H, B, T, threads, clusters, pad", CLUSTER_SIM_CASES)
def test_cluster_kernel_source_on_cpu_threads(host_sim, tmp_path, cell, H, B, T, threads,
                                              clusters, pad):
    """The cluster kernels, every block at once on CPU threads (the cluster barrier a
    std::barrier over each cluster's threads, the pushes into the other blocks' shared
    memory real stores there), launched twice: equal the float64 reference and the float32
    emulation, write no padding, leave h0/c0 and the (unused) sync counters zero, and load
    nothing through the staging path."""
    U = ceil(H, P.PK_CLUSTER)
    fit = P.geometry(cell, H, B, U, threads, k_tile=P.full_tile(H), clusters=clusters)
    assert fit.ok and fit.cluster == P.PK_CLUSTER and fit.blocks == P.PK_CLUSTER * clusters
    data, ref = layer_case(cell, T, B, H, dtype=np.float32)
    out = run_host_sim(host_sim, tmp_path, cell, fit, data, T, pad=pad)
    _check_sim(cell, H, B, T, fit, data, ref, out)
    assert out[3] == {"ldcg128": 0, "ldcg32": 0}, out[3]


def test_cluster_sim_cases_cover_the_variants():
    """CLUSTER_SIM_CASES run one and several clusters, a last cluster with fewer batches, a
    block that owns no unit, one output tile a lane and several, 1 and PK_CPT cells a thread."""
    seen = {"clusters": set(), "short_last": set(), "idle_rank": set(), "out_tiles": set(),
            "cpt": set()}
    for H, B, T, threads, clusters, pad in CLUSTER_SIM_CASES:
        for cell in CELLS:
            f = P.geometry(cell, H, B, ceil(H, P.PK_CLUSTER), threads, k_tile=P.full_tile(H),
                           clusters=clusters)
            lr, lb, _ = f.lanes
            seen["clusters"].add(clusters > 1)
            seen["short_last"].add(len(f.batches(f.blocks - 1)) < f.batch_per_block)
            seen["idle_rank"].add(any(len(f.units(x)) == 0 for x in range(f.blocks)))
            seen["out_tiles"].add(ceil(f.rows, P.PK_TM * lr)
                                  * ceil(f.batch_per_block, P.PK_TB * lb) > 1)
            seen["cpt"].add(f.cells_per_thread)
    assert seen == {"clusters": {False, True}, "short_last": {False, True},
                    "idle_rank": {False, True}, "out_tiles": {False, True},
                    "cpt": {1, P.PK_CPT}}, seen


def test_cluster_protocol_has_no_data_race(tsan_sim, tmp_path):
    """ThreadSanitizer over the cluster kernels on CPU threads: the pushes of h_{t+1} into
    the other blocks' buffers and their reads next step are ordered by the cluster barrier
    (no report); without the barrier at the end of each step (its arrive and its wait), it
    reports a data race."""
    exe = tsan_sim
    T, B, H = 3, 5, 20
    fit = P.geometry("lstm", H, B, ceil(H, P.PK_CLUSTER), 32, k_tile=P.full_tile(H),
                     clusters=2)
    data, ref = layer_case("lstm", T, B, H, dtype=np.float32)
    work = tmp_path / "ok"
    work.mkdir()
    (h, _, _), _, _, _ = run_host_sim(exe, work, "lstm", fit, data, T, launches=1)
    assert_close(h, ref["h"], FP32_ATOL, FP32_RTOL, name="lstm h under TSan (clusters)")
    text = S.source("persistent.cu")   # self-contained: the copy compiles from anywhere
    for line in ("                pk_cluster_arrive();\n", "                pk_cluster_wait();\n"):
        assert text.count(line) == 1, line
        text = text.replace(line, "", 1)
    broken = tmp_path / "persistent_no_cluster_sync.cu"
    broken.write_text(text)
    exe = build_host_sim(tmp_path / "sim_tsan_broken", broken, tsan=True)
    work = tmp_path / "broken"
    work.mkdir()
    with pytest.raises(AssertionError, match="ThreadSanitizer: data race"):
        run_host_sim(exe, work, "lstm", fit, data, T, launches=1)


def test_kernel_sums_the_k_groups_k_columns_says(host_sim, tmp_path):
    """On data where the grouping of the columns into k-groups decides the result
    (``_cancelling_case``: by hand, h_1 is 0 for batch 0 and tanh(1) for batch 1), the
    kernel on CPU threads gives what emulate gives, which sums k_columns' groups in k-group
    order: the kernel's k-groups are k_columns'."""
    fit, data = cancelling_case()
    assert fit.ok and E.k_columns(fit, 0).tolist() == chunk_cols(0, 3)
    want = np.tanh(np.float32([[0], [1]])) * np.ones((2, 37), np.float32)
    h_emu = E.emulate("rnn_tanh", fit, **data)[0]
    np.testing.assert_allclose(h_emu[1], want, atol=1e-6, err_msg="emulate")
    (h, _, _), _, _, _ = run_host_sim(host_sim, tmp_path, "rnn_tanh", fit, data, 1,
                                      launches=1)
    np.testing.assert_allclose(h[1], want, atol=1e-6, err_msg="the kernel on CPU threads")


@pytest.mark.parametrize("broken", ["none", "smem", "threads", "units", "cells", "k_tile",
                                    "k_tile_smem"])
def test_kernel_traps_on_a_geometry_that_disagrees(host_sim, tmp_path, broken):
    """Less dynamic shared memory than the layout needs, a block that is not whole warps, a
    grid that leaves units out, more (b, j) cells than PK_CPT a thread, a k_tile that is not
    a multiple of 4, or a k_tile wider than the shared memory was sized for: the kernel traps
    at once instead of computing garbage. Each broken launch differs from a good one (which
    runs: "none") in that one respect; the simulator passes fit.smem_bytes as the dynamic
    shared memory."""
    from dataclasses import replace
    fit = P.geometry("lstm", 37, 3, 5, 32)
    assert fit.ok and fit.k_tile == 40
    # 48 threads: the kernel's layout for them (1 warp) is the one for 32: the same smem
    assert P.geometry("lstm", 37, 3, 5, 48).smem_bytes == fit.smem_bytes
    # 5 units x B 13 = 65 cells: 64 threads hold them, 32 do not (2 a thread); the shared
    # memory sized for 64 threads is more than 32 threads' layout needs
    wide = P.geometry("lstm", 37, 13, 5, 64)
    narrow = P.geometry("lstm", 37, 13, 5, 32)
    assert wide.ok and not narrow.ok and "65 cells" in narrow.reason
    assert narrow.smem_bytes <= wide.smem_bytes
    # k_tile 48 needs a wider h tile than the 40 the shared memory was sized for
    assert P.geometry("lstm", 37, 3, 5, 32, k_tile=48).smem_bytes > fit.smem_bytes
    bad = {"none": fit,
           "smem": replace(fit, smem_partials=fit.smem_partials - 4),
           "threads": replace(fit, threads=48),
           "units": replace(fit, blocks=7),                 # 7 blocks x 5 units < 37
           "cells": replace(wide, threads=32),
           "k_tile": replace(fit, k_tile=38),               # shared memory sized for 40
           "k_tile_smem": replace(fit, k_tile=48)}[broken]
    data, ref = layer_case("lstm", 2, bad.batch, 37, dtype=np.float32)
    if broken == "none":
        (h, _, _), _, _, _ = run_host_sim(host_sim, tmp_path, "lstm", bad, data, 2, launches=1)
        assert_close(h, ref["h"], FP32_ATOL, FP32_RTOL, name="the good launch")
        return
    with pytest.raises(AssertionError, match=r"__trap\(\)"):
        run_host_sim(host_sim, tmp_path, "lstm", bad, data, 2, launches=1)
