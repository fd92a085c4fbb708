"""GPU precision (marker gpu), issue 23: every cell x every ladder rung x {tf32, bfloat16,
float16}, forward and forward + backward, on the graph executor, against the rounding-aware
float64 reference of the same precision (tf32: every GEMM's operands TF32-rounded, to
nearest) within precision.get_precision(dtype).atol / rtol,
every output poisoned (NaN) before the run, the worst element reported (rnnrt.check);
a 16-bit run's stored outputs (y, and h_n / dx where their buffer is 'store') are exactly
representable in the storage type (they really were rounded); a 16-bit plan's store buffers
are 2 bytes an element and its workspace smaller than the fp32 plan's; the persistent rung
of a 16-bit key runs the kernels' typed instantiations (issue 24; no fallback). fp32 results are the existing
tests' (test_gpu_forward.py, test_gpu_backward.py: unchanged).

All the typed twins the tests run are compiled up front, one NVRTC compile a file.
About 1-2 minutes on an H100 (compiles included). Run: pytest -m gpu tests/gpu/test_gpu_precision.py
"""
from __future__ import annotations

import numpy as np
import pytest

from rnnrt.device import gpu_available

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU with CuPy")]

from testkit import gpu_plan_key as PlanKey  # noqa: E402 (plans for this GPU)
from testkit import random_layer_stack  # noqa: E402

from rnnrt import reference  # noqa: E402
from rnnrt.check import assert_close  # noqa: E402
from rnnrt.params import per_layer, to_flat  # noqa: E402
from rnnrt.plan.switches import ladder  # noqa: E402
from rnnrt.precision import get_precision, round_to_storage  # noqa: E402

CELLS = ("lstm", "gru", "rnn_tanh", "rnn_relu")
DTYPES = ("tf32", "bfloat16", "float16")
RUNGS = ladder(input_batch=4)
T, B, I, H, L = 6, 4, 24, 40, 2     # I != H; T not a multiple of the chunk 4; two layers


def _key(cell, rung, dtype, train):
    return PlanKey(cell, T, B, I, H, L, True, rung.switches, train=train, dtype=dtype)


def _plans(key):
    from rnnrt.plan import forward_plan
    from rnnrt.plan.backward import backward_plan
    return (forward_plan(key), backward_plan(key)) if key.train else (forward_plan(key), None)


_CASES = {}


def reference_case(cell, dtype, shape=None):
    """Weights and inputs (random_layer_stack: fp32, never zero), output gradients, and the
    float64 reference of ``dtype``'s rounding, at ``shape`` (T, B, I, H, L; default the
    module's), cached."""
    shape = (T, B, I, H, L) if shape is None else tuple(shape)
    if (cell, dtype, shape) not in _CASES:
        t, b, i, h, nl = shape
        layout, flat, x, h0, c0, rng = random_layer_stack(cell, nl, t, b, h, i)
        dy = rng.standard_normal((t, b, h)).astype(np.float32)
        dhn = rng.standard_normal((nl, b, h)).astype(np.float32)
        dcn = rng.standard_normal((nl, b, h)).astype(np.float32) if cell == "lstm" else None
        d64 = lambda a: None if a is None else a.astype(np.float64)  # noqa: E731
        p64 = per_layer(flat.astype(np.float64), layout)
        y, hn, cn, cache = reference.forward(cell, p64, d64(x), d64(h0), d64(c0), dtype=dtype)
        g = reference.backward(cell, p64, cache, d64(dy), d64(dhn), d64(dcn), dtype=dtype)
        ref = {"y": y, "h_n": hn, "c_n": cn, "dx": g["dx"], "dh0": g["dh0"], "dc0": g["dc0"],
               "grads": to_flat(g["params"], layout)}
        _CASES[cell, dtype, shape] = (layout, flat, (x, h0, c0), (dy, dhn, dcn), ref)
    return _CASES[cell, dtype, shape]


def _case(cell, dtype):
    return reference_case(cell, dtype)


@pytest.fixture(scope="module")
def twins_compiled(cp, ctx):
    """Every typed twin the module's plans launch, compiled before the first test (one
    compile a file, not one a plan)."""
    from rnnrt.exec.cuda_exec import twin_requests
    from rnnrt.exec.workspace import buffer_elements
    requests = set()
    for cell in CELLS:
        for dtype in ("bfloat16", "float16"):
            for rung, train in ((r, t) for r in RUNGS for t in (False, True)):
                for p in filter(None, _plans(_key(cell, rung, dtype, train))):
                    elements = buffer_elements(p, "float32", get_precision(dtype).storage)
                    requests.update(twin_requests(p, elements))
    ctx.kernels.instantiate(sorted(requests))
    return len(requests)


