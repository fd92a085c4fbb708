"""Helpers shared by the test modules (no fixtures: those are in conftest.py). Test modules
import from here, never from each other: ``from testkit import FakeCupy, layer_case``
(tests/ is on sys.path through conftest.py).

- CUDA toolchain: ``find_nvrtc``, ``nvrtc_compile``; a stand-in for CuPy (``FakeCupy``,
  ``FakeKernel``) that records compilations and launches;
- persistent kernels: the cells, kernel lists, made-up device properties (``H100``,
  ``SMALL``), one layer's data and reference (``layer_case``), the cancelling k-group case;
- CPU plans: keys for the example H100, a case with its reference, the NumPy executor;
- GPU plans: keys for the GPU the tests run on, random fp32 layer stacks, the forward case
  and its run on an executor (the GPU test modules share them);
- bench: a tiny sweep configuration.

Nothing here imports CuPy at import time.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import glob
import os
import re
import sys
import types

import numpy as np

from rnnrt import reference
from rnnrt.cells import get_cell
from rnnrt.check import FP32_ATOL, FP32_RTOL, assert_close, reduction_atol
from rnnrt.kernels.limits import H100_SXM
from rnnrt.kernels.registry import REGISTRY
from rnnrt.kernels.stack import STACK_KERNEL
from rnnrt.params import make_layout, per_layer
from rnnrt.plan import PlanKey

CELLS = ("lstm", "gru", "rnn_tanh", "rnn_relu")


# --- the CUDA toolchain ------------------------------------------------------------------------

def find_nvrtc():
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


def nvrtc_compile(lib, text, name, options):
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


class FakeKernel:
    """Stands in for a cupy.RawKernel: records launches (with their shared memory) and the
    dynamic shared memory limit set on it."""

    def __init__(self, fake, name):
        self.fake, self.name = fake, name
        self.max_dynamic_shared_size_bytes = 0

    def __call__(self, grid, block, args, *, shared_mem=0):
        self.fake.launches.append((self.name, grid, block, args))
        self.fake.shared_mem.append((self.name, shared_mem, self.max_dynamic_shared_size_bytes))


class FakeCupy(types.ModuleType):
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
                return FakeKernel(fake, name)

        self.RawModule = RawModule


# --- the persistent kernels -----------------------------------------------------------------

# the per-layer persistent kernels (the stack kernel, all layers in one launch, has its own
# arguments and tests: tests/kernels/test_kernels_stack.py)
PERSISTENT = [k.name for k in REGISTRY if k.persistent and k.name != STACK_KERNEL]
GRID_KERNELS = [n for n in PERSISTENT if "_cluster" not in n]      # the grid barrier kernels
CLUSTER_KERNELS = [n for n in PERSISTENT if "_cluster" in n]

# cupy.cuda.runtime.getDeviceProperties of an H100 80GB HBM3 (the keys the fit reads)
H100 = dict(multiProcessorCount=132, sharedMemPerBlockOptin=232448,
            sharedMemPerMultiprocessor=233472, reservedSharedMemPerBlock=1024,
            maxThreadsPerBlock=1024, maxThreadsPerMultiProcessor=2048,
            regsPerMultiprocessor=65536, regsPerBlock=65536)
# a small made-up GPU: 6 SMs, 48 KB of shared memory a block, half the registers
SMALL = dict(multiProcessorCount=6, sharedMemPerBlockOptin=49152,
             sharedMemPerMultiprocessor=65536, reservedSharedMemPerBlock=1024,
             maxThreadsPerBlock=512, maxThreadsPerMultiProcessor=1024,
             regsPerMultiprocessor=32768, regsPerBlock=32768)


def ceil(a, b):
    """ceil(a / b) for positive ints (written here, not imported from the code under test)."""
    return -(-a // b)


def layer_case(cell, T, B, H, I=5, bias=True, seed=0, dtype=np.float64):
    """One layer's inputs as the kernel takes them (gx = W x without bias) and the
    reference's h [T+1, B, H], c, act."""
    rng = np.random.default_rng(seed)
    spec = get_cell(cell)
    G = spec.gates
    u = lambda *shape: rng.uniform(-0.6, 0.6, shape)   # noqa: E731 - out of the linear range
    p = {"weight_ih": u(G * H, I), "weight_hh": u(G * H, H),
         "bias_ih": u(G * H) if bias else None, "bias_hh": u(G * H) if bias else None}
    x = rng.standard_normal((T, B, I))
    h0 = 0.5 * rng.standard_normal((B, H))
    c0 = 0.5 * rng.standard_normal((B, H)) if spec.has_cell_state else None
    _, _, _, cache = reference.forward(cell, [p], x, h0[None],
                                       None if c0 is None else c0[None])
    lc = cache.layers[0]
    ref = {"h": lc.h, "c": lc.c, "act": lc.gates}
    gx = x @ p["weight_ih"].T
    cast = lambda a: None if a is None else np.asarray(a, dtype)   # noqa: E731
    return dict(gx=cast(gx), R=cast(p["weight_hh"]), bw=cast(p["bias_ih"]),
                br=cast(p["bias_hh"]), h0=cast(h0), c0=cast(c0)), ref


