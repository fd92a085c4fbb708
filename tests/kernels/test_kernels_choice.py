"""The schedule selector and the persistent-family choice (rnnrt/kernels/selector.py,
choice.py, tuning.py), without a GPU: candidates, keys and length buckets, the timing loop with a fake timer and a
fake clock, the disk cache (write, read, damaged, stale, unwritable, bounded), the switch that
turns timing off, and plans that name a persistent family."""
from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from rnnrt import reference
from rnnrt.check import assert_close
from rnnrt.exec import numpy_exec
from rnnrt.exec.workspace import Workspace
from rnnrt.kernels import choice as C
from rnnrt.kernels import selector as SEL
from rnnrt.kernels.limits import H100_SXM
from rnnrt.kernels.tuning import ScheduleCache, ScheduleCacheWarning, device_key
from rnnrt.params import make_layout, per_layer
from rnnrt.plan import PlanKey, forward_plan

PAPER = SEL.Shape("lstm", 4, 512, 512, 64, 100)


def names(scheds):
    return [s.name for s in scheds]


# --- candidates, keys, buckets --------------------------------------------------------------

def test_candidates_are_the_fitting_families_then_the_paper_schedules():
    assert names(C.candidates(PAPER, H100_SXM)) == ["stack", "grid", "paper", "ib10", "ib2",
                                                    "iball"]
    small = SEL.Shape("lstm", 1, 128, 128, 32, 100)   # one layer: no stack; R fits a cluster
    assert names(C.candidates(small, H100_SXM))[:3] == ["cluster", "regs", "grid"]
    gru = SEL.Shape("gru", 4, 512, 512, 64, 100)      # the stack kernels: LSTM and GRU
    assert names(C.candidates(gru, H100_SXM))[0] == "stack"
    tanh = SEL.Shape("rnn_tanh", 4, 512, 512, 64, 100)
    assert "stack" not in names(C.candidates(tanh, H100_SXM))
    big = SEL.Shape("lstm", 4, 2048, 2048, 64, 100)   # R of H 2048 fits no SM: cuBLAS only
    assert names(C.candidates(big, H100_SXM)) == ["paper", "ib10", "ib2", "iball"]
    for s in C.candidates(PAPER, H100_SXM):         # every candidate is a valid plan
        key = C.with_family(PlanKey("lstm", 8, 64, 512, 512, 4, True, s.switches,
                                    device=H100_SXM), s)
        plan = forward_plan(key)
        assert plan.fallback is None, (s.name, plan.fallback)


def test_bucket_steps_and_the_shape_key():
    assert [SEL.bucket_steps(t) for t in (1, 16, 17, 100, 128, 129, 10000)] == \
        [16, 16, 32, 128, 128, 256, 16384]
    for bad in (0, -3, 2.5, True, "100"):
        with pytest.raises(ValueError, match="steps"):
            SEL.bucket_steps(bad)
    base = SEL.Shape("lstm", 2, 256, 256, 32, 100)
    same = SEL.Shape("lstm", 2, 256, 256, 32, 70)       # one bucket: tuned once
    assert base.key() == same.key()
    for other in (SEL.Shape("lstm", 2, 256, 256, 32, 200), SEL.Shape("gru", 2, 256, 256, 32, 100),
                  SEL.Shape("lstm", 2, 256, 256, 32, 100, train=True),
                  SEL.Shape("lstm", 2, 256, 256, 32, 100, dtype="bfloat16"),
                  SEL.Shape("lstm", 2, 256, 256, 32, 100, executor="eager"),
                  SEL.Shape("lstm", 2, 256, 256, 64, 100)):
        assert other.key() != base.key(), other


def test_schedule_round_trips_through_a_dict():
    for s in C.candidates(PAPER, H100_SXM):
        assert C.Schedule.from_dict(json.loads(json.dumps(s.as_dict()))) == s
    for bad in (None, 3, {"name": 1}, {"name": "x"}, {"name": "x", "switches": {"bogus": 1}}):
        with pytest.raises((ValueError, TypeError)):
            C.Schedule.from_dict(bad)


