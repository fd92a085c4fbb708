"""The CUDA kernels, checked without a GPU.

- every cuda_src/*.cu compiles for sm_90 with nvcc, and with NVRTC where its library is
  found (the way CuPy will compile it: no includes);
- each file's header, its `extern "C" __global__` definitions and the registry agree on the
  kernels and their arguments;
- the NumPy twins match formulas written here, on views with padding (ld > cols), broadcast
  biases (ld = 0) and in place, with outputs poisoned with NaN and nothing written outside;
- the backward twins, chained over time with the GEMMs between them, reproduce
  ``reference.backward``; the naive rung's ew_* kernels compose to the fused backward twins;
- the registry's arguments, launch geometry and loader (with a stand-in for CuPy).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from rnnrt import kernels as K
from rnnrt import reference
from rnnrt.cells import get_cell
from rnnrt.check import assert_close as check_close
from rnnrt.exec import kernels_np as knp
from rnnrt.ops import View

CU_FILES = sorted(p.name for p in K.cuda_src_dir().glob("*.cu"))
REPO = Path(K.__file__).resolve().parent.parent


# --- compiling ----------------------------------------------------------------------------

@pytest.mark.parametrize("file", CU_FILES)
def test_nvcc_compiles_sm90(file, tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH")
    cmd = [nvcc, "-arch=sm_90", "--cubin", "-std=c++17", "-Werror", "all-warnings",
           "-o", str(tmp_path / "k.cubin"), str(K.cuda_src_dir() / file)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stdout}\n{r.stderr}"


def _find_nvrtc():
    """libnvrtc through ctypes: the system's, CUDA_HOME's or a pip wheel's (nvidia-cuda-nvrtc)."""
    candidates = [ctypes.util.find_library("nvrtc")]
    for root in [os.environ.get("CUDA_HOME", "/usr/local/cuda")]:
        candidates += sorted(glob.glob(os.path.join(root, "lib*", "libnvrtc.so*")))
    for d in sys.path:
        candidates += sorted(glob.glob(os.path.join(d, "nvidia", "*", "lib", "libnvrtc.so*")))
    for c in candidates:
        if c:
            try:
                # libnvrtc dlopens its builtins by name: load them first, from beside it.
                for b in glob.glob(os.path.join(os.path.dirname(c), "libnvrtc-builtins.so*")):
                    if ".alt." not in b:
                        ctypes.CDLL(b, mode=ctypes.RTLD_GLOBAL)
                return ctypes.CDLL(c)
            except OSError:
                continue
    return None


def _nvrtc_compile(lib, text, name, options):
    """(ok, log) of compiling ``text`` with NVRTC."""
    prog = ctypes.c_void_p()
    rc = lib.nvrtcCreateProgram(ctypes.byref(prog), text.encode(), name.encode(), 0, None, None)
    assert rc == 0, f"nvrtcCreateProgram: {rc}"
    opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
    try:
        rc = lib.nvrtcCompileProgram(prog, len(options), opts)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        return rc == 0, log.value.decode(errors="replace")
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


@pytest.mark.parametrize("file", CU_FILES)
def test_compiles_as_nvrtc_sees_it(file):
    text = K.source(file)
    includes = [ln for ln in text.splitlines() if ln.lstrip().startswith("#include")]
    assert not includes, f"{file}: NVRTC (CuPy RawModule) has no host headers: {includes}"
    lib = _find_nvrtc()
    if lib is None:
        pytest.skip("libnvrtc not found (pip install nvidia-cuda-nvrtc to run this check)")
    ok, log = _nvrtc_compile(lib, text, file, ["-std=c++17", "--gpu-architecture=sm_90"])
    assert ok, f"{file}: NVRTC failed:\n{log}"
    assert "warning" not in log.lower(), f"{file}: NVRTC warnings:\n{log}"


# --- headers, code and registry agree -----------------------------------------------------

_DEFINITION = re.compile(r'extern\s+"C"\s+__global__\s+void\s+'
                         r'(?:__launch_bounds__\s*\([^)]*\)\s+)?'
                         r'(?:__cluster_dims__\s*\([^)]*\)\s+)?(\w+)\s*\(([^)]*)\)', re.S)


def _signatures(text):
    """{kernel: (outs, ins, scalars, uint pointers)} from the `extern "C" __global__`
    signatures, checking the calling convention on the way: int rows, int cols, then
    (pointer, int ld) pairs, non-const outputs before const float* inputs, then int scalars.
    Outputs are float*, or unsigned int* (returned as the uint pointers: barrier counters)."""
    found = {}
    for name, params in _DEFINITION.findall(text):
        ps = [" ".join(p.split()) for p in params.split(",")]
        assert ps[:2] == ["int rows", "int cols"], f"{name}: starts with {ps[:2]}"
        outs, ins, scalars, uints = [], [], [], []
        rest = ps[2:]
        while rest and "*" in rest[0]:
            assert len(rest) > 1, f"{name}: {rest[0]!r} without its ld"
            ptr, ld = rest[0], rest[1]
            assert ld.startswith("int "), f"{name}: {ptr!r} is followed by {ld!r}, not an int ld"
            *qual, pname = ptr.replace("*", " * ").split()
            qual = [q for q in qual if q != "__restrict__"]
            if qual in (["float", "*"], ["unsigned", "int", "*"]):
                assert not ins, f"{name}: output {pname} after an input"
                outs.append(pname)
                if qual[0] == "unsigned":
                    uints.append(pname)
            else:
                assert qual == ["const", "float", "*"], f"{name}: {ptr!r} is not a float pointer"
                ins.append(pname)
            rest = rest[2:]
        for p in rest:
            typ, _, sname = p.partition(" ")
            assert typ == "int" and re.fullmatch(r"\w+", sname), \
                f"{name}: {p!r} after the pairs is not an int scalar"
            scalars.append(sname)
        found[name] = (tuple(outs), tuple(ins), tuple(scalars), tuple(uints))
    return found


