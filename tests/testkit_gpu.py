"""Test helpers for plans on the GPU (the GPU test modules share them), split from testkit.py
by concept; testkit re-exports them, so test modules import from testkit as before: keys for
the GPU the tests run on, random fp32 layer stacks, the forward and backward cases and their
runs on a GPU executor.

Nothing here imports CuPy at import time.
"""
from __future__ import annotations

import numpy as np

from rnnrt import reference
from rnnrt.check import FP32_ATOL, FP32_RTOL, assert_close
from rnnrt.params import make_layout, per_layer, to_flat

# --- plans on the GPU ---------------------------------------------------------------------------

def cell_model(cell, inp, hidden, layers=1, seed=0):
    """The rnnrt model of ``cell`` ('lstm', 'gru', 'rnn_tanh', 'rnn_relu')."""
    import rnnrt
    if cell == "lstm":
        return rnnrt.LSTM(inp, hidden, num_layers=layers, seed=seed)
    if cell == "gru":
        return rnnrt.GRU(inp, hidden, num_layers=layers, seed=seed)
    return rnnrt.RNN(inp, hidden, num_layers=layers, nonlinearity=cell.split("_")[1], seed=seed)


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

_GPU_BWD_CASES = {}


def gpu_backward_case(cell, layers, steps=GPU_SHAPE[0], batch=GPU_SHAPE[1],
                      hidden=GPU_SHAPE[3], inp=GPU_SHAPE[2], bias=True, seed=0):
    """fp32 weights and inputs (``random_layer_stack``), output gradients dy, dh_n, dc_n
    (LSTM) from the same stream, and the float64 reference gradients: -> (layout, flat,
    (x, h0, c0), (dy, dh_n, dc_n), {"dx", "dh0", "dc0", "grads"}), made once per arguments."""
    k = (cell, layers, steps, batch, hidden, inp, bias, seed)
    if k not in _GPU_BWD_CASES:
        layout, flat, x, h0, c0, rng = random_layer_stack(cell, layers, steps, batch, hidden,
                                                           inp, bias, seed)
        f32 = np.float32
        dy = rng.standard_normal((steps, batch, hidden)).astype(f32)
        dhn = rng.standard_normal((layers, batch, hidden)).astype(f32)
        dcn = rng.standard_normal((layers, batch, hidden)).astype(f32) if cell == "lstm" else None
        d64 = lambda a: None if a is None else a.astype(np.float64)  # noqa: E731
        p64 = per_layer(flat.astype(np.float64), layout)
        _, _, _, cache = reference.forward(cell, p64, d64(x), d64(h0), d64(c0))
        g = reference.backward(cell, p64, cache, d64(dy), d64(dhn), d64(dcn))
        _GPU_BWD_CASES[k] = (layout, flat, (x, h0, c0), (dy, dhn, dcn),
                             {"dx": g["dx"], "dh0": g["dh0"], "dc0": g["dc0"],
                              "grads": to_flat(g["params"], layout)})
    return _GPU_BWD_CASES[k]


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


# the backward's own outputs (a backward plan's outputs include the forward's y, h_n, c_n)
BWD_OUTPUTS = ("dx", "dh0", "dc0", "grads")


