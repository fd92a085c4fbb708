"""Variable-length batches as plans see them: the *pattern* a plan runs (its per-step active
batch), the bucketing that maps a packed batch to a pattern, and the row map between the
batch's packed rows and the plan's rows.

A packed batch (torch's PackedSequence layout, ``rnnrt/varlen.py``) is described by its
batch_sizes [T]: non-increasing, batch_sizes[t] sequences (a prefix of the batch, the
longest first) active at step t. A variable-length plan (``PlanKey.batch_sizes``) runs a
pattern P of the same kind: each step's GEMMs and pointwise kernels work on its P[t] rows
only, its rows packed one step after another (step t's first row at sum(P[:t])). A plan
runs any batch its pattern *covers* (len(P) >= T, P[t] >= batch_sizes[t]): a row whose
sequence has ended before its pattern row does is *frozen* by the masked step kernels
(its state passes through unchanged; cuda_src/lstm.cu etc.), so every row's last pattern
slot holds its own final state, and its gradient flows back through the frozen steps to
its own last step. The per-step mask ([sum(P)] floats, 1 where the row's sequence runs)
is an input of the plan, as x is.

Why bucket: a plan (and its CUDA graph) is built per pattern, and the exact batch_sizes of
random batches almost never repeat: a training loop over them would build a plan every
step. ``bucket`` maps a batch to a pattern from a small family:
  - the steps T rounded up on a grid of STEPS_PER_OCTAVE steps an octave (exact up to 8,
    then multiples of 2, 4, 8, ... : at most 12.5% more steps, and steps are what a
    recurrence costs);
  - the rows in ROW_GROUPS groups of a multiple of ROW_QUANTUM rows (the longest first),
    each group running to its longest sequence's length rounded up to a GROUP_FRACTION-th
    of the pattern's steps (at most GROUP_FRACTION distinct active batches; frozen rows
    cost GEMM rows, not steps).
Measured on random batches (1000 each, ``tests/plan/test_plan_packing.py`` keeps these
bounds): lengths uniform in 20-200, batch 64: 16 patterns, 41% more rows than real and
4.7% more steps than the longest sequence; lengths 1-500, batch 32: 31 patterns. Exact
patterns would give a plan per batch; a grid per group (instead of fractions of T) gave
71-531 patterns for 24-37% fewer frozen rows. Padding every batch to its longest sequence
is the one-group extreme (82% more rows on the first case). A batch that comes again (a
fixed set of batches looped over) pays its bucket's padding once: GpuRunner runs a batch
it has seen before on its exact pattern (``GpuRunner.pattern``).

Row map (``row_map``): the pattern row of each packed row. In reverse (a bidirectional
layer's second direction) each sequence is read from its own end: packed row (t, b) goes
to pattern step len_b - 1 - t, so the one forward plan runs both directions.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..varlen import check_batch_sizes
from ..varlen import lengths as varlen_lengths  # the one sequence-length rule

ROW_QUANTUM = 8
"""Rows of a pattern's groups are multiples of this (GEMM tiles, vector loads)."""
ROW_GROUPS = 4
"""Row groups of a bucketed pattern: at most this many distinct active batches."""
STEPS_PER_OCTAVE = 8
"""The steps grid: a pattern's steps are rounded up to 8 values per power of two."""
GROUP_FRACTION = 4
"""A group's steps are rounded up to a multiple of (pattern steps / GROUP_FRACTION)."""


def check_pattern(batch_sizes, name: str = "batch_sizes") -> tuple[int, ...]:
    """``batch_sizes`` as a tuple of Python ints, checked: at least one step, every entry
    >= 1, non-increasing (rnnrt.varlen.check_batch_sizes with min_rows=1). ValueError
    naming ``name`` otherwise.

    batch_sizes: [T] integers (a tuple, list or NumPy array)
    """
    return tuple(check_batch_sizes(batch_sizes, min_rows=1, name=name).tolist())