def _definitions(text):
    """{kernel: ((output names), (input names))} from the signatures (see _signatures)."""
    return {k: (o, i) for k, (o, i, _, _) in _signatures(text).items()}


@pytest.mark.parametrize("file", CU_FILES)
def test_header_lists_what_the_file_defines(file):
    text = K.source(file)
    header, code = K.parse_header(text), _definitions(text)
    assert list(header) == list(code), \
        f"{file}: header lists {list(header)}, code defines {list(code)}"
    assert K.header_kernels(file) == list(code)
    for name, (outs, ins) in code.items():
        assert header[name] == (outs, ins), \
            f"{file}: {name}: header args {header[name]} != code {(outs, ins)}"
        kinfo = K.KERNELS.get(name)
        assert kinfo is not None, f"{file}: {name} is not in the registry"
        assert kinfo.file == file
        reg = (tuple(a for a, _ in kinfo.outs), tuple(a for a, _ in kinfo.ins))
        assert reg == (outs, ins), f"{name}: registry args {reg} != code {(outs, ins)}"
    # scalars after the pairs, and the unsigned int* pointers: header, code and registry
    header_scalars = K.parse_header_scalars(text)
    for name, (_, _, scalars, uints) in _signatures(text).items():
        kinfo = K.KERNELS[name]
        assert header_scalars[name] == scalars == kinfo.scalars, \
            f"{name}: scalars header {header_scalars[name]}, code {scalars}, " \
            f"registry {kinfo.scalars}"
        assert uints == kinfo.uint_args, f"{name}: unsigned int* {uints} != {kinfo.uint_args}"
        assert kinfo.persistent == (file == "persistent.cu")


def test_headers_and_registry_list_the_same_kernels():
    in_headers = [k for f in CU_FILES for k in K.header_kernels(f)]
    assert len(in_headers) == len(set(in_headers)), f"a kernel listed twice: {in_headers}"
    assert set(in_headers) == set(K.KERNELS)
    assert set(K.kernel_files()) == set(CU_FILES)
    assert [k.name for k in K.REGISTRY] == list(K.KERNELS)


def _helper(text, name):
    m = re.search(r"(template <class F>\n)?__device__ __forceinline__ \w+ " + name + r"\(.*?\n}\n",
                  text, re.S)
    return m and m[0]


@pytest.mark.parametrize("helper", ["for_each_element", "sigmoidf"])
def test_copied_device_helpers_are_identical(helper):
    copies = {f: _helper(K.source(f), helper) for f in CU_FILES}
    copies = {f: c for f, c in copies.items() if c}
    assert copies, f"no file defines {helper}"
    first = next(iter(copies.values()))
    assert all(c == first for c in copies.values()), f"{helper} differs between {sorted(copies)}"


# --- NumPy twins against direct formulas --------------------------------------------------

def _sig(x):
    return 1.0 / (1.0 + np.exp(-x))


def _ref_lstm(x):
    pre = x["gx"] + x["bw"] + x["gh"] + x["br"]
    i, f, g, o = np.split(pre, 4, axis=1)
    i, f, g, o = _sig(i), _sig(f), np.tanh(g), _sig(o)
    c = f * x["c_prev"] + i * g
    return {"h": o * np.tanh(c), "c": c, "act": np.concatenate([i, f, g, o], axis=1)}


def _ref_gru(x):
    gx, gh = x["gx"] + x["bw"], x["gh"] + x["br"]
    xr, xz, xn = np.split(gx, 3, axis=1)
    hr, hz, hn = np.split(gh, 3, axis=1)
    r, z = _sig(xr + hr), _sig(xz + hz)
    n = np.tanh(xn + r * hn)
    return {"h": (1 - z) * n + z * x["h_prev"], "act": np.concatenate([r, z, n, hn], axis=1)}


def _ref_lstm_bwd(x):
    i, f, g, o = np.split(x["act"], 4, axis=1)
    dh = x["dh_above"] + x["dh_rec"]
    tc = np.tanh(x["c"])
    dc = x["dc_next"] + dh * o * (1 - tc**2)
    dgx = [dc * g * i * (1 - i), dc * x["c_prev"] * f * (1 - f), dc * i * (1 - g**2),
           dh * tc * o * (1 - o)]
    return {"dgx": np.concatenate(dgx, axis=1), "dc_prev": dc * f}