# --- the timing loop ------------------------------------------------------------------------

class FakeTimer:
    """Per candidate name, the ms its runs take (a list cycles); records every call."""

    def __init__(self, ms, fail=()):
        self.ms, self.fail, self.calls = ms, set(fail), []

    def __call__(self, sched, shape, repeats):
        self.calls.append((sched.name, repeats))
        if sched.name in self.fail:
            raise RuntimeError(f"{sched.name} cannot run here")
        return [self.ms[sched.name]] * repeats


class FakeClock:
    def __init__(self, step=0.0):
        self.t, self.step = 0.0, step

    def __call__(self):
        self.t += self.step
        return self.t


MS = {"stack": 3.0, "grid": 5.0, "paper": 5.5, "ib10": 4.0, "ib2": 3.9, "iball": 9.0}


def test_the_fastest_candidate_wins_and_clearly_slower_ones_stop_early():
    timer = FakeTimer(MS)
    sel = SEL.Selector(timer, H100_SXM, autotune=True).select(PAPER)
    assert sel.schedule.name == "stack" and sel.source == "tuned"
    rows = {r["name"]: r for r in sel.candidates}
    # every candidate, then the winner with its GEMMs' kernels timed (no time here: it fails)
    assert set(rows) == set(MS) | {"stack+lt"} and sel.candidates[-1]["name"] == "stack+lt"
    assert rows["stack+lt"]["ms"] is None and rows["stack+lt"]["status"].startswith("failed")
    assert rows["stack"]["ms"] == 3.0 and rows["stack"]["status"] == "timed"
    # 5.0 / 3.0 > CLEARLY_SLOWER: one timed run only
    assert rows["grid"]["status"].startswith("stopped early")
    assert ("grid", 1) in timer.calls and ("grid", SEL.TUNE_REPEATS - 1) not in timer.calls
    # within CLEARLY_SLOWER of the best: timed to the full count
    assert ("ib2", SEL.TUNE_REPEATS - 1) in timer.calls


def test_a_candidate_that_fails_loses_and_says_why():
    timer = FakeTimer(MS, fail={"stack"})
    sel = SEL.Selector(timer, H100_SXM, autotune=True).select(PAPER)
    assert sel.schedule.name == "ib2"
    stack = next(r for r in sel.candidates if r["name"] == "stack")
    assert stack["ms"] is None and "cannot run here" in stack["status"]


def test_nothing_runs_gives_the_heuristic_and_says_so():
    timer = FakeTimer(MS, fail=set(MS))
    sel = SEL.Selector(timer, H100_SXM, autotune=True).select(PAPER)
    assert sel.source == "heuristic" and "no candidate" in sel.note
    assert sel.schedule == C.heuristic(PAPER, H100_SXM)


def test_the_tuning_budget_skips_the_rest():
    timer = FakeTimer(MS)
    clock = FakeClock(step=1.0)   # every clock read one second later
    sel = SEL.Selector(timer, H100_SXM, autotune=True, budget_s=2.5, clock=clock).select(PAPER)
    skipped = [r["name"] for r in sel.candidates if r["status"].startswith("skipped")]
    assert skipped and skipped == names(C.candidates(PAPER, H100_SXM))[-len(skipped):]
    assert all(name not in {c for c, _ in timer.calls} for name in skipped)
    assert sel.tune_s > 0


def test_a_choice_is_remembered_in_memory_per_bucket():
    timer = FakeTimer(MS)
    s = SEL.Selector(timer, H100_SXM, autotune=True)
    first = s.select(PAPER)
    n = len(timer.calls)
    again = s.select(SEL.Shape("lstm", 4, 512, 512, 64, 90))   # the same bucket
    assert again is first and len(timer.calls) == n
    s.select(SEL.Shape("lstm", 4, 512, 512, 64, 300))            # another bucket: tuned
    assert len(timer.calls) > n


