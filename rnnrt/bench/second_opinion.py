"""The ladder's check at tf32 and 16 bits where the float64 NumPy reference would take too
long (ladder.reference_runs false): a second opinion from cuDNN at float32.

There the rungs are held to cuDNN's output at the same precision with that precision's
tolerance. Both sides carry the precision's rounding error (a bfloat16 weight gradient sums
T*B rounded terms), so a large fwd+bwd point can disagree with no way to say which side errs.
The second opinion: cuDNN at float32 with TF32 off, on the same model and inputs, taken once
per ladder; a rung its first check refuses is still accepted where, for every array (y; with
backward dx and grads), its worst absolute error against cuDNN-fp32 is at most 2x cuDNN-at-
dtype's own (check.compare_with_peer: the issue's goal). Both verdicts go in the row's check.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..check import Comparison, PeerComparison, compare_with_peer, max_abs_errors

AGAINST = "cuDNN float32 (TF32 off)"
SAME_PRECISION = "same-precision check"
"""What a row's check says accepted it (``accepted_by``): the check against cuDNN's output at
the run's precision, or the second opinion."""
SECOND_OPINION = "float32 second opinion"


class SecondOpinion:
    """cuDNN's float32 outputs of a ladder (``ref``: name -> array, y [T, B, H], dx [T, B, I],
    grads [n] flat) and cuDNN-at-``dtype``'s worst absolute errors against them (``peer``:
    name -> Comparison), taken once; ``judge`` holds a rung's outputs to them."""

    def __init__(self, ref: dict, peer_outputs: dict, dtype: str):
        self.ref = ref
        self.peer_name = f"cuDNN {dtype}"
        self.peer = max_abs_errors(peer_outputs, ref, AGAINST)

    def judge(self, got: dict) -> PeerComparison:
        """``got`` (the rung's outputs, the arrays of ``ref``) against the rule."""
        return compare_with_peer(got, self.ref, self.peer, AGAINST, self.peer_name)

    def peer_record(self) -> dict:
        """cuDNN-at-dtype's own error against cuDNN-fp32, for the cuDNN row's check."""
        return {"against": AGAINST,
                "arrays": {n: {"max_abs_err": c.max_abs_err, "worst_index": list(c.worst_index)}
                           for n, c in self.peer.items()}}


def second_opinion(cfg, peer_outputs: dict, model, inputs, progress) -> SecondOpinion | None:
    """The second opinion of a ladder of ``cfg`` whose rungs are held to ``peer_outputs``
    (cuDNN's at cfg.dtype: CudnnBench.outputs), from cuDNN at float32 on ``model`` and
    ``inputs`` = (x [T, B, I], h0 [L, B, H], c0 [L, B, H] or None, dy [T, B, H]); None at
    float32, where cuDNN's output already is the float32 one."""
    if cfg.dtype == "float32":
        return None
    from .cudnn import float32_outputs
    progress(f"computing cuDNN's float32 outputs (second opinion for {cfg.dtype})")
    return SecondOpinion(float32_outputs(cfg, model, *inputs), peer_outputs, cfg.dtype)


@dataclass(frozen=True)
class Verdict:
    """A rung's check: ``ok`` (time it), ``check`` (the row's record), ``reason`` (the
    words of a refusal) and ``accepted_by`` (SAME_PRECISION / SECOND_OPINION where a second
    opinion was asked, else None)."""
    ok: bool
    check: dict
    reason: str
    accepted_by: str | None = None


def verdict(first: Comparison, got: dict, second: SecondOpinion | None) -> Verdict:
    """The check of a rung whose outputs ``got`` (the arrays of the reference: y, dx,
    grads) ``first`` held to the reference. Without a second opinion: ``first`` alone. With
    one: accepted if ``first`` passes or else the second opinion does; the check record is
    first's fields with ``ok`` the row's verdict, ``same_precision_ok`` first's own,
    ``accepted_by`` and ``second_opinion`` (its record); a refusal gives both reasons."""
    if second is None:
        return Verdict(first.ok, first.as_dict(), str(first))
    s = second.judge(got)
    ok = first.ok or s.ok
    by = (SAME_PRECISION if first.ok else SECOND_OPINION) if ok else None
    check = {**first.as_dict(), "ok": ok, "same_precision_ok": first.ok, "accepted_by": by,
             "second_opinion": s.as_dict()}
    return Verdict(ok, check, f"{first}; second opinion {s}", by)