def run_gpu_backward_case(cp, ctx, key, executor, data, runs=2):
    """The forward then the backward plan of ``key`` on the GPU executor ``executor``
    ('eager' or 'graph') with the data of ``gpu_backward_case``: every buffer poisoned
    (NaN) before the forward, the backward's own buffers (all but the constants it keeps,
    'ones' and 'bsync') again before each of ``runs`` backward runs; a graph is captured
    before the first run and its capture must have written none of the backward's outputs.
    -> a list, one dict a run, of the backward's outputs as NumPy arrays ({"dx", "dh0",
    "dc0", "grads"}, those the plan has), for testkit.check_bwd_outputs."""
    from rnnrt.exec.cuda_exec import EXECUTORS as EX
    from rnnrt.exec.workspace import Workspace
    from rnnrt.plan import forward_plan
    from rnnrt.plan.backward import backward_plan
    _, flat, (x, h0, c0), (dy, dhn, dcn), _ = data
    fplan, bplan = forward_plan(key), backward_plan(key)
    ws = Workspace(bplan, cp, np.float32, cp.asarray(flat))
    bwd_bufs = {b.name for b in bplan.buffers} - {b.name for b in fplan.buffers}
    outputs = [name for name in BWD_OUTPUTS if name in bplan.outputs]
    ws.poison()
    ws.load_inputs(x, h0, c0)
    EX[executor](fplan, ws, ctx).run()
    bwd = EX[executor](bplan, ws, ctx, **({"capture": False} if executor == "graph" else {}))
    outs = []
    for i in range(runs):
        ws.poison(names=bwd_bufs - {"ones", "bsync"})
        ws.load(dy=dy, dh_n=dhn, **({"dc_n": dcn} if dcn is not None else {}))
        cp.cuda.Device().synchronize()
        if executor == "graph" and i == 0:
            bwd.capture()
            cp.cuda.Device().synchronize()
            for name in outputs:   # the capture must not have run anything
                assert bool(cp.isnan(ws.read(name)).all()), f"backward capture wrote {name}"
        bwd.run()
        cp.cuda.Device().synchronize()
        outs.append({name: ws.read(name).get() for name in outputs})
    return outs


def launch_stack_fit(cp, fit, d_outs, d_ins, scalars, dtype="float32"):
    """Launch ``fit``'s stack kernel once on CuPy arrays (outputs, then inputs: [rows, ld]
    each, the registry's order) with its int ``scalars`` by name, at precision ``dtype`` (a
    typed kernel's instantiation), the device synchronized before and after (the poison
    fills run on CuPy's current stream)."""
    from rnnrt.kernels.library import KernelLibrary
    from rnnrt.kernels.registry import get_kernel
    info = get_kernel(fit.kernel)
    raw = KernelLibrary().with_shared(fit.kernel, fit.smem_bytes, dtype)
    args = [np.int32(fit.batch), np.int32(fit.hidden)]
    for a in list(d_outs) + list(d_ins):
        args += [a, np.int32(a.shape[1])]
    args += [np.int32(scalars[n]) for n in info.scalars]
    cp.cuda.Device().synchronize()
    raw(fit.grid, fit.block, tuple(args), shared_mem=fit.smem_bytes)
    cp.cuda.Device().synchronize()


# A ReLU pre-activation closer to 0 than this is within fp32 summation error of it: the
# fp32 forward's order, not the float64 reference, decides its mask (``relu_margin``)
RELU_AMBIGUOUS = 1e-5


def relu_margin(data) -> float:
    """The smallest |pre-activation| of the float64 forward of a ReLU RNN case (``data``:
    ``gpu_backward_case``'s). Where it is below RELU_AMBIGUOUS, the fp32 forward's summation
    order decides that unit's mask and with it every gradient behind it (rnn_relu L1 H512 B64
    T100 seed 5: -1.8e-7 at step 22, batch 57, unit 28; the float64 reference then differs
    from ANY fp32 kernel by W^T's row at that cell): the reference is no arbiter there."""
    layout, flat, (x, h0, _), _, _ = data
    params = per_layer(flat.astype(np.float64), layout)
    cache = reference.forward("rnn_relu", params, x.astype(np.float64),
                              h0.astype(np.float64), None)[3]
    low = np.inf
    for p, layer in zip(params, cache.layers):   # all steps at once, from the saved x and h
        a = (layer.x @ p["weight_ih"].T + p["bias_ih"]) + (layer.h[:-1] @ p["weight_hh"].T
                                                          + p["bias_hh"])
        low = min(low, float(np.abs(a).min()))
    return low


def assert_runs_allocate_nothing(cp, ex, runs=3):
    """``ex.run()`` ``runs`` times leaves the CuPy pool's used and total bytes as they were."""
    pool = cp.get_default_memory_pool()
    cp.cuda.Device().synchronize()
    before = pool.used_bytes(), pool.total_bytes()
    for _ in range(runs):
        ex.run()
    cp.cuda.Device().synchronize()
    assert (pool.used_bytes(), pool.total_bytes()) == before