def test_memory_is_bounded(monkeypatch):
    monkeypatch.setattr(SEL, "MEMORY_ENTRIES", 3)
    s = SEL.Selector(FakeTimer(MS), H100_SXM, autotune=True)
    for b in (17, 20, 24, 28, 32):
        s.select(SEL.Shape("lstm", 4, 512, 512, b, 100))
    assert len(s._memory) == 3


def test_timing_off_takes_the_heuristic_without_timing(monkeypatch):
    timer = FakeTimer(MS)
    monkeypatch.setenv("RNNRT_AUTOTUNE", "0")
    s = SEL.Selector(timer, H100_SXM)
    assert not s.autotune
    sel = s.select(PAPER)
    assert timer.calls == [] and sel.source == "heuristic" and "RNNRT_AUTOTUNE" in sel.note
    assert sel.schedule.name == "stack"
    assert SEL.autotune_enabled({"RNNRT_AUTOTUNE": "off"}) is False
    assert SEL.autotune_enabled({}) is True
    # deterministic; never the grid kernel where it was the cliff (LSTM L4 H1024 B64), but
    # where it wins (H1024 B8); the paper rung at large batches, chunks of 10 at small ones
    cases = {SEL.Shape("lstm", 4, 1024, 1024, 64, 100): "ib10",
             SEL.Shape("gru", 4, 1024, 1024, 128, 100): "paper",
             SEL.Shape("lstm", 1, 1024, 1024, 8, 100): "grid",
             SEL.Shape("gru", 1, 128, 128, 32, 100): "cluster",
             SEL.Shape("lstm", 1, 2048, 2048, 8, 100): "ib10"}
    for shape, want in cases.items():
        h = C.heuristic(shape, H100_SXM)
        assert h == C.heuristic(shape, H100_SXM)
        assert h.name == want, (shape, h.name)


# --- the disk cache ---------------------------------------------------------------------------

DEV = device_key({"device": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0",
                  "cuda_driver": 13000, "cuda_runtime": 13020, "cupy": "14.2.0",
                  "rnnrt": "0.1.0"})


def test_a_tuned_choice_is_read_back_by_the_next_process(tmp_path):
    path = tmp_path / "schedules.json"
    timer = FakeTimer(MS)
    SEL.Selector(timer, H100_SXM, ScheduleCache(DEV, path), autotune=True).select(PAPER)
    data = json.loads(path.read_text())
    assert data["format"] == "rnnrt.schedules/1" and PAPER.key() in data["devices"][DEV]
    fresh = FakeTimer(MS)
    sel = SEL.Selector(fresh, H100_SXM, ScheduleCache(DEV, path), autotune=True).select(PAPER)
    assert fresh.calls == [] and sel.source == "cache" and sel.schedule.name == "stack"


def test_another_device_or_version_tunes_again(tmp_path):
    path = tmp_path / "schedules.json"
    SEL.Selector(FakeTimer(MS), H100_SXM, ScheduleCache(DEV, path), autotune=True).select(PAPER)
    other = DEV.replace("0.1.0", "0.2.0")
    timer = FakeTimer(MS)
    sel = SEL.Selector(timer, H100_SXM, ScheduleCache(other, path), autotune=True).select(PAPER)
    assert timer.calls and sel.source == "tuned"
    # both sections are kept
    assert set(json.loads(path.read_text())["devices"]) == {DEV, other}


@pytest.mark.parametrize("content", [b"{not json", b"\xff\xfe\x00garbage", b"[1, 2]", b"3",
                                     b'{"format": "rnnrt.schedules/0", "devices": {}}',
                                     b'{"format": "rnnrt.schedules/1", "devices": 7}'],
                         ids=["torn", "binary", "list", "number", "old-format", "bad-devices"])