def _ref_gru_bwd(x):
    r, z, n, hn = np.split(x["act"], 4, axis=1)
    dh = x["dh_above"] + x["dh_rec"]
    dn = dh * (1 - z) * (1 - n**2)
    dr = dn * hn * r * (1 - r)
    dz = dh * (x["h_prev"] - n) * z * (1 - z)
    return {"dgx": np.concatenate([dr, dz, dn], axis=1),
            "dgh": np.concatenate([dr, dz, dn * r], axis=1), "dh_prev": dh * z}


REF = {
    "ew_add": lambda x: {"out": x["a"] + x["b"]},
    "ew_sub": lambda x: {"out": x["a"] - x["b"]},
    "ew_mul": lambda x: {"out": x["a"] * x["b"]},
    "ew_sigmoid": lambda x: {"out": _sig(x["a"])},
    "ew_tanh": lambda x: {"out": np.tanh(x["a"])},
    "ew_relu": lambda x: {"out": np.maximum(x["a"], 0)},
    "transpose": lambda x: {"out": x["in"].T},
    "lstm_fwd": _ref_lstm,
    "gru_fwd": _ref_gru,
    "rnn_tanh_fwd": lambda x: {"h": np.tanh(x["gx"] + x["bw"] + x["gh"] + x["br"])},
    "rnn_relu_fwd": lambda x: {"h": np.maximum(x["gx"] + x["bw"] + x["gh"] + x["br"], 0)},
    "ew_dsigmoid": lambda x: {"out": x["dy"] * x["y"] * (1 - x["y"])},
    "ew_dtanh": lambda x: {"out": x["dy"] * (1 - x["y"] ** 2)},
    "ew_drelu": lambda x: {"out": x["dy"] * (x["y"] > 0)},
    "lstm_bwd": _ref_lstm_bwd,
    "gru_bwd": _ref_gru_bwd,
    "rnn_tanh_bwd": lambda x: {"dg": (x["dh_above"] + x["dh_rec"]) * (1 - x["h"] ** 2)},
    "rnn_relu_bwd": lambda x: {"dg": (x["dh_above"] + x["dh_rec"]) * (x["h"] > 0)},
}
TOL = {np.float32: (2e-6, 2e-5), np.float64: (1e-13, 1e-12)}   # (atol, rtol)
# The fused backward kernels multiply up to four N(0, 4) inputs after sums that may cancel
# (dh_above + dh_rec, dc_next + t, 1 - tanh(c)^2, dh - dh*z): fp32 rounding of terms near
# 100 is ~1e-5 absolute (seen: 5.6e-6 over 200 seeds at the base tolerance).
TOL_FP32_BWD = (2e-5, 1e-4)


def _tol(name, dtype):
    return TOL_FP32_BWD if dtype is np.float32 and name in ("lstm_bwd", "gru_bwd") else TOL[dtype]
BIAS = ("bw", "br")
# Inputs that the "bcast" layout hands over with ld = 0: the biases, and in the backward the
# gradients from step t+1 (a caller may pass one zero row for them at t = T-1).
BCAST = {"lstm_bwd": ("dh_rec", "dc_next"), "gru_bwd": ("dh_rec",),
         "rnn_tanh_bwd": ("dh_rec",), "rnn_relu_bwd": ("dh_rec",)}


def _bcast_args(name):
    return BCAST.get(name, BIAS)


def assert_close(got, ref, atol, rtol, what):
    """|got - ref| <= atol + rtol*|ref| everywhere (NaN fails); reports the worst element."""
    got = np.asarray(got, np.float64)
    assert got.shape == ref.shape, f"{what}: shape {got.shape} != {ref.shape}"
    allowed = atol + rtol * np.abs(ref)
    err = np.abs(got - ref)
    bad = ~(err <= allowed)
    if bad.any():
        excess = np.where(np.isnan(err), np.inf, err - allowed)
        idx = np.unravel_index(np.argmax(excess), ref.shape)
        pytest.fail(f"{what}: {bad.sum()} of {bad.size} elements off; worst at {idx}: got "
                    f"{got[idx]!r}, want {ref[idx]!r} (|err| {err[idx]:.3g}, "
                    f"allowed {allowed[idx]:.3g})")


