"""exec/lt_gemms.py's logic on the CPU, cuBLASLt faked: a problem's options are timed once and
remembered; cublasSgemm's own kernel is kept unless an algorithm wins (the chooser's rule);
the winner is prepared on the op's own pointers, stream and workspace; no memory to time the
options declines (cublasSgemm) and says so; the operands' alignments are part of the problem."""
from __future__ import annotations

import pytest

from rnnrt.exec import lt_gemms as LT


class FakeHandle:
    lib = None
    handle = None

    def close(self):
        pass


class FakeAlgo:
    def __init__(self, name):
        self.name, self.struct, self.workspace = name, name.encode(), 0

    def describe(self):
        return self.name


class FakeProblem:
    """Records the problems made (their ids and arguments) and those freed (their ids)."""

    made, args, closed = [], [], []

    def __init__(self, handle, M, N, K, ta, tb, a_ld, b_ld, out_ld, aligns):
        FakeProblem.made.append(id(self))
        FakeProblem.args.append((M, N, K, ta, tb, a_ld, b_ld, out_ld, aligns))

    def algos(self, n, ws):
        return [FakeAlgo("x"), FakeAlgo("y")]

    def prepare(self, algo, *ptrs):
        return ("call", algo.name, ptrs)

    def __del__(self):   # the real one frees its descriptors when the last user lets go
        FakeProblem.closed.append(id(self))


@pytest.fixture
def lt(monkeypatch):
    FakeProblem.made, FakeProblem.args, FakeProblem.closed = [], [], []
    monkeypatch.setattr(LT, "LtHandle", FakeHandle)
    monkeypatch.setattr(LT, "LtProblem", FakeProblem)

    def make(ms=None, oom=False):
        calls = []

        def timer(problem, lp, options):
            if oom:
                raise MemoryError("out of memory allocating scratch")
            return lambda i: calls.append(i) or ms[i]
        return LT.LtGemms(None, 1 << 20, timer=timer), calls
    return make


ARGS = dict(M=64, N=32, K=16, trans_a=False, trans_b=True, out_ptr=0x2000, out_ld=64,
            a_ptr=0x1000, a_ld=16, b_ptr=0x3000, b_ld=16, alpha=1.0, beta=0.0,
            stream_ptr=0x77, workspace_ptr=0x9000, copies=4)


def test_the_default_is_kept_and_the_choice_remembered(lt):
    g, calls = lt([1.0, 1.5, 0.995])
    call, choice = g.prepare(**ARGS)
    assert call is None and choice.index == 0 and choice.label == "cublasSgemm"
    assert calls == [0, 1, 2] and FakeProblem.closed == FakeProblem.made   # nothing kept
    call, again = g.prepare(**ARGS)
    assert again is choice and calls == [0, 1, 2]     # not timed again


def test_a_winner_runs_on_the_ops_own_pointers(lt):
    g, calls = lt([1.0, 0.5, 0.8])
    call, choice = g.prepare(**ARGS)
    assert choice.label == "x" and choice.index == 1
    tag, algo, ptrs = call
    assert (tag, algo) == ("call", "x")
    # out, a, b, alpha, beta, workspace, its bytes, stream
    assert ptrs == (0x2000, 0x1000, 0x3000, 1.0, 0.0, 0x9000, 1 << 20, 0x77)
    assert FakeProblem.args[0][-1] == (256, 256, 256)
    assert [r["algo"] for r in g.chooser.summary()] == ["x"]
    # another op of the same problem: its own pointers on the problem's one set of descriptors
    call2, again = g.prepare(**{**ARGS, "out_ptr": 0x5000, "stream_ptr": 0x78})
    assert again is choice and call2[2][0] == 0x5000 and call2[2][-1] == 0x78
    assert len(FakeProblem.made) == 1 and calls == [0, 1, 2]


def test_no_memory_to_time_declines_and_says_so(lt):
    g, _ = lt(oom=True)
    call, choice = g.prepare(**ARGS)
    assert call is None and choice.index == 0 and choice.label.startswith("declined: no memory")
    assert len(g.chooser) == 0            # not remembered: memory may be free next time


def test_alignments_and_copies_are_part_of_the_problem(lt):
    g, calls = lt([1.0, 2.0, 2.0])
    g.prepare(**ARGS)
    g.prepare(**{**ARGS, "a_ptr": 0x1004})          # 4-byte aligned a: another problem
    g.prepare(**{**ARGS, "copies": 9})              # capped at MAX_COPIES (4): the same
    assert len(g.chooser) == 2 and calls == [0, 1, 2, 0, 1, 2]
    assert FakeProblem.args[1][-1] == (4, 256, 256)
