"""The tensor-core grid kernels' host side and compile (rnnrt/kernels/mma.py,
cuda_src/persistent_mma.cu), without a GPU: the constants match the kernel; nvcc compiles
every bf16 / fp16 instantiation for sm_90a with mma.sync of that type, no stack, no spills
and no more registers than the fit assumes; the fit's decisions (16-bit keys only, with the
reason; whole k16 steps where they fit; one block per SM); the NVRTC expressions.
"""
from __future__ import annotations

import re

import pytest

from rnnrt.kernels import mma as MM
from rnnrt.kernels import sources as S
from rnnrt.kernels import typed
from rnnrt.kernels.limits import H100_SXM
from testkit import CELLS, check_no_spills, nvcc_instantiations

SRC = S.source("persistent_mma.cu")
FORWARD_ARGS = {"lstm": "int, int, {T}*, int, float*, int, float*, int, unsigned int*, int, "
                 "const float*, int, const float*, int, const float*, int, const float*, int, "
                 "int, int, int",
         "gru": "int, int, {T}*, int, float*, int, unsigned int*, int, const float*, int, "
                "const float*, int, const float*, int, const float*, int, int, int, int"}
FORWARD_ARGS["rnn_tanh"] = FORWARD_ARGS["rnn_relu"] = (
    "int, int, {T}*, int, unsigned int*, int, const float*, int, const float*, int, "
    "const float*, int, const float*, int, int, int, int")


def test_constants_match_the_kernel():
    for name in ("PK_MMA_MT", "PK_MMA_NT"):
        m = re.search(rf"#define {name} (\d+)", SRC)
        assert m and int(m[1]) == getattr(MM, name), name
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in SRC
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in SRC
    assert MM.mma_stride(40) == 72 and MM.mma_stride(64) == 72 and MM.mma_stride(65) == 104


@pytest.fixture(scope="module")
def usage(tmp_path_factory):
    return nvcc_instantiations(
        tmp_path_factory.mktemp("mma"), "persistent_mma.cu",
        [f"{MM.kernel_name(c)}_t<{t}, false>({FORWARD_ARGS[c].format(T=t)})"
         for c in CELLS for t in ("bf16", "fp16")])


def test_every_instantiation_compiles_without_spills(usage):
    found, ptx = usage
    check_no_spills(found, MM.kernel_name, MM.NVCC_REGS)
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in ptx
    assert "cvt.rn.bf16x2.f32" in ptx and "cvt.rn.f16x2.f32" in ptx


def test_fit_takes_16_bit_keys_only_with_the_reason():
    props = H100_SXM.props()
    for dtype in MM.MMA_DTYPES:
        f = MM.mma_fit("lstm", 512, 64, props, dtype)
        assert f.ok and f.blocks <= props["multiProcessorCount"], f.reason
        assert f.whole_steps and f.tiles == 1 and f.k_groups == f.warps
    for dtype in ("float32", "tf32"):
        f = MM.mma_fit("lstm", 512, 64, props, dtype)
        assert not f.ok and MM.MMA_DTYPES_REASON in f.reason
    f = MM.mma_fit("lstm", 1024, 256, props, "bfloat16")
    assert not f.ok and "shared memory" in f.reason
    f = MM.mma_fit("gru", 100, 8, dict(props, major=7), "float16")
    assert not f.ok and "compute capability" in f.reason


def test_whole_k16_steps_where_they_fit_else_narrower_tiles():
    props = H100_SXM.props()
    f = MM.mma_fit("lstm", 256, 64, props, "bfloat16")
    assert f.k_tile % MM.k_step_quantum(f.threads) == 0 and f.whole_steps
    f = MM.mma_fit("lstm", 1024, 64, props, "bfloat16")   # no whole-step tile fits
    assert f.ok and not f.whole_steps and f.tiles > 1
    g = MM.mma_geometry("lstm", 40, 9, 5, 128)
    assert g.smem_bytes == 4 * (20 * 72 + 9 * 72 + 4 * 20 * 40)


def test_expressions():
    assert typed.persistent_expression("gru_persistent_mma_fwd", "bfloat16") == \
        "gru_persistent_mma_fwd_t<bf16, false>"
    assert typed.persistent_expression("lstm_persistent_mma_fwd", "float16") == \
        "lstm_persistent_mma_fwd_t<fp16, false>"
    for dtype in ("float32", "tf32"):
        with pytest.raises(ValueError, match="no .* instantiation"):
            typed.persistent_expression("lstm_persistent_mma_fwd", dtype)