def run_twin(name, rows, cols, dtype, strided=False, bcast=False, alias=None, seed=0):
    """Lay every argument of a [rows, cols] launch of ``name`` out in one NaN-filled flat
    buffer (with padding between rows and views when ``strided``; biases with ld 0 when
    ``bcast`` (and _bcast_args); output alias[0] on top of input alias[1]), run the twin,
    check it against REF
    and check that nothing outside the outputs changed."""
    kinfo = K.KERNELS[name]
    rng = np.random.default_rng(seed)
    out_shapes, in_shapes = kinfo.arg_shapes(rows, cols)
    args = ([(a, s, False) for (a, _), s in zip(kinfo.ins, in_shapes)]
            + [(a, s, True) for (a, _), s in zip(kinfo.outs, out_shapes)])
    place, offset = {}, 3
    for arg, (r, c), is_out in args:
        if is_out and alias and arg == alias[0]:
            place[arg] = place[alias[1]]
            continue
        ld = 0 if (bcast and arg in _bcast_args(name)) else c + (5 if strided else 0)
        place[arg] = (offset, r, c, ld)
        offset += (r - 1) * ld + c + (7 if strided else 0)
    buf = np.full(offset + 3, np.nan, dtype)

    x = {}
    for arg, (r, c), is_out in args:
        if is_out:
            continue
        off, _, _, ld = place[arg]
        data = rng.standard_normal((1 if ld == 0 else r, c)) * 2.0
        knp.view(buf, off, data.shape[0], c, ld or c)[...] = data
        x[arg] = np.asarray(knp.view(buf, off, r, c, ld), np.float64).copy()
    written = np.zeros(buf.size, bool)
    for a, _ in kinfo.outs:
        off, r, c, ld = place[a]
        for i in range(r):
            written[off + i * ld:off + i * ld + c] = True
    before = buf.copy()

    outs = [knp.view(buf, *place[a]) for a, _ in kinfo.outs]
    ins = [knp.view(buf, *place[a]) for a, _ in kinfo.ins]
    with np.errstate(over="raise", divide="raise", invalid="raise"):
        kinfo.numpy_fn(rows, cols, outs, ins)

    atol, rtol = _tol(name, dtype)
    for (a, _), got in zip(kinfo.outs, outs):
        assert_close(got, REF[name](x)[a], atol, rtol, f"{name} {a}")
    np.testing.assert_array_equal(buf[~written], before[~written],
                                  err_msg=f"{name} wrote outside its outputs")


# The persistent kernels' twins run whole sequences: tests/test_persistent_cpu.py.
STEP_KERNELS = {name: kinfo for name, kinfo in K.KERNELS.items() if not kinfo.persistent}
CASES = [(name, layout) for name, kinfo in STEP_KERNELS.items()
         for layout in ("packed", "strided")
         + (("strided+bcast",) if any(a in _bcast_args(name) for a, _ in kinfo.ins) else ())]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rows, cols", [(5, 7), (1, 3)])
@pytest.mark.parametrize("name, layout", CASES)
def test_twin_matches_formula(name, layout, rows, cols, dtype):
    run_twin(name, rows, cols, dtype, strided="strided" in layout, bcast="bcast" in layout)


IN_PLACE = {"ew_add": ("out", "a"), "ew_sub": ("out", "b"), "ew_mul": ("out", "a"),
            "ew_sigmoid": ("out", "a"), "ew_tanh": ("out", "a"), "ew_relu": ("out", "a"),
            "lstm_fwd": ("c", "c_prev"), "gru_fwd": ("h", "h_prev"),
            "rnn_tanh_fwd": ("h", "gx"), "rnn_relu_fwd": ("h", "gx"),
            "ew_dsigmoid": ("out", "y"), "ew_dtanh": ("out", "dy"), "ew_drelu": ("out", "y"),
            "lstm_bwd": ("dgx", "act"), "gru_bwd": ("dh_prev", "dh_rec"),
            "rnn_tanh_bwd": ("dg", "h"), "rnn_relu_bwd": ("dg", "dh_above")}
# and a second output in place, for the kernels with more than one
IN_PLACE_2 = {"lstm_bwd": ("dc_prev", "dc_next"), "gru_bwd": ("dh_prev", "dh_above")}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(IN_PLACE))
def test_twin_in_place(name, dtype):
    run_twin(name, 4, 6, dtype, strided=True, alias=IN_PLACE[name])


@pytest.mark.parametrize("name", sorted(IN_PLACE_2))
def test_twin_in_place_second_output(name):
    run_twin(name, 4, 6, np.float32, strided=True, alias=IN_PLACE_2[name])


def test_every_kernel_but_transpose_has_an_in_place_case():
    assert set(IN_PLACE) == set(STEP_KERNELS) - {"transpose"}


def test_ew_add_in_place_same_view_twice():
    """out = a + a with all three the same view (the naive rung does pre = pre + ...)."""
    buf = np.arange(20, dtype=np.float32)
    v = knp.view(buf, 2, 3, 4, 6)
    want = 2 * np.asarray(v, np.float64)
    knp.ew_add(3, 4, [v], [v, v])
    assert_close(v, want, 0, 0, "ew_add")


def test_activations_saturate_without_overflow():
    a = np.array([[-1e4, -200.0, -88.8, 0.0, 88.8, 200.0, 1e4]], np.float32)
    out = np.full_like(a, np.nan)
    with np.errstate(over="raise", divide="raise", invalid="raise"):
        knp.ew_sigmoid(1, 7, [out], [a])
    assert out[0, 0] == 0 and out[0, 1] == 0 and out[0, 3] == 0.5 and (out[0, 4:] == 1).all()
    assert 0 < out[0, 2] < 1e-38


def test_nan_propagates():
    a = np.array([[np.nan, -1.0, 2.0]], np.float32)
    for fn in (knp.ew_sigmoid, knp.ew_tanh, knp.ew_relu):
        out = np.zeros_like(a)
        fn(1, 3, [out], [a])
        assert np.isnan(out[0, 0]), fn.__name__
    out = np.zeros_like(a)
    knp.ew_relu(1, 3, [out], [a])
    assert out[0, 1] == 0 and out[0, 2] == 2