def step_grid(steps: int) -> int:
    """``steps`` rounded up to the pattern steps grid (STEPS_PER_OCTAVE values an octave;
    exact up to STEPS_PER_OCTAVE)."""
    if steps <= STEPS_PER_OCTAVE:
        return steps
    unit = 1 << max(0, (steps - 1).bit_length() - 1 - (STEPS_PER_OCTAVE.bit_length() - 1))
    return -(-steps // unit) * unit


def lengths(batch_sizes) -> np.ndarray:
    """[B] each sequence's length (longest first) from batch_sizes [T] (B = batch_sizes[0]):
    rnnrt.varlen.lengths, taking any sequence of ints."""
    return varlen_lengths(np.asarray(batch_sizes, dtype=np.int64))


def batch_sizes(lengths) -> tuple[int, ...]:
    """batch_sizes [T] (T = the longest) of sequences of ``lengths`` [B] (any order: torch's
    packing sorts them longest first); the inverse of ``lengths``.

    lengths: [B] positive ints (a tuple, list, NumPy array or CPU tensor)
    """
    try:
        lens = tuple(int(n) for n in lengths)
    except (TypeError, ValueError):
        raise ValueError(f"lengths: expected a sequence of ints, got {lengths!r}") from None
    if any(isinstance(n, bool) for n in lengths) or not lens or min(lens) < 1:
        raise ValueError(f"lengths: expected at least one sequence, each at least one step "
                         f"long, got {list(lens)}")
    counts = np.bincount(lens)            # sequences of each length
    longer = counts[::-1].cumsum()[::-1]  # sequences at least this long, by length
    return tuple(int(n) for n in longer[1:])


def offsets(pattern) -> np.ndarray:
    """[T+1] the first row of each step in a packed layout of ``pattern`` [T], and the
    total rows last."""
    off = np.zeros(len(pattern) + 1, dtype=np.int64)
    np.cumsum(pattern, out=off[1:])
    return off


def group_rows(batch: int) -> int:
    """Rows a group of a bucketed pattern of ``batch`` rows holds (the last may hold fewer)."""
    per = -(-batch // ROW_GROUPS)
    return -(-per // ROW_QUANTUM) * ROW_QUANTUM


def bucket(batch_sizes, checked: bool = False) -> tuple[int, ...]:
    """The bucketed pattern that runs the packed batch ``batch_sizes`` [T] (module
    docstring): it covers batch_sizes, has step_grid(T) steps and at most ROW_GROUPS
    distinct entries. checked: batch_sizes is ``check_pattern``'s tuple already (a caller
    that checked its input once, GpuRunner), so it is not checked again."""
    bs = batch_sizes if checked else check_pattern(batch_sizes)
    lens = lengths(bs)
    batch = bs[0]
    steps = step_grid(len(bs))
    per = group_rows(batch)
    ends = [steps]   # each group's steps: its longest sequence's, rounded up to a multiple
    for first in range(per, batch, per):   # of steps / GROUP_FRACTION (in whole steps)
        units = -(-int(lens[first]) * GROUP_FRACTION // steps)
        ends.append(-(-units * steps // GROUP_FRACTION))
    return tuple(min(batch, per * sum(e > t for e in ends)) for t in range(steps))


def staircase(steps: int, batch: int) -> tuple[int, ...]:
    """The bucketed pattern of ``batch`` sequences whose lengths fall evenly from ``steps``
    to steps / batch: what random lengths up to ``steps`` bucket to, for the schedule
    selector to time a variable-length key on (its small active batches included: cuBLAS's
    kernel choice for a few rows can differ from the full batch's)."""
    lens = [-(-steps * (batch - b) // batch) for b in range(batch)]
    return bucket(tuple(sum(n > t for n in lens) for t in range(steps)))


def covers(pattern, batch_sizes) -> bool:
    """Whether a plan of ``pattern`` runs the batch ``batch_sizes`` (same batch, at least
    as many steps, at least as many rows every step)."""
    if len(pattern) < len(batch_sizes) or pattern[0] != batch_sizes[0]:
        return False
    return all(p >= b for p, b in zip(pattern, batch_sizes))


@dataclass(frozen=True, eq=False)
class RowMap:
    """Where a packed batch lives in a plan of its pattern.

    rows: [N] int64, the pattern row of each packed row (N = sum(batch_sizes))
    mask: [sum(pattern)] float32, 1 at the rows that carry data this step, 0 at frozen rows
    """

    rows: np.ndarray
    mask: np.ndarray


def row_map(batch_sizes, pattern, reverse: bool = False, checked: bool = False) -> RowMap:
    """The RowMap of the packed batch ``batch_sizes`` [T] in a plan of ``pattern`` (which
    must cover it). reverse: each sequence is read from its own end (packed row (t, b) to
    pattern step len_b - 1 - t). checked: both are ``check_pattern``'s tuples already (as
    ``bucket``'s); that the pattern covers the batch is checked either way."""
    if not checked:
        batch_sizes, pattern = check_pattern(batch_sizes), check_pattern(pattern, "pattern")
    bs, pat = np.asarray(batch_sizes, dtype=np.int64), pattern
    if not covers(pat, tuple(bs)):
        raise ValueError(f"pattern {list(pat)} does not cover batch_sizes {bs.tolist()}")
    off, poff = offsets(bs), offsets(pat)
    step = np.repeat(np.arange(len(bs)), bs)          # each packed row's step
    seq = np.arange(int(off[-1])) - off[step]         # ... and its sequence
    if reverse:
        step = lengths(bs)[seq] - 1 - step
    rows = poff[step] + seq
    mask = np.zeros(int(poff[-1]), dtype=np.float32)
    mask[rows] = 1
    return RowMap(rows, mask)
