"""The tensor-core cluster kernels' host side and compile (rnnrt/kernels/mmac.py,
cuda_src/persistent_mmac.cu), without a GPU: the constants match the kernel; nvcc compiles
every bf16 / fp16 instantiation for sm_90a with mma.sync of that type, the cluster barrier and
distributed shared-memory stores, no stack, no spills and no more registers than the fit
assumes; the fit's decisions (16-bit keys only, compute capability 9.0, a cluster per 8
batches, the parts of the k16 steps within the launch bound, shared memory) with their
reasons; the NVRTC expressions; a device without clusters compiles none of them.
"""
from __future__ import annotations

import re

import pytest

from rnnrt.kernels import mmac as MC
from rnnrt.kernels import sources as S
from rnnrt.kernels import typed
from rnnrt.kernels.library import typed_persistent_kernels
from rnnrt.kernels.limits import H100_SXM
from test_kernels_mma import _ARGS
from testkit import CELLS, check_no_spills, nvcc_instantiations

SRC = S.source("persistent_mmac.cu")


def test_constants_match_the_kernel():
    for name, value in (("PK_MMAC_MAX_THREADS", MC.MMAC_MAX_THREADS),
                        ("PK_MMAC_BG", MC.MMAC_BG)):
        m = re.search(rf"#define {name} (\d+)", SRC)
        assert m and int(m[1]) == value, name
    assert SRC.count("__cluster_dims__(PK_CLUSTER, 1, 1)") == 4


@pytest.fixture(scope="module")
def usage(tmp_path_factory):
    return nvcc_instantiations(
        tmp_path_factory.mktemp("mmac"), "persistent_mmac.cu",
        [f"{MC.kernel_name(c)}_t<{t}, false>({_ARGS[c].format(T=t)})"
         for c in CELLS for t in ("bf16", "fp16")])


def test_every_instantiation_compiles_without_spills(usage):
    found, ptx = usage
    check_no_spills(found, MC.kernel_name, MC.NVCC_REGS)
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in ptx
    assert "barrier.cluster.arrive.release" in ptx and "st.shared::cluster.f32" in ptx


def test_layout_is_the_kernels():
    # LSTM H 40: U 5, M 20 -> 2 m16 tiles, 3 k16 steps (KP 48); 2 parts: 128 threads
    f = MC.mmac_layout("lstm", 40, 5, 2)
    assert (f.units_per_block, f.m_tiles, f.k_steps, f.threads, f.k_tile) == (5, 2, 3, 128, 48)
    assert f.smem_r == 2 * 32 * (48 + 8)                       # [MT*16][KP + 8] 16-bit
    assert f.smem_tile == 4 * 2 * MC.MMAC_BG * (64 + 8)        # 2 x [8][mma_stride(48)]
    assert f.smem_partials == 4 * 2 * 32 * 8                   # [KPARTS][MT*16][8] floats
    assert [list(f.part_steps(p)) for p in range(2)] == [[0], [1, 2]]
    assert f.part_columns(1).tolist() == list(range(16, 40))
    g = MC.mmac_layout("gru", 30, 11)
    assert (g.clusters, g.batch_per_block, g.blocks) == (2, 6, 16)


def test_fit_takes_16_bit_keys_on_clusters_with_the_reasons():
    props = H100_SXM.props()
    for dtype in MC.MMA_DTYPES:
        f = MC.mmac_fit("lstm", 256, 32, props, dtype)
        assert f.ok and f.clusters == 4 and f.threads <= MC.MMAC_MAX_THREADS, f.reason
        assert f.k_parts == 2 and f.m_tiles == 8
    for dtype in ("float32", "tf32"):
        f = MC.mmac_fit("lstm", 256, 32, props, dtype)
        assert not f.ok and MC.MMA_DTYPES_REASON in f.reason
    f = MC.mmac_fit("gru", 256, 8, dict(props, major=8), "float16")
    assert not f.ok and "compute capability 9.0" in f.reason
    f = MC.mmac_fit("lstm", 512, 8, props, "float16")
    assert not f.ok and "shared memory" in f.reason
    f = MC.mmac_fit("lstm", 1024, 8, props, "float16")
    assert not f.ok and "launch bound" in f.reason
    f = MC.mmac_fit("gru", 64, 8, props, "float16", k_parts=5)   # 4 k16 steps
    assert not f.ok and "empty" in f.reason
    with pytest.raises(ValueError, match="hidden must be a positive int"):
        MC.mmac_layout("lstm", 0, 8)


def test_expressions_and_devices_without_clusters():
    for c in CELLS:
        name = MC.kernel_name(c)
        assert typed.persistent_expression(name, "float16") == f"{name}_t<fp16, false>"
        assert typed.persistent_expression(name, "bfloat16") == f"{name}_t<bf16, false>"
        with pytest.raises(ValueError, match="no float32 instantiation"):
            typed.persistent_expression(name, "float32")
        assert typed.needs_clusters(name)
    assert typed_persistent_kernels("persistent_mmac.cu", cluster=False) == ()
    assert len(typed_persistent_kernels("persistent_mmac.cu", cluster=True)) == 4
