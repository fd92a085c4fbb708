"""The pointwise kernels' typed twins (cuda_src/*.cu's K_t templates, rnnrt/kernels/typed.py),
checked without a GPU, through NVRTC as CuPy compiles them (name expressions):

- every twin instantiated with fp32 everywhere compiles to its ``extern "C"`` kernel's PTX,
  the entry's name aside: the twin is the fp32 kernel's math, not a second copy of it;
- every twin compiles with each argument bf16 or fp16 (all 16-bit; and the combinations a
  16-bit plan uses: one argument 16-bit, the others fp32), no warnings;
- a 16-bit store is a cvt.rn (round to nearest even) and a 2-byte store, a 16-bit load a
  2-byte load and a widening (a shift for bf16), and an fp32 twin has neither;
- name expressions, the header paragraph and the registry agree.
"""
from __future__ import annotations

import ctypes
import re

import pytest
from testkit import find_nvrtc

from rnnrt.kernels import registry as K
from rnnrt.kernels import sources as S
from rnnrt.kernels import typed

POINTWISE = [k for k in K.REGISTRY if not k.persistent]
FILES = sorted({k.file for k in POINTWISE})
OPTIONS = ["-std=c++17", "--gpu-architecture=sm_90"]


def nvrtc_ptx(lib, text, name, exprs, options=OPTIONS):
    """(PTX, {expression: lowered name}) of ``text`` compiled with NVRTC, the name
    expressions ``exprs`` instantiated (as cupy.RawModule(name_expressions=...) does)."""
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), text.encode(), name.encode(), 0, None,
                                  None) == 0
    try:
        for e in exprs:
            assert lib.nvrtcAddNameExpression(prog, e.encode()) == 0, e
        opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
        rc = lib.nvrtcCompileProgram(prog, len(options), opts)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        log = log.value.decode(errors="replace")
        assert rc == 0, f"{name}: NVRTC failed:\n{log}"
        assert "warning" not in log.lower(), f"{name}: NVRTC warnings:\n{log}"
        lowered = {}
        for e in exprs:
            out = ctypes.c_char_p()
            assert lib.nvrtcGetLoweredName(prog, e.encode(), ctypes.byref(out)) == 0
            lowered[e] = out.value.decode()
        lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
        ptx = ctypes.create_string_buffer(size.value)
        assert lib.nvrtcGetPTX(prog, ptx) == 0
        return ptx.value.decode(), lowered
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def entry(ptx, name):
    """The PTX of entry ``name`` (its parameters and body), with ``name`` replaced by 'K' and
    the labels' function numbers dropped ($L__BB3_2 -> $L__BB_2), the kernel's statics named
    by their own names (_ZZ9transposeE4tile -> tile), so that two entries of different names
    compare."""
    m = re.search(r"\.entry " + re.escape(name) + r"\(.*?\n}\n", ptx, re.S)
    assert m, f"no entry {name} in the PTX"
    body = re.sub(r"_ZZ\w*?E\d+(\w+)", r"\1", m[0])
    return re.sub(r"\$L__BB\d+_", "$L__BB_", body.replace(name, "K"))


def _nargs(k):
    return len(k.outs) + len(k.ins)


@pytest.fixture(scope="module")
def nvrtc():
    lib = find_nvrtc()
    if lib is None:
        pytest.skip("libnvrtc not found (pip install nvidia-cuda-nvrtc to run this check)")
    return lib


@pytest.fixture(scope="module")
def fp32_twins(nvrtc):
    """{file: (PTX, lowered names)}: each file with every twin's all-fp32 instantiation."""
    out = {}
    for f in FILES:
        exprs = [typed.name_expression(k.name, ["float32"] * _nargs(k))
                 for k in POINTWISE if k.file == f]
        out[f] = nvrtc_ptx(nvrtc, S.source(f), f, exprs)
    return out


@pytest.mark.parametrize("kinfo", POINTWISE, ids=lambda k: k.name)
def test_fp32_twin_is_the_fp32_kernel(kinfo, fp32_twins):
    ptx, lowered = fp32_twins[kinfo.file]
    twin = lowered[typed.name_expression(kinfo.name, ["float32"] * _nargs(kinfo))]
    assert entry(ptx, twin) == entry(ptx, kinfo.name), \
        f"{kinfo.name}_t<float, ...> does not compile to {kinfo.name}'s PTX"


def _combos(k):
    """The 16-bit combinations checked: all bf16, all fp16, and each argument alone bf16
    (then fp16) with the others fp32."""
    n = _nargs(k)
    yield ["bfloat16"] * n
    yield ["float16"] * n
    for i in range(n):
        for t in ("bfloat16", "float16"):
            yield ["float32"] * i + [t] + ["float32"] * (n - i - 1)


@pytest.mark.parametrize("file", FILES)
def test_16bit_twins_compile(file, nvrtc):
    exprs = [typed.name_expression(k.name, c) for k in POINTWISE if k.file == file
             for c in _combos(k)]
    ptx, lowered = nvrtc_ptx(nvrtc, S.source(file), file, exprs)
    for e, low in lowered.items():
        assert f".entry {low}(" in ptx, f"{e}: not in the PTX"


