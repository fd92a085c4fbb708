"""The persistent backward as a selector candidate (rnnrt/kernels/choice.py), without a GPU:
training shapes where the kernel fits get candidates with it (first where its cost model
prefers it), forward-only shapes and shapes it cannot take do not; every such candidate is a
valid plan pair that runs the kernel; a fake timer picks it when it is fastest and the
choice survives the disk cache; with timing off the heuristic takes it exactly where the
cost models say (justified in prefers_persistent_backward's docstring)."""
from __future__ import annotations

import dataclasses
import json

import pytest

from rnnrt.kernels import choice as C
from rnnrt.kernels import selector as SEL
from rnnrt.kernels import choice_backward as CB
from rnnrt.kernels.limits import H100_SXM
from rnnrt.kernels.tuning import ScheduleCache
from rnnrt.plan import PlanKey, forward_plan
from rnnrt.plan.backward import backward_plan

SMALL = SEL.Shape("lstm", 1, 128, 128, 8, 100, train=True)     # the wide grid's worst point
PAPER = SEL.Shape("lstm", 4, 512, 512, 64, 100, train=True)


def names(scheds):
    return [s.name for s in scheds]


def test_training_shapes_get_the_persistent_backward_candidates(monkeypatch):
    got = names(C.candidates(SMALL, H100_SXM))
    assert got[:3] == ["cluster+pbwd", "regs+pbwd", "grid+pbwd"], got   # preferred: first
    fwd = names(C.candidates(dataclasses.replace(SMALL, train=False), H100_SXM))
    counts = [n for n in fwd if "/" in n]   # the cluster families' other counts: once
    # the regs forwards with the register-resident backward next (fp32, H <= 128)
    rbwd = [f"{n}+rbwd" for n in ["regs"] + [n for n in counts if n.startswith("regs/")]]
    assert got[3:3 + len(rbwd)] == rbwd, got
    got = got[:3] + got[3 + len(rbwd):]
    assert counts and got[3:3 + len(counts)] == [f"{n}+pbwd" for n in counts]   # each
    assert got[3 + len(counts):] == [n for n in fwd if n not in counts]
    paper = names(C.candidates(PAPER, H100_SXM))
    assert paper[:2] == ["stack", "grid"] and paper[2:4] == ["stack+pbwd", "grid+pbwd"]
    assert not any("pbwd" in n for n in names(C.candidates(
        dataclasses.replace(PAPER, train=False), H100_SXM)))
    big = SEL.Shape("lstm", 1, 2048, 2048, 8, 100, train=True)   # R^T / SM does not fit
    assert not C.backward_fit(big, H100_SXM).ok
    assert not any("pbwd" in n for n in names(C.candidates(big, H100_SXM)))
    # where no persistent forward fits but the backward does, ib10 carries it
    monkeypatch.setattr(C, "fitting_families", lambda shape, device: {})
    assert names(C.candidates(SMALL, H100_SXM))[:2] == ["ib10+pbwd", "paper"]
    assert C.paper_schedule("ib10") == C.paper_schedules()[1]
    with pytest.raises(ValueError, match="'ib3' is not one of"):
        C.paper_schedule("ib3")


def test_the_backward_fit_is_searched_once_a_shape(monkeypatch):
    """candidates and the heuristic fit the backward kernel (a search over units, block
    sizes and tiles) once a shape, not again for the cost model's verdict."""
    calls = []
    fit = CB.persistent_bwd_fit   # the backward's decisions live in choice_backward.py

    def counted(*args, **kw):
        calls.append(args[:3])
        return fit(*args, **kw)

    monkeypatch.setattr(CB, "persistent_bwd_fit", counted)
    assert names(C.candidates(SMALL, H100_SXM))[0] == "cluster+pbwd"
    assert calls == [("lstm", 128, 8)]
    calls.clear()
    assert C.heuristic(SMALL, H100_SXM).backward == "persistent" and len(calls) == 1


