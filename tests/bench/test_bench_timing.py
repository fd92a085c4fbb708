"""rnnrt/bench/timing.py's protocols on the CPU, CUDA events replaced by perf_counter stand-ins
(testkit.NumpyCupy for CuPy, a small stand-in for torch.cuda): time_in_turn runs the fns in
turn a round at a time after their warm-ups, makes each fn's events once, times what each
fn does (not its neighbour), and refuses a fn it has no events for; time_torch is its
one-fn case."""
from __future__ import annotations

import time
import types

import pytest
from testkit import NumpyCupy

from rnnrt.bench.timing import Timing, time_in_turn, time_torch


class _Event:
    made = 0

    def __init__(self, enable_timing=False):
        assert enable_timing, "a timing event must be asked for"
        type(self).made += 1
        self.t = None

    def record(self, stream=None):
        self.t = time.perf_counter()

    def synchronize(self):
        pass

    def elapsed_time(self, stop):
        return (stop.t - self.t) * 1e3


def fake_torch():
    _Event.made = 0
    syncs = []
    cuda = types.SimpleNamespace(Event=_Event, synchronize=lambda: syncs.append(1))
    return types.SimpleNamespace(cuda=cuda, syncs=syncs)


class CountingCupy(NumpyCupy):
    """NumpyCupy whose Event constructor counts."""

    def __init__(self):
        super().__init__()
        self.events = 0
        event = self.cuda.Event

        def counted(*a, **kw):
            self.events += 1
            return event(*a, **kw)

        self.cuda.Event = counted


def test_in_turn_after_the_warmups_events_made_once():
    cp, torch = CountingCupy(), fake_torch()
    calls = []
    stream = cp.cuda.get_current_stream()
    fns = {"a": (lambda: calls.append("a"), stream), "b": lambda: calls.append("b"),
           "c": (lambda: calls.append("c"), stream)}
    got = time_in_turn(fns, repeats=4, warmup=2, cp=cp, torch=torch)
    assert calls == ["a"] * 2 + ["b"] * 2 + ["c"] * 2 + ["a", "b", "c"] * 4
    assert set(got) == {"a", "b", "c"}
    assert all(isinstance(t, Timing) and t.runs == 4 and len(t.samples) == 4
               for t in got.values())
    assert cp.events == 4 and _Event.made == 2     # two a fn, before the rounds
    assert torch.syncs, "the warm-up's work must be waited for before the rounds"


def test_each_fn_is_timed_alone():
    """A slow fn beside a fast one: the slow one's runs are its own, the fast one's short
    (each run's events bracket that fn only)."""
    cp, torch = NumpyCupy(), fake_torch()
    stream = cp.cuda.get_current_stream()
    got = time_in_turn({"slow": (lambda: time.sleep(0.02), stream), "fast": lambda: None,
                        "slow_torch": lambda: time.sleep(0.02)}, repeats=3, warmup=0,
                       cp=cp, torch=torch)
    assert got["slow"].ms_min >= 19 and got["slow_torch"].ms_min >= 19
    assert got["fast"].ms_max < 10
    assert got["slow"].ms_min <= got["slow"].ms_median <= got["slow"].ms_max


def test_time_torch_is_the_one_fn_case():
    torch = fake_torch()
    n = []
    t = time_torch(torch, lambda: n.append(1), repeats=5, warmup=3)
    assert len(n) == 8 and t.runs == 5 and _Event.made == 2


def test_refuses_what_it_cannot_time_before_any_work():
    ran = []

    def work():
        ran.append(1)

    cases = [({"fns": {"ok": work, "a": (work, None)}, "torch": fake_torch()},
              ["fns['a']", "pass cp"]),
             ({"fns": {"ok": (work, None), "a": work}, "cp": NumpyCupy()},
              ["fns['a']", "pass torch"]),
             ({"fns": {"a": work}, "torch": fake_torch(), "repeats": 0}, ["repeats", ">= 1"])]
    for kw, words in cases:
        with pytest.raises(ValueError) as info:
            time_in_turn(**{"repeats": 2, **kw})
        assert all(w in str(info.value) for w in words), str(info.value)
    assert not ran, "work ran before the refusal"


def test_the_ladder_interleaves_a_rung_with_cudnn_through_time_in_turn():
    """ladder's --interleave: the rung and cuDNN one run each a round after their warm-ups,
    the rung's Timing returned, cuDNN's runs pooled into its row (add_samples)."""
    from rnnrt.bench import ladder
    cp, torch = NumpyCupy(), fake_torch()
    calls, pooled = [], []
    rr = types.SimpleNamespace(run=lambda: calls.append("rung"),
                               stream=cp.cuda.get_current_stream())
    bench = types.SimpleNamespace(run=lambda: calls.append("cudnn"), torch=torch,
                                  add_samples=pooled.append)
    cfg = types.SimpleNamespace(repeats=3, warmup=1)
    t = ladder._interleaved(cp, rr, bench, cfg)
    assert calls == ["rung", "cudnn"] + ["rung", "cudnn"] * 3
    assert isinstance(t, Timing) and t.runs == 3
    assert len(pooled) == 1 and len(pooled[0]) == 3