def test_a_damaged_cache_warns_once_and_is_rewritten(tmp_path, content):
    path = tmp_path / "schedules.json"
    path.write_bytes(content)
    timer = FakeTimer(MS)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        cache = ScheduleCache(DEV, path)
        sel = SEL.Selector(timer, H100_SXM, cache, autotune=True).select(PAPER)
    ours = [x for x in w if issubclass(x.category, ScheduleCacheWarning)]
    assert len(ours) == 1, [str(x.message) for x in w]
    assert sel.source == "tuned" and timer.calls
    assert json.loads(path.read_text())["devices"][DEV][PAPER.key()]   # rewritten, valid


def test_a_damaged_entry_is_tuned_again(tmp_path):
    path = tmp_path / "schedules.json"
    path.write_text(json.dumps({"format": "rnnrt.schedules/1", "devices": {DEV: {
        PAPER.key(): {"schedule": {"name": "stack", "switches": {"warp_drive": True}}}}}}))
    timer = FakeTimer(MS)
    with pytest.warns(ScheduleCacheWarning, match="damaged"):
        sel = SEL.Selector(timer, H100_SXM, ScheduleCache(DEV, path), autotune=True).select(PAPER)
    assert sel.source == "tuned" and timer.calls


def test_an_unwritable_cache_warns_and_works_in_memory(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache folder should be")
    cache = ScheduleCache(DEV, blocker / "sub" / "schedules.json")
    timer = FakeTimer(MS)
    s = SEL.Selector(timer, H100_SXM, cache, autotune=True)
    with pytest.warns(ScheduleCacheWarning, match="cannot be written"):
        sel = s.select(PAPER)
    assert sel.schedule.name == "stack"
    n = len(timer.calls)
    assert s.select(PAPER) is sel and len(timer.calls) == n


def test_the_cache_file_is_bounded_least_recently_used_first(tmp_path):
    path = tmp_path / "schedules.json"
    clock = iter(range(1000))
    cache = ScheduleCache(DEV, path, max_entries=3, clock=lambda: next(clock))
    for b in (17, 20, 24, 28):
        cache.put(f"k{b}", {"schedule": {"name": "x"}})
    cache.get("k17")   # used again: not the oldest any more ... but only in memory
    cache.put("k32", {"schedule": {"name": "x"}})
    kept = set(json.loads(path.read_text())["devices"][DEV])
    assert len(kept) == 3 and "k32" in kept and "k20" not in kept


def test_the_cache_path_follows_the_environment(tmp_path):
    from rnnrt.kernels.tuning import default_path
    assert default_path({"RNNRT_CACHE_DIR": str(tmp_path)}) == tmp_path / "schedules.json"
    assert default_path({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "rnnrt" / \
        "schedules.json"


# --- plans that name a persistent family -----------------------------------------------------

def _key(family, batch=8, cell="lstm", hidden=64, layers=2, steps=5, persistent=True):
    sched = C.persistent_schedule(family) if persistent else C.paper_schedule("ib10")
    return PlanKey(cell, steps, batch, hidden, hidden, layers, True, sched.switches,
                   device=H100_SXM, family=sched.family)


def test_a_named_family_runs_even_where_the_rules_would_not_take_it():
    plan = forward_plan(_key("stack", batch=8))     # the rules keep B 8 off the stack
    assert [op.name for op in plan.ops if op.kind == "persistent"] == \
        ["lstm_persistent_stack_fwd"]
    plan = forward_plan(_key("grid", batch=8))      # the rules would take the stack ...
    assert {op.name for op in plan.ops if getattr(op, "kind", "") == "persistent"} == \
        {"lstm_persistent_fwd"}
    plan = forward_plan(_key("cluster", batch=8))
    assert {op.name for op in plan.ops if getattr(op, "kind", "") == "persistent"} == \
        {"lstm_persistent_cluster_fwd"}


def test_a_named_family_that_does_not_fit_falls_back_and_says_why():
    plan = forward_plan(_key("stack", cell="rnn_tanh"))
    assert plan.fallback and "LSTM and GRU only" in plan.fallback
    assert not any(getattr(op, "kind", "") == "persistent" for op in plan.ops)
    plan = forward_plan(_key("cluster", hidden=2048, layers=1))
    assert plan.fallback and "declined" in plan.fallback


def test_a_family_needs_the_persistent_switch():
    with pytest.raises(ValueError, match="family"):
        PlanKey("lstm", 5, 8, 64, 64, 2, True, C.paper_schedule("ib10").switches,
                device=H100_SXM, family="stack")
    with pytest.raises(ValueError, match="family"):
        PlanKey("lstm", 5, 8, 64, 64, 2, True, C.persistent_schedule("stack").switches,
                device=H100_SXM, family="warp")


@pytest.mark.parametrize("family", ["stack", "grid", "cluster", "regs"])
def test_a_named_family_computes_the_reference(family):
    key = _key(family, batch=5, layers=2, steps=4)
    plan = forward_plan(key)
    layout = make_layout("lstm", 64, 64, 2, True)
    rng = np.random.default_rng(3)
    flat = rng.uniform(-0.2, 0.2, layout.size)
    x = rng.standard_normal((4, 5, 64))
    h0 = 0.5 * rng.standard_normal((2, 5, 64))
    c0 = 0.5 * rng.standard_normal((2, 5, 64))
    ws = Workspace(plan, np, np.float64, flat)
    ws.poison()
    ws.load_inputs(x, h0, c0)
    numpy_exec.run(plan, ws)
    y, hn, cn, _ = reference.forward("lstm", per_layer(flat, layout), x, h0, c0)
    out = ws.outputs()
    for name, ref in (("y", y), ("h_n", hn), ("c_n", cn)):
        assert_close(out[name], ref, 1e-10, 1e-9, name=f"{family} {name}")


def test_long_runs_are_tuned_on_a_prefix_and_short_ones_whole():
    assert SEL.tuning_steps(PAPER) == 100                     # 107 GFLOP: ~4 ms, all of it
    big = SEL.Shape("lstm", 4, 2048, 2048, 256, 100, train=True)   # ~20 TFLOP a run
    n = SEL.tuning_steps(big)
    assert SEL.TUNE_MIN_STEPS <= n < 100
    long = SEL.Shape("lstm", 2, 256, 256, 32, 100000)
    assert SEL.tuning_steps(long) < 100000


def test_a_long_first_run_is_not_repeated_past_the_budget():
    slow = {k: 1500.0 for k in MS}                          # 1.5 s a run
    timer = FakeTimer(slow)
    sel = SEL.Selector(timer, H100_SXM, autotune=True, budget_s=2.0).select(PAPER)
    assert all(r == 1 for _, r in timer.calls)              # nobody ran twice
    assert any("timed once" in c["status"] for c in sel.candidates)


def test_a_variable_length_shape_has_its_own_key_and_cublas_candidates():
    """Shape.varlen: a key of its own; candidates the cuBLAS schedules (varlen_schedules, a
    pre-transposed chunk-2 variant among them), whatever persistent family would fit the
    full batch; the heuristic takes the pre-transposed paper rung."""
    from dataclasses import replace

    from rnnrt.kernels.choice import candidates, heuristic, varlen_schedules
    from rnnrt.kernels.selector import Shape
    from rnnrt.kernels.limits import H100_SXM
    fixed = Shape("lstm", 2, 512, 512, 64, 100, True)
    var = replace(fixed, varlen=True)
    assert var.key() == fixed.key() + "|varlen"
    assert any(s.family for s in candidates(fixed, H100_SXM))
    assert candidates(var, H100_SXM) == varlen_schedules()
    assert not any(s.switches.persistent for s in varlen_schedules())
    assert heuristic(var, H100_SXM).switches.pretranspose
