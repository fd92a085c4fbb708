"""The paper's optimizations as switches, the one ordered ladder, and the rules on combinations.

Every table, test, benchmark and plot derives from ``Switches`` and ``ladder()`` here.
A switch changes the schedule (which ops, on which stream, after which event), never the
math: every combination computes the same function as the NumPy reference.

Switches (Appleyard, Kocisky, Blunsom 2016; the numbers are the paper's optimizations, in its
order, as docs/paper.md lists them):
  grouped       2. the G gate matrices that share an input are one GEMM (G times as tall)
  streams       3. W.x on an input stream, R.h on a recurrence stream, joined by events
  fused         4. one pointwise kernel per cell step instead of one per elementary op
  pretranspose  5. W and R transposed once per pass (inside the pass), GEMMs read them N-N
  input_batch   6. W.x for k steps as one GEMM: 1 = off, an int k > 1, or 'all' (= T steps)
  wavefront     7. layers overlap along anti-diagonals of the (layer, step) grid, each layer
                   on its own streams; off: layer l+1 starts after layer l has finished
  persistent    beyond the paper (its future work): each layer's recurrence runs in a
                   persistent kernel (cuda_src/persistent*.cu) that keeps R on chip across
                   steps: one launch for all T steps, one per input chunk where layers can
                   overlap, or one for the whole stack (kernels/choice.py decides); W.x
                   stays cuBLAS GEMMs as the other switches say, except in the stack kernel.
                   Where the layer does not fit the device, the plan falls back to the other
                   switches' schedule and says so (Plan.fallback)

Rules (the only combinations rejected; everything else works):
  - wavefront needs streams: the wavefront is concurrency between layers' streams, and
    "streams off" means one stream for everything, so there is nothing to overlap.
  - persistent needs fused: the persistent kernel is a fused pointwise kernel too (it does
    the fused kernels' arithmetic in their order), and its fallback must be the fused
    schedule so that a declined shape still computes with the same kernels' math.
  - input_batch is an int >= 1 or the string 'all'.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, fields, replace

ALL = "all"

# Steps per input GEMM for the ladder's input-batching rung when none is given.
# 'all' makes one W.x GEMM per layer, which serialises layers under the wavefront (layer l+1's
# single input GEMM needs all of layer l); a chunk lets layer l+1 start after k steps of
# layer l. 10 is the chunk of the project's first cuBLAS calibration on the H100 (4.7 ms at
# the paper's shape with graphs; docs/journal.md, first session); the ladder's --input-batch
# flag and the sweep vary it.
DEFAULT_INPUT_BATCH = 10


@dataclass(frozen=True)
class Switches:
    """One configuration of the paper's optimizations. Frozen and hashable (plans cache on it)."""

    grouped: bool = False
    streams: bool = False
    fused: bool = False
    pretranspose: bool = False
    input_batch: int | str = 1
    wavefront: bool = False
    persistent: bool = False

    def __post_init__(self):
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "input_batch":
                continue
            if not isinstance(v, bool):
                raise TypeError(f"Switches.{f.name}: expected a bool, got {v!r}")
        ib = self.input_batch
        if ib != ALL and (isinstance(ib, bool) or not isinstance(ib, int) or ib < 1):
            raise ValueError(
                f"Switches.input_batch: expected an int >= 1 (1 = off) or {ALL!r}, got {ib!r}")
        if self.wavefront and not self.streams:
            raise ValueError(
                "Switches: wavefront=True needs streams=True (the wavefront overlaps layers on "
                "their own streams; with streams off everything runs on one stream)")
        if self.persistent and not self.fused:
            raise ValueError(
                "Switches: persistent=True needs fused=True (the persistent kernel does the "
                "fused kernels' pointwise math, and a shape it declines falls back to the "
                "fused schedule)")

    def steps_per_input_gemm(self, steps: int) -> int:
        """How many timesteps one W.x GEMM covers for a sequence of ``steps``."""
        if self.input_batch == ALL:
            return steps
        return min(int(self.input_batch), steps)

    def label(self) -> str:
        """Short human label, e.g. 'grouped+streams+fused+ib10'."""
        parts = [f.name for f in fields(self)
                 if f.name != "input_batch" and getattr(self, f.name)]
        if self.input_batch != 1:
            parts.append(f"ib{self.input_batch}")
        return "+".join(parts) if parts else "naive"

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class Rung:
    """One rung of the ladder: a name (as every table and plot shows it) and its switches."""

    name: str
    switches: Switches


# The ladder, in the paper's order: each rung turns on one more switch (cumulative).
# (name, the field it turns on). The one list every table, test and plot derives from.
LADDER_STEPS: tuple[tuple[str, str | None], ...] = (
    ("naive", None),
    ("+grouped", "grouped"),
    ("+streams", "streams"),
    ("+fused", "fused"),
    ("+pretranspose", "pretranspose"),
    ("+input_batch", "input_batch"),
    ("+wavefront", "wavefront"),
    ("+persistent", "persistent"),     # beyond the paper: not a row of its Table 1
)
PAPER_RUNGS = [name for name, _ in LADDER_STEPS].index("+persistent")
"""How many rungs (from the first) are the paper's Table 1; the rest go beyond it."""


def ladder(input_batch: int | str = DEFAULT_INPUT_BATCH) -> tuple[Rung, ...]:
    """The ordered, cumulative rungs; ``input_batch`` is the k of the input-batching rung."""
    rungs = []
    sw = Switches()
    for name, field in LADDER_STEPS:
        if field == "input_batch":
            sw = replace(sw, input_batch=input_batch)
        elif field is not None:
            sw = replace(sw, **{field: True})
        rungs.append(Rung(name, sw))
    return tuple(rungs)


def rung_names() -> tuple[str, ...]:
    return tuple(name for name, _ in LADDER_STEPS)


def all_combinations(input_batches=(1, 2, ALL)):
    """Every valid Switches, for exhaustive tests. Validity is decided by Switches itself
    (the rules above), so this list cannot drift from them."""
    out = []
    for bits in itertools.product((False, True), repeat=6):
        grouped, streams, fused, pretranspose, wavefront, persistent = bits
        for ib in input_batches:
            try:
                out.append(Switches(grouped, streams, fused, pretranspose, ib, wavefront,
                                    persistent))
            except ValueError:
                continue
    return tuple(out)