def chunk_cols(*chunks):
    """The columns of float4 chunks (absolute: chunk c is columns 4c .. 4c+3)."""
    return [k for c in chunks for k in range(4 * c, 4 * c + 4)]


def cancelling_case():
    """rnn_tanh H 37, B 2, U 5, 64 threads, one tile of 40: lanes 2 x 1 x 16, 32 k-groups;
    warp 0 owns chunks 0..4, halves 0..2 and 3..4, so k-group 0 sums chunks 0 and 3 and
    k-group 1 chunks 1 and 4. Every row of R has 1e8, -1e8, 1 in columns 0, 4, 12 (chunks 0,
    1, 3) and 1e8, 1, -1e8 in columns 1, 5, 13 (the same chunks); h0 is 1 in the first three
    for batch 0 and in the second three for batch 1, 0 elsewhere. Batch 0: k-group 0 rounds
    1e8 + 1 to 1e8 in float32, k-group 1 cancels it: h_1 = tanh(0) = 0. Batch 1: k-group 0
    cancels exactly, k-group 1 adds 1: h_1 = tanh(1). Had chunk 3 been k-group 3's (lane
    groups running on through both halves), the two batches would swap; had R been
    ignored, both would be 0."""
    from rnnrt.kernels.persistent import geometry
    fit = geometry("rnn_tanh", 37, 2, 5, threads=64)
    R = np.zeros((37, 37), np.float32)
    R[:, [0, 4, 12]] = [1e8, -1e8, 1]
    R[:, [1, 5, 13]] = [1e8, 1, -1e8]
    h0 = np.zeros((2, 37), np.float32)
    h0[0, [0, 4, 12]] = 1
    h0[1, [1, 5, 13]] = 1
    data = dict(gx=np.zeros((1, 2, 37), np.float32), R=R, bw=None, br=None, h0=h0, c0=None)
    return fit, data


# --- plans on the CPU -------------------------------------------------------------------------

# rnnrt.plan.PlanKey for the example H100's limits (what the persistent switch's fit reads):
# CPU plans are built for the lent H100
cpu_plan_key = functools.partial(PlanKey, device=H100_SXM)


# tiny odd shapes: T not a multiple of the input-batch chunk 2, I != H, B > 1
PLAN_SHAPE = (5, 3, 4, 6)   # T, B, I, H


def plan_case(cell, layers, bias=True, seed=0, dtype=np.float64, steps=PLAN_SHAPE[0],
              batch=PLAN_SHAPE[1]):
    """Random weights, inputs and states at PLAN_SHAPE's sizes and the reference outputs:
    -> (flat, x, h0, c0, {"y", "h_n", "c_n"})."""
    _, _, I, H = PLAN_SHAPE
    rng = np.random.default_rng(seed)
    layout = make_layout(cell, I, H, layers, bias)
    flat = np.zeros(layout.size, dtype)
    for e in layout.entries:
        n = int(np.prod(e.shape))
        flat[e.offset:e.offset + n] = rng.uniform(-0.6, 0.6, n)
    x = rng.standard_normal((steps, batch, I)).astype(dtype)
    h0 = rng.standard_normal((layers, batch, H)).astype(dtype) * 0.5
    c0 = rng.standard_normal((layers, batch, H)).astype(dtype) * 0.5 if cell == "lstm" else None
    y, hn, cn, _ = reference.forward(cell, per_layer(flat, layout), x, h0, c0)
    return flat, x, h0, c0, {"y": y, "h_n": hn, "c_n": cn}