def check_rounded(name, arr, dtype):
    """Every value of ``arr`` is one the storage type holds (exactly representable)."""
    a = np.asarray(arr.get() if hasattr(arr, "get") else arr, dtype=np.float32)
    r = round_to_storage(a, dtype)
    bad = ~((a == r) | (np.isnan(a) & np.isnan(r)))
    assert not bad.any(), (f"{dtype} {name}: {int(bad.sum())} values not representable in "
                           f"the storage type, e.g. {a[bad][:3]}")


def run_graph(cp, ctx, key, case):
    """Forward (and backward for a training key) on the graph executor, every buffer but
    the constants poisoned first. -> ({output: numpy array}, the workspace)."""
    from rnnrt.exec.cuda_exec import EXECUTORS
    from rnnrt.exec.workspace import Workspace
    _, flat, (x, h0, c0), (dy, dhn, dcn), _ = case
    fplan, bplan = _plans(key)
    ws = Workspace(bplan or fplan, cp, np.float32, cp.asarray(flat))
    ws.poison()
    ws.load_inputs(x, h0, c0)
    EXECUTORS["graph"](fplan, ws, ctx).run()
    names = ["y", "h_n"] + (["c_n"] if "c_n" in fplan.outputs else [])
    if bplan is not None:
        ws.load(dy=dy, dh_n=dhn, **({"dc_n": dcn} if dcn is not None else {}))
        EXECUTORS["graph"](bplan, ws, ctx).run()
        names += [n for n in ("dx", "dh0", "dc0", "grads") if n in bplan.outputs]
    cp.cuda.Device().synchronize()
    return {n: ws.read(n).get() for n in names}, ws, (bplan or fplan)


