"""Helpers shared by the test modules (no fixtures: those are in conftest.py). Test modules
import from here, never from each other: ``from testkit import FakeCupy, layer_case``
(tests/ is on sys.path through conftest.py).

- CUDA toolchain: ``find_nvrtc``, ``nvrtc_compile``; a stand-in for CuPy (``FakeCupy``,
  ``FakeKernel``) that records compilations and launches;
- persistent kernels (testkit_kernels.py, re-exported): kernel lists, made-up device
  properties (``H100``, ``SMALL``), one layer's data and reference (``layer_case``), the
  cancelling k-group case, the host simulation's build;
- CPU plans: keys for the example H100, a case with its reference, the NumPy executor;
- GPU plans (testkit_gpu.py, re-exported): keys for the GPU the tests run on, random fp32
  layer stacks, the forward and backward cases and their runs on an executor;
- bench: a tiny sweep configuration;
- examples and scripts: ``example_module`` (imported by name, as spawned workers do);
- record names: experiments/results' naming scheme (``RECORD_KINDS``, ``record_name_match``).

Nothing here imports CuPy at import time.
"""
from __future__ import annotations

import contextlib
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
from rnnrt.check import assert_close
from rnnrt.kernels.limits import H100_SXM
from rnnrt.params import make_layout, per_layer, to_flat
from rnnrt.plan import PlanKey

from testkit_kernels import CELLS  # (one definition of the four cells)


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
        self.kernel = self     # cupy.RawKernel.kernel: the function the executors launch
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
            def __init__(self, code, options, name_expressions=None):
                fake.compiled.append((code, options) if name_expressions is None
                                     else (code, options, tuple(name_expressions)))
                self.code, self.exprs = code, name_expressions

            def get_function(self, name):
                if self.exprs is not None and name in self.exprs:   # a template's twin
                    base = name.split("<")[0]
                    assert re.search(rf"template\s*<[^>]*>\s*__global__\s+void\s+{base}\s*\(",
                                     self.code), name
                    return FakeKernel(fake, name)
                assert re.search(rf'__global__\s+void\s+(__launch_bounds__\([^)]*\)\s+)?'
                                 rf'(__cluster_dims__\([^)]*\)\s+)?{name}\s*\(',
                                 self.code), name
                return FakeKernel(fake, name)

        self.RawModule = RawModule


@contextlib.contextmanager
def fake_cupy_installed(monkeypatch):
    """A FakeCupy as ``cupy`` (through ``monkeypatch``) with rnnrt.kernels.library's compile
    caches empty on entry and on exit, so compiles are the fake's and none leak. -> it."""
    from rnnrt.kernels import library
    fake = FakeCupy()
    monkeypatch.setitem(sys.modules, "cupy", fake)
    library.compile_module.cache_clear()
    library.compile_twins.cache_clear()
    try:
        yield fake
    finally:
        library.compile_module.cache_clear()
        library.compile_twins.cache_clear()


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


def model_reference(model, x, h0=None, c0=None, dy=None, dh_n=None, dc_n=None,
                    dtype="float32", flat=None):
    """The float64 NumPy reference of the rnnrt ``model`` with weights ``flat`` [layout.size]
    (default model.flat; a runner's r.params on the host) on x [T, B, I], h0 / c0
    [L, B, H] (None: zeros), at precision ``dtype``'s rounding points (float32: none):
    {'y', 'h_n', 'c_n'}; with dy [T, B, H] (dh_n / dc_n [L, B, H] or None) the backward too:
    {'dx', 'dh0', 'dc0', 'grads' [layout.size] flat}. c_n / dc0 are None for a cell without c.
    """
    def d64(a):
        return None if a is None else np.asarray(a, np.float64)

    cell = model.cell_name
    p64 = per_layer(d64(model.flat if flat is None else flat), model.layout)
    y, h_n, c_n, cache = reference.forward(cell, p64, d64(x), d64(h0), d64(c0), dtype=dtype)
    out = {"y": y, "h_n": h_n, "c_n": c_n}
    if dy is not None:
        g = reference.backward(cell, p64, cache, d64(dy), d64(dh_n), d64(dc_n))
        out.update(dx=g["dx"], dh0=g["dh0"], dc0=g["dc0"],
                   grads=to_flat(g["params"], model.layout))
    return out


