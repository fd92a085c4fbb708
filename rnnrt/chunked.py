"""Long sequences on a GpuRunner: a fixed-length sequence longer than a chunk runs as a series
of chunk plans with the state carried, so plan time, capture time and graph memory stay
bounded in T, and inference keeps only one chunk's pre-activations alive.

The chunk length (``ChunkedRunner.length``): the largest power of two from MIN_CHUNK_STEPS
to MAX_CHUNK_STEPS whose chunk workspace (every buffer that grows with the steps, of the
largest of the shape's candidate schedules) fits ``RNNRT_CHUNK_BYTES`` (default
DEFAULT_CHUNK_BYTES) — or ``RNNRT_CHUNK_STEPS`` steps where set (0: never chunk). A sequence
of at most one chunk runs unchunked, as before (its own exact-length plan). A longer one is
cut into full chunks and its remainder into powers of two (``pieces``: 10,000 steps in
chunks of 128 = 78 x 128 + 16), so every plan a runner builds for fixed lengths has a
power-of-two length of at most a chunk: nothing pads (a T = 10,000 run is not a 16,384 one),
the selector tunes each piece on its own key (a power of two is its own steps bucket), and
a handful of plans and graphs per batch serve every length.

Forward: piece after piece, each piece's plan captured once and replayed; h_n / c_n of a
piece are the next one's h0 / c0; y is written piece by piece into one [T, B, H] array, and
x is copied in a piece at a time (a host x never goes to the device whole).
Training: each piece runs on a state of its own whose workspace keeps only what the backward
reads from the forward and what grows with the steps (the activations: h, c, the saved
gates, x; ``kept_buffers``); every other buffer (W.x pre-activations, the backward's
gradients, scratch) is shared by the states of one key. Backward runs the pieces last-first
with dh / dc carried, each piece's weight gradients added to the previous ones'
(backward plans with accumulate; the last piece, run first, takes the caller's accumulate).
The chunk states of the last training pass stay cached (their graphs are bound to their
buffers: a training loop's next step reuses them); a pass drops the idle ones it does not
take, and a workspace that does not fit drops them all (``drop_idle``) before it is refused.

Packed sequences of different lengths (``forward_packed``) are not chunked: they run their
bucketed or exact pattern unchunked, whatever their length.
"""
from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, replace
from functools import partial

MAX_CHUNK_STEPS = 1024
"""The longest chunk: longer ones gain nothing (per-chunk host work is ~0.1 ms against
milliseconds of GPU work) and cost plan time."""
MIN_CHUNK_STEPS = 16
"""The shortest chunk the byte rule picks (RNNRT_CHUNK_STEPS may force less)."""
DEFAULT_CHUNK_BYTES = 1 << 30
"""Bytes a chunk's step-dependent workspace may take (RNNRT_CHUNK_BYTES overrides)."""


def pieces(steps: int, chunk: int) -> list[tuple[int, int]]:
    """(first step, steps) of each piece of a ``steps``-long sequence in chunks of ``chunk``:
    the full chunks, then the remainder in powers of two, largest first."""
    out = [(t0, chunk) for t0 in range(0, steps - steps % chunk, chunk)]
    t0, rest = steps - steps % chunk, steps % chunk
    while rest:
        n = 1 << (rest.bit_length() - 1)
        out.append((t0, n))
        t0, rest = t0 + n, rest - n
    return out


def _env_int(name: str) -> int | None:
    v = os.environ.get(name)
    if v is None or v.strip() == "":
        return None
    try:
        n = int(v)
    except ValueError:
        raise ValueError(f"{name}: expected an int >= 0, got {v!r}") from None
    if n < 0:
        raise ValueError(f"{name}: expected an int >= 0, got {v!r}")
    return n


