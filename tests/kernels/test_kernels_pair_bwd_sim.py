"""The backward grid kernels in cluster pairs (cuda_src/persistent_bwd_pair.cu) on CPU threads
(tests/kernels/persistent_host_sim.cpp built with PK_SIM_BWD_PAIR: the backward main with the
pair kernels, two blocks a cluster: the grid barrier's atomics, the cluster barrier a
std::barrier over the pair's threads, st.shared::cluster a real store into the other block's
shared memory), without a GPU: launched twice on one sync buffer with every output poisoned,
each cell equals the float64 reference (dh0, dc0, and dx and every weight and bias gradient
the written dg give) and the pair twin (emulate_bwd.pair_products: each block's half in its
k-groups' order, then half 0 + half 1), writes no padding, stages dg with 16-byte loads
exactly where it can, and leaves the counters zero. The cases cover unequal halves (G*H not a
multiple of 8), a last block without units, one tile and several, two output tiles of rows a
lane, two cells a thread, T 1 and B 1. Planted faults: a cell that drops the other block's
half (caught against the reference), and the pair's cluster barrier removed (ThreadSanitizer
reports the race on the other half's sums; the kernels as written run race-free under it).
"""
from __future__ import annotations

import numpy as np
import pytest
from test_kernels_persistent_bwd_sim import check_sim, run_bwd_sim
from testkit import CELLS, build_host_sim, bwd_layer_case, ceil, emulated

from rnnrt.kernels import persistent_bwd as PB
from rnnrt.kernels import sources as S
from rnnrt.kernels.emulate_bwd import pair_products

DEFINE = "PK_SIM_BWD_PAIR"
FILE = "persistent_bwd_pair.cu"


@pytest.fixture(scope="module")
def pair_sim(tmp_path_factory):
    exe = tmp_path_factory.mktemp("pair_bwd_sim") / "pair_bwd_host_sim"
    return build_host_sim(exe, S.cuda_src_dir() / FILE, define=DEFINE)


def pair_emulated(cell, fit, data):
    """The pair twin's order (emulate_bwd with pair_products) on a bwd_layer_case's data."""
    return emulated(cell, fit, data, products=pair_products(fit))


def run_pair(exe, tmp_path, cell, fit, data, **kw):
    return run_bwd_sim(exe, tmp_path, cell, fit, data, cluster=2, **kw)


# (cell, H, B, T, U, threads, k_tile, pad): LSTM H 37 (K 148: halves 76 + 72), U 5: 8 blocks,
# the last pair's second block 2 units, 4-byte staging; GRU H 24 U 7 (halves 36 + 36): tiles
# of 12 (several a half), 16-byte staging; RNN tanh H 37 (halves 20 + 17, one tile) with 33
# batches: two cells a thread, T 1; RNN ReLU H 75 U 35: 2U = 70 rows, two output tiles of rows
# a lane (LR 16), block 3 without units; LSTM B 1, tiles of 8
PAIR_CASES = [("lstm", 37, 3, 3, 5, 32, None, 3), ("gru", 24, 5, 2, 7, 64, 12, 4),
              ("rnn_tanh", 37, 33, 1, 5, 128, None, 4), ("rnn_relu", 75, 3, 2, 35, 128, None, 4),
              ("lstm", 37, 1, 3, 7, 32, 8, 3)]


def test_pair_cases_cover_the_variants():
    """PAIR_CASES run every cell and path: unequal halves, a block without units, one tile
    and several, both staging paths, one output tile a lane and several, one cell a thread
    and two, T 1."""
    seen = {k: set() for k in ("unequal", "idle_block", "tiles", "vec", "out_tiles", "cpt",
                               "t1")}
    for cell, H, B, T, U, threads, k_tile, pad in PAIR_CASES:
        f = PB.pair_geometry(cell, H, B, U, threads, k_tile=k_tile)
        assert f.ok, f.reason
        kh, kc = f.halves
        lr, lb, _ = f.lanes
        seen["unequal"].add(kh != kc)
        seen["idle_block"].add(any(len(f.units(x)) == 0 for x in range(f.blocks)))
        seen["tiles"].add(f.tiles > 1)
        seen["vec"].add(pad % 4 == 0 and kh % 4 == 0 and kc % 4 == 0)
        seen["out_tiles"].add(ceil(f.rows, 4 * lr) * ceil(B, 8 * lb) > 1)
        seen["cpt"].add(f.cells_per_thread)
        seen["t1"].add(T == 1)
    assert {c for c, *_ in PAIR_CASES} == set(CELLS)
    assert all(v == {False, True} for k, v in seen.items() if k != "cpt"), seen
    assert seen["cpt"] == {1, 2}, seen


