"""Patterns of variable-length plans (rnnrt/plan/packing.py), without a GPU: the steps grid,
bucketing (covers the batch, few distinct batches, few patterns over random batches: the
bounds its docstring states), and the row maps of both directions."""
from __future__ import annotations

import numpy as np
import pytest

from rnnrt.plan import packing as pk


def test_step_grid_rounds_up_by_at_most_an_eighth():
    for t in range(1, 1200):
        g = pk.step_grid(t)
        assert t <= g <= max(t, int(t * 1.125) + 1), t
        assert pk.step_grid(g) == g, t          # grid values are fixed points
    assert [pk.step_grid(t) for t in (8, 9, 17, 100, 200, 500)] == [8, 9, 18, 104, 208, 512]
    assert len({pk.step_grid(t) for t in range(257, 513)}) == 8   # 8 values an octave


def _random_bs(rng, lo, hi, batch):
    return pk.batch_sizes(rng.integers(lo, hi + 1, batch))


@pytest.mark.parametrize("lo, hi, batch", [(20, 200, 64), (1, 500, 32), (1, 30, 200),
                                           (5, 5, 12), (1, 9, 3)])
def test_bucket_covers_with_few_distinct_batches(lo, hi, batch):
    rng = np.random.default_rng(0)
    for _ in range(50):
        bs = _random_bs(rng, lo, hi, batch)
        p = pk.bucket(bs)
        assert pk.covers(p, bs) and len(p) == pk.step_grid(len(bs))
        assert p == pk.check_pattern(p)          # a valid pattern: non-increasing, >= 1
        assert len(set(p)) <= pk.ROW_GROUPS
        assert all(v % pk.ROW_QUANTUM == 0 or v == batch for v in p)


@pytest.mark.parametrize("lo, hi, batch, most_patterns, most_rows", [
    (20, 200, 64, 20, 1.5),    # the train-step benchmark's distribution (docstring: 16, 1.41)
    (1, 500, 32, 40, 1.5),     # the memory-varlen benchmark's (docstring: 31)
])
def test_random_batches_share_few_patterns(lo, hi, batch, most_patterns, most_rows):
    """1000 random batches: a bounded number of distinct plans, at a bounded cost in rows and
    steps over the real ones (the numbers the module docstring gives)."""
    rng = np.random.default_rng(0)
    patterns, rows, steps = set(), [], []
    for _ in range(1000):
        bs = _random_bs(rng, lo, hi, batch)
        p = pk.bucket(bs)
        patterns.add(p)
        rows.append(sum(p) / sum(bs))
        steps.append(len(p) / len(bs))
    assert len(patterns) <= most_patterns
    assert np.mean(rows) <= most_rows and max(steps) <= 1.125


def test_row_map_both_directions():
    lengths = [7, 5, 5, 2, 1]
    bs = pk.batch_sizes(lengths)                  # (5, 4, 3, 3, 3, 1, 1)
    pattern = pk.bucket(bs)
    off, poff = pk.offsets(bs), pk.offsets(pattern)
    for reverse in (False, True):
        m = pk.row_map(bs, pattern, reverse)
        assert m.rows.shape == (sum(bs),) and len(set(m.rows.tolist())) == sum(bs)
        assert m.mask.shape == (sum(pattern),) and m.mask.sum() == sum(bs)
        assert (m.mask[m.rows] == 1).all()
        for t in range(len(bs)):
            for b in range(bs[t]):
                step = lengths[b] - 1 - t if reverse else t
                assert m.rows[off[t] + b] == poff[step] + b, (reverse, t, b)
    exact = pk.row_map(bs, bs)
    assert (exact.rows == np.arange(sum(bs))).all() and exact.mask.all()


def test_bad_patterns_are_refused_by_name():
    with pytest.raises(ValueError, match="non-increasing"):
        pk.check_pattern([2, 3])
    with pytest.raises(ValueError, match="at least one active row"):
        pk.check_pattern([2, 0])
    with pytest.raises(ValueError, match="batch_sizes: expected at least one"):
        pk.check_pattern([])
    with pytest.raises(ValueError, match="does not cover"):
        pk.row_map((3, 3, 1), (3, 2, 2))
    assert not pk.covers((4, 4), (3, 3)) and not pk.covers((3,), (3, 3))
    assert list(pk.lengths((3, 2, 2, 1))) == [4, 3, 1]


def test_batch_sizes_is_the_inverse_of_lengths():
    """packing.batch_sizes: torch's packing of sequences of given lengths (any order),
    written out here for one batch, the inverse of packing.lengths on random ones; bad
    lengths refused by name."""
    assert pk.batch_sizes([2, 7, 5, 1, 5]) == (5, 4, 3, 3, 3, 1, 1)
    assert pk.batch_sizes(np.array([3, 3])) == (2, 2, 2) and pk.batch_sizes([1]) == (1,)
    rng = np.random.default_rng(3)
    for _ in range(200):
        lens = rng.integers(1, 40, rng.integers(1, 20))
        bs = pk.batch_sizes(lens)
        assert pk.check_pattern(bs) == bs and sum(bs) == lens.sum()
        assert list(pk.lengths(bs)) == sorted(lens.tolist(), reverse=True)
    for bad, words in (([], "at least one"), ([3, 0], "at least one step"),
                       ([2, True], "at least one"), ("ab", "sequence of ints"),
                       (None, "sequence of ints")):
        with pytest.raises(ValueError, match="lengths: expected") as info:
            pk.batch_sizes(bad)
        assert words in str(info.value), info.value


def test_staircase_is_what_random_lengths_bucket_to():
    """The selector's stand-in pattern: falling lengths, bucketed; it has the row groups
    of random lengths at the same steps and batch."""
    for steps, batch in ((208, 64), (512, 32), (13, 20), (5, 3)):
        p = pk.staircase(steps, batch)
        assert len(p) == pk.step_grid(steps) and p[0] == batch
        assert p == pk.check_pattern(p) and len(set(p)) <= pk.ROW_GROUPS
    rng = np.random.default_rng(3)
    common = [pk.bucket(_random_bs(rng, 1, 208, 64)) for _ in range(50)]
    assert len(set(pk.staircase(208, 64))) == max(len(set(c)) for c in common) == 4