def growth(key) -> dict:
    """{buffer name: bytes per step} of the buffers of ``key``'s workspace that grow with
    its steps (the workspace is affine in the steps: two sizes give each slope)."""
    from .plan.backward import workspace_buffers
    s = key.steps
    now = {b.name: b.size * b.itemsize(key.dtype) for b in workspace_buffers(key)}
    twice = workspace_buffers(replace(key, steps=2 * s))
    out = {}
    for b in twice:
        more = b.size * b.itemsize(key.dtype) - now.get(b.name, 0)
        if more > 0:
            out[b.name] = more // s
    return out


def step_bytes(key) -> int:
    """Bytes of ``key``'s workspace that grow with its steps, per step."""
    return sum(growth(key).values())


def kept_buffers(fwd, bwd, grows) -> frozenset:
    """Buffers a training chunk keeps for its backward: those the backward plan ``bwd``
    reads that the forward plan ``fwd`` writes or takes as input, among ``grows`` (the
    buffers whose size grows with the steps: what does not — transposed weights, barrier
    counters — holds the same for every chunk), less those ``bwd`` remakes before it reads
    them (a recompute key's gates, plan/recompute.py: shared like the pre-activations)."""
    from .plan.recompute import recomputed
    made = {v.buf for op in fwd.ops for v in op.writes}
    made |= {v.buf for b in fwd.inputs.values() for v in b.views}
    read = {v.buf for op in bwd.ops for v in op.reads}
    return frozenset(made & read & set(grows)) - recomputed(bwd)


@dataclass(eq=False)
class ChunkedTape:
    """What ``GpuRunner.backward`` needs from a chunked training forward: each piece's key,
    state and the state's generation at the forward."""

    pieces: list
    keys: list
    states: list
    generations: list
    batch_first: bool
    steps: int
    batch: int
    device: int = -1