def run_numpy(plan, flat, x, h0, c0, order="program", seed=None):
    """The plan on the NumPy executor (a fresh workspace) -> its outputs."""
    from rnnrt.exec import numpy_exec
    from rnnrt.exec.workspace import Workspace
    ws = Workspace(plan, np, flat.dtype, flat)
    ws.load_inputs(x, h0, c0)
    numpy_exec.run(plan, ws, order=order, seed=seed)
    return ws.outputs()


def assert_missing_wait_caught(plan, which, run_and_check, seeds=30):
    """Remove the ``which``-th event wait of ``plan``: the static race checker must report
    a race, and ``run_and_check(broken_plan, seed)`` (a random interleaving checked against
    the reference; AssertionError when wrong) must fail for some seed."""
    import dataclasses

    from rnnrt.exec.racecheck import find_races
    from rnnrt.plan.ops import Wait
    waits = [i for i, op in enumerate(plan.ops) if isinstance(op, Wait)]
    i = waits[which]
    broken = dataclasses.replace(plan, ops=plan.ops[:i] + plan.ops[i + 1:])
    assert find_races(broken), f"removing {plan.ops[i]} was not seen"
    failures = 0
    for seed in range(seeds):
        try:
            run_and_check(broken, seed)
        except AssertionError:
            failures += 1
    assert failures > 0, "no random interleaving exposed the missing wait"


def check_outputs(out, ref, what):
    for name in ("y", "h_n", "c_n"):
        if ref.get(name) is not None:
            assert_close(out[name], ref[name], atol=1e-12, rtol=1e-10, name=f"{what} {name}")


# --- variable-length plans ----------------------------------------------------------------------

def batch_sizes_of(lengths):
    """batch_sizes [T] (a tuple) of sequences of ``lengths`` (sorted longest first)."""
    lens = sorted((int(n) for n in lengths), reverse=True)
    return tuple(sum(n > t for n in lens) for t in range(lens[0]))


def varlen_case(cell, layers, lengths, inp, hidden, bias=True, seed=0, dtype=np.float64):
    """A packed batch of sequences of ``lengths`` with random weights (never zero), states
    and output gradients, and rnnrt.varlen's forward and backward of it in both directions:
    -> dict(flat, layout, bs, x [N, I], h0, c0, dy [N, H], dh_n, dc_n, ref={reverse: dict(
    y, h_n, c_n, dx, dh0, dc0, grads [layout.size])})."""
    from rnnrt import varlen
    from rnnrt.params import to_flat
    rng = np.random.default_rng(seed)
    bs = batch_sizes_of(lengths)
    n, batch = sum(bs), bs[0]
    layout = make_layout(cell, inp, hidden, layers, bias)
    flat = np.zeros(layout.size, dtype)
    for e in layout.entries:
        k = int(np.prod(e.shape))
        flat[e.offset:e.offset + k] = rng.uniform(-0.6, 0.6, k)
    lstm = cell == "lstm"
    draw = lambda *shape, s=1.0: (s * rng.standard_normal(shape)).astype(dtype)   # noqa: E731
    case = dict(flat=flat, layout=layout, bs=bs, x=draw(n, inp),
                h0=draw(layers, batch, hidden, s=0.5),
                c0=draw(layers, batch, hidden, s=0.5) if lstm else None,
                dy=draw(n, hidden), dh_n=draw(layers, batch, hidden),
                dc_n=draw(layers, batch, hidden) if lstm else None, ref={})
    params = per_layer(flat, layout)
    for reverse in (False, True):
        y, hn, cn, cache = varlen.forward(cell, params, case["x"], bs, case["h0"], case["c0"],
                                          reverse=reverse)
        g = varlen.backward(cache, case["dy"], case["dh_n"], case["dc_n"])
        case["ref"][reverse] = dict(y=y, h_n=hn, c_n=cn, dx=g["dx"], dh0=g["dh0"],
                                    dc0=g["dc0"], grads=to_flat(g["params"], layout))
    return case