@pytest.mark.parametrize("shape", [SMALL, PAPER, SEL.Shape("gru", 2, 96, 128, 16, 20, True)])
def test_every_backward_candidate_is_a_plan_that_runs_the_kernel(shape):
    for s in C.candidates(shape, H100_SXM):
        key = C.with_family(PlanKey(shape.cell, 12, shape.batch, shape.input_size,
                                    shape.hidden, shape.layers, True, s.switches,
                                    train=True, device=H100_SXM), s)
        assert key.backward == s.backward
        forward_plan(key)
        plan = backward_plan(key)
        assert plan.fallback is None, (s.name, plan.fallback)
        launches = plan.counts()["kernel:persistent"]
        if s.backward is None:
            assert launches == 0, s.name
        elif C.choose_persistent_backward(key).stack is not None:   # after a stack forward
            assert launches == 1 and plan.fit.startswith("stack backward"), (s.name, plan.fit)
        else:   # one launch a layer, or (cluster kernel, several layers) one a chunk
            k = C.choose_persistent_backward(key).steps_per_launch
            assert launches == shape.layers * -(-12 // k), (s.name, plan.fit)
            assert ("launches of" in plan.fit) == (k < 12)
        assert C.Schedule.from_dict(json.loads(json.dumps(s.as_dict()))) == s


class FakeTimer:
    def __init__(self, ms):
        self.ms, self.calls = ms, []

    def __call__(self, sched, shape, repeats):
        self.calls.append(sched.name)
        return [self.ms.get(sched.name, 50.0)] * repeats


def test_the_selector_picks_it_where_it_is_fastest_and_the_cache_keeps_it(tmp_path):
    timer = FakeTimer({"cluster+pbwd": 0.8, "grid+pbwd": 1.0, "cluster": 5.8})
    cache = ScheduleCache("dev", path=tmp_path / "s.json")
    sel = SEL.Selector(timer, H100_SXM, cache=cache, autotune=True).select(SMALL)
    assert sel.schedule.name == "cluster+pbwd" and sel.schedule.backward == "persistent"
    assert sel.source == "tuned" and timer.calls[0] == "cluster+pbwd"
    again = SEL.Selector(FakeTimer({}), H100_SXM, autotune=True,
                       cache=ScheduleCache("dev", path=tmp_path / "s.json")).select(SMALL)
    assert again.source == "cache" and again.schedule == sel.schedule
    # an entry written before the backward field existed reads as the per-step backward
    old = {k: v for k, v in sel.schedule.as_dict().items() if k != "backward"}
    assert C.Schedule.from_dict(old).backward is None
    # and where the per-step backward is faster, it wins
    slow = FakeTimer({"cluster+pbwd": 9.0, "grid+pbwd": 9.0, "cluster": 5.8})
    assert SEL.Selector(slow, H100_SXM, autotune=True).select(SMALL).schedule.name == "cluster"


def test_the_heuristic_follows_the_cost_models():
    """RNNRT_AUTOTUNE=0: the forward's choice, with the persistent backward exactly where
    the kernel's modelled chain (layers x steps x step_us; for the cluster kernel of
    several layers, chunked: (steps + (layers - 1) x 10) x step_us) is shorter than the
    per-step backward's model, or after the stack forward where the stack backward is
    preferred (the paper shape: its model says no to the grid kernel, the stack rule yes)."""
    for shape, want in ((SMALL, True), (dataclasses.replace(SMALL, layers=4), True),
                        (dataclasses.replace(SMALL, batch=32), True),
                        (dataclasses.replace(SMALL, layers=4, batch=32), True),
                        (dataclasses.replace(SMALL, batch=256), True),
                        (dataclasses.replace(SMALL, layers=4, batch=256), True), (PAPER, False),
                        (dataclasses.replace(SMALL, train=False), False)):
        h = C.heuristic(shape, H100_SXM)
        assert want == C.prefers_persistent_backward(shape, H100_SXM)
        stack = (C.forward_heuristic(shape, H100_SXM).family == "stack"
                 and C.prefers_stack_backward(shape, H100_SXM))
        assert stack == (shape == PAPER), shape
        assert (h.backward == "persistent") == (want or stack)
        assert h.switches == C.forward_heuristic(shape, H100_SXM).switches
        fit = C.backward_fit(shape, H100_SXM)
        kernel = shape.layers * shape.steps * fit.step_us()
        if fit.cluster and shape.layers > 1:   # chunked along the reverse wavefront
            kernel = (shape.steps + (shape.layers - 1) * 10) * fit.step_us()
        cublas = shape.steps * max(C.CUBLAS_BWD_STEP_US,
                                   shape.layers * C.CUBLAS_BWD_LAYER_STEP_US)
        if shape.batch <= 8:
            cublas *= C.CUBLAS_SLOW_ROWS[2]
        assert (kernel < cublas) == want or not shape.train
    sel = SEL.Selector(FakeTimer({}), H100_SXM, autotune=False).select(SMALL)
    assert sel.source == "heuristic" and sel.schedule.name.endswith("+pbwd")


def test_the_stack_backward_rule_and_its_candidate(monkeypatch):
    """prefers_stack_backward: wherever the stack backward fits (measured: B 32 and B 64
    chose it; at 16 bits the tensor-core one; a GRU's in cluster pairs only:
    choice_backward.prefers_stack_backward); never for inference, a GRU without clusters,
    past the stack's batch or at tf32 (no stack kernel). The
    candidates time stack+pbwd first even where the per-layer backward kernels' fit
    declines."""
    assert C.prefers_stack_backward(PAPER, H100_SXM)
    assert C.prefers_stack_backward(dataclasses.replace(PAPER, batch=32), H100_SXM)
    for shape in (dataclasses.replace(PAPER, train=False), dataclasses.replace(PAPER, batch=65),
                  dataclasses.replace(PAPER, dtype="tf32")):
        assert not C.prefers_stack_backward(shape, H100_SXM), shape
    gru = dataclasses.replace(PAPER, cell="gru")
    no_clusters = dataclasses.replace(H100_SXM, name="no clusters", cc_major=8)
    assert C.prefers_stack_backward(gru, H100_SXM)
    assert not C.prefers_stack_backward(gru, no_clusters)
    assert C.prefers_stack_backward(PAPER, no_clusters)   # LSTM: the one-block kernel too
    # bfloat16 / float16: the tensor-core stack backward (after the tensor-core stack
    # forward), where its cluster pairs fit
    for dtype in ("bfloat16", "float16"):
        assert C.prefers_stack_backward(dataclasses.replace(PAPER, dtype=dtype), H100_SXM)
    sm80 = dataclasses.replace(H100_SXM, name="no clusters", cc_major=8)
    assert not C.prefers_stack_backward(dataclasses.replace(PAPER, dtype="bfloat16"), sm80)
    assert C.prefers_stack_backward(dataclasses.replace(PAPER, hidden=256, input_size=256),
                                    H100_SXM)
    # the paper shape: stack+pbwd is timed first (it wins there)
    names = [s.name for s in C.candidates(PAPER, H100_SXM)]
    assert "stack+pbwd" in names
    # a device whose per-layer backward fit declines every shape: stack+pbwd still timed
    real = C.backward_fit
    monkeypatch.setattr(C, "backward_fit", lambda shape, device: dataclasses.replace(
        real(shape, device), ok=False, reason="declined for the test"))
    names = [s.name for s in C.candidates(PAPER, H100_SXM)]
    assert names[0] == "stack+pbwd" and names.count("stack+pbwd") == 1, names
    # a GRU: its stack backward in pairs, timed first as LSTM's
    names = [s.name for s in C.candidates(dataclasses.replace(PAPER, cell="gru"), H100_SXM)]
    assert names[0] == "stack+pbwd", names
    # where no stack backward fits (a plain RNN: no stack kernel): no stack+pbwd
    names = [s.name for s in C.candidates(dataclasses.replace(PAPER, cell="rnn_tanh"),
                                           H100_SXM)]
    assert "stack+pbwd" not in names and not any(n.endswith("+pbwd") for n in names), names


def test_bwd_clusters_runs_the_cluster_kernel_with_that_count():
    """PlanKey.bwd_clusters (the probe's knob): the cluster backward kernel with exactly that
    many clusters, the plan's fit string saying so; None keeps the rule's; bad values and a
    count without a persistent backward (or with 'grid') are refused with the field named."""
    from rnnrt.plan.switches import Switches
    sw = Switches(grouped=True, streams=True, fused=True, wavefront=True, persistent=True,
                  input_batch=10)
    key = PlanKey("lstm", 30, 32, 128, 128, 4, True, sw, train=True, device=H100_SXM,
                  backward="persistent")
    rule = CB.choose_persistent_backward(key)
    assert rule.runs and rule.fit.cluster
    for n in (2, 4, rule.fit.clusters):
        got = CB.choose_persistent_backward(dataclasses.replace(key, bwd_clusters=n))
        assert got.runs and got.fit.cluster and got.fit.clusters == n, got.describe()
        assert f"fits: {n} cluster" in got.describe()
        assert backward_plan(dataclasses.replace(key, bwd_clusters=n)).fit == got.describe()
    with pytest.raises(ValueError, match="PlanKey.bwd_clusters: expected an int >= 1"):
        dataclasses.replace(key, bwd_clusters=0)
    with pytest.raises(ValueError, match="PlanKey.bwd_clusters: .*backward is None"):
        dataclasses.replace(key, backward=None, bwd_clusters=2)
    with pytest.raises(ValueError, match="backward is 'grid'"):
        CB.choose_persistent_backward(dataclasses.replace(key, backward="grid",
                                                          bwd_clusters=2))


def test_bwd_clusters_names_the_cluster_kernel_after_a_stack_forward():
    """After a stack forward 'persistent' takes the stack backward, but a cluster count names
    the cluster kernel (the probe's knob must time what it says); 'stack' with a count is
    refused when the key is made."""
    from rnnrt.kernels.choice import persistent_schedule
    sw = persistent_schedule("stack").switches
    key = PlanKey("lstm", 20, 8, 128, 128, 2, True, sw, train=True, device=H100_SXM,
                  family="stack", backward="persistent")
    assert CB.choose_persistent_backward(key).stack is not None
    got = CB.choose_persistent_backward(dataclasses.replace(key, bwd_clusters=2))
    assert got.stack is None and got.runs and got.fit.cluster and got.fit.clusters == 2
    with pytest.raises(ValueError, match="PlanKey.bwd_clusters 2: .*backward is 'stack'"):
        dataclasses.replace(key, backward="stack", bwd_clusters=2)
