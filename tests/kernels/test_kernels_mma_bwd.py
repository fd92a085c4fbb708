"""The tensor-core backward grid kernels' host side and compile (rnnrt/kernels/mma_bwd.py,
cuda_src/persistent_mma_bwd.cu), without a GPU: nvcc compiles every bf16 / fp16
instantiation for sm_90a with mma.sync of that type, no stack, no spills and no more
registers than the fit assumes; the fit's decisions (16-bit keys only, with the reason;
whole k16 steps where they fit; one block per SM; U by the cost model); the layout is the
kernel's (pk_geom<true> with M = U, K = G*H); the registry's entries (typed only, the
backward grid kernels' arguments, the twin over this cut) and the NVRTC expressions.
"""
from __future__ import annotations

import re

import pytest

from rnnrt.kernels import mma as MM
from rnnrt.kernels import mma_bwd as MB
from rnnrt.kernels import registry as K
from rnnrt.kernels import sources as S
from rnnrt.kernels import typed
from rnnrt.kernels.limits import H100_SXM
from testkit import CELLS, check_no_spills, nvcc_instantiations

SRC = S.source("persistent_mma_bwd.cu")
_ARGS = {"lstm": "int, int, {T}*, int, float*, int, float*, int, unsigned int*, int, "
                 "const float*, int, const float*, int, const float*, int, const float*, int, "
                 "const float*, int, const float*, int, int, int, int",
         "gru": "int, int, {T}*, int, {T}*, int, float*, int, unsigned int*, int, const float*, "
                "int, const float*, int, const float*, int, const {T}*, int, const float*, int, "
                "int, int, int"}
_ARGS["rnn_tanh"] = _ARGS["rnn_relu"] = (
    "int, int, {T}*, int, float*, int, unsigned int*, int, const float*, int, const float*, "
    "int, const {T}*, int, const float*, int, int, int, int")


@pytest.fixture(scope="module")
def usage(tmp_path_factory):
    return nvcc_instantiations(
        tmp_path_factory.mktemp("mma_bwd"), "persistent_mma_bwd.cu",
        [f"{MB.kernel_name(c)}_t<{t}, false>({_ARGS[c].format(T=t)})"
         for c in CELLS for t in ("bf16", "fp16")])


def test_every_instantiation_compiles_without_spills(usage):
    found, ptx = usage
    check_no_spills(found, MB.kernel_name, MB.NVCC_REGS)
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in ptx
    # the typed backward's stores and loads: dg stored 2 bytes, no 16-byte staging of it
    assert re.search(r"st\.global(\.cg)?\.[ub]16", ptx)
    assert "cp.async.cg.shared.global" not in ptx


def test_the_kernel_is_the_backward_body_on_tensor_cores():
    """The .cu's kernels are persistent_bwd<..., MMA = true> grid instantiations (CL 0),
    whose layout is pk_geom<true> over the backward's product (one row a unit, K = G*H) and
    whose k-group is the warp; the factored body is persistent_bwd.cu's too."""
    assert SRC.count("__launch_bounds__(PK_MAX_THREADS, 1)") == len(CELLS)
    assert len(re.findall(r"persistent_bwd<\d, CELL_\w+, 0, TS, TF32, true>", SRC)) == len(CELLS)
    assert "const PkGeom g = pk_geom<MMA>(1, PAIR ? 2 * U : U, BG, KD, KT, nt);" in SRC   # KD = K
    assert "const int kg = MMA ? warp : warp * g.LK + lk;" in SRC
    assert "pk_mma_span<TS>(macc, g, Rs, hcur, B, K, k0, c0, c1, 0, 0, lane);" in SRC
    assert "persistent_bwd.cuh (inlined" in S.source("persistent_bwd.cu")
    assert "extern \"C\"" not in re.sub(r"//[^\n]*|/\*.*?\*/", "", SRC, flags=re.S)


