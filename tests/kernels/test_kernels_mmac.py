"""The tensor-core cluster kernels' host side and compile (rnnrt/kernels/mmac.py,
cuda_src/persistent_mmac.cu, their wide form persistent_mmacw.cu and grid form
persistent_mmag.cu), without a GPU: the constants match the kernel; nvcc compiles
every bf16 / fp16 instantiation for sm_90a with mma.sync of that type, the cluster barrier and
distributed shared-memory stores, no stack, no spills and no more registers than the fit
assumes; the fit's decisions (16-bit keys only, compute capability 9.0, a cluster per 8
batches, the parts of the k16 steps within the launch bound, shared memory) with their
reasons; the wide form past half the SMs' clusters; the grid form where no cluster holds R; the NVRTC expressions; a device without
clusters compiles none of them.
"""
from __future__ import annotations

import re

import pytest

from rnnrt.kernels import mmac as MC
from rnnrt.kernels import sources as S
from rnnrt.kernels import typed
from rnnrt.kernels.library import typed_persistent_kernels
from rnnrt.kernels.limits import H100_SXM
from test_kernels_mma import FORWARD_ARGS
from testkit import CELLS, check_no_spills, nvcc_instantiations

SRC = S.source("persistent_mmac.cu")
GRID_SRC = S.source("persistent_mmag.cu")
WIDE_SRC = S.source("persistent_mmacw.cu")


def test_constants_match_the_kernel():
    for name, value in (("PK_MMAC_MAX_THREADS", MC.MMAC_MAX_THREADS),
                        ("PK_MMAC_BG", MC.MMAC_BG), ("PK_MMAC_CLUSTER16", MC.NON_PORTABLE),
                        ("PK_MMAC_KR", MC.MMAC_KR)):
        m = re.search(rf"#define {name} (\d+)", SRC)
        assert m and int(m[1]) == value, name
    for name, value in (("PK_MMAG_NT", MC.MMAG_NT), ("PK_MMAG_KR", MC.MMAG_KR),
                        ("PK_MMAC_WNT", MC.MMAC_WNT), ("PK_MMAG_CLUSTER", MC.MMAG_CLUSTER),
                        ("PK_MMAG_BARRIER", MC.MMAG_BARRIER),
                        ("PK_MMAC_RS_PAD", MC.MMAC_RS_PAD), ("PK_MMAC_RS_PAD1", MC.MMAC_RS_PAD1)):
        m = re.search(rf"#define {name} (\d+)", GRID_SRC)
        assert m and int(m[1]) == value, name
    wide = WIDE_SRC.split("#endif  // RNNRT_PERSISTENT_MMAC_CUH")[1]
    assert wide.count("__cluster_dims__(PK_CLUSTER, 1, 1)") == 4
    assert wide.count("PK_CLUSTER, PK_MMAC_WNT>(") == 4
    grid = GRID_SRC.split("#endif  // RNNRT_PERSISTENT_MMAC_CUH")[1]
    assert grid.count("__cluster_dims__(PK_MMAG_CLUSTER, 1, 1)") == 4   # the grid form in pairs
    assert "(GRID ? PK_MMAG_BARRIER : 0)" in GRID_SRC   # the kernel's need counts it
    assert SRC.count("__cluster_dims__(PK_CLUSTER, 1, 1)") == 4
    assert SRC.count("__cluster_dims__(PK_MMAC_CLUSTER16, 1, 1)") == 4
    assert MC.MMAC_CLUSTERS == (8, MC.NON_PORTABLE)


@pytest.fixture(scope="module")
def usage(tmp_path_factory):
    return nvcc_instantiations(
        tmp_path_factory.mktemp("mmac"), "persistent_mmac.cu",
        [f"{MC.kernel_name(c, cn)}_t<{t}, false>({FORWARD_ARGS[c].format(T=t)})"
         for cn in MC.MMAC_CLUSTERS for c in CELLS for t in ("bf16", "fp16")])


@pytest.fixture(scope="module")
def grid_usage(tmp_path_factory):
    return nvcc_instantiations(
        tmp_path_factory.mktemp("mmag"), "persistent_mmag.cu",
        [f"{MC.kernel_name(c, MC.GRID_FORM)}_t<{t}, false>({FORWARD_ARGS[c].format(T=t)})"
         for c in CELLS for t in ("bf16", "fp16")])


