"""Property-based (hypothesis): random valid small shapes x random switch combinations, every
plan against the float64 reference — the forward's y, h_n, c_n and, for training keys, the
backward's dx, dh0, dc0 and every parameter gradient — on the NumPy executor in a random
stream interleaving, outputs poisoned (NaN) first. And the sizes module's closed forms against
what the builders make: the parameter count, the workspace, the bound on a plan's ops."""
from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rnnrt import reference, sizes
from rnnrt.cells import forward_flops, layer_input_size
from rnnrt.check import assert_close
from rnnrt.exec import numpy_exec
from rnnrt.exec.workspace import Workspace
from rnnrt.params import make_layout, per_layer, to_flat
from rnnrt.plan import forward_plan
from rnnrt.plan.backward import backward_plan
from rnnrt.plan.switches import all_combinations
from testkit import cpu_plan_key as PlanKey

COMBOS = all_combinations()
CELLS = ("lstm", "gru", "rnn_tanh", "rnn_relu")
FAST = settings(max_examples=30, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow])

shapes = st.fixed_dictionaries({
    "cell": st.sampled_from(CELLS), "layers": st.integers(1, 3), "inp": st.integers(1, 7),
    "hidden": st.integers(1, 7), "batch": st.integers(1, 4), "steps": st.integers(1, 7),
    "bias": st.booleans(), "combo": st.integers(0, len(COMBOS) - 1), "train": st.booleans(),
    "seed": st.integers(0, 2**16)})


def _case(s):
    rng = np.random.default_rng(s["seed"])
    layout = make_layout(s["cell"], s["inp"], s["hidden"], s["layers"], s["bias"])
    flat = np.zeros(layout.size)
    for e in layout.entries:
        flat[e.offset:e.end] = rng.uniform(-0.7, 0.7, e.numel)   # never zeros
    T, B, L, H = s["steps"], s["batch"], s["layers"], s["hidden"]
    x = rng.standard_normal((T, B, s["inp"]))
    h0 = 0.5 * rng.standard_normal((L, B, H))
    c0 = 0.5 * rng.standard_normal((L, B, H)) if s["cell"] == "lstm" else None
    dy = rng.standard_normal((T, B, H))
    return layout, flat, x, h0, c0, dy


@FAST
@given(shapes)
def test_random_shapes_and_switches_match_the_reference(s):
    layout, flat, x, h0, c0, dy = _case(s)
    key = PlanKey(s["cell"], s["steps"], s["batch"], s["inp"], s["hidden"], s["layers"],
                  s["bias"], COMBOS[s["combo"]], train=s["train"])
    fwd = forward_plan(key)
    plan = backward_plan(key) if s["train"] else fwd
    ws = Workspace(plan, np, np.float64, flat)
    ws.poison(roles=("io", "scratch"))
    ws.load_inputs(x, h0, c0)
    numpy_exec.run(fwd, ws, order="random", seed=s["seed"])
    p = per_layer(flat, layout)
    y, hn, cn, cache = reference.forward(s["cell"], p, x, h0, c0)
    what = f"{key.switches.label()} {s}"
    for name, ref in (("y", y), ("h_n", hn), ("c_n", cn)):
        if ref is not None:
            assert_close(ws.read(name), ref, 1e-12, 1e-10, name=f"{what} {name}")
    if not s["train"]:
        return
    ws.load(dy=dy, dh_n=None, **({"dc_n": None} if "dc_n" in plan.inputs else {}))
    numpy_exec.run(plan, ws, order="random", seed=s["seed"] + 1)
    g = reference.backward(s["cell"], p, cache, dy)
    for name in ("dx", "dh0", "dc0"):
        if g[name] is not None:
            assert_close(ws.read(name), g[name], 1e-12, 1e-10, name=f"{what} {name}")
    want = to_flat(g["params"], layout)
    got = ws.read("grads")
    for e in layout.entries:   # the padding is not a gradient
        assert_close(got[e.offset:e.end], want[e.offset:e.end], 1e-12, 1e-10,
                     name=f"{what} {e.name}")


@FAST
@given(shapes)
def test_sizes_closed_forms_agree_with_the_builders(s):
    cell, L, I, H = s["cell"], s["layers"], s["inp"], s["hidden"]
    assert sizes.param_elements(cell, I, H, L, s["bias"]) == make_layout(cell, I, H, L,
                                                                         s["bias"]).size
    key = PlanKey(cell, s["steps"], s["batch"], I, H, L, s["bias"], COMBOS[s["combo"]],
                  train=s["train"])
    plan = backward_plan(key) if s["train"] else forward_plan(key)
    assert sizes.workspace_elements(key) == sum(b.size for b in plan.buffers)
    assert sizes.plan_ops_bound(key) >= len(forward_plan(key).ops)
    if s["train"]:
        assert sizes.plan_ops_bound(key, backward=True) >= len(plan.ops)
    # the FLOP count is a closed form of the per-layer sum
    loop = sum(2 * get_gates(cell) * H * s["batch"] * s["steps"]
               * (layer_input_size(li, I, H) + H) for li in range(L))
    assert forward_flops(cell, I, H, L, s["batch"], s["steps"]) == loop


def get_gates(cell):
    from rnnrt.cells import get_cell
    return get_cell(cell).gates