def run_varlen_numpy(key, case, reverse=False, order="program", seed=None, fwd=None,
                     bwd=None, ws=None):
    """A variable-length plan pair (forward, and backward when key.train) on the NumPy
    executor, the batch scattered into the plan's rows by plan.packing.row_map: poisoned
    buffers, x's other rows zero. -> (outputs {y, h_n, c_n, dx, dh0, dc0, grads}, ws)."""
    from rnnrt.exec import numpy_exec
    from rnnrt.exec.workspace import Workspace
    from rnnrt.plan import backward_plan, forward_plan
    from rnnrt.plan.packing import row_map
    fwd = fwd or forward_plan(key)
    bwd = bwd or (backward_plan(key) if key.train else None)
    if ws is None:
        ws = Workspace(bwd or fwd, np, case["flat"].dtype, case["flat"])
        ws.poison()
    ws = ws.sharing(bwd or fwd)
    m = row_map(case["bs"], key.batch_sizes, reverse)
    ws.load_rows("x", m.rows, case["x"], fill=0.0)
    ws.load(mask=m.mask)
    ws.load(h0=case["h0"], **({"c0": case["c0"]} if "c0" in fwd.inputs else {}))
    numpy_exec.run(fwd, ws, order=order, seed=seed)
    out = {"y": ws.read_rows("y", m.rows), **{k: ws.read(k) for k in ("h_n", "c_n")
                                              if k in fwd.outputs}}
    if bwd is not None:
        ws.load_rows("dy", m.rows, case["dy"])
        ws.load(dh_n=case["dh_n"], **({"dc_n": case["dc_n"]} if "dc_n" in bwd.inputs else {}))
        numpy_exec.run(bwd, ws, order=order, seed=seed)
        out.update(grads=ws.read("grads"),
                   **{k: ws.read(k) for k in ("dh0", "dc0") if k in bwd.outputs})
        if "dx" in bwd.outputs:
            out["dx"] = ws.read_rows("dx", m.rows)
    return out, ws


def check_varlen(out, case, reverse, what, atol=1e-12, rtol=1e-10):
    """``run_varlen_numpy``'s outputs against the case's reference (the gradient buffer's
    padding is not a gradient: only the layout's entries are compared)."""
    ref = case["ref"][reverse]
    for name in ("y", "h_n", "c_n", "dx", "dh0", "dc0"):
        if name in out and ref[name] is not None:
            assert_close(out[name], ref[name], atol, rtol, name=f"{what} {name}")
    if "grads" in out:
        for e in case["layout"].entries:
            k = int(np.prod(e.shape))
            assert_close(out["grads"][e.offset:e.offset + k], ref["grads"][e.offset:e.offset + k],
                         atol, rtol, name=f"{what} {e.name}")


# --- GpuRunner's own logic on the CPU --------------------------------------------------------------

def _packed_reference(r, x, bs, hx, dy, dhx, reverse):
    """rnnrt.varlen in float64 on the runner's fp32 weights: (y, h_n, c_n, grads dict)."""
    from rnnrt import varlen
    from rnnrt.params import to_flat
    m = r.model
    f64 = lambda a: None if a is None else np.asarray(a, np.float64)   # noqa: E731
    h0, c0 = hx if isinstance(hx, tuple) else (hx, None)
    dh, dc = dhx if isinstance(dhx, tuple) else (dhx, None)
    params = r.params.get() if hasattr(r.params, "get") else r.params   # CuPy or NumPy
    p = per_layer(f64(params), m.layout)
    y, hn, cn, cache = varlen.forward(m.cell_name, p, f64(x), bs, f64(h0), f64(c0),
                                      reverse=reverse)
    g = varlen.backward(cache, f64(dy), f64(dh), f64(dc))
    return y, hn, cn, dict(g, flat=to_flat(g["params"], m.layout))


def draw32(rng, *shape):
    """Standard normal float32 of ``shape``."""
    return rng.standard_normal(shape).astype(np.float32)


def check_runner_packed_step(r, lengths, rng, reverse=False, with_states=True, what=""):
    """One training step of GpuRunner ``r`` (a real one, or one on CpuSession) on a packed
    batch of sequences of ``lengths``: forward_packed, backward, every output against
    rnnrt.varlen in float64 (fp32 tolerances; weight gradients by reduction_atol).
    -> the tape."""
    m = r.model
    bs = batch_sizes_of(lengths)
    n, batch, L = sum(bs), bs[0], m.num_layers
    lstm = m.cell.has_cell_state
    I, H = m.input_size, m.hidden_size
    x, dy = draw32(rng, n, I), draw32(rng, n, H)
    h0 = draw32(rng, L, batch, H) if with_states else None
    hx = (h0, draw32(rng, L, batch, H) if with_states else None) if lstm else h0
    dh = draw32(rng, L, batch, H) if with_states else None
    dhx = (dh, draw32(rng, L, batch, H) if with_states else None) if lstm else dh
    y, hx_n, tape = r.forward_packed(x, bs, hx, train=True, reverse=reverse)
    g = r.backward(tape, dy, dhx)
    ry, rhn, rcn, rg = _packed_reference(r, x, bs, hx, dy, dhx, reverse)
    tag = f"{m.cell_name} {lengths} reverse={reverse} {what}"
    assert_close(y, ry, name=f"{tag} y")
    assert_close(hx_n[0] if lstm else hx_n, rhn, name=f"{tag} h_n")
    if lstm:
        assert_close(hx_n[1], rcn, name=f"{tag} c_n")
        assert_close(g.dc0, rg["dc0"], name=f"{tag} dc0")
    assert_close(g.dx, rg["dx"], name=f"{tag} dx")
    assert_close(g.dh0, rg["dh0"], name=f"{tag} dh0")
    for e in m.layout.entries:
        assert_close(g.flat[e.offset:e.end], rg["flat"][e.offset:e.end],
                     reduction_atol(n), FP32_RTOL, name=f"{tag} {e.name}")
    return tape