@pytest.mark.parametrize("train", [False, True], ids=["fwd", "fwd+bwd"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cell", CELLS)
def test_every_rung_against_the_rounding_aware_reference(cp, ctx, twins_compiled, cell, dtype,
                                                          train):
    p = get_precision(dtype)
    case = _case(cell, dtype)
    layout, ref = case[0], case[4]
    for rung in RUNGS:
        key = _key(cell, rung, dtype, train)
        got, ws, plan = run_graph(cp, ctx, key, case)
        what = f"{cell} {dtype} {rung.name} {'fwd+bwd' if train else 'fwd'}"
        for name in ("y", "h_n", "c_n", "dx", "dh0", "dc0"):
            if name in got and ref[name] is not None:
                assert_close(got[name], ref[name], p.atol, p.rtol, name=f"{what} {name}")
        if "grads" in got:
            for e in layout.entries:   # the padding between parameters is not a gradient
                assert_close(got["grads"][e.offset:e.end], ref["grads"][e.offset:e.end],
                             p.atol, p.rtol, name=f"{what} {e.name}")
        if p.rounds:
            bindings = {**plan.inputs, **plan.outputs}
            for name, arr in got.items():
                if all(ws.elements[v.buf] == p.storage for v in bindings[name].views):
                    check_rounded(f"{what} {name}", arr, dtype)
            assert ws.elements[plan.outputs["y"].views[0].buf] == p.storage, \
                f"{what}: y is not in a {p.storage} buffer"
            if rung.switches.persistent:   # the typed kernels ran (issue 24), no fallback
                fallback = _plans(key)[0].fallback
                assert fallback is None, f"{what}: the persistent rung fell back: {fallback}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cell", CELLS)
def test_split_dh_gemm_in_each_precision(cp, ctx, cell, dtype):
    """The split-K recurrent backward GEMM (cublasGemmStridedBatchedEx on the storage type,
    kernels/gemm_split.py) against the rounding-aware reference."""
    import dataclasses
    p = get_precision(dtype)
    case = _case(cell, dtype)
    layout, ref = case[0], case[4]
    key = dataclasses.replace(_key(cell, RUNGS[-2], dtype, True), bwd_splits=5)
    got, _, plan = run_graph(cp, ctx, key, case)
    assert {op.batch for op in plan.ops if getattr(op, "kind", "") == "dh"} == {5}
    for name in ("dx", "dh0", "dc0"):
        if ref[name] is not None:
            assert_close(got[name], ref[name], p.atol, p.rtol, name=f"{dtype} split {name}")
    for e in layout.entries:
        assert_close(got["grads"][e.offset:e.end], ref["grads"][e.offset:e.end], p.atol,
                     p.rtol, name=f"{cell} {dtype} split {e.name}")


def test_16bit_store_buffers_are_two_bytes(cp, ctx):
    """A 16-bit plan's store buffers hold 2 bytes an element (bfloat16's arrays: uint16
    bits), its other buffers 4; at the paper shape (LSTM L4 H512 B64 T100, training) its
    workspace is smaller than the fp32 plan's although it adds the weights' 16-bit copies."""
    from rnnrt.exec.workspace import Workspace
    rung = RUNGS[5]
    sizes = {}
    for dtype in ("float32", "bfloat16", "float16"):
        key = PlanKey("lstm", 100, 64, 512, 512, 4, True, rung.switches, train=True,
                      dtype=dtype)
        plan = _plans(key)[1]
        params = next(b.size for b in plan.buffers if b.name == "params")
        ws = Workspace(plan, cp, np.float32, cp.zeros(params, np.float32))
        assert any(b.dtype == "store" for b in plan.buffers), f"{dtype}: no store buffer"
        for b in plan.buffers:
            want = 2 if (b.dtype == "store" and dtype != "float32") else 4
            assert ws.bufs[b.name].itemsize == want, (dtype, b.name, ws.bufs[b.name].dtype)
            assert ws.bufs[b.name].nbytes == want * b.size, (dtype, b.name)
        sizes[dtype] = sum(ws.bufs[b.name].nbytes for b in plan.buffers)
        del ws
        cp.get_default_memory_pool().free_all_blocks()
    for dtype in ("bfloat16", "float16"):
        assert sizes[dtype] < sizes["float32"], sizes


@pytest.mark.parametrize("dtype", DTYPES)
def test_runner_in_each_precision(cp, dtype):
    """GpuRunner(model, 'auto', dtype=...): the selector's schedule (cuBLAS for 16-bit keys),
    forward with train=True and backward against the rounding-aware reference; y comes back
    float32 holding exactly the stored values."""
    import rnnrt
    from rnnrt.gpu import GpuRunner
    p = get_precision(dtype)
    rdt = dtype
    rng = np.random.default_rng(3)
    for cls, cell in ((rnnrt.LSTM, "lstm"), (rnnrt.GRU, "gru")):
        m = cls(I, H, num_layers=L, seed=5)
        x = rng.standard_normal((T, B, I)).astype(np.float32)
        dy = rng.standard_normal((T, B, H)).astype(np.float32)
        p64 = per_layer(np.asarray(m.flat, np.float64), m.layout)
        y_ref, _, _, cache = reference.forward(cell, p64, x.astype(np.float64), dtype=rdt)
        g = reference.backward(cell, p64, cache, dy.astype(np.float64), dtype=rdt)
        r = GpuRunner(m, "auto", dtype=dtype)
        assert r.dtype == dtype
        y, _, tape = r.forward(cp.asarray(x), train=True)
        what = f"runner {cell} {dtype}"
        assert y.dtype == np.float32, f"{what}: y is {y.dtype}"
        assert_close(y, y_ref, p.atol, p.rtol, name=f"{what} y")
        if p.rounds:
            check_rounded(f"{what} y", y, dtype)
        grads = r.backward(tape, cp.asarray(dy))
        assert_close(grads.dx, g["dx"], p.atol, p.rtol, name=f"{what} dx")
        flat_ref = to_flat(g["params"], m.layout)
        flat = grads.flat.get()
        for e in m.layout.entries:
            assert_close(flat[e.offset:e.end], flat_ref[e.offset:e.end], p.atol, p.rtol,
                         name=f"{what} {e.name}")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_loads_round_to_storage_on_the_device(cp, dtype):
    """Workspace.load rounds into a 16-bit buffer on the GPU exactly as
    precision.round_to_storage does (ties to even, overflow to Inf, NaN kept), and read
    gives the stored values back as float32; random values and the edge cases."""
    from rnnrt.exec.workspace import Workspace
    from rnnrt.plan import forward_plan
    key = _key("lstm", RUNGS[3], dtype, False)
    plan = forward_plan(key)
    params = next(b.size for b in plan.buffers if b.name == "params")
    ws = Workspace(plan, cp, np.float32, cp.zeros(params, np.float32))
    assert ws.elements[plan.inputs["x"].views[0].buf] == get_precision(dtype).storage
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((T, B, I)) * 10.0 ** rng.integers(-6, 6, (T, B, I)))
    x = x.astype(np.float32)
    edges = np.float32([1.00390625, 1.01171875, 65504.0, 65520.0, 3.3895314e38, 1e-40,
                        np.inf, -np.inf, np.nan, -0.0, 1.0 + 2 ** -11, 1.0 + 3 * 2 ** -11])
    x.reshape(-1)[:edges.size] = edges
    ws.load(x=cp.asarray(x))
    got = ws.read("x").get()
    want = round_to_storage(x, dtype).astype(np.float32)
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    assert same.all(), f"{dtype}: {int((~same).sum())} loads differ, e.g. x={x[~same][:3]} " \
                       f"got {got[~same][:3]} want {want[~same][:3]}"