@pytest.fixture(scope="module")
def wide_usage(tmp_path_factory):
    return nvcc_instantiations(
        tmp_path_factory.mktemp("mmacw"), "persistent_mmacw.cu",
        [f"{MC.kernel_name(c, wide=True)}_t<{t}, false>({FORWARD_ARGS[c].format(T=t)})"
         for c in CELLS for t in ("bf16", "fp16")])


def test_the_wide_form_compiles_without_spills(wide_usage):
    found, ptx = wide_usage
    check_no_spills(found, lambda c: MC.kernel_name(c, wide=True), MC.NVCC_REGS)
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in ptx
    assert "barrier.cluster.arrive.release" in ptx and "st.shared::cluster.b16" in ptx
    assert ".reqnctapercluster 8, 1, 1" in ptx and "ld.acquire.gpu" not in ptx


def test_the_grid_form_compiles_without_spills(grid_usage):
    found, ptx = grid_usage
    check_no_spills(found, lambda c: MC.kernel_name(c, MC.GRID_FORM), MC.NVCC_REGS)
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx
    assert ("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
            in ptx and "ld.acquire.gpu" in ptx)   # the pairs' staging, the grid barrier
    # in clusters of 2 (its barrier at the start and the end, none a step; no pushes)
    assert ".reqnctapercluster 2, 1, 1" in ptx and ptx.count("barrier.cluster.wait") == 2 * 8
    assert "st.shared::cluster" not in ptx


@pytest.mark.parametrize("cluster", MC.MMAC_CLUSTERS)
def test_every_instantiation_compiles_without_spills(usage, cluster):
    found, ptx = usage
    tag = "mmac16" if cluster == 16 else "mmac_"
    check_no_spills({k: v for k, v in found.items() if tag in k},
                    lambda c: MC.kernel_name(c, cluster), MC.NVCC_REGS)
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in ptx
    assert "barrier.cluster.arrive.release" in ptx and "st.shared::cluster.b16" in ptx
    assert ".reqnctapercluster 16, 1, 1" in ptx and ".reqnctapercluster 8, 1, 1" in ptx


def test_layout_is_the_kernels():
    # LSTM H 40: U 5, M 20 -> 2 m16 tiles, 3 k16 steps (KP 48); 2 parts: 128 threads
    f = MC.mmac_layout("lstm", 40, 5, 2)
    assert (f.units_per_block, f.m_tiles, f.k_steps, f.threads, f.k_tile) == (5, 2, 3, 128, 48)
    assert f.smem_r == 2 * 32 * (48 + 8)                       # [MT*16][KP + 8] 16-bit
    assert f.smem_tile == 2 * 2 * MC.MMAC_BG * (48 + 8)        # 2 x [8][KP + 8] 16-bit
    assert f.smem_partials == 4 * 2 * 32 * (8 + 1)             # [KPARTS][MT*16][8 + pad] floats
    assert [list(f.part_steps(p)) for p in range(2)] == [[0], [1, 2]]
    assert f.part_columns(1).tolist() == list(range(16, 40))
    g = MC.mmac_layout("gru", 30, 11)
    assert (g.clusters, g.batch_per_block, g.blocks) == (2, 6, 16)
    g = MC.mmac_layout("gru", 30, 11, cluster=16)
    assert (g.units_per_block, g.blocks, g.kernel) == (2, 32, "gru_persistent_mmac16_fwd")
    with pytest.raises(ValueError, match="cluster must be one of"):
        MC.mmac_layout("gru", 30, 11, cluster=4)


