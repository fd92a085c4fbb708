"""Property-based (hypothesis): random valid small shapes x random switch combinations, every
plan against the float64 reference — the forward's y, h_n, c_n and, for training keys, the
backward's dx, dh0, dc0 and every parameter gradient — on the NumPy executor in a random
stream interleaving, outputs poisoned (NaN) first. And the sizes module's closed forms against
what the builders make: the parameter count, the workspace, the bound on a plan's ops."""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rnnrt import sizes
from rnnrt.cells import forward_flops, get_cell, layer_input_size
from rnnrt.params import make_layout
from rnnrt.plan import forward_plan
from rnnrt.plan.backward import backward_plan
from rnnrt.plan.switches import all_combinations
from testkit import bwd_plan_case, check_bwd_plan, check_outputs, run_bwd_plan, run_numpy
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


@FAST
@given(shapes)
def test_random_shapes_and_switches_match_the_reference(s):
    shape = (s["steps"], s["batch"], s["inp"], s["hidden"])
    layout, flat, fwd_in, bwd_in, ref = bwd_plan_case(s["cell"], s["layers"], s["bias"],
                                                      s["seed"], shape=shape)
    key = PlanKey(s["cell"], *shape, s["layers"], s["bias"], COMBOS[s["combo"]],
                  train=s["train"])
    what = f"{key.switches.label()} {s}"
    if not s["train"]:
        check_outputs(run_numpy(forward_plan(key), flat, *fwd_in, order="random",
                                seed=s["seed"]), ref, what)
        return
    ws = run_bwd_plan(key, flat, fwd_in, bwd_in, "random", s["seed"])
    check_outputs(ws.outputs(), ref, what)   # the backward leaves the forward's outputs
    check_bwd_plan(ws, layout, ref, what)


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
    loop = sum(2 * get_cell(cell).gates * H * s["batch"] * s["steps"]
               * (layer_input_size(li, I, H) + H) for li in range(L))
    assert forward_flops(cell, I, H, L, s["batch"], s["steps"]) == loop