def check_outputs(out, ref, what):
    for name in ("y", "h_n", "c_n"):
        if ref.get(name) is not None:
            assert_close(out[name], ref[name], atol=1e-12, rtol=1e-10, name=f"{what} {name}")


# backward plans at odd tiny sizes: T, B, I, H
BWD_PLAN_SHAPE = (5, 3, 4, 6)


def bwd_plan_case(cell, layers, bias=True, seed=0, shape=BWD_PLAN_SHAPE, dtype="float32"):
    """Random weights (never zero), inputs, output gradients at ``shape`` (T, B, I, H) and
    the float64 reference (rounding-aware for precision ``dtype``): -> (layout, flat, (x,
    h0, c0), (dy, dh_n, dc_n), ref) with ref {"dx", "dh0", "dc0", "grads" (the flat
    layout), and the forward's "y", "h_n", "c_n"}."""
    T, B, I, H = shape
    rng = np.random.default_rng(seed)
    layout = make_layout(cell, I, H, layers, bias)
    flat = np.zeros(layout.size)
    for e in layout.entries:
        n = int(np.prod(e.shape))
        flat[e.offset:e.offset + n] = rng.uniform(-0.6, 0.6, n)
    x = rng.standard_normal((T, B, I))
    h0 = 0.5 * rng.standard_normal((layers, B, H))
    c0 = 0.5 * rng.standard_normal((layers, B, H)) if cell == "lstm" else None
    dy = rng.standard_normal((T, B, H))
    dhn = rng.standard_normal((layers, B, H))
    dcn = rng.standard_normal((layers, B, H)) if cell == "lstm" else None
    p = per_layer(flat, layout)
    y, hn, cn, cache = reference.forward(cell, p, x, h0, c0, dtype=dtype)
    g = reference.backward(cell, p, cache, dy, dhn, dcn)
    ref = {"dx": g["dx"], "dh0": g["dh0"], "dc0": g["dc0"], "grads": to_flat(g["params"], layout),
           "y": y, "h_n": hn, "c_n": cn}
    return layout, flat, (x, h0, c0), (dy, dhn, dcn), ref


def run_bwd_plan(key, flat, fwd_in, bwd_in, order="program", seed=None, accumulate=False,
                 ws=None, fwd=None, bwd=None, dtype=np.float64):
    """The forward then the backward plan of ``key`` on the NumPy executor, every io and
    scratch buffer poisoned (NaN) first unless ``ws`` is given. -> the workspace."""
    from rnnrt.exec import numpy_exec
    from rnnrt.exec.workspace import Workspace
    from rnnrt.plan import forward_plan
    from rnnrt.plan.backward import backward_plan
    fwd = fwd or forward_plan(key)
    bwd = bwd or backward_plan(key, accumulate)
    if ws is None:
        ws = Workspace(bwd, np, dtype, flat)
        ws.poison(roles=("io", "scratch"))
    x, h0, c0 = fwd_in
    ws.load_inputs(x, h0, c0)
    numpy_exec.run(fwd, ws, order=order, seed=seed)
    ws.load_output_grads(*bwd_in)
    numpy_exec.run(bwd, ws, order=order, seed=seed)
    return ws


def check_bwd_plan(ws, layout, ref, what, scale=1.0, atol=1e-12, rtol=1e-10):
    """dx, dh0, dc0 and every parameter's gradient of ``ws`` against ``ref`` (scaled), the
    worst element named on failure."""
    got = {name: ws.read(name) for name in ("dx", "dh0", "dc0") if ref[name] is not None}
    check_bwd_outputs({**got, "grads": ws.read("grads")}, layout, ref, what, atol, rtol,
                      scale=scale)