def test_fit_takes_the_grid_form_where_no_cluster_holds_r():
    """LSTM H 1024 (8 MiB of fp16 R): neither cluster size holds a block's share; the grid
    form does, one block an SM at U = ceil(H / SMs), all batches up to MMAG_BATCH."""
    props = H100_SXM.props()
    for B in (8, 32):
        f = MC.mmac_fit("lstm", 1024, B, props, "float16")
        assert f.ok and f.cluster == MC.GRID_FORM, f.reason
        assert f.kernel == "lstm_persistent_mmacg_fwd" and "grid form" in f.reason
        assert (f.units_per_block, f.blocks, f.m_tiles, f.k_parts, f.threads) == (
            8, 128, 2, 4, 256)
        assert f.smem_tile == 2 * 8 * MC.ceil_div(B, 8) * (1024 + 8)   # one [8 NT][KP + 8]
        # [KPARTS][MT*16][8 NT] floats, then the staging's mbarrier
        assert (f.smem_partials
                == 4 * 4 * 32 * MC.partial_stride(MC.ceil_div(B, 8)) + MC.MMAG_BARRIER)
        assert MC.partial_stride(1) == 9 and MC.partial_stride(4) == 35
        assert f.barrier_arrivals(100) == 99 * 128   # the grid barrier's counter
        assert "clusters of 2" in f.reason
    # blocks round up to whole clusters of 2 (the last owns no units); past the SMs, no fit
    f = MC.mmac_layout("gru", 1000, 8, cluster=MC.GRID_FORM, units_per_block=8)
    assert f.ok and f.blocks == 126 and f.blocks * 8 - 1000 == 8
    odd = dict(props, multiProcessorCount=125)
    f = MC.mmac_fit("lstm", 1000, 8, odd, "float16", cluster=MC.GRID_FORM)
    assert not f.ok and "126 blocks" in f.reason and "125 SMs" in f.reason, f.reason
    f = MC.mmac_fit("lstm", 1024, 64, props, "float16")
    assert not f.ok and "grid form" in f.reason and "batch 64 > 32" in f.reason
    f = MC.mmac_fit("lstm", 2048, 8, props, "bfloat16")
    assert not f.ok and "one block an SM" in f.reason and "shared memory" in f.reason
    f = MC.mmac_fit("lstm", 1024, 8, dict(props, major=8), "bfloat16", cluster=MC.GRID_FORM)
    assert not f.ok and "compute capability 9.0" in f.reason
    f = MC.mmac_fit("gru", 256, 8, props, "float16")
    assert f.ok and f.cluster == 8, f.reason   # a cluster where one holds R
    with pytest.raises(ValueError, match="units_per_block"):
        MC.mmac_layout("lstm", 1024, 8, cluster=MC.GRID_FORM)


def test_layout_of_the_wide_form():
    """Past one n8 tile a cluster (clusters of 8 only): NT tiles, two h buffers of 8 NT rows,
    partial sums 8 NT wide; past MMAC_WIDE_BATCH, or at clusters of 16, more clusters."""
    f = MC.mmac_layout("lstm", 40, 20, 2, clusters=1)   # 20 batches: 3 n8 tiles
    assert f.ok and f.wide and f.n_tiles == 3 and f.kernel == "lstm_persistent_mmacw_fwd"
    assert f.smem_tile == 2 * 2 * 8 * 3 * (48 + 8)             # 2 x [8 NT][KP + 8] 16-bit
    assert f.smem_partials == 4 * 2 * 32 * (8 * 3 + 3)         # [KPARTS][MT*16][8 NT + pad]
    assert "3 n8 tiles: the wide form" in f.describe()
    one = MC.mmac_layout("lstm", 40, 16, 2, clusters=2)        # 8 a cluster: one tile
    assert one.ok and not one.wide and one.n_tiles == 1 and one.kernel.endswith("mmac_fwd")
    f = MC.mmac_layout("lstm", 40, 33, 2, clusters=1)
    assert not f.ok and "33 batches a cluster > 32" in f.reason
    f = MC.mmac_layout("lstm", 40, 9, 2, clusters=1, cluster=16)
    assert not f.ok and "the wide form runs clusters of 8" in f.reason
    with pytest.raises(ValueError, match="the wide form runs clusters of 8"):
        MC.kernel_name("gru", 16, wide=True)