@pytest.mark.parametrize("name", ["rnn_relu_bwd", "ew_drelu"])
def test_relu_backward_edges(name):
    """y > 0 ? dy : 0 (torch's convention): 0 at y == 0 and -0; 0 where y <= 0 or y is NaN
    even if dy is NaN or Inf; dy (NaN and Inf included) passes where y > 0."""
    y = np.array([[-1.0, -0.0, 0.0, 1e-30, 2.0, 3.0, np.nan, -2.0, 4.0]], np.float32)
    dy = np.array([[1.0, 1.0, 1.0, 1.5, np.nan, np.inf, 1.0, np.nan, -2.5]], np.float32)
    want = np.array([[0.0, 0.0, 0.0, 1.5, np.nan, np.inf, 0.0, 0.0, -2.5]])
    out = np.full_like(y, 7.0)
    if name == "ew_drelu":
        knp.ew_drelu(1, 9, [out], [dy, y])
    else:   # the two incoming gradients summed: split dy as dy + 0
        knp.rnn_relu_bwd(1, 9, [out], [dy, np.zeros_like(dy), y])
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, want.astype(np.float32))
    assert not np.signbit(out[0, :3]).any(), "gradient at y <= 0 must be +0"


# --- backward twins chained over time against reference.backward ------------------------

def _reference_case(cell, seed=0, T=4, B=3, I=5, H=6):
    """A 1-layer float64 case: (params, x, cache, dy, dh_n, dc_n, reference gradients)."""
    rng = np.random.default_rng(seed)
    spec = get_cell(cell)
    G = spec.gates
    u = lambda *shape: rng.uniform(-0.8, 0.8, shape)   # large enough to leave the linear range
    params = [{"weight_ih": u(G * H, I), "weight_hh": u(G * H, H),
               "bias_ih": u(G * H), "bias_hh": u(G * H)}]
    x = rng.standard_normal((T, B, I))
    h0 = rng.standard_normal((1, B, H)) * 0.5
    c0 = rng.standard_normal((1, B, H)) * 0.5 if spec.has_cell_state else None
    _, _, _, cache = reference.forward(cell, params, x, h0, c0)
    dy = rng.standard_normal((T, B, H))
    dh_n = rng.standard_normal((1, B, H))
    dc_n = rng.standard_normal((1, B, H)) if spec.has_cell_state else None
    ref = reference.backward(cell, params, cache, dy, dh_n, dc_n)
    return params, cache, dy, dh_n, dc_n, ref


def _twin_backward(cell, params, cache, dy, dh_n, dc_n, dtype):
    """Backprop through time of one layer with the fused backward twin per step and the GEMMs
    between steps as the GPU plan does them: dh_rec = dgh_{t+1} R (+ GRU's direct part)."""
    kinfo = K.KERNELS[f"{cell}_bwd"]
    lc = cache.layers[0]
    cast = lambda a: np.ascontiguousarray(a, dtype)
    w, r = cast(params[0]["weight_ih"]), cast(params[0]["weight_hh"])
    x, h, gates = cast(lc.x), cast(lc.h), None if lc.gates is None else cast(lc.gates)
    c = None if lc.c is None else cast(lc.c)
    dy = cast(dy)
    steps, batch, hidden = dy.shape
    out_shapes, _ = kinfo.arg_shapes(batch, hidden)
    dw, dr = np.zeros_like(w), np.zeros_like(r)
    db_ih, db_hh = np.zeros(w.shape[0], dtype), np.zeros(w.shape[0], dtype)
    dx = np.empty(x.shape, dtype)
    dh_rec = cast(dh_n[0])
    dc = None if dc_n is None else cast(dc_n[0])
    for t in reversed(range(steps)):
        outs = [np.full(s, np.nan, dtype) for s in out_shapes]
        direct = None
        with np.errstate(over="raise", divide="raise", invalid="raise"):
            if cell == "lstm":
                kinfo.numpy_fn(batch, hidden, outs, [dy[t], dh_rec, dc, gates[t], c[t + 1], c[t]])
                (dgx, dc), dgh = outs, outs[0]
            elif cell == "gru":
                kinfo.numpy_fn(batch, hidden, outs, [dy[t], dh_rec, gates[t], h[t]])
                dgx, dgh, direct = outs
            else:
                kinfo.numpy_fn(batch, hidden, outs, [dy[t], dh_rec, h[t + 1]])
                dgx = dgh = outs[0]
        dx[t] = dgx @ w
        dw += dgx.T @ x[t]
        dr += dgh.T @ h[t]
        db_ih += dgx.sum(axis=0)
        db_hh += dgh.sum(axis=0)
        dh_rec = dgh @ r
        if direct is not None:
            dh_rec = dh_rec + direct
    return {"dx": dx, "dh0": dh_rec[None], "dc0": None if dc is None else dc[None],
            "params": [{"weight_ih": dw, "weight_hh": dr, "bias_ih": db_ih, "bias_hh": db_hh}]}


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn_tanh", "rnn_relu"])
def test_backward_twins_chained_reproduce_reference(cell, dtype):
    params, cache, dy, dh_n, dc_n, ref = _reference_case(cell)
    got = _twin_backward(cell, params, cache, dy, dh_n, dc_n, dtype)
    # float64: the same math in another order; float32: the fp32 tolerances of every fast path
    atol, rtol = (1e-12, 1e-10) if dtype is np.float64 else (1e-4, 1e-3)
    if cell == "rnn_relu":
        assert 0 < (cache.layers[0].h[1:] > 0).mean() < 1, "the relu case must have both sides"
    for key in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
        check_close(got["params"][0][key], ref["params"][0][key], atol, rtol, f"{cell} {key}")
    check_close(got["dx"], ref["dx"], atol, rtol, f"{cell} dx")
    check_close(got["dh0"], ref["dh0"], atol, rtol, f"{cell} dh0")
    if cell == "lstm":
        check_close(got["dc0"], ref["dc0"], atol, rtol, f"{cell} dc0")
    # not vacuous: the gradients are not all ~0
    assert np.abs(ref["params"][0]["weight_hh"]).max() > 0.1


