"""A first-use kernel compile says what it is doing and about how long it takes: one line
(from a timer, while NVRTC runs) for a compile that is still running after
ANNOUNCE_AFTER_S, nothing for a fast load from CuPy's disk cache, and a line after the fact
where the timer could not run. Through compile_module with a stand-in for CuPy whose compile
takes a while."""
from __future__ import annotations

import sys
import time

from rnnrt.kernels import library as L
from testkit import FakeCupy

TEXT = "x" * 47_000   # persistent.cu's size: about 9 s by the estimate


def test_a_slow_compile_says_what_and_how_long_once():
    said = []
    out = L.announced("persistent.cu", TEXT, lambda: time.sleep(0.4) or "module",
                      say=said.append, after_s=0.1)
    assert out == "module" and len(said) == 1
    assert said[0].startswith("compiling persistent.cu (47 kB of CUDA, NVRTC)")
    assert "about 9 s" in said[0] and "cached on disk" in said[0]


def test_a_fast_load_says_nothing():
    said = []
    assert L.announced("lstm.cu", TEXT, lambda: 7, say=said.append, after_s=0.5) == 7
    time.sleep(0.6)                       # the timer was cancelled: nothing comes later
    assert said == []


def test_a_compile_that_holds_the_interpreter_is_reported_after():
    said = []

    def busy():                           # the timer thread cannot print before this ends
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 0.3:
            pass

    sw = sys.getswitchinterval()
    sys.setswitchinterval(10.0)
    try:
        L.announced("stack.cu", TEXT, busy, say=said.append, after_s=0.05)
    finally:
        sys.setswitchinterval(sw)
    assert len(said) == 1 and "stack.cu" in said[0]
    assert said[0].startswith("compil")


def test_once_when_the_timer_and_the_end_meet():
    """The compile ends as the timer fires: the timer thread and the caller both want to
    say it, and exactly one does, every time."""
    runs = []
    for _ in range(300):
        said = []
        L.announced("gru.cu", TEXT, lambda: time.sleep(0.001), say=said.append,
                    after_s=0.001)
        runs.append(said)
    time.sleep(0.1)                       # any timer thread still running has said it by now
    assert [len(s) for s in runs] == [1] * len(runs)


def test_compile_module_announces_through_the_library(monkeypatch, capsys):
    fake = FakeCupy()

    class SlowModule(fake.RawModule):
        def compile(self):
            time.sleep(0.3)

    fake.RawModule = SlowModule
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(L, "ANNOUNCE_AFTER_S", 0.05)
    L.compile_module.cache_clear()
    try:
        L.KernelLibrary().get("lstm_fwd")
        L.KernelLibrary().get("lstm_fwd")          # compiled once a process: one line
    finally:
        L.compile_module.cache_clear()
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("[rnnrt] compiling lstm.cu"), err


def test_the_estimate_grows_with_the_source():
    assert L.compile_estimate_s("x") == 1.0
    assert L.compile_estimate_s("x" * 50_000) == 10.0


def test_compile_seconds_count_every_compile_fast_or_slow():
    """compile_seconds() grows by each compile's time (what the sweep leaves out of a point's
    time for its budget), a failed one too."""
    before = L.compile_seconds()
    L.announced("a.cu", TEXT, lambda: time.sleep(0.2), say=lambda _m: None, after_s=5.0)
    mid = L.compile_seconds()
    assert 0.2 <= mid - before < 2.0

    def fails():
        time.sleep(0.1)
        raise RuntimeError("nvrtc: error")

    try:
        L.announced("b.cu", TEXT, fails, say=lambda _m: None, after_s=5.0)
    except RuntimeError:
        pass
    assert 0.1 <= L.compile_seconds() - mid < 2.0