def test_a_16bit_store_rounds_to_nearest_even_and_a_load_widens(nvrtc):
    """ew_copy_t: the fp32 -> 16-bit copy stores through cvt.rn (ties to even) and a 2-byte
    store; the 16-bit -> fp32 copy loads 2 bytes and widens (a shift for bf16, cvt for
    fp16); the fp32 copy neither."""
    combos = [("bfloat16", "float32"), ("float16", "float32"), ("float32", "bfloat16"),
              ("float32", "float16"), ("float32", "float32")]
    names = {c: typed.name_expression("ew_copy", c) for c in combos}
    ptx, lowered = nvrtc_ptx(nvrtc, S.source("elementwise.cu"), "elementwise.cu",
                             list(names.values()))
    body = {c: entry(ptx, lowered[e]) for c, e in names.items()}
    store16 = re.compile(r"st\.global\.[ub]16")
    load16 = re.compile(r"ld\.global\.(nc\.)?[ub]16")
    conv = re.compile(r"cvt\.(rn\.)?(bf16|f16|f32)\.(f32|f16|bf16)")
    assert "cvt.rn.bf16.f32" in body["bfloat16", "float32"]
    assert store16.search(body["bfloat16", "float32"])
    assert "cvt.rn.f16.f32" in body["float16", "float32"]
    assert store16.search(body["float16", "float32"])
    assert load16.search(body["float32", "bfloat16"]) and "shl.b32" in body["float32", "bfloat16"]
    assert not conv.search(body["float32", "bfloat16"])     # bf16 -> f32 is a shift, exact
    assert load16.search(body["float32", "float16"]) and "cvt.f32.f16" in body["float32", "float16"]
    fp32 = body["float32", "float32"]
    assert not (conv.search(fp32) or load16.search(fp32) or store16.search(fp32))


def test_name_expressions_and_checks():
    assert typed.name_expression("ew_copy", ("bfloat16", "float32")) == "ew_copy_t<bf16, float>"
    assert typed.name_expression("transpose", ("float16", "float32")) == \
        "transpose_t<fp16, float>"
    with pytest.raises(ValueError, match="ew_copy: types: expected 2"):
        typed.name_expression("ew_copy", ("float32",))
    with pytest.raises(ValueError, match="has element type 'float64'"):
        typed.name_expression("ew_copy", ("float64", "float32"))
    with pytest.raises(ValueError, match="persistent"):
        persistent = next(k for k in K.REGISTRY if k.persistent)
        typed.name_expression(persistent.name, ["float32"] * _nargs(persistent))
    assert typed.is_fp32(("float32", "float32")) and not typed.is_fp32(("bfloat16", "float32"))


_TWIN = re.compile(r"template\s*<([^>]*)>\s*__global__\s+void\s+(\w+)_t\s*\(([^)]*)\)", re.S)


@pytest.mark.parametrize("file", FILES)
def test_every_pointwise_kernel_has_a_twin_with_its_arguments(file):
    """Each kernel of the file has one twin K_t, one template parameter per pointer, the
    pointer names the registry's, in its order; the header says twins exist."""
    text = S.source(file)
    twins = {}
    for params, name, args in _TWIN.findall(text):
        assert name not in twins, f"{file}: {name}_t defined twice"
        ptrs = re.findall(r"(\w+)\s*\*\s*(?:__restrict__\s+)?(\w+)\s*,", args + ",")
        tparams = [p.split()[-1] for p in params.split(",")]
        assert [t for t, _ in ptrs] == tparams, f"{name}_t: pointer types {ptrs} vs {tparams}"
        twins[name] = tuple(n for _, n in ptrs)
    kernels = [k for k in POINTWISE if k.file == file]
    assert sorted(twins) == sorted(k.name for k in kernels)
    for k in kernels:
        assert twins[k.name] == tuple(a for a, _ in k.outs + k.ins), k.name
    assert "typed twin" in text.split("*/", 1)[0], f"{file}: the header does not say"


def test_the_fp32_comparison_catches_a_twin_that_computes_otherwise(nvrtc):
    """Planted fault: ew_add_t subtracting (its call of the shared loop given op_sub; ew_add's
    call, the first, kept) no longer compiles to ew_add's PTX (the check above would fail)."""
    text = S.source("elementwise.cu")
    call = "ew_binary<op_add>(rows, cols, out, ldout, a, lda, b, ldb);"
    assert text.count(call) == 2    # ew_add's, then ew_add_t's
    head, twin = text.rsplit(call, 1)
    broken = head + call.replace("op_add", "op_sub") + twin
    e = typed.name_expression("ew_add", ["float32"] * 3)
    ptx, lowered = nvrtc_ptx(nvrtc, broken, "elementwise.cu", [e])
    assert entry(ptx, lowered[e]) != entry(ptx, "ew_add")