# --- the naive rung: ew_* kernels compose to the fused backward ---------------------------

def _ew(name, *ins):
    out = np.full(ins[0].shape, np.nan, ins[0].dtype)
    K.KERNELS[name].numpy_fn(*out.shape, [out], list(ins))
    return out


def _naive_lstm_bwd(dh_above, dh_rec, dc_next, act, c, c_prev):
    i, f, g, o = np.split(act, 4, axis=1)
    dh = _ew("ew_add", dh_above, dh_rec)
    tc = _ew("ew_tanh", c)
    dho = _ew("ew_mul", dh, o)
    t = _ew("ew_dtanh", dho, tc)
    dcc = _ew("ew_add", dc_next, t)
    do_ = _ew("ew_mul", dh, tc)
    di, df, dg = _ew("ew_mul", dcc, g), _ew("ew_mul", dcc, c_prev), _ew("ew_mul", dcc, i)
    dgx = [_ew("ew_dsigmoid", di, i), _ew("ew_dsigmoid", df, f), _ew("ew_dtanh", dg, g),
           _ew("ew_dsigmoid", do_, o)]
    return [np.concatenate(dgx, axis=1), _ew("ew_mul", dcc, f)]


def _naive_gru_bwd(dh_above, dh_rec, act, h_prev):
    r, z, n, hn = np.split(act, 4, axis=1)
    dh = _ew("ew_add", dh_above, dh_rec)
    dhz = _ew("ew_mul", dh, z)
    dn = _ew("ew_sub", dh, dhz)
    dn_p = _ew("ew_dtanh", dn, n)
    d = _ew("ew_sub", h_prev, n)
    dz = _ew("ew_mul", dh, d)
    dz_p = _ew("ew_dsigmoid", dz, z)
    dhn = _ew("ew_mul", dn_p, r)
    dr = _ew("ew_mul", dn_p, hn)
    dr_p = _ew("ew_dsigmoid", dr, r)
    return [np.concatenate([dr_p, dz_p, dn_p], axis=1),
            np.concatenate([dr_p, dz_p, dhn], axis=1), dhz]


NAIVE_BWD = {
    "lstm_bwd": _naive_lstm_bwd,
    "gru_bwd": _naive_gru_bwd,
    "rnn_tanh_bwd": lambda a, b, h: [_ew("ew_dtanh", _ew("ew_add", a, b), h)],
    "rnn_relu_bwd": lambda a, b, h: [_ew("ew_drelu", _ew("ew_add", a, b), h)],
}


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", sorted(NAIVE_BWD))
def test_naive_chain_matches_fused_backward(name, dtype):
    """Same operations in the same order: identical results (+ - * round exactly, and tanh
    is applied to the same array), so the fused twin and the naive rung agree exactly."""
    rng = np.random.default_rng(1)
    B, H = 5, 7
    kinfo = K.KERNELS[name]
    out_shapes, in_shapes = kinfo.arg_shapes(B, H)
    ins = []
    for (arg, _), shape in zip(kinfo.ins, in_shapes):
        if arg == "act":   # the activated gates in their ranges; GRU's hn is unbounded
            kinds = "sstu" if name == "gru_bwd" else "ssts"   # r z n hn | i f g o
            a = np.concatenate([{"s": rng.uniform(0, 1, (B, H)), "t": rng.uniform(-1, 1, (B, H)),
                                 "u": rng.standard_normal((B, H)) * 2}[k] for k in kinds], axis=1)
        elif arg == "h" and name == "rnn_tanh_bwd":
            a = rng.uniform(-1, 1, shape)
        else:
            a = rng.standard_normal(shape) * 2
        ins.append(a.astype(dtype))
    outs = [np.full(s, np.nan, dtype) for s in out_shapes]
    kinfo.numpy_fn(B, H, outs, ins)
    naive = NAIVE_BWD[name](*ins)
    for (arg, _), fused, nv in zip(kinfo.outs, outs, naive):
        assert nv.dtype == dtype
        check_close(nv, fused, 0, 0, f"{name} {arg}: naive vs fused")