class _FakeStream:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def wait_event(self, event):
        pass

    def synchronize(self):
        pass


class _FakeEvent:
    def __init__(self, *args, **kw):
        self.t = 0.0

    def record(self, stream=None):
        import time
        self.t = time.perf_counter()

    def synchronize(self):
        pass


class NumpyCupy(types.ModuleType):
    """Stands in for cupy where GpuRunner's own logic is tested on the CPU (CpuSession):
    arrays are NumPy arrays, streams and events do nothing, the memory pool counts frees."""

    def __init__(self):
        super().__init__("cupy")
        self.ndarray, self.float32 = np.ndarray, np.float32
        self.zeros, self.ones, self.random = np.zeros, np.ones, np.random
        # cupy.asarray of host data is a copy on the device: never the caller's array
        self.asarray = lambda a, dtype=None: np.array(a, dtype=dtype, copy=True)
        self.frees = 0
        fake = self

        class Pool:
            def free_all_blocks(self):
                fake.frees += 1

        self.get_default_memory_pool = lambda: Pool()
        stream = _FakeStream()
        self.cuda = types.SimpleNamespace(Event=_FakeEvent, get_current_stream=lambda: stream,
                                          Device=lambda *a: stream,
                                          get_elapsed_time=lambda a, b: (b.t - a.t) * 1e3)


class NumpyPlanExecutor:
    """A plan on the NumPy executor behind the GPU executors' interface (run, stream,
    prepared.plan / prepared.ws)."""

    def __init__(self, plan, ws):
        self.prepared = types.SimpleNamespace(plan=plan, ws=ws)
        self.stream = _FakeStream()
        self.runs = 0

    def run(self):
        from rnnrt.exec import numpy_exec
        numpy_exec.run(self.prepared.plan, self.prepared.ws)
        self.runs += 1


class CpuSession:
    """rnnrt.session.GpuSession's interface on the CPU: NumPy workspaces (float32) and the
    NumPy executor, the lent H100's limits. Monkeypatch it over GpuSession to run GpuRunner
    (with explicit switches or RNNRT_AUTOTUNE=0: nothing to time) without a GPU."""

    def __init__(self):
        self.cp = NumpyCupy()
        self.limits = H100_SXM
        self.info = {"device": "cpu (CpuSession)"}
        self.ctx = types.SimpleNamespace(kernels=types.SimpleNamespace(get=lambda name: None))
        self.executors_made = 0

    def workspace(self, plan, params, grads=None):
        from rnnrt.exec.workspace import Workspace
        return Workspace(plan, np, np.float32, params, grads=grads)

    def executor(self, name, plan, ws):
        self.executors_made += 1
        return NumpyPlanExecutor(plan, ws)

    def close(self):
        pass


# --- plans on the GPU ---------------------------------------------------------------------------

def gpu_plan_key(*args, **kw):
    """rnnrt.plan.PlanKey for the GPU the tests run on (its limits, which the persistent
    switch's fit reads)."""
    import cupy

    from rnnrt.kernels.limits import DeviceLimits
    from rnnrt.plan import PlanKey
    return PlanKey(*args, device=DeviceLimits.from_device(cupy), **kw)