def test_fit_takes_the_wide_form_past_half_the_sms():
    """One n8 tile a cluster while ceil(B / 8) clusters fill at most half the SMs (64 of
    132); past that the fewest tiles that keep the count there, within PK_CPT cells a thread
    (``cluster_count``); clusters of 16 stay one tile a cluster. The rule's cases in turn."""
    props = H100_SXM.props()
    for B, n in ((8, 1), (64, 8), (72, 9)):
        f = MC.mmac_fit("lstm", 128, B, props, "float16")
        if B == 72:   # 9 one-tile clusters > 8: two tiles, 5 clusters of 15 batches
            assert f.ok and f.wide and (f.clusters, f.batch_per_block) == (5, 15), f.reason
        else:
            assert f.ok and not f.wide and f.clusters == n, f.reason
    f = MC.mmac_fit("lstm", 128, 256, props, "float16")
    assert f.ok and f.wide and (f.clusters, f.n_tiles) == (8, 4), f.reason
    assert "the wide form, 32 batches (4 n8 tiles) a cluster" in f.reason
    f = MC.mmac_fit("lstm", 128, 128, props, "bfloat16")
    assert f.ok and (f.clusters, f.n_tiles, f.kernel) == (8, 2, "lstm_persistent_mmacw_fwd")
    # LSTM H 256: 256 threads of 32 units hold 16 batches (PK_CPT 2): 16 clusters at B 256
    f = MC.mmac_fit("lstm", 256, 256, props, "float16")
    assert f.ok and (f.clusters, f.batch_per_block) == (16, 16), f.reason
    f = MC.mmac_fit("gru", 128, 256, props, "float16")   # 192 threads of 16 units: 24
    assert f.ok and (f.clusters, f.batch_per_block) == (11, 24), f.reason
    f = MC.mmac_fit("lstm", 512, 128, props, "float16")   # clusters of 16: one tile each
    assert f.ok and f.cluster == 16 and (f.clusters, f.n_tiles) == (16, 1), f.reason
    f = MC.mmac_fit("lstm", 128, 256, props, "float16", clusters=32)   # named: one tile
    assert f.ok and not f.wide and f.clusters == 32
    assert MC.cluster_count(256, 132, 32) == 8 and MC.cluster_count(256, 132, 8) == 32
    assert MC.cluster_count(100, 132, 32) == 7 and MC.cluster_count(64, 132, 32) == 8
    assert MC.cluster_count(256, 66, 32) == 8   # 4 clusters' cap: 4 tiles still 8 clusters


def test_fit_takes_16_bit_keys_on_clusters_with_the_reasons():
    props = H100_SXM.props()
    for dtype in MC.MMA_DTYPES:
        f = MC.mmac_fit("lstm", 256, 32, props, dtype)
        assert f.ok and f.clusters == 4 and f.threads <= MC.MMAC_MAX_THREADS, f.reason
        assert f.k_parts == 1 and f.m_tiles == 8 and f.threads == 256
        assert MC.mmac_fit("lstm", 128, 8, props, dtype).k_parts == 2   # 4 m16 tiles
    for dtype in ("float32", "tf32"):
        f = MC.mmac_fit("lstm", 256, 32, props, dtype)
        assert not f.ok and MC.MMA_DTYPES_REASON in f.reason
    f = MC.mmac_fit("gru", 256, 8, dict(props, major=8), "float16")
    assert not f.ok and "compute capability 9.0" in f.reason
    # LSTM H 512: a block's share at clusters of 8 does not fit; at 16 it does
    f = MC.mmac_fit("lstm", 512, 8, props, "float16", cluster=8)
    assert not f.ok and "launch bound" in f.reason   # 16 m16 tiles: 512 threads
    f = MC.mmac_fit("lstm", 512, 8, props, "float16")
    assert f.ok and f.cluster == 16 and f.kernel == "lstm_persistent_mmac16_fwd", f.reason
    f = MC.mmac_fit("lstm", 256, 8, props, "float16")
    assert f.ok and f.cluster == 8, f.reason   # 8 where it fits
    f = MC.mmac_fit("rnn_tanh", 1536, 4, props, "float16", cluster=16)
    assert not f.ok and "clusters of 16" in f.reason and "shared memory" in f.reason
    f = MC.mmac_fit("lstm", 1024, 8, props, "float16", cluster=16)
    assert not f.ok and "launch bound" in f.reason
    f = MC.mmac_fit("lstm", 512, 8, dict(props, multiProcessorCount=12), "float16",
                    cluster=16)
    assert not f.ok and "12 SMs < one cluster of 16" in f.reason
    f = MC.mmac_fit("gru", 64, 8, props, "float16", k_parts=5)   # 4 k16 steps
    assert not f.ok and "empty" in f.reason
    with pytest.raises(ValueError, match="hidden must be a positive int"):
        MC.mmac_layout("lstm", 0, 8)


def test_expressions_and_devices_without_clusters():
    for c in CELLS:
        for cn in MC.MMAC_FORMS:
            name = MC.kernel_name(c, cn)
            assert typed.persistent_expression(name, "float16") == f"{name}_t<fp16, false>"
            assert typed.persistent_expression(name, "bfloat16") == f"{name}_t<bf16, false>"
            with pytest.raises(ValueError, match="no float32 instantiation"):
                typed.persistent_expression(name, "float32")
            assert typed.needs_clusters(name)
            assert MC.non_portable(name) == (cn == 16)
        name = MC.kernel_name(c, wide=True)
        assert typed.persistent_expression(name, "float16") == f"{name}_t<fp16, false>"
        assert typed.needs_clusters(name) and not MC.non_portable(name)
    for file, n in (("persistent_mmac.cu", 8), ("persistent_mmag.cu", 4),
                    ("persistent_mmacw.cu", 4)):
        assert typed_persistent_kernels(file, cluster=False) == ()
        assert len(typed_persistent_kernels(file, cluster=True)) == n