class ChunkedRunner:
    """The long-sequence passes of one GpuRunner (``runner.long``): its chunk lengths and
    its training chunk states (a list per chunk key)."""

    def __init__(self, runner):
        self.runner = runner
        self._lengths = {}    # (batch, train) -> chunk steps (a few batches: bounded below)
        self._states = {}     # chunk PlanKey -> [RunState] (training)
        self._kept = {}       # chunk PlanKey -> kept_buffers

    # -- the chunk length ---------------------------------------------------------------
    def length(self, batch: int, train: bool) -> int:
        """The chunk steps of (batch, train) (module docstring: the rule); 0: never chunk."""
        forced = _env_int("RNNRT_CHUNK_STEPS")
        if forced is not None:
            return forced
        k = (int(batch), bool(train))
        if k not in self._lengths:
            budget = _env_int("RNNRT_CHUNK_BYTES")
            budget = DEFAULT_CHUNK_BYTES if budget is None else budget
            per_step = max(step_bytes(key) for key in self._candidate_keys(batch, train))
            n = MAX_CHUNK_STEPS
            while n > MIN_CHUNK_STEPS and n * per_step > budget:
                n //= 2
            if len(self._lengths) >= 64:
                self._lengths.clear()
            self._lengths[k] = n
        return self._lengths[k]

    def _candidate_keys(self, batch, train):
        """The PlanKeys at MAX_CHUNK_STEPS of every schedule the runner may choose."""
        from .kernels.choice import candidates
        r = self.runner
        if r.switches == "auto":
            shape = r.selector_shape(MAX_CHUNK_STEPS, batch, train)
            scheds = [(s.switches, s.family, s.backward, s.clusters)
                      for s in candidates(shape, r.limits)]
        else:
            scheds = [(r.switches, None, None, None)]
        return [r.new_key(MAX_CHUNK_STEPS, batch, train, sw, fam, bwd, clusters=n, chunk=True)
                for sw, fam, bwd, n in scheds]

    def pieces(self, steps: int, batch: int, train: bool):
        """The pieces of a fixed-length call, or None where it runs unchunked."""
        n = self.length(batch, train)
        return pieces(steps, n) if 0 < n < steps else None

    # -- states ---------------------------------------------------------------------------
    def _train_states(self, keys) -> list:
        """A free training state for each of ``keys`` (the pieces' chunk keys, in order),
        made where a key has too few: the first of a key allocates its whole workspace, the
        others only the kept buffers over the first's shared ones."""
        from .gpu_state import RunState
        from .plan.backward import backward_plan, workspace_buffers
        from .plan.forward import forward_plan
        from .sizes import gpu_available, refuse_if
        r = self.runner
        new = Counter(keys)   # states each key takes
        # idle states past what this pass takes go (of any key): what stays cached between
        # passes is the last pass's, reused (graphs and all) by a training loop's next step
        self._drop_idle(new)
        need = 0
        if len(self._kept) > 256:   # keys of many batches seen: start again
            self._kept.clear()
        for key in new:
            if key not in self._kept:
                self._kept[key] = kept_buffers(forward_plan(key), backward_plan(key),
                                               growth(key))
        for key, count in new.items():
            have = self._states.get(key, [])
            free = sum(not st.busy for st in have)
            missing = max(0, count - free)
            if missing:
                sizes = {b.name: b.size * b.itemsize(key.dtype) for b in workspace_buffers(key)}
                need += missing * sum(sizes[n] for n in self._kept[key])
                if not have:
                    need += sum(sizes.values())
        if need:   # before any allocation: all the kept activations must fit
            refuse_if(need, gpu_available(r.cp),
                      f"the activations of a chunked training pass ({len(keys)} chunks, "
                      f"batch {keys[0].batch})", "GPU memory")
        free = {key: iter([st for st in self._states.get(key, []) if not st.busy])
                for key in new}
        out = []
        for key in keys:
            have = self._states.setdefault(key, [])
            st = next(free[key], None)
            if st is None:
                if have:
                    ws = have[0].ws.with_own(self._kept[key])
                else:
                    ws = r.session.workspace(backward_plan(key), r.params, grads=r.grads)
                st = RunState(ws, partial(r.session.executor, r.executor_name))
                st.owner = r
                have.append(st)
            out.append(st)
        return out

    def drop_idle(self) -> int:
        """Drop every training chunk state no live tape holds (to make room); -> how many."""
        return self._drop_idle({})

    def states(self) -> list:
        """Every training chunk state kept (busy or idle)."""
        return [st for sts in self._states.values() for st in sts]

    def _drop_idle(self, take: dict) -> int:
        """Drop the idle training states of each key past ``take[key]`` (0 where absent),
        memory handed back to CuPy's pool; -> how many went."""
        n = 0
        for k in list(self._states):
            idle = [st for st in self._states[k] if not st.busy]
            keep = [st for st in self._states[k] if st.busy] + idle[:take.get(k, 0)]
            n += len(self._states[k]) - len(keep)
            self._states[k] = keep
            if not keep:
                del self._states[k]
        if n:
            self.runner.cp.get_default_memory_pool().free_all_blocks()
        return n

    def clear(self):
        for sts in self._states.values():
            for st in sts:
                st.owner = None
        self._states.clear()

    # -- passes -----------------------------------------------------------------------------
    def forward(self, x, h0, c0, train: bool, parts):
        """The chunked forward of x [T, B, I] (time-major), h0 / c0 [L, B, H] or None, in
        the pieces ``parts``. -> (y [T, B, H], h_n, c_n, tape or None)."""
        from .plan.forward import forward_plan
        from .sizes import gpu_available, refuse_if
        r, m = self.runner, self.runner.model
        cp = r.cp
        T, B = int(x.shape[0]), int(x.shape[1])
        refuse_if(T * B * m.hidden_size * 4, gpu_available(cp),
                  f"y of {T} steps x batch {B} x hidden {m.hidden_size}", "GPU memory")
        # a key, plan maker (and inference state) per piece length, not per piece: the
        # pieces are a handful of lengths (the chunk, the remainder's powers of two)
        by_n = {n: r.plan_key(n, B, train, chunk=True) for n in {n for _, n in parts}}
        keys = [by_n[n] for _, n in parts]
        plans = {k: partial(forward_plan, k) for k in by_n.values()}
        if train:
            states = self._train_states(keys)
        else:   # no tape holds an inference state: every piece of a key runs on one
            one = {k: r.state(k) for k in by_n.values()}
            states = [one[k] for k in keys]
        has_c = m.cell.has_cell_state
        y = cp.full((T, B, m.hidden_size), float("nan"), dtype=cp.float32)
        h, c = h0, c0
        with _Chain(cp) as chain:
            for (t0, n), key, st in zip(parts, keys, states):
                ex = st.executor_of(key, "fwd", plans[key])
                ws = ex.prepared.ws
                with chain.on(ex.stream):
                    ws.load(x=x[t0:t0 + n], h0=h)
                    if has_c:
                        ws.load(c0=c)
                    ex.run()
                    y[t0:t0 + n] = ws.read("y", copy=False)
                    h = ws.read("h_n")
                    c = ws.read("c_n") if has_c else None
        tape = None
        if train:
            gens = []
            tape = ChunkedTape(list(parts), keys, states, gens, False, T, B, r.device_id)
            for st in states:
                st.generation += 1
                gens.append(st.generation)
                st.hold(tape)
        return y, h, c, tape

    def backward(self, tape: ChunkedTape, dy, dh_n, dc_n, accumulate: bool, need_dx: bool):
        """Backward of a chunked tape: the pieces last-first, dh / dc carried, the weight
        gradients of each piece added to the later pieces'. dy [T, B, H] (time-major) or
        None (zeros). -> (dx [T, B, I] or None, dh0, dc0 or None)."""
        from .plan.backward import backward_plan
        r, m = self.runner, self.runner.model
        cp = r.cp
        for st, gen in zip(tape.states, tape.generations):
            if st.owner is not r:
                raise ValueError("tape: it is not one of this runner's (a tape of another "
                                 "runner, or of one that was closed); run backward on the "
                                 "runner whose forward made it")
            if st.generation != gen:
                raise ValueError("tape: stale — a later training forward overwrote its "
                                 "activations; run forward again")
        has_c = m.cell.has_cell_state
        dx = (cp.full((tape.steps, tape.batch, m.input_size), float("nan"), dtype=cp.float32)
              if need_dx else None)
        dh, dc = dh_n, dc_n
        last = len(tape.pieces) - 1
        plans = {(k, acc): partial(backward_plan, k, acc, need_dx)
                 for k in set(tape.keys) for acc in {accumulate, True}}
        with _Chain(cp) as chain:
            for i in range(last, -1, -1):
                (t0, n), key, st = tape.pieces[i], tape.keys[i], tape.states[i]
                acc = accumulate if i == last else True
                ex = st.executor_of(key, ("bwd", acc, need_dx), plans[key, acc])
                ws = ex.prepared.ws
                with chain.on(ex.stream):
                    ws.load(dy=None if dy is None else dy[t0:t0 + n], dh_n=dh)
                    if has_c:
                        ws.load(dc_n=dc)
                    ex.run()
                    if need_dx:
                        dx[t0:t0 + n] = ws.read("dx", copy=False)
                    dh = ws.read("dh0")
                    dc = ws.read("dc0") if has_c else None
        return dx, dh, dc


class _Chain:
    """Orders the pieces' work across their executors' streams: the first after the caller's
    prior work, each after the previous one's, the caller's later work after the last (an
    event recorded where the stream changes; no host wait). One event serves the whole
    chain: a stream's wait takes the event's record at the time of the wait, so recording
    it again for the next piece does not touch the earlier waits."""

    def __init__(self, cp):
        self.prev = cp.cuda.get_current_stream()
        self.caller = self.prev
        self.event = cp.cuda.Event(disable_timing=True)

    def __enter__(self):
        return self

    def _follow(self, stream, after):
        if stream is not after:
            self.event.record(after)
            stream.wait_event(self.event)

    def on(self, stream):
        self._follow(stream, self.prev)
        self.prev = stream
        return stream

    def __exit__(self, *exc):
        self._follow(self.caller, self.prev)
        return False
