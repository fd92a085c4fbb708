"""What a schedule is, and the named ones: a way to run a shape (the switches, with the
persistent switch the family and, for the cluster kernel, the cluster count; for a training
shape the backward), as kernels/selector.py times and records them, and the cuBLAS
and persistent schedules its candidates are made of. Nothing here decides which runs."""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..plan.model import (BACKWARD_FAMILIES, CLUSTER_FAMILIES, GEMM_CHOICES,
                          PERSISTENT_FAMILIES)
from ..plan.switches import Switches


@dataclass(frozen=True)
class Schedule:
    """One way to run a shape: the switches, and with the persistent switch the family it
    names (None: choose_persistent's rules); for a training shape the backward it runs
    (``backward``: None, the switches' per-step backward; else the persistent backward
    kernel, as PlanKey.backward names it); with family 'cluster' or 'regs' the cluster count
    (``clusters``: None, the rule's; else exactly that, PlanKey.clusters). ``name`` is what
    records and tables show ('cluster/14' for 14 clusters, 'regs/30'). ``gemm``: who picks
    the cuBLAS GEMMs' kernels (PlanKey.gemm: 'cublas', or 'lt' timed per GEMM; the name
    ends in '+lt', ``with_lt``)."""

    name: str
    switches: Switches
    family: str | None = None
    backward: str | None = None
    clusters: int | None = None
    gemm: str = "cublas"

    def as_dict(self) -> dict:
        return {"name": self.name, "switches": self.switches.as_dict(), "family": self.family,
                "backward": self.backward, "clusters": self.clusters, "gemm": self.gemm}

    @classmethod
    def from_dict(cls, d: dict) -> "Schedule":
        """The inverse of ``as_dict`` (raises ValueError / TypeError on a damaged entry)."""
        if not isinstance(d, dict) or not isinstance(d.get("name"), str):
            raise ValueError(f"schedule: expected a dict with a name, got {d!r}")
        sw = d.get("switches")
        if not isinstance(sw, dict):
            raise ValueError(f"schedule {d['name']!r}: switches missing")
        switches = Switches(**sw)
        family = d.get("family")
        if family is not None and (family not in PERSISTENT_FAMILIES or not switches.persistent):
            raise ValueError(f"schedule {d['name']!r}: family {family!r} is not a persistent "
                             f"family of its switches ({list(PERSISTENT_FAMILIES)})")
        backward = d.get("backward")
        if backward is not None and backward not in BACKWARD_FAMILIES:
            raise ValueError(f"schedule {d['name']!r}: backward {backward!r} is not one of "
                             f"{list(BACKWARD_FAMILIES)}")
        n = d.get("clusters")   # absent in entries written before the count was a choice
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1
                              or family not in CLUSTER_FAMILIES):
            raise ValueError(f"schedule {d['name']!r}: clusters {n!r} is not a cluster count "
                             f"(an int >= 1 with family one of {list(CLUSTER_FAMILIES)})")
        gemm = d.get("gemm", "cublas")   # absent in entries written before the choice
        if gemm not in GEMM_CHOICES:
            raise ValueError(f"schedule {d['name']!r}: gemm {gemm!r} is not one of "
                             f"{list(GEMM_CHOICES)}")
        return cls(d["name"], switches, family, backward, n, gemm)


def with_lt(s: Schedule) -> Schedule:
    """``s`` with its cuBLAS GEMMs' kernels chosen by timing (PlanKey.gemm 'lt'), named
    '<name>+lt'."""
    return replace(s, name=f"{s.name}+lt", gemm="lt")


_PAPER = dict(grouped=True, streams=True, fused=True, wavefront=True)


def paper_schedules() -> tuple[Schedule, ...]:
    """The cuBLAS schedules every shape can run: the ladder's best paper rung (every switch
    of the paper, input chunks of 10 steps) and input-batching variants without the
    pre-transposition (which loses under graphs on Hopper): chunks of 10, of 2 (layers start
    sooner), and one W.x GEMM a layer ('all': fewest launches, no overlap of layers)."""
    return (Schedule("paper", Switches(**_PAPER, pretranspose=True, input_batch=10)),
            Schedule("ib10", Switches(**_PAPER, input_batch=10)),
            Schedule("ib2", Switches(**_PAPER, input_batch=2)),
            Schedule("iball", Switches(**_PAPER, input_batch="all")))


def paper_schedule(name: str) -> Schedule:
    """The paper schedule called ``name`` ('paper', 'ib10', 'ib2', 'iball')."""
    for s in paper_schedules():
        if s.name == name:
            return s
    raise ValueError(f"paper_schedule: {name!r} is not one of "
                     f"{[s.name for s in paper_schedules()]}")


def varlen_schedules() -> tuple[Schedule, ...]:
    """The candidates of a variable-length key: the cuBLAS schedules (no persistent kernel
    takes a per-step batch), with a pre-transposed variant of chunks of 2 besides the paper
    rung: a pattern's late steps run few rows, where cuBLAS's kernel for the product with
    the weights used transposed is slow (journal: ~35 us a step at 8 rows against the
    pre-transposed one's few)."""
    return paper_schedules() + (
        Schedule("pt-ib2", Switches(**_PAPER, pretranspose=True, input_batch=2)),)


def persistent_schedule(family: str) -> Schedule:
    """The schedule that runs ``family``'s persistent kernel (falls back to ib10)."""
    return Schedule(family, Switches(**_PAPER, input_batch=10, persistent=True), family)


def cluster_schedule(clusters: int, family: str = "cluster") -> Schedule:
    """Cluster family ``family``'s schedule (CLUSTER_FAMILIES) at exactly ``clusters``
    clusters ('cluster/14')."""
    if family not in CLUSTER_FAMILIES:
        raise ValueError(f"family: expected one of {CLUSTER_FAMILIES}, got {family!r}")
    return replace(persistent_schedule(family), name=f"{family}/{clusters}",
                   clusters=int(clusters))