def test_view_helper():
    buf = np.arange(30, dtype=np.float64)
    v = knp.view(buf, 1, 3, 4, 10)
    assert v.shape == (3, 4) and v[2, 3] == 1 + 2 * 10 + 3
    v[1, 0] = -1
    assert buf[11] == -1
    b = knp.view(buf, 5, 4, 3, 0)
    assert (b == buf[5:8]).all() and not b.flags.writeable
    assert knp.view(buf, 5, 1, 3, 0).flags.writeable
    with pytest.raises(ValueError, match="past the buffer"):
        knp.view(buf, 1, 3, 4, 14)
    with pytest.raises(ValueError, match="ld 3 < cols 4"):
        knp.view(buf, 0, 2, 4, 3)
    with pytest.raises(ValueError, match="contiguous 1-D"):
        knp.view(buf.reshape(5, 6), 0, 2, 2, 2)


# --- registry: arguments, launch geometry, views ------------------------------------------

def test_kernel_args_types_and_order():
    kinfo = K.KERNELS["lstm_fwd"]
    outs = [(1000, 8), (2000, 8), (3000, 32)]
    ins = [(4000, 32), (5000, 32), (6000, 0), (7000, 0), (2**40, 8)]
    args = K.kernel_args(kinfo, 4, 8, outs, ins)
    assert len(args) == 2 + 2 * 8
    assert type(args[0]) is np.int32 and type(args[1]) is np.int32 and args[:2] == (4, 8)
    assert all(type(p) is np.uint64 for p in args[2::2])
    assert all(type(ld) is np.int32 for ld in args[3::2])
    assert [int(p) for p in args[2::2]] == [p for p, _ in outs + ins]
    assert [int(ld) for ld in args[3::2]] == [ld for _, ld in outs + ins]


@pytest.mark.parametrize("name", list(K.KERNELS))
def test_kernel_args_every_kernel(name):
    kinfo = K.KERNELS[name]
    scalars = {s: 2 for s in kinfo.scalars} or None
    out_shapes, in_shapes = kinfo.arg_shapes(3, 5, **(scalars or {}))
    pairs = [(4096 * (i + 1), c) for i, (_, c) in enumerate(out_shapes + in_shapes)]
    args = K.kernel_args(kinfo, 3, 5, pairs[:kinfo.n_outs], pairs[kinfo.n_outs:], scalars)
    assert len(args) == 2 + 2 * (kinfo.n_outs + kinfo.n_ins) + len(kinfo.scalars)
    assert all(type(a) is np.int32 for a in args[len(args) - len(kinfo.scalars):])
    with pytest.raises(ValueError, match=f"takes {kinfo.n_outs} outputs"):
        K.kernel_args(kinfo, 3, 5, pairs[:kinfo.n_outs] + [(1, 5)], pairs[kinfo.n_outs:],
                      scalars)
    with pytest.raises(ValueError, match=f"and {kinfo.n_ins} inputs"):
        K.kernel_args(kinfo, 3, 5, pairs[:kinfo.n_outs], pairs[kinfo.n_outs + 1:], scalars)
    with pytest.raises(ValueError, match="takes scalars"):
        K.kernel_args(kinfo, 3, 5, pairs[:kinfo.n_outs], pairs[kinfo.n_outs:],
                      {**(scalars or {}), "extra": 1})


def test_kernel_args_rejects_bad_lds_and_sizes():
    kinfo = K.KERNELS["ew_add"]
    with pytest.raises(ValueError, match="output out with ld 0"):
        K.kernel_args(kinfo, 3, 5, [(64, 0)], [(128, 5), (256, 5)])
    K.kernel_args(kinfo, 1, 5, [(64, 0)], [(128, 0), (256, 5)])   # one row: ld 0 is harmless
    with pytest.raises(ValueError, match="ld 4 < its 5 columns"):
        K.kernel_args(kinfo, 3, 5, [(64, 5)], [(128, 4), (256, 5)])
    with pytest.raises(ValueError, match="rows = 0"):
        K.kernel_args(kinfo, 0, 5, [(64, 5)], [(128, 5), (256, 5)])
    with pytest.raises(ValueError, match="ld -1"):
        K.kernel_args(kinfo, 3, 5, [(64, 5)], [(128, -1), (256, 5)])
    with pytest.raises(ValueError, match="not a device address"):
        K.kernel_args(kinfo, 3, 5, [(0, 5)], [(128, 5), (256, 5)])
    with pytest.raises(ValueError, match="ld 4 < its 5 columns"):   # transpose out is [cols, rows]
        K.kernel_args(K.KERNELS["transpose"], 5, 4, [(64, 4)], [(128, 4)])