@pytest.mark.parametrize("cell, H, B, T, U, threads, k_tile, pad", PAIR_CASES)
def test_pair_kernel_source_on_cpu_threads(pair_sim, tmp_path, cell, H, B, T, U, threads,
                                           k_tile, pad):
    """The .cu on CPU threads, every block at once in pairs, launched twice with one sync
    buffer (the counters zero after each: checked inside): the reference's gradients, the
    pair twin's dg, no padding written; dg staged with 16-byte loads exactly where every
    row and both halves are 16-byte aligned."""
    fit = PB.pair_geometry(cell, H, B, U, threads, k_tile=k_tile)
    data, ref = bwd_layer_case(cell, T, B, H)
    out, raw, loads = run_pair(pair_sim, tmp_path, cell, fit, data, pad=pad)
    check_sim(cell, fit, data, ref, out, raw, f"pair {cell} H{H} B{B} U{U}",
              emulate=pair_emulated)
    kh, kc = fit.halves
    if pad % 4 == 0 and kh % 4 == 0 and kc % 4 == 0:
        assert loads["ldcg128"] > 0 and loads["ldcg32"] == 0, loads
    else:
        assert loads["ldcg128"] == 0 and loads["ldcg32"] > 0, loads


def test_pair_twin_sums_the_halves_apart():
    """The twin's order is the pair's: a row with 1e8 in half 0 and -1e8, 1 in half 1 sums
    to 1e8 + (-1e8 + 1) = 0 in float32 (-1e8 + 1 rounds to -1e8), where the sum in k order,
    (1e8 - 1e8) + 1, is 1."""
    fit = PB.pair_geometry("rnn_tanh", 8, 1, 4, 32)
    assert fit.halves == (4, 4)
    rs = np.zeros((1, 8), np.float32)
    rs[0, 0], rs[0, 4], rs[0, 5] = 1e8, -1e8, 1.0
    dg = np.ones((1, 8), np.float32)
    assert pair_products(fit)(rs, dg)[0, 0] == 0.0
    in_order = np.float32(0)
    for k in range(8):
        in_order = np.float32(in_order + rs[0, k] * dg[0, k])
    assert in_order == 1.0


def _broken(tmp_path, old, new, name):
    """persistent_bwd_pair.cu's inlined source with ``old`` replaced by ``new`` (once)."""
    text = S.source(FILE)
    assert text.count(old) == 1, old
    path = tmp_path / name
    path.write_text(text.replace(old, new))
    return path


def test_a_dropped_half_is_caught(tmp_path):
    """Planted fault: each cell keeps its own block's half and drops the other's; the
    check above fails (so it can)."""
    src = _broken(tmp_path, "const float v = pc ? o + own[i] : own[i] + o;",
                  "const float v = own[i] + 0.f * o;", "pair_dropped_half.cu")
    exe = build_host_sim(tmp_path / "sim_dropped", src, define=DEFINE)
    fit = PB.pair_geometry("lstm", 20, 3, 5, 32)
    data, ref = bwd_layer_case("lstm", 2, 3, 20)
    out, raw, _ = run_pair(exe, tmp_path, "lstm", fit, data)
    with pytest.raises(AssertionError, match=r"^dropped half (dh0|dc0|dx|weight_\w+|bias_\w+): "
                                             r"MISMATCH"):
        check_sim("lstm", fit, data, ref, out, raw, "dropped half", emulate=pair_emulated)


def test_pair_exchange_has_no_data_race(tmp_path):
    """ThreadSanitizer over the pair kernel on CPU threads: the sends into the other block's
    recv and its reads are ordered by the cluster barrier, recv's next sends by the grid
    barrier (no report); with the cluster barrier's arrive and wait removed it reports a
    data race (the checker is not vacuous)."""
    fit = PB.pair_geometry("gru", 20, 3, 7, 32)
    data, ref = bwd_layer_case("gru", 3, 3, 20)
    exe = build_host_sim(tmp_path / "sim_tsan", S.cuda_src_dir() / FILE, tsan=True,
                         define=DEFINE)
    work = tmp_path / "ok"
    work.mkdir()
    out, raw, _ = run_pair(exe, work, "gru", fit, data, launches=1)
    check_sim("gru", fit, data, ref, out, raw, "pair under TSan", emulate=pair_emulated)
    text = S.source(FILE)
    for old in ("reaches after its reads below.\n                pk_cluster_arrive();\n",
                "                pk_cluster_wait();   // acquire: the other's half is in recv\n"):
        assert text.count(old) == 1, old
        text = text.replace(old, old.split("\n")[0] + "\n" if "reaches" in old else "")
    broken = tmp_path / "pair_no_cluster_barrier.cu"
    broken.write_text(text)
    exe = build_host_sim(tmp_path / "sim_tsan_broken", broken, tsan=True, define=DEFINE)
    work = tmp_path / "broken"
    work.mkdir()
    with pytest.raises(AssertionError, match="ThreadSanitizer: data race"):
        run_pair(exe, work, "gru", fit, data, launches=1)