def check_bwd_key(key, case, what, seed=1, always_random=False):
    """The backward plan of ``key`` is statically race-free and gives the reference
    gradients of ``case`` (``bwd_plan_case``'s tuple) in program order, and in a random
    interleaving (``seed``) where it has several streams (``always_random``: whatever its
    streams); every io and scratch buffer poisoned first. -> the plan."""
    from rnnrt.exec.racecheck import find_races
    from rnnrt.plan.backward import backward_plan
    layout, flat, fwd_in, bwd_in, ref = case
    plan = backward_plan(key)
    races = find_races(plan)
    assert not races, f"{what}: " + races[0].describe(plan)
    check_bwd_plan(run_bwd_plan(key, flat, fwd_in, bwd_in), layout, ref, what)
    if always_random or len(plan.streams) > 1:
        check_bwd_plan(run_bwd_plan(key, flat, fwd_in, bwd_in, "random", seed), layout, ref,
                       f"{what} random")
    return plan


def check_bwd_outputs(got, layout, ref, what, atol=1e-12, rtol=1e-10, grads_atol=None,
                      scale=1.0):
    """A backward's outputs ``got`` ({"dx", "dh0", "dc0": arrays, "grads": the flat
    gradients [layout.size]}; NumPy or CuPy) against ``ref`` (``bwd_plan_case``'s or
    ``gpu_backward_case``'s; its grads scaled by ``scale``): dx, dh0, dc0 where the reference
    has them, then every parameter's gradient (the padding between them is not one) with
    ``grads_atol`` (default ``atol``), the worst element named on failure."""
    for name in ("dx", "dh0", "dc0"):
        if ref[name] is not None:
            assert_close(got[name], ref[name], atol, rtol, name=f"{what} {name}")
    grads = got["grads"]
    grads = np.asarray(grads.get() if hasattr(grads, "get") else grads)   # CuPy: one copy
    for e in layout.entries:
        assert_close(grads[e.offset:e.end], scale * ref["grads"][e.offset:e.end],
                     atol if grads_atol is None else grads_atol, rtol, name=f"{what} {e.name}")


# --- bench ------------------------------------------------------------------------------------

def tiny_sweep(**kw):
    """A 2 x 2 grid (hidden x minibatch) that the NumPy executor runs in a second."""
    from rnnrt.bench import sweep as sw
    base = dict(hidden=(6, 8), batch=(2, 3), layers=(2,), cells=("lstm",), steps=3,
                repeats=1, warmup=0, cpu=True)
    base.update(kw)
    return sw.SweepConfig(**base)


# --- examples and scripts -------------------------------------------------------------------------

def example_module(name):
    """examples/<name>.py or experiments/scripts/<name>.py, imported by its name with both
    folders on sys.path (put there once): what the scripts do themselves (train_ddp imports
    train_charlm and charlm_parts by name), so every test shares one module object, a
    dataclass finds its module in sys.modules, and spawned workers (which inherit sys.path)
    re-import the module their function lives in the same way."""
    import importlib
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    for folder in (root / "examples", root / "experiments" / "scripts"):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    return importlib.import_module(name)


# --- precisions (issue 23) ---------------------------------------------------------------------

# --- record names ---------------------------------------------------------------------------------

# experiments/results' naming scheme, written out here, not imported from rnnrt.bench.records,
# so that a change to the code cannot widen what passes: tests/bench/test_bench_index.py holds
# every committed record to it, the examples' tests the records they write.
RECORD_STAMP = r"\d{8}T\d{6}"
RECORD_SLUG = r"nvidia(?:-[a-z0-9]+)*|cpu"
_WORDS = r"(?:-[A-Za-z0-9_.]+)"
_SHAPE = r"[a-z_]+-L\d+-H\d+-B\d+-T\d+"
RECORD_KINDS = {  # kind: (stem, extension)
    "ladder": (rf"ladder-{_SHAPE}-(?:fwd|fwdbwd)(?:-(?:tf32|bfloat16|float16))?", "json"),
    "sweep": (rf"sweep{_WORDS}+", "jsonl"),
    "kernels": (rf"(?:persistent|stack-bench|stack-bwd-bench|pointwise-bench|tile-bench|schedule-probe|backward-probe){_WORDS}+"
                r"|gemm-layouts|gemm3x-bench|gemm-algos-bench|pretranspose-probe|grid-barrier-bench"
                r"|staging-bench",
                "json"),
    "trace": (rf"trace(?:-[a-z0-9_]+)*-{_SHAPE}(?:-fwdbwd)?", "json"),
    "training": ((rf"charlm-{_SHAPE}-S\d+|train-step-{_SHAPE}"
                  rf"|memory-varlen-[a-z_]+-L\d+-H\d+-B\d+"
                  rf"|ddp-charlm-{_SHAPE}-S\d+-W\d+|ddp-scaling-{_SHAPE}|ddp-link"), "json"),
    "long-sequence": ("long-sequence", "json"),
    "precision": (rf"precision-{_SHAPE}(?:-T\d+)*", "json"),
    "profiles": (rf"(?:ncu|torch-profile){_WORDS}+", "txt|json"),
    "logs": (rf"(?:gpu-tests|sweep-progress|ladder-progress|charlm|env|bench-log){_WORDS}*", "log|txt|json"),
}