def test_geometry_is_the_kernels_layout():
    f = MB.mma_bwd_geometry("lstm", 40, 9, 5, 128)   # K = 160 in one tile
    assert (f.rows, f.depth, f.k_tile, f.k_groups, f.lanes) == (5, 160, 160, 4, (1, 1, 1))
    assert f.smem_bytes == 4 * (5 * MM.mma_stride(160) + 9 * MM.mma_stride(160)
                                + 4 * 5 * MM.mma_stride(9))
    assert (f.m_tiles, f.n_tiles, f.tile_groups) == (1, 2, 1)
    g = MB.mma_bwd_geometry("gru", 40, 9, 34, 256, 16)
    assert (g.m_tiles, g.tile_groups, g.blocks, g.tiles) == (3, 2, 2, 8)
    assert g.kernel == "gru_persistent_mma_bwd" and f.kernel == "lstm_persistent_mma_bwd"
    assert not MB.mma_bwd_geometry("lstm", 40, 300, 5, 128).ok   # 1,500 cells > 2 a thread


def test_fit_takes_16_bit_keys_only_with_the_reason():
    props = H100_SXM.props()
    for cell in ("lstm", "gru"):
        for dtype in MM.MMA_DTYPES:
            for H in (256, 512, 1024):
                for B in (8, 64):
                    f = MB.mma_bwd_fit(cell, H, B, props, dtype)
                    assert f.ok and f.blocks <= props["multiProcessorCount"], f.describe()
                    assert f.whole_steps and f.k_groups == f.warps, f.describe()
                    assert "by the cost model" in f.reason
    for dtype in ("float32", "tf32"):
        f = MB.mma_bwd_fit("lstm", 512, 64, props, dtype)
        assert not f.ok and MM.MMA_DTYPES_REASON in f.reason and "DOES NOT FIT" in f.describe()
    f = MB.mma_bwd_fit("gru", 100, 8, dict(props, major=7), "float16")
    assert not f.ok and "compute capability" in f.reason
    f = MB.mma_bwd_fit("lstm", 512, 64, props, "bfloat16", units_per_block=1)
    assert not f.ok and "one block per SM" in f.reason
    f = MB.mma_bwd_fit("lstm", 4096, 64, props, "bfloat16")
    assert not f.ok and "shared memory" in f.reason, f.reason


def test_the_cost_model_prefers_fewer_blocks_up_to_a_whole_m16_tile():
    """Doubling U halves the dg_t every block stages and, up to 16 units (one m16 tile),
    costs no tensor-core steps: the fit takes U 16 where it fits (B 8), and the step model
    counts padded tiles."""
    props = H100_SXM.props()
    f = MB.mma_bwd_fit("lstm", 512, 8, props, "bfloat16")
    assert f.units_per_block == 16, f.describe()
    a = MB.mma_bwd_geometry("lstm", 512, 8, 8, 256, 512)
    b = MB.mma_bwd_geometry("lstm", 512, 8, 16, 256, 512)
    assert b.step_us() < a.step_us()
    assert a.m_tiles == b.m_tiles == 1


def test_registry_entries_and_expressions():
    for cell in CELLS:
        k, fma = K.get_kernel(MB.kernel_name(cell)), K.get_kernel(f"{cell}_persistent_bwd")
        assert k.file == "persistent_mma_bwd.cu" and k.persistent
        assert (k.outs, k.ins, k.scalars, k.uint_args) == (fma.outs, fma.ins, fma.scalars,
                                                           fma.uint_args)
        assert k.numpy_fn.__name__ == MB.kernel_name(cell)
    assert typed.persistent_expression("gru_persistent_mma_bwd", "bfloat16") == \
        "gru_persistent_mma_bwd_t<bf16, false>"
    assert typed.persistent_expression("lstm_persistent_mma_bwd", "float16") == \
        "lstm_persistent_mma_bwd_t<fp16, false>"
    for dtype in ("float32", "tf32"):
        with pytest.raises(ValueError, match="no .* instantiation"):
            typed.persistent_expression("lstm_persistent_mma_bwd", dtype)
    assert typed.persistent_types("gru_persistent_mma_bwd", "float16") == \
        typed.persistent_types("gru_persistent_bwd", "float16")
    from rnnrt.kernels.library import typed_persistent_kernels
    assert set(typed_persistent_kernels("persistent_mma_bwd.cu", cluster=True)) == \
        {MB.kernel_name(c) for c in CELLS}
