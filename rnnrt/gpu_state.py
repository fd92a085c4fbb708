"""What a GpuRunner keeps between calls, bounded: ``RunState`` (one workspace and the executors
that run on it) and ``StateCache`` (the states by workspace key, within a byte budget, least
recently used first out). No CuPy here: the runner hands in the workspace and a function that
makes executors, so the bounds are tested on the CPU (tests/core/test_core_state_cache.py).
"""
from __future__ import annotations

import weakref
from collections import OrderedDict

DEFAULT_PLAN_BYTES = 2 << 30
"""Host bytes of plans (plan.cache.plan_bytes) a runner's cached states may hold through
their executors: a variable-length state of a long capacity holds up to MAX_EXECUTORS
plans, each O(steps) Python objects."""
MAX_EXECUTORS = 64
"""Executors (each a captured CUDA graph) one state keeps: a fixed batch needs a few
(forward; backward with and without accumulation, with and without dx); a state of
variable-length plans two a pattern of its capacity (plan/packing.py buckets random
batches into 16-31 patterns)."""


class RunState:
    """The workspace of one workspace key and the executors that run on it, built on first
    use and reused until evicted.

    ws: the Workspace (of the key's training plan, whose buffers hold the forward's too).
    make_executor: ``make_executor(plan, ws) -> executor`` for a plan whose buffers are the
    workspace's (``ws.sharing(plan)`` is handed in: the executor's bindings are its plan's).
    One key for a fixed batch; one for every pattern of a capacity for variable lengths
    (their plans have the same buffers), so a state holds up to ``max_executors`` of them,
    least recently used dropped first.

    Busy while the tape of its last training forward is alive (its activations are needed).
    ``zeroed``: inputs known to hold zeros (h0, c0, dh_n, dc_n: no plan writes them), so a
    call that passes None again skips the fill; ``rows``: the row map whose x padding (zero)
    and mask the workspace holds (variable lengths), so a repeated batch loads neither again.
    ``owner``: the runner that made it (None once that runner closed): a tape's backward
    runs only there.
    """

    def __init__(self, ws, make_executor, max_executors: int = MAX_EXECUTORS):
        self.ws = ws
        self._make = make_executor
        self._executors: OrderedDict = OrderedDict()
        self.max_executors = int(max_executors)
        self.generation = 0
        self._tape = None
        self.zeroed: set = set()
        self.rows = None
        self.owner = None

    def executor(self, plan, what):
        """The executor of ``plan`` on this workspace (``what`` tells passes apart: 'fwd',
        ('bwd', accumulate, need_dx)), made on first use."""
        return self.executor_of(plan.key, what, lambda: plan)

    def executor_of(self, key, what, make_plan):
        """``executor`` of the plan ``make_plan()`` of ``key`` (a PlanKey: its hash is
        cached), which is called only where no executor of (key, what) is kept: a call
        that finds its executor looks nothing else up (the plan caches may have dropped
        the plan meanwhile: the executor holds its own)."""
        k = (key, what)
        ex = self._executors.get(k)
        if ex is None:
            plan = make_plan()
            ex = self._make(plan, self.ws.sharing(plan))
            self._executors[k] = ex
            while len(self._executors) > self.max_executors:
                self._executors.popitem(last=False)
        else:
            self._executors.move_to_end(k)
        return ex

    def __len__(self) -> int:
        return len(self._executors)

    @property
    def busy(self) -> bool:
        return self._tape is not None and self._tape() is not None

    def hold(self, tape) -> None:
        self._tape = weakref.ref(tape)

    @property
    def plan_bytes(self) -> int:
        """Host bytes of the plans its executors hold (plan.cache.plan_bytes each)."""
        from .plan.cache import plan_bytes
        return sum(plan_bytes(ex.prepared.plan) for ex in self._executors.values())

    def arrays(self) -> list:
        """The workspace's arrays, less params and grads (shared with the runner)."""
        return [b for name, b in self.ws.bufs.items() if name not in ("params", "grads")]

    @property
    def nbytes(self) -> int:
        """Device bytes the workspace holds (its buffers; params and grads are shared)."""
        return sum(int(b.nbytes) for b in self.arrays())


class StateCache:
    """The runner's states by workspace key, bounded: at most ``budget`` bytes of workspaces
    and ``plan_budget`` host bytes of the plans their executors hold; adding past either
    evicts the least recently used states (never the newest, nor a busy one: a live tape
    needs it) and returns their memory to CuPy's pool (``free``), so a loop over many
    lengths does not grow."""

    def __init__(self, budget: int, free=None, plan_budget: int = DEFAULT_PLAN_BYTES):
        self.budget, self.free = int(budget), free
        self.plan_budget = int(plan_budget)
        self._states = OrderedDict()
        self.evictions = 0

    def get(self, key):
        st = self._states.get(key)
        if st is not None:
            self._states.move_to_end(key)
        return st

    def add(self, key, st) -> None:
        self._states[key] = st
        self._states.move_to_end(key)
        evicted = False
        for old in list(self._states):
            if self.nbytes <= self.budget and self.plan_bytes <= self.plan_budget:
                break
            if old == key or self._states[old].busy:
                continue   # the newest, and states whose activations a tape still needs
            del self._states[old]
            self.evictions += 1
            evicted = True
        if evicted and self.free is not None:
            self.free()

    @property
    def nbytes(self) -> int:
        return sum(st.nbytes for st in self._states.values())

    @property
    def plan_bytes(self) -> int:
        """Host bytes of the plans the states' executors hold."""
        return sum(st.plan_bytes for st in self._states.values())

    def __contains__(self, key) -> bool:
        return key in self._states

    def holds(self, st) -> bool:
        """Whether ``st`` (a state, not a key) is one of this cache's."""
        return any(s is st for s in self._states.values())

    def drop_idle(self) -> int:
        """Evict every state no live tape needs (to make room for a large one); -> how many."""
        idle = [k for k, st in self._states.items() if not st.busy]
        for k in idle:
            del self._states[k]
        self.evictions += len(idle)
        if idle and self.free is not None:
            self.free()
        return len(idle)

    def __len__(self) -> int:
        return len(self._states)

    def __iter__(self):
        """The states, least recently used first."""
        return iter(list(self._states.values()))

    def clear(self) -> None:
        self._states.clear()