def test_launch_geometry():
    for kinfo in K.REGISTRY:
        if kinfo.persistent:   # its geometry is a persistent.Fit: test_persistent_cpu.py
            with pytest.raises(ValueError, match="launch_persistent"):
                kinfo.launch(3, 5)
            continue
        if kinfo.tiled:
            continue
        assert kinfo.launch(3, 5) == ((1, 1, 1), (256, 1, 1))
        assert kinfo.launch(64, 1024) == ((256, 1, 1), (256, 1, 1))
        grid, _ = kinfo.launch(100 * 64, 4 * 2048)   # a time-batched [T*B, 4H] problem
        assert grid == (K.MAX_POINTWISE_BLOCKS, 1, 1)
    tr = K.KERNELS["transpose"]
    assert tr.launch(4096, 1000) == ((32, 128, 1), (32, 8, 1))   # x: column tiles, y: row tiles
    assert tr.launch(1, 1) == ((1, 1, 1), (32, 8, 1))
    assert tr.launch(2**23, 33) == ((2, 65535, 1), (32, 8, 1))   # y capped; the kernel loops
    assert K.TILE == int(re.search(r"#define TILE (\d+)", K.source("transpose.cu"))[1])


def test_check_views():
    B, H = 4, 3
    kinfo = K.KERNELS["gru_fwd"]
    outs = (View("h", 0, B, H, H), View("act", 0, B, 4 * H, 4 * H))
    ins = (View("gx", 0, B, 3 * H, 3 * H), View("gh", 0, B, 3 * H, 5 * H),
           View("params", 7, B, 3 * H, 0), View("params", 9, 1, 3 * H, 0), View("h", 0, B, H, H))
    K.check_views(kinfo, B, H, outs, ins)
    with pytest.raises(ValueError, match=r"gx is \[4, 12\], expected \[4, 9\]"):
        K.check_views(kinfo, B, H, outs, (View("gx", 0, B, 4 * H, 4 * H),) + ins[1:])
    with pytest.raises(ValueError, match="output h with ld 0"):
        K.check_views(kinfo, B, H, (View("h", 0, B, H, 0),) + outs[1:], ins)
    with pytest.raises(ValueError, match="takes 2 outputs"):
        K.check_views(kinfo, B, H, outs[:1], ins)
    tr = K.KERNELS["transpose"]
    K.check_views(tr, 6, 2, (View("w", 0, 2, 6, 6),), (View("p", 0, 6, 2, 2),))


def test_arg_shapes():
    assert K.KERNELS["lstm_fwd"].arg_shapes(2, 3) == (
        [(2, 3), (2, 3), (2, 12)], [(2, 12), (2, 12), (2, 12), (2, 12), (2, 3)])
    assert K.KERNELS["transpose"].arg_shapes(2, 3) == ([(3, 2)], [(2, 3)])
    with pytest.raises(ValueError, match="unknown"):
        K.get_kernel("unknown")


# --- sources and the loader ---------------------------------------------------------------

def test_cuda_src_dir_is_the_checkout():
    assert K.cuda_src_dir() == REPO / "cuda_src"
    assert all((K.cuda_src_dir() / f).is_file() for f in K.kernel_files())


def test_import_needs_no_cupy():
    code = "import sys, rnnrt.kernels as k; k.KernelLibrary(); assert 'cupy' not in sys.modules"
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stderr


class _FakeKernel:
    """Stands in for a cupy.RawKernel: records launches (with their shared memory) and the
    dynamic shared memory limit set on it."""

    def __init__(self, fake, name):
        self.fake, self.name = fake, name
        self.max_dynamic_shared_size_bytes = 0

    def __call__(self, grid, block, args, *, shared_mem=0):
        self.fake.launches.append((self.name, grid, block, args))
        self.fake.shared_mem.append((self.name, shared_mem, self.max_dynamic_shared_size_bytes))


class _FakeCupy(types.ModuleType):
    """Stands in for cupy: RawModule records each compilation, kernels record launches."""

    def __init__(self):
        super().__init__("cupy")
        self.compiled, self.launches, self.shared_mem = [], [], []
        fake = self

        class RawModule:
            def __init__(self, code, options):
                fake.compiled.append((code, options))
                self.code = code

            def get_function(self, name):
                assert re.search(rf'__global__\s+void\s+(__launch_bounds__\([^)]*\)\s+)?'
                                 rf'(__cluster_dims__\([^)]*\)\s+)?{name}\s*\(',
                                 self.code), name
                return _FakeKernel(fake, name)

        self.RawModule = RawModule


def test_library_compiles_each_file_once(monkeypatch):
    fake = _FakeCupy()
    monkeypatch.setitem(sys.modules, "cupy", fake)
    K._compile.cache_clear()
    try:
        lib1, lib2 = K.KernelLibrary(), K.KernelLibrary()
        for name in K.KERNELS:
            assert lib1.get(name) is lib1.get(name)
            lib2.get(name)
        assert len(fake.compiled) == len(K.kernel_files())
        assert all(opts == ("-std=c++17",) for _, opts in fake.compiled)
        K.KernelLibrary(options=("-std=c++17", "-lineinfo")).get("lstm_fwd")
        assert len(fake.compiled) == len(K.kernel_files()) + 1

        lib1.launch("ew_add", 64, 1024, [(4096, 1024)], [(8192, 1024), (16384, 0)])
        name, grid, block, args = fake.launches[-1]
        assert (name, grid, block) == ("ew_add", (256, 1, 1), (256, 1, 1)) and len(args) == 8
        with pytest.raises(ValueError, match="expected one of"):
            lib1.get("lstm_bwd2")
    finally:
        K._compile.cache_clear()
