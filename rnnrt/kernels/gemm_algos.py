"""Which algorithm runs a GEMM of a plan whose key asks for chosen GEMM algorithms
(PlanKey.gemm 'lt', the selector's '+lt' schedules): cublasSgemm's own choice, or one of the
algorithms cuBLASLt's heuristic offers for the same fp32 problem, whichever runs it fastest
beside ``copies`` copies of itself (the wavefront runs the layers' GEMMs at once; a kernel that
is best alone is often not best there: experiments/scripts/gemm_algos_bench.py).

Every option is the same fp32 arithmetic (FMA kernels, fp32 accumulation; a split-K algorithm
sums K in slices, as cuBLAS's own choice may): the choice changes the schedule of the sums, not
their precision, and the plan's results are checked against the float64 reference either way.

``GemmAlgoChooser.choose(problem, options, time_fn)`` times each option once per problem
(``time_fn(i) -> ms``, the GPU's in exec/lt_gemms.py, tests pass a fake) and keeps the fastest,
the default (option 0) unless another is at least MIN_GAIN faster (noise does not flip it);
choices are remembered per problem, the least recently used evicted past ``max_entries``.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

MAX_ENTRIES = 512
"""Problems a chooser remembers (a runner's plans have a handful each)."""
MIN_GAIN = 0.02
"""An algorithm replaces cublasSgemm's choice only when at least this much faster."""
OPTIONS = 8
"""cuBLASLt algorithms timed per problem (the heuristic's first ones) besides the default."""
MAX_COPIES = 4


@dataclass(frozen=True)
class GemmProblem:
    """What a choice is keyed on: the row-major problem out[N, M] = op(a) @ op(b) (op(a)
    [N, K]), its leading dimensions, the operands' address alignments (bytes: a, b, out),
    whether it reads out (beta != 0), and how many copies run at once when it is timed."""

    M: int
    N: int
    K: int
    trans_a: bool
    trans_b: bool
    a_ld: int
    b_ld: int
    out_ld: int
    aligns: tuple = (256, 256, 256)
    accumulate: bool = False
    copies: int = 1

    def flops(self) -> int:
        return 2 * self.M * self.N * self.K


@dataclass
class AlgoChoice:
    """The option chosen for a problem (0: cublasSgemm's own), its label, and every option's
    median ms (None: it failed, with why in ``failed``)."""

    index: int
    label: str
    ms: list = field(default_factory=list)
    failed: dict = field(default_factory=dict)
    payload: object = None    # what the caller needs to run the chosen option (opaque here)

    def gain(self) -> float:
        """The default's time over the chosen one's (1.0: the default kept)."""
        return self.ms[0] / self.ms[self.index] if self.ms and self.ms[self.index] else 1.0


class GemmAlgoChooser:
    """Chooses and remembers the algorithm of each GEMM problem (module docstring)."""

    def __init__(self, max_entries: int = MAX_ENTRIES, min_gain: float = MIN_GAIN, pick=None):
        """pick: ``pick(ms) -> index`` instead of the rule (ms: each option's median, None
        for one that failed): the GPU tests force a cuBLASLt algorithm with it, so its path
        runs whatever the timings say."""
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise ValueError(f"max_entries: expected an int >= 1, got {max_entries!r}")
        self.max_entries, self.min_gain = max_entries, float(min_gain)
        self.pick = pick
        self._memory: OrderedDict[GemmProblem, AlgoChoice] = OrderedDict()

    def __len__(self) -> int:
        return len(self._memory)

    def known(self, problem: GemmProblem) -> AlgoChoice | None:
        """The remembered choice of ``problem`` (None: not chosen yet, or evicted)."""
        c = self._memory.get(problem)
        if c is not None:
            self._memory.move_to_end(problem)
        return c

    def choose(self, problem: GemmProblem, labels, time_fn, payloads=None) -> AlgoChoice:
        """The option of ``problem`` among ``labels`` (labels[0]: the default), timing each
        with ``time_fn(i) -> ms`` the first time; an option that raises is out (the default's
        failure propagates: nothing could run the problem). ``payloads[i]``: kept with the
        choice of option i (what runs it)."""
        c = self.known(problem)
        if c is not None:
            return c
        labels = list(labels)
        if not labels:
            raise ValueError("choose: no options (labels[0] must be the default)")
        ms, failed = [], {}
        for i in range(len(labels)):
            try:
                t = float(time_fn(i))
            except Exception as e:  # noqa: BLE001 - an algorithm that cannot run loses
                if i == 0:
                    raise
                failed[i] = f"{type(e).__name__}: {e}"
                ms.append(None)
                continue
            ms.append(t)
        best = 0
        for i, t in enumerate(ms):
            if t is not None and t * (1.0 + self.min_gain) <= ms[0] and t < ms[best]:
                best = i
        if self.pick is not None:
            best = int(self.pick(list(ms)))
            if not 0 <= best < len(ms) or ms[best] is None:
                raise ValueError(f"pick: chose option {best} of {len(ms)} (ms {ms})")
        c = AlgoChoice(best, labels[best], ms, failed,
                       None if payloads is None else list(payloads)[best])
        self._memory[problem] = c
        while len(self._memory) > self.max_entries:   # bounded: least recently used first
            self._memory.popitem(last=False)
        return c

    def summary(self) -> list[dict]:
        """Every remembered choice, for records: the problem, the label, the gain."""
        return [{"M": p.M, "N": p.N, "K": p.K, "trans_a": p.trans_a, "trans_b": p.trans_b,
                 "copies": p.copies, "algo": c.label, "x_default": round(c.gain(), 3)}
                for p, c in self._memory.items()]
