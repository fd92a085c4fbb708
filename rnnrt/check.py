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


def reduction_atol(terms: int, atol: float = FP32_ATOL, base: int = 64,
                   scale: float = 0.0) -> float:
    """The absolute tolerance of a value that is a sum of ``terms`` products (a weight
    gradient sums over all T*B rows): ``atol`` for up to ``base`` terms, growing with the
    square root beyond (rounding errors of a long sum add like a random walk), plus ``atol``
    x ``scale``, the size of the sums themselves (compare_all passes the reference's rms).

    The first part holds for terms of size about 1. The second is the same random walk for
    terms of any size (a sum of n random-signed terms of size s is about sqrt(n) s), and it
    is what 16-bit storage needs: a gate gradient computed in another fp32 order rounds one
    storage ulp the other way where it sits near a rounding boundary, the flip carries down
    the backward chain (each dh sums R x the rounded gradients) and a weight gradient ends a
    few storage ulps of the gradients' size off. bfloat16 GRU 1 x 2048, B 8, T 100: rms 6.2;
    the NumPy executor at the reference's own rounding points was 0.078 off, an H200 0.089
    (1.3% and 1.4% of the rms; allowed by the first part alone: 0.084). At T*B = 25,600 and
    scale 0 the tolerance is 20 x atol; a missing or doubled term of the size of the terms
    is still far outside it in fp32."""
    if terms < 1:
        raise ValueError(f"terms: expected >= 1, got {terms!r}")
    if not 0.0 <= scale < float("inf"):
        raise ValueError(f"scale: expected a finite value >= 0, got {scale!r}")
    return atol * (max(1.0, (terms / base) ** 0.5) + scale)


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


def rms(a) -> float:
    """The root mean square of ``a`` (NumPy or CuPy, any shape; 0.0 when empty), non-finite
    elements left out."""
    r = _to_numpy(a).astype(np.float64).ravel()
    r = r[np.isfinite(r)]
    return float(np.sqrt(np.mean(r * r))) if r.size else 0.0


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
    with their own size (the reference's rms) widens their absolute tolerance
    (reduction_atol); every other array is held to ``atol``."""
    worst = None
    for name, r in ref.items():
        if r is None:
            continue
        a = reduction_atol(rows, atol, scale=rms(r)) if name == "grads" else atol
        c = compare(got[name], r, a, rtol, name=f"{name} vs {against}")
        if worst is None or (not c.ok and worst.ok) or c.max_excess > worst.max_excess:
            worst = c
    return worst


PEER_RATIO = 2.0
"""The issue's precision goal: a result's error against a high-precision reference may be at
most this many times a peer's (cuDNN's at the same precision) against the same reference."""


def max_abs_errors(got: dict, ref: dict, against: str = "the reference") -> dict:
    """Each array of the dict ``ref`` (a None one skipped) against ``got``'s of the same name
    with no tolerance: name -> Comparison (named '<name> vs <against>') whose max_abs_err is
    the worst absolute error and worst_index where it is; a non-finite element of ``got``
    where ``ref`` is finite is an infinite error (compare())."""
    missing = [name for name, r in ref.items() if r is not None and name not in got]
    if missing:
        raise ValueError(f"got: no array {missing[0]!r} (the reference has {sorted(ref)})")
    return {name: compare(got[name], r, 0.0, 0.0, name=f"{name} vs {against}")
            for name, r in ref.items() if r is not None}


@dataclass(frozen=True)
class PeerComparison:
    """A result and a peer of the same precision, each against one higher-precision
    reference (``against``): per array name, the result's worst absolute error and where it
    is, the peer's, their ratio and whether the result's is within ``ratio`` x the peer's."""
    against: str
    peer: str
    ratio: float
    arrays: dict             # name -> {max_abs_err, worst_index, ..., peer_max_abs_err, ok}
    ok: bool

    def __str__(self):
        parts = ", ".join(f"{n} {a['max_abs_err']:.3g} vs {a['peer_max_abs_err']:.3g}" + (
            "" if a["ok"] else f" WORSE (worst at {tuple(a['worst_index'])}: got "
                               f"{a['worst_actual']!r} want {a['worst_ref']!r})")
            for n, a in self.arrays.items())
        return (f"vs {self.against}: {'ok' if self.ok else 'MISMATCH'} max|err| (its vs "
                f"{self.peer}'s, limit {self.ratio:g}x): {parts}")

    def as_dict(self) -> dict:
        """The fields a benchmark record keeps (JSON: a ratio where the peer's error is 0 is
        None)."""
        return {"ok": self.ok, "against": self.against, "peer": self.peer,
                "rule": f"max|err| <= {self.ratio:g} x the peer's, every array",
                "arrays": self.arrays}


def compare_with_peer(got: dict, ref: dict, peer: dict, against: str, peer_name: str,
                      ratio: float = PEER_RATIO) -> PeerComparison:
    """Whether ``got`` is no further from ``ref`` than ``ratio`` x its peer, array by array.

    Why: at 16 bits (and tf32) a result and cuDNN's output at the same precision both carry
    the precision's rounding error (a weight gradient sums T*B rounded terms), so holding
    one to the other with the precision's tolerance adds two errors and cannot say which
    side errs. Against a higher-precision reference (cuDNN at float32) each error is measured
    on its own; the result passes where, for every array, its worst absolute error is at most
    ``ratio`` x the peer's (the issue's goal: no worse than 2x cuDNN at the same precision).

    got, ref: name -> array, NumPy or CuPy (y [T, B, H]; dx [T, B, I]; grads [n] flat), the
    same shapes name by name; every array of ``ref`` is judged. peer: name -> Comparison,
    ``max_abs_errors(peer's outputs, ref)``, taken once for every result judged. NaN or Inf
    in the result never passes (not even where the reference has one too), and a peer whose
    error is not finite is no yardstick (refused).
    """
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or \
            not np.isfinite(ratio) or ratio <= 0:
        raise ValueError(f"ratio: expected a finite number > 0, got {ratio!r}")
    missing = [name for name, r in ref.items() if r is not None and name not in peer]
    if missing:
        raise ValueError(f"peer: no error for {missing[0]!r} (it has {sorted(peer)})")
    arrays = {name: _against_peer(c, bool(np.isfinite(_to_numpy(got[name])).all()),
                                  peer[name].max_abs_err, ratio)
              for name, c in max_abs_errors(got, ref, against).items()}
    return PeerComparison(against, peer_name, float(ratio), arrays,
                          all(a["ok"] for a in arrays.values()))


def _against_peer(c: Comparison, all_finite: bool, theirs: float, ratio: float) -> dict:
    """One array's entry of a PeerComparison: the result's Comparison ``c`` (no tolerance;
    ``all_finite``: no NaN or Inf in the result, where even a NaN reference element would
    have let a NaN through as error 0) beside the peer's worst absolute error ``theirs``."""
    ours = c.max_abs_err
    finite = bool(all_finite and np.isfinite(ours) and np.isfinite(theirs))
    return {"max_abs_err": ours, "worst_index": list(c.worst_index),
            "worst_actual": c.worst_actual, "worst_ref": c.worst_ref,
            "peer_max_abs_err": theirs,
            "ratio": ours / theirs if finite and theirs > 0 else None,
            "ok": finite and ours <= ratio * theirs}
