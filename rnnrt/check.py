"""Comparing a result with a reference: ``|a - r| <= atol + rtol*|r|`` elementwise, the worst
element reported. Used by the tests and by every benchmark before it times anything.

NaN or Inf in the result where the reference is finite is always a failure (a poisoned,
unwritten element shows up this way).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# fp32 tolerances for a fast path against the float64 reference (GEMM K up to a few
# thousand: accumulated rounding stays well under these)
FP32_ATOL = 1e-4
FP32_RTOL = 1e-3


def reduction_atol(terms: int, atol: float = FP32_ATOL, base: int = 64) -> float:
    """The absolute tolerance of a value that is a sum of ``terms`` fp32 products (a weight
    gradient sums over all T*B rows): ``atol`` for up to ``base`` terms, growing with the
    square root beyond (rounding errors of a long fp32 sum add like a random walk). At
    T*B = 25,600 that is 20 x atol; a missing or doubled term of the size of the terms is
    still far outside it."""
    if terms < 1:
        raise ValueError(f"terms: expected >= 1, got {terms!r}")
    return atol * max(1.0, (terms / base) ** 0.5)


@dataclass(frozen=True)
class Comparison:
    name: str
    ok: bool
    max_abs_err: float
    max_excess: float        # max of |a - r| - (atol + rtol*|r|); <= 0 when ok
    worst_index: tuple
    worst_actual: float
    worst_ref: float
    n_bad: int
    size: int

    def __str__(self):
        return (f"{self.name}: {'ok' if self.ok else 'MISMATCH'} max|err|={self.max_abs_err:.3g}"
                f" worst at {self.worst_index}: got {self.worst_actual!r} want {self.worst_ref!r}"
                f" ({self.n_bad}/{self.size} outside tolerance)")

    def as_dict(self) -> dict:
        """The fields a benchmark record keeps of a check."""
        return {"ok": self.ok, "against": self.name, "max_abs_err": self.max_abs_err,
                "worst_index": list(self.worst_index), "n_bad": self.n_bad}


def _to_numpy(a):
    if hasattr(a, "get"):          # CuPy array
        a = a.get()
    return np.asarray(a)


def compare(actual, ref, atol: float = FP32_ATOL, rtol: float = FP32_RTOL,
            name: str = "array") -> Comparison:
    """Compare ``actual`` with ``ref`` (NumPy or CuPy, same shape) in float64."""
    a = _to_numpy(actual).astype(np.float64)
    r = _to_numpy(ref).astype(np.float64)
    if a.shape != r.shape:
        raise ValueError(f"{name}: shape {a.shape} != reference shape {r.shape}")
    if a.size == 0:
        return Comparison(name, True, 0.0, 0.0, (), 0.0, 0.0, 0, 0)
    err = np.abs(a - r)
    allowed = atol + rtol * np.abs(r)
    excess = err - allowed
    # non-finite where the reference is finite: infinitely bad
    bad_nonfinite = ~np.isfinite(a) & np.isfinite(r)
    excess = np.where(bad_nonfinite, np.inf, excess)
    both_nan = np.isnan(a) & np.isnan(r)
    excess = np.where(both_nan, -np.inf, excess)
    err = np.where(np.isfinite(err), err, np.where(both_nan, 0.0, np.inf))
    flat = int(np.argmax(excess))
    idx = np.unravel_index(flat, a.shape)
    n_bad = int(np.count_nonzero(excess > 0))
    return Comparison(name, n_bad == 0, float(err.max()), float(excess.max()),
                      tuple(int(i) for i in idx), float(a[idx]), float(r[idx]), n_bad, a.size)


def assert_close(actual, ref, atol: float = FP32_ATOL, rtol: float = FP32_RTOL,
                 name: str = "array") -> Comparison:
    """compare(), raising AssertionError with the worst element when out of tolerance."""
    c = compare(actual, ref, atol, rtol, name)
    if not c.ok:
        raise AssertionError(str(c))
    return c


def compare_all(got, ref, against: str = "the reference", rows: int = 1,
                atol: float = FP32_ATOL, rtol: float = FP32_RTOL) -> Comparison | None:
    """compare() every array of the dict ``ref`` (a None one skipped) with ``got``'s of the
    same name, each named '<name> vs <against>'; the worst (by excess) returned, None when
    ``ref`` holds none. ``rows``: the T*B rows the weight gradients ('grads') sum over, which
    widens their absolute tolerance (reduction_atol); every other array is held to ``atol``."""
    worst = None
    for name, r in ref.items():
        if r is None:
            continue
        a = reduction_atol(rows, atol) if name == "grads" else atol
        c = compare(got[name], r, a, rtol, name=f"{name} vs {against}")
        if worst is None or (not c.ok and worst.ok) or c.max_excess > worst.max_excess:
            worst = c
    return worst
