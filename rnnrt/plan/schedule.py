"""Scheduling: a list of tasks (each a few ops on one stream, with the tasks it depends on and
a priority) -> the ops in host issue order, with an event Record / Wait for every dependency
that crosses streams. The builders (forward.py, backward.py) make the tasks; this turns any
task list into a plan's op sequence.
"""
from __future__ import annotations

import heapq
from collections import defaultdict
from dataclasses import dataclass

from .ops import Op, Record, Wait


@dataclass
class Task:
    """One schedulable unit: ``name`` (unique, e.g. ('cell', layer, t)), the ``stream`` its
    ``ops`` run on, the task names it depends on (``deps``) and its priority (``prio``, a
    tuple; smaller issues first among ready tasks)."""

    name: tuple
    stream: int
    deps: list
    prio: tuple
    ops: list


def schedule(tasks: list[Task]) -> tuple[tuple[Op, ...], int]:
    """Issue ``tasks`` in priority order as soon as their dependencies are issued.

    A dependency on another stream becomes Record(producer stream) + Wait(consumer stream);
    a dependency on the same stream is kept by stream order. Returns (ops, number of events).
    """
    by_name = {t.name: t for t in tasks}
    if len(by_name) != len(tasks):
        raise ValueError("schedule: duplicate task names")
    consumers = defaultdict(list)
    indeg = {}
    for t in tasks:
        for d in t.deps:
            if d not in by_name:
                raise ValueError(f"schedule: task {t.name} depends on unknown task {d}")
            consumers[d].append(t.name)
        indeg[t.name] = len(t.deps)
    needs_event = {t.name: any(by_name[c].stream != t.stream for c in consumers[t.name])
                   for t in tasks}
    heap = [(t.prio, i, t.name) for i, t in enumerate(tasks) if indeg[t.name] == 0]
    heapq.heapify(heap)
    order = {t.name: i for i, t in enumerate(tasks)}
    event_of: dict = {}
    waited: dict[int, set] = defaultdict(set)
    ops: list = []
    issued = 0
    while heap:
        _, _, name = heapq.heappop(heap)
        t = by_name[name]
        for d in t.deps:
            dt = by_name[d]
            if dt.stream != t.stream:
                e = event_of[d]
                if e not in waited[t.stream]:
                    ops.append(Wait(t.stream, e))
                    waited[t.stream].add(e)
        ops.extend(t.ops)
        if needs_event[name]:
            e = len(event_of)
            event_of[name] = e
            ops.append(Record(t.stream, e))
        issued += 1
        for c in consumers[name]:
            indeg[c] -= 1
            if indeg[c] == 0:
                ct = by_name[c]
                heapq.heappush(heap, (ct.prio, order[c], c))
    if issued != len(tasks):
        raise ValueError("schedule: dependency cycle")
    return tuple(ops), len(event_of)
