"""Static race check of a plan: every pair of ops on different streams that touch
overlapping memory, at least one of them writing, must be ordered by events.

Ordering is CUDA's: ops on one stream run in issue order; Wait(e) on stream s orders
everything after it on s after everything before Record(e) on its stream. We compute a
vector clock per op (one entry per stream) in issue order; op A happens before op B iff
B's clock has seen A's position on A's stream.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from ..plan.ops import Record, Wait


@dataclass(frozen=True)
class Race:
    """Two unordered ops (indices into plan.ops) touching the same elements of ``buf``."""

    first: int
    second: int
    buf: str
    kind: str   # 'write-write' or 'read-write'

    def describe(self, plan) -> str:
        a, b = plan.ops[self.first], plan.ops[self.second]
        return (f"{self.kind} race on {self.buf!r}: op {self.first} (stream {a.stream}, "
                f"{getattr(a, 'name', a.kind)} L{getattr(a, 'layer', '?')} "
                f"t{getattr(a, 'steps', '?')}) vs op {self.second} (stream {b.stream}, "
                f"{getattr(b, 'name', b.kind)} L{getattr(b, 'layer', '?')} "
                f"t{getattr(b, 'steps', '?')})")


def vector_clocks(plan):
    """Per op: (stream, position on that stream (1-based), clock tuple)."""
    ns = len(plan.streams)
    clock = [[0] * ns for _ in range(ns)]
    event_clock = {}
    out = []
    for op in plan.ops:
        s = op.stream
        if isinstance(op, Wait):
            ec = event_clock[op.event]
            clock[s] = [max(a, b) for a, b in zip(clock[s], ec)]
        clock[s][s] += 1
        if isinstance(op, Record):
            event_clock[op.event] = list(clock[s])
        out.append((s, clock[s][s], tuple(clock[s])))
    return out


def _overlap(va, vb) -> bool:
    """Do two views of the same buffer share an element? (The caller matches buffers.)"""
    if va.offset >= vb.end or vb.offset >= va.end:
        return False
    ia, ib = va.row_intervals(), vb.row_intervals()
    j = 0
    ib = sorted(ib)
    for a0, a1 in sorted(ia):
        while j < len(ib) and ib[j][1] <= a0:
            j += 1
        k = j
        while k < len(ib) and ib[k][0] < a1:
            if ib[k][1] > a0:
                return True
            k += 1
    return False


def find_races(plan, limit: int = 20) -> list[Race]:
    """Return up to ``limit`` races of ``plan`` (an empty list means race-free)."""
    vc = vector_clocks(plan)

    def ordered(i, j):  # i issued before j: does i happen before j?
        si, pi, _ = vc[i]
        return vc[j][2][si] >= pi

    accesses = defaultdict(list)   # buf -> [(op index, view, is_write)]
    for i, op in enumerate(plan.ops):
        for v in op.writes:
            accesses[v.buf].append((i, v, True))
        for v in op.reads:
            accesses[v.buf].append((i, v, False))
    races = []
    for buf, acc in accesses.items():
        writes = [a for a in acc if a[2]]
        if not writes:
            continue
        for wi, wv, _ in writes:
            for oi, ov, ow in acc:
                if oi == wi or (ow and oi < wi):   # each write-write pair once
                    continue
                if plan.ops[oi].stream == plan.ops[wi].stream:
                    continue
                first, second = (wi, oi) if wi < oi else (oi, wi)
                if ordered(first, second) or not _overlap(wv, ov):
                    continue
                races.append(Race(first, second, buf, "write-write" if ow else "read-write"))
                if len(races) >= limit:
                    return races
    return races