def random_layer_stack(cell, layers, steps, batch, hidden, inp, bias=True, seed=0):
    """Random fp32 weights (uniform in +-1/sqrt(hidden), the flat torch layout) and inputs
    (x [steps, batch, inp], h0 [layers, batch, hidden], c0 likewise for LSTM, else None),
    never zero. -> (layout, flat, x, h0, c0, rng): rng continues the same stream, for
    whatever else a test draws (the backward's dy, dh_n, dc_n)."""
    rng = np.random.default_rng(seed)
    layout = make_layout(cell, inp, hidden, layers, bias)
    flat = np.zeros(layout.size, np.float32)
    bound = 1 / np.sqrt(hidden)
    for e in layout.entries:
        n = int(np.prod(e.shape))
        flat[e.offset:e.offset + n] = rng.uniform(-bound, bound, n)
    f32 = np.float32
    x = rng.standard_normal((steps, batch, inp)).astype(f32)
    h0 = (0.5 * rng.standard_normal((layers, batch, hidden))).astype(f32)
    c0 = (0.5 * rng.standard_normal((layers, batch, hidden))).astype(f32) \
        if cell == "lstm" else None
    return layout, flat, x, h0, c0, rng


GPU_SHAPE = (6, 4, 24, 40)   # T, B, I, H: I != H; T not a multiple of the chunk 4

_GPU_CASES = {}


def gpu_forward_case(cell, layers, steps=GPU_SHAPE[0], batch=GPU_SHAPE[1], hidden=GPU_SHAPE[3],
                     inp=GPU_SHAPE[2], bias=True, seed=0):
    """fp32 weights and inputs (random, never zero) and the float64 reference outputs:
    -> (flat, x, h0, c0, {"y", "h_n", "c_n"}), made once per process for each arguments."""
    k = (cell, layers, steps, batch, hidden, inp, bias, seed)
    if k not in _GPU_CASES:
        layout, flat, x, h0, c0, _ = random_layer_stack(cell, layers, steps, batch, hidden,
                                                         inp, bias, seed)
        p64 = per_layer(flat.astype(np.float64), layout)
        y, hn, cn, _ = reference.forward(cell, p64, x.astype(np.float64), h0.astype(np.float64),
                                         None if c0 is None else c0.astype(np.float64))
        _GPU_CASES[k] = (flat, x, h0, c0, {"y": y, "h_n": hn, "c_n": cn})
    return _GPU_CASES[k]


def run_gpu_forward_case(cp, ctx, key, executor, data, prove_capture=True):
    """The forward plan of ``key`` on the GPU executor ``executor`` ('eager' or 'graph'),
    outputs poisoned with NaN first, against the reference of ``data``
    (``gpu_forward_case``); a graph's capture must run nothing; a second run on re-poisoned
    buffers must be right too. -> the executor."""
    from rnnrt.exec.cuda_exec import EXECUTORS as EX
    from rnnrt.exec.workspace import Workspace
    from rnnrt.plan import forward_plan
    flat, x, h0, c0, ref = data
    plan = forward_plan(key)
    ws = Workspace(plan, cp, np.float32, cp.asarray(flat))
    ws.poison()
    ws.load_inputs(x, h0, c0)
    cp.cuda.Device().synchronize()
    if executor == "graph":
        ex = EX["graph"](plan, ws, ctx, capture=False)
        ex.capture()
        cp.cuda.Device().synchronize()
        if prove_capture:   # the capture must not have run anything
            out = ws.outputs()
            for name, arr in out.items():
                assert bool(cp.isnan(arr).all()), \
                    f"graph capture ran work eagerly: {name} was written during capture"
    else:
        ex = EX["eager"](plan, ws, ctx)
    ex.run()
    cp.cuda.Device().synchronize()
    out = ws.outputs()
    for name in ("y", "h_n", "c_n"):
        if ref[name] is not None:
            assert_close(out[name], ref[name], FP32_ATOL, FP32_RTOL,
                         name=f"{key.switches.label()} {executor} {name}")
    # replay again on re-poisoned buffers: the second run must not depend on the first
    ws.poison()
    ws.load_inputs(x, h0, c0)
    ex.run()
    cp.cuda.Device().synchronize()
    assert_close(ws.outputs()["y"], ref["y"], FP32_ATOL, FP32_RTOL, name="second run y")
    return ex


# --- bench ------------------------------------------------------------------------------------

def tiny_sweep(**kw):
    """A 2 x 2 grid (hidden x minibatch) that the NumPy executor runs in a second."""
    from rnnrt.bench import sweep as sw
    base = dict(hidden=(6, 8), batch=(2, 3), layers=(2,), cells=("lstm",), steps=3,
                repeats=1, warmup=0, cpu=True)
    base.update(kw)
    return sw.SweepConfig(**base)
