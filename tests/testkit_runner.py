"""Test helpers for variable-length plans and for GpuRunner's own logic on the CPU (a NumPy
stand-in for CuPy, ``CpuSession``), split from testkit.py by concept; testkit re-exports
them, so test modules import from testkit as before.

Nothing here imports CuPy at import time.
"""
from __future__ import annotations

import contextlib
import types

import numpy as np

from rnnrt.check import FP32_RTOL, assert_close, reduction_atol
from rnnrt.kernels.limits import H100_SXM
from rnnrt.params import make_layout, per_layer
from rnnrt.plan.packing import batch_sizes

# --- variable-length plans ----------------------------------------------------------------------

def varlen_case(cell, layers, lengths, inp, hidden, bias=True, seed=0, dtype=np.float64,
                precision="float32"):
    """A packed batch of sequences of ``lengths`` with random weights (never zero), states
    and output gradients, and rnnrt.varlen's forward and backward of it in both directions
    (rounding-aware for ``precision``):
    -> dict(flat, layout, bs, x [N, I], h0, c0, dy [N, H], dh_n, dc_n, ref={reverse: dict(
    y, h_n, c_n, dx, dh0, dc0, grads [layout.size])})."""
    from rnnrt import varlen
    from rnnrt.params import to_flat
    rng = np.random.default_rng(seed)
    bs = batch_sizes(lengths)
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
                                          reverse=reverse, dtype=precision)
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


@contextlib.contextmanager
def mmac_fit_held(monkeypatch, **held):
    """Within: the selector's fit of family 'mmac' (kernels/choice.py ``mmac_fit``) called
    with the keywords ``held`` whatever the shape (``cluster=GRID_FORM``: the grid form,
    persistent_mmag.cu; ``clusters=1``: one cluster of every batch, the wide form past 8);
    the plan cache cleared on the way in and out (its plans of the same keys are the
    default fit's)."""
    from rnnrt.kernels import choice
    from rnnrt.kernels import mmac
    from rnnrt.plan import forward_plan
    monkeypatch.setattr(choice, "mmac_fit",
                        lambda *a, **kw: mmac.mmac_fit(*a, **{**kw, **held}))
    forward_plan.cache_clear()
    try:
        yield
    finally:
        forward_plan.cache_clear()


def mmac_grid_form_held(monkeypatch):
    """``mmac_fit_held`` at the tensor-core cluster kernels' grid form."""
    from rnnrt.kernels import mmac
    return mmac_fit_held(monkeypatch, cluster=mmac.GRID_FORM)


def runs_named_family(r, family, steps, batch):
    """Give GpuRunner ``r``'s selector the one candidate persistent family ``family`` and
    check, for the forward and the training key of (steps, batch) at the runner's dtype, that
    the family runs it without a fallback: every persistent op of the forward plan launches
    the family's kernel. -> (that kernel's name, the count of its forward ops)."""
    from rnnrt.kernels import choice as C
    from rnnrt.plan import forward_plan
    r.selector.candidates_fn = lambda shape, device: (C.persistent_schedule(family),)
    got = set()
    for train in (False, True):
        key = r.plan_key(steps, batch, train)
        choice = C.choose_persistent(key)
        assert key.dtype == r.dtype and key.family == family and choice.family == family \
            and choice.fallback is None, choice.describe()
        ops = [op.name for op in forward_plan(key).ops if op.kind == "persistent"]
        assert ops and set(ops) == {choice.fit.kernel}, ops
        got.add((choice.fit.kernel, len(ops)))
    assert len(got) == 1, got
    return got.pop()


def check_runner_packed_step(r, lengths, rng, reverse=False, with_states=True, what=""):
    """One training step of GpuRunner ``r`` (a real one, or one on CpuSession) on a packed
    batch of sequences of ``lengths``: forward_packed, backward, every output against
    rnnrt.varlen in float64 (fp32 tolerances; weight gradients by reduction_atol).
    -> the tape."""
    m = r.model
    bs = batch_sizes(lengths)
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
        self.full = np.full
        # cupy.asarray of host data is a copy on the device: never the caller's array
        self.asarray = lambda a, dtype=None: np.array(a, dtype=dtype, copy=True)
        self.frees = 0
        fake = self

        class Pool:
            def free_all_blocks(self):
                fake.frees += 1

            def free_bytes(self):
                return 0

        self.get_default_memory_pool = lambda: Pool()
        stream = _FakeStream()
        # a device of 80 GiB with 64 free (rnnrt.sizes asks before it allocates)
        runtime = types.SimpleNamespace(memGetInfo=lambda: (64 << 30, 80 << 30))
        self.cuda = types.SimpleNamespace(Event=_FakeEvent, get_current_stream=lambda: stream,
                                          Device=lambda *a: types.SimpleNamespace(
                                              id=0, synchronize=stream.synchronize),
                                          runtime=runtime,
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
        # no compiled kernels: the cluster count cap is derived from the limits
        # (kernels/occupancy.py cluster_cap without a kernel)
        self.ctx = types.SimpleNamespace(kernels=types.SimpleNamespace(
            get=lambda name: None, get_persistent=lambda name, dtype: None,
            with_shared=lambda name, smem_bytes, dtype="float32": None))
        self.executors_made = 0

    def workspace(self, plan, params, grads=None):
        from rnnrt.exec.workspace import Workspace
        return Workspace(plan, np, np.float32, params, grads=grads)

    def executor(self, name, plan, ws):
        self.executors_made += 1
        return NumpyPlanExecutor(plan, ws)

    def close(self):
        pass
