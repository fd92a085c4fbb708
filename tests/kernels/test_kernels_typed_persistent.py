"""The per-layer persistent kernels' typed instantiations (persistent.cu, persistent_bwd.cu,
persistent_regs.cu, persistent_solo.cu: K_t<TS, TF32>; rnnrt/kernels/typed.py persistent_expression), checked without a GPU through
NVRTC as CuPy compiles them (name expressions):

- K_t<float, false> compiles to the ``extern "C"`` kernel K's PTX, the entry's name aside
  (the typed kernel at float32 is the fp32 kernel's math, not a second copy of it; with the
  functions an entry calls, the solo _rr kernels' bodies);
- every kernel's tf32, bf16 and fp16 instantiations compile without warnings, and round
  where the design says: a 16-bit instantiation stores h / dg with cvt.rn and a 2-byte
  store and stages them with 2-byte loads (no 16-byte cp.async of them), tf32 rounds its
  operands with the integer rounding (and->0xffffe000) and stages with 4-byte loads;
- the expressions and element types the executor asks for.
"""
from __future__ import annotations

import re

import pytest
from test_kernels_typed import entry, nvrtc_ptx
from testkit import find_nvrtc

from rnnrt.kernels import registry as K
from rnnrt.kernels import sources as S
from rnnrt.kernels import typed

TYPED = [k for k in K.REGISTRY if k.persistent and k.file in typed.TYPED_PERSISTENT_FILES]
DTYPES = ("float32", "tf32", "bfloat16", "float16")


@pytest.fixture(scope="module")
def compiled():
    lib = find_nvrtc()
    if lib is None:
        pytest.skip("libnvrtc not found (pip install nvidia-cuda-nvrtc to run this check)")
    out = {}
    for f in typed.TYPED_PERSISTENT_FILES:
        exprs = [f"{k.name}_t<float, false>" for k in TYPED if k.file == f]
        exprs += [typed.persistent_expression(k.name, d) for k in TYPED if k.file == f
                  for d in DTYPES[1:]]
        out[f] = nvrtc_ptx(lib, S.source(f), f, exprs)
    return out


def _with_callees(ptx, name):
    """Entry ``name``'s PTX (``entry``) and the bodies of the functions it calls (the solo
    _rr kernels' bodies are __noinline__ functions: solo_fwd_rr), call sequence numbers
    dropped (PTX numbers the calls of a whole module: two entries calling one function differ
    there only)."""
    text = entry(ptx, name)
    for callee in sorted(set(re.findall(r"\b(_Z\w+)", text))):
        m = re.search(r"\.func\s+" + re.escape(callee) + r"\(.*?\n}\n", ptx, re.S)
        if m:
            text += m[0]
    return re.sub(r"callseq \d+", "callseq", text)


def test_every_per_layer_persistent_kernel_is_typed():
    # 4 cells x (grid, cluster x forward, backward + the register-resident and the solo
    # forward) + the solo forward with R in registers (GRU and the RNNs)
    assert len(TYPED) == 27


@pytest.mark.parametrize("kinfo", TYPED, ids=lambda k: k.name)
def test_fp32_instantiation_is_the_fp32_kernel(kinfo, compiled):
    ptx, lowered = compiled[kinfo.file]
    low = lowered[f"{kinfo.name}_t<float, false>"]
    assert _with_callees(ptx, low) == _with_callees(ptx, kinfo.name), \
        f"{kinfo.name}_t<float, false> does not compile to {kinfo.name}'s PTX"


@pytest.mark.parametrize("kinfo", TYPED, ids=lambda k: k.name)
def test_typed_instantiations_round_where_the_design_says(kinfo, compiled):
    ptx, lowered = compiled[kinfo.file]
    fp32 = _with_callees(ptx, kinfo.name)
    body = {d: _with_callees(ptx, lowered[typed.persistent_expression(kinfo.name, d)])
            for d in DTYPES[1:]}
    assert "cvt.rn.bf16.f32" in body["bfloat16"] and "cvt.rn.f16.f32" in body["float16"]
    for d in ("bfloat16", "float16"):
        assert re.search(r"st\.global(\.cg)?\.[ub]16", body[d]), d
        if kinfo.name != "lstm_persistent_cluster_bwd":   # it loads no 16-bit sequence
            assert re.search(r"ld\.global(\.cg|\.cs|\.nc)?\.[ub]16", body[d]), d
    for d in DTYPES[1:]:   # no 16-byte staging of the typed sequence
        assert "cp.async.cg.shared.global" not in body[d], d
    if kinfo.file in ("persistent.cu", "persistent_bwd.cu") and "cluster" not in kinfo.name:
        # the contrast: the fp32 grid kernel stages 16 bytes (the cluster, register-resident
        # and solo kernels keep h_{t+1} in shared memory instead)
        assert "cp.async.cg.shared.global" in fp32
    assert "-8192" in body["tf32"] or "0xffffe000" in body["tf32"].lower() or \
        "4294959104" in body["tf32"], "tf32: no TF32 rounding mask"
    assert "cvt.rn.bf16" not in body["tf32"] and "cvt.rn.bf16" not in fp32