class _Fn:
    def __init__(self):
        self.max_dynamic_shared_size_bytes = 48 * 1024
        self.kernel = type("F", (), {"ptr": 1234})()


def test_clusters_of_16_opt_in_before_every_launch(monkeypatch):
    """KernelLibrary.with_shared sets NON_PORTABLE_CLUSTER_SIZE_ALLOWED on a kernel of
    clusters of 16 (cuFuncSetAttribute, a fake here), not on one of 8; a refusal says what
    the driver returned."""
    from rnnrt.kernels import library as L
    from rnnrt.kernels import occupancy as O
    calls = []
    fn = _Fn()
    monkeypatch.setattr(L.KernelLibrary, "get_persistent", lambda self, name, dtype: fn)
    monkeypatch.setattr(O, "libcuda_set_attribute",
                        lambda: lambda f, attr, value: calls.append((f.value, attr, value)) or 0)
    lib = L.KernelLibrary()
    lib.with_shared(MC.kernel_name("lstm", 8), 100_000, "float16")
    assert calls == [] and fn.max_dynamic_shared_size_bytes == 100_000
    lib.with_shared(MC.kernel_name("lstm", 16), 100_000, "float16")
    assert calls == [(1234, O.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)]
    with pytest.raises(RuntimeError, match="CUresult 1"):
        O.allow_non_portable_clusters(fn, setter=lambda f, attr, value: 1)


def _bank_ways(addresses):
    """The most distinct 4-byte words one shared-memory bank serves for these word addresses
    (one warp's access: 32 banks, a word read by several lanes is one broadcast)."""
    banks = {}
    for a in addresses:
        banks.setdefault(a % 32, set()).add(a)
    return max(len(v) for v in banks.values())


def _partial_sum_ways(fit, rs):
    """(reads, writes): the worst bank conflict of the partial sums' accesses at row stride
    ``rs`` (the kernel's red [KPARTS][MT*16][RS]): the pointwise threads' reads of a gate row
    (cell e = tid + i * threads: unit e % U, batch e / U) and the fragments' writes (lane g, c:
    row g, columns 2c (+1) + 8n)."""
    U, BG = fit.units_per_block, fit.batch_per_block
    reads = 1
    for i in range(MC.ceil_div(U * BG, fit.threads)):
        for w in range(fit.threads // 32):
            cells = [(e % U, e // U) for e in range(i * fit.threads + 32 * w,
                                                     i * fit.threads + 32 * w + 32)]
            words = [jj * rs + b for jj, b in cells if b < BG]
            if words:
                reads = max(reads, _bank_ways(words))
    writes = max(_bank_ways([g * rs + 2 * c + 8 * n + h for g in range(8) for c in range(4)])
                 for n in range(fit.n_tiles) for h in (0, 1))
    return reads, writes


def test_partial_sums_row_stride_avoids_bank_conflicts():
    """The rows of the partial sums are 8 NT floats and a pad (partial_stride): at 8 NT the
    grid form's reads at B 32 were 8-way bank conflicts (ncu: 44% of its shared-load
    wavefronts), the one-tile cluster form's at H 256 too; with the pad every form's reads
    and writes are at most 2-way."""
    props = H100_SXM.props()
    fits = [MC.mmac_fit("lstm", 1024, 32, props, "float16"),             # grid form, 4 tiles
            MC.mmac_fit("gru", 1024, 8, props, "float16"),               # grid form, 1 tile
            MC.mmac_fit("lstm", 256, 8, props, "float16"),               # clusters of 8
            MC.mmac_fit("lstm", 512, 8, props, "float16"),               # clusters of 16
            MC.mmac_fit("lstm", 128, 256, props, "float16")]             # the wide form
    assert [f.cluster for f in fits] == [0, 0, 8, 16, 8] and fits[-1].wide
    for f in fits:
        assert f.ok, f.reason
        reads, writes = _partial_sum_ways(f, MC.partial_stride(f.n_tiles))
        assert reads <= 2 and writes <= 2, (f.describe(), reads, writes)
    assert _partial_sum_ways(fits[0], 8 * 4) == (8, 8)   # without the pad
    assert _partial_sum_ways(fits[2], 8)[0] == 8