def record_name_match(kind, name):
    """re.fullmatch of a record's file ``name`` against the scheme of ``kind`` (None: it
    does not follow it)."""
    stem, ext = RECORD_KINDS[kind]
    return re.fullmatch(rf"(?:{stem})-(?:{RECORD_SLUG})-{RECORD_STAMP}\.(?:{ext})", name)


# --- bad input: refused before any work, nothing changed ----------------------------------------

class Spy:
    """Stands in for a function that does the work (a reference pass, a plan build, a run):
    records calls and fails loudly, so a refusal that came after the work started shows."""

    def __init__(self, name="the work"):
        self.name, self.calls = name, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        raise AssertionError(f"{self.name} started before the refusal")


def tree_state(folder):
    """{relative path: bytes} of every file under ``folder`` (to show nothing was written)."""
    from pathlib import Path
    folder = Path(folder)
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def assert_refused(call, exc, words, arrays=(), folders=(), spies=(), within_s=2.0):
    """``call()`` raises ``exc`` (exactly that type or a subclass) whose message contains
    every string of ``words`` (the argument's name first), within ``within_s`` seconds; every
    array of ``arrays`` is byte-for-byte unchanged, every folder of ``folders`` holds exactly
    the files it held, unchanged; no ``spies`` (Spy) was called. -> the exception."""
    import time

    import pytest
    arrays_before = [a.tobytes() for a in arrays]
    folders_before = [tree_state(f) for f in folders]
    t0 = time.perf_counter()
    with pytest.raises(exc) as info:
        call()
    took = time.perf_counter() - t0
    msg = str(info.value)
    for w in words:
        assert w in msg, f"{w!r} not in the message {msg!r}"
    assert took < within_s, f"refused after {took:.2f} s: work was done first"
    for a, before in zip(arrays, arrays_before):
        assert a.tobytes() == before, "an input array was changed"
    for f, before in zip(folders, folders_before):
        assert tree_state(f) == before, f"files under {f} changed"
    for s in spies:
        assert s.calls == 0, f"{s.name} ran"
    return info.value


from testkit_kernels import (  # noqa: E402, F401  (re-exported: tests import from testkit)
    BWD_KERNELS, CLUSTER_KERNELS, GRID_KERNELS, H100, PERSISTENT, SIM_ENV, SMALL,
    alternating_runs, build_host_sim, bwd_gradients, bwd_layer_case, cancelling_case, ceil,
    check_bwd_against_reference, check_no_spills, chunk_cols, emulated, layer_case,
    nvcc_instantiations, nvcc_usage)
from testkit_gpu import (  # noqa: E402, F401  (re-exported: tests import from testkit)
    BWD_OUTPUTS, GPU_SHAPE, cell_model, gpu_backward_case, gpu_forward_case, gpu_plan_key,
    RELU_AMBIGUOUS, assert_runs_allocate_nothing, launch_stack_fit, random_layer_stack,
    relu_margin, run_gpu_backward_case, run_gpu_forward_case)
from testkit_runner import (  # noqa: E402, F401  (re-exported: tests import from testkit)
    CpuSession, NumpyCupy, NumpyPlanExecutor, check_runner_packed_step, check_varlen, draw32,
    mmac_fit_held, mmac_grid_form_held, run_varlen_numpy, runs_named_family, varlen_case)