def test_expressions_and_element_types():
    assert typed.persistent_expression("lstm_persistent_fwd", "float32") is None
    assert typed.persistent_expression("gru_persistent_cluster_bwd", "bfloat16") == \
        "gru_persistent_cluster_bwd_t<bf16, false>"
    assert typed.persistent_expression("lstm_persistent_bwd", "tf32") == \
        "lstm_persistent_bwd_t<float, true>"
    with pytest.raises(ValueError, match="no typed persistent instantiation"):
        typed.persistent_expression("lstm_persistent_stack_fwd", "float16")
    assert typed.persistent_types("lstm_persistent_fwd", "bfloat16") == (
        "bfloat16", "float32", "float32", "uint32", "float32", "float32", "float32", "float32")
    # the backward: dg and (GRU / RNN) the forward's h in storage, the LSTM's c fp32
    assert typed.persistent_types("gru_persistent_bwd", "float16")[:2] == ("float16",) * 2
    t = typed.persistent_types("lstm_persistent_bwd", "float16")
    assert t[0] == "float16" and "float16" not in t[1:]
    assert typed.persistent_types("rnn_tanh_persistent_bwd", "float16")[-2] == "float16"


@pytest.mark.parametrize("file", typed.TYPED_PERSISTENT_FILES)
def test_typed_only_module_has_no_fp32_kernels(file):
    """The module get_persistent compiles for one precision (-DRNNRT_TYPED_ONLY) holds every
    kernel's instantiation and none of the file's fp32 kernels (each of those would be
    compiled again for nothing)."""
    from rnnrt.kernels.library import TYPED_ONLY, typed_persistent_kernels
    from test_kernels_typed import OPTIONS

    lib = find_nvrtc()
    if lib is None:
        pytest.skip("libnvrtc not found (pip install nvidia-cuda-nvrtc to run this check)")
    names = typed_persistent_kernels(file, cluster=True)
    assert names and all(get.file == file for get in map(K.get_kernel, names))
    exprs = [typed.persistent_expression(n, "bfloat16") for n in names]
    ptx, lowered = nvrtc_ptx(lib, S.source(file), file, exprs, [*OPTIONS, TYPED_ONLY])
    entries = set(re.findall(r"\.entry\s+(\w+)\(", ptx))
    assert entries == set(lowered.values()), entries ^ set(lowered.values())
    assert not entries & set(names)   # no extern "C" kernel in the module


def test_get_persistent_compiles_one_module_a_file_and_precision(monkeypatch):
    """The first typed request of a (file, precision) compiles every kernel of the file at
    that precision in one module; later requests of that precision compile nothing; fp32
    asks for the extern "C" kernel."""
    from rnnrt.kernels import library as L

    calls = []

    class Module:
        def get_function(self, expr):
            return ("fn", expr)

    def fake_compile(file, text, options, exprs):
        calls.append((file, options, exprs))
        return Module()

    monkeypatch.setattr(L, "compile_twins", fake_compile)
    monkeypatch.setattr(L, "device_has_clusters", lambda: True)
    lib = L.KernelLibrary()
    a = lib.get_persistent("gru_persistent_fwd", "bfloat16")
    b = lib.get_persistent("lstm_persistent_cluster_fwd", "bfloat16")
    assert a == ("fn", "gru_persistent_fwd_t<bf16, false>")
    assert b == ("fn", "lstm_persistent_cluster_fwd_t<bf16, false>")
    assert len(calls) == 1
    file, options, exprs = calls[0]
    assert file == "persistent.cu" and L.TYPED_ONLY in options and len(exprs) == 8
    lib.get_persistent("gru_persistent_fwd", "tf32")
    lib.get_persistent("gru_persistent_bwd", "tf32")
    assert [c[0] for c in calls] == ["persistent.cu", "persistent.cu", "persistent_bwd.cu"]
    assert "gru_persistent_fwd_t<float, true>" in calls[1][2]


def test_a_device_without_clusters_instantiates_no_cluster_kernel():
    """typed_persistent_kernels(cluster=False): no cluster kernel of persistent.cu /
    persistent_bwd.cu, none of the register-resident file (every kernel there runs in
    clusters), every solo kernel (one block, no cluster)."""
    from rnnrt.kernels.library import typed_persistent_kernels
    assert typed_persistent_kernels("persistent_regs.cu", cluster=False) == ()
    assert len(typed_persistent_kernels("persistent_regs.cu", cluster=True)) == 4
    grid = typed_persistent_kernels("persistent.cu", cluster=False)
    assert len(grid) == 4 and not any("_cluster_" in n for n in grid), grid
    assert len(typed_persistent_kernels("persistent.cu", cluster=True)) == 8
    assert len(typed_persistent_kernels("persistent_solo.cu", cluster=False)) == 7
    assert typed.needs_clusters("gru_persistent_regs_fwd")
    assert not typed.needs_clusters("gru_persistent_solo_rr_fwd")
