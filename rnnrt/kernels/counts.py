"""The cluster counts of the cluster families (the cluster kernel, ``persistent.py``; the
register-resident kernel, ``regs.py``; the tensor-core cluster kernel in clusters of 8,
``mmac.py``, whose counts past one n8 tile a cluster run its wide form): which counts besides
the rule's the schedule selector times, each within the device's co-resident cap
(``occupancy.py``), and each layer's share of the SMs in a chunked plan. choice.py decides
with them; nothing here picks a kernel.

Why timed, not ruled (H100, L1 H 128, 100 steps): at B 256, 14-15 clusters of the cluster
kernel are 10-14% faster than the rule's 8 and 16 run in two waves; at B 128, 10 beat 8 and
12 lose. The register-resident kernel needs fewer registers and little shared memory, so two
of its blocks may share an SM and its cap is higher.
"""
from __future__ import annotations

from typing import Callable

from .budget import ceil_div
from .mmac import mmac_fit
from .occupancy import ClusterCap, derived_cap
from .persistent import CLUSTER_MAX_FMAS, cluster_count, persistent_fit
from .regs import regs_fit
from ..plan.model import CLUSTER_FAMILIES
from .schedules import Schedule, cluster_schedule

MAX_EXTRA_COUNTS = 3
"""Cluster counts a key times besides the rule's (each one run of the budget where slower)."""


def family_fit(family: str, cell: str, H: int, B: int, props: dict, clusters=None,
               dtype="float32"):
    """The fit of cluster family ``family`` at ``clusters`` clusters (None: the rule's), at
    precision ``dtype`` (the tensor-core cluster kernel's fit declines all but bf16 / fp16)."""
    if family == "regs":
        return regs_fit(cell, H, B, props, clusters=clusters)
    if family == "mmac":
        return mmac_fit(cell, H, B, props, dtype, clusters=clusters)
    if family == "cluster":
        if clusters is None:
            return persistent_fit(cell, H, B, props, kind="cluster")
        return persistent_fit(cell, H, B, props, clusters=clusters)
    raise ValueError(f"family: expected one of {CLUSTER_FAMILIES}, got {family!r}")


def layer_share_fit(cell: str, H: int, B: int, props: dict, layers: int, fit,
                    family: str = "cluster"):
    """The fit of each layer of a chunked plan (``layers`` launches overlapping along the
    wavefront) of cluster family ``family``: every layer's launch resident at once, each on
    1/layers of the SMs (``cluster_count(B, SMs, layers)``) where that still fits (and, for
    the cluster kernel, pays: CLUSTER_MAX_FMAS), else ``fit`` (one launch's)."""
    n = cluster_count(B, props["multiProcessorCount"], layers)
    if n != fit.clusters:
        share = family_fit(family, cell, H, B, props, clusters=n)
        if share.ok and (family != "cluster" or share.fmas_per_thread <= CLUSTER_MAX_FMAS):
            return share
    return fit


def extra_cluster_counts(batch: int, rule: int, cap: int,
                         most: int = MAX_EXTRA_COUNTS) -> tuple[int, ...]:
    """Cluster counts worth timing besides the rule's ``rule``: each the fewest clusters
    that give a cluster fewer batches than the rule's (ceil(B / BG) for BG < ceil(B / rule):
    more clusters at the same batches a cluster only add copies of R), above ``rule`` and at
    most ``cap``; of more than ``most``, the one nearest each of ``most`` even steps from
    the rule's to the largest (which is always kept)."""
    bg0 = ceil_div(batch, rule)
    opts = sorted({n for n in (ceil_div(batch, bg) for bg in range(1, bg0)) if rule < n <= cap})
    if len(opts) <= most:
        return tuple(opts)
    top, picks = opts[-1], set()
    for i in range(1, most + 1):
        target = rule + (top - rule) * i / most
        picks.add(min(opts, key=lambda n: (abs(n - target), n)))
    return tuple(sorted(picks))


def count_schedules(shape, device, family: str = "cluster",
                    cluster_cap: Callable[..., ClusterCap] | None = None) -> tuple[Schedule, ...]:
    """Cluster family ``family`` at other counts than the rule's, for ``shape`` (a
    selector.Shape whose precision the family runs: the caller checks) on ``device``
    (DeviceLimits), where the family fits: the ``extra_cluster_counts`` up to the device's
    co-resident cap — for one layer's launch, ``cluster_cap(fit, dtype)`` (an
    occupancy.ClusterCap of the kernel at the shape's precision; default
    ``occupancy.derived_cap`` from the properties), for a chunked plan (several layers'
    launches overlapping) each layer's 1/L share of it — each count's own fit within its own
    cap. The tensor-core cluster kernel: only where the rule's count runs its wide form (a
    one-tile cluster multiplies a whole n8 tile at any batch up to 8, so more clusters would
    only add copies of R), one launch a layer (never chunked). Nothing for a training
    shape's persistent backward: the count is the forward kernel's."""
    if shape.varlen:
        return ()
    props = device.props()
    cap_of = cluster_cap or (lambda f, dtype: derived_cap(f, props))
    fit = family_fit(family, shape.cell, shape.hidden, shape.batch, props, dtype=shape.dtype)
    if not fit.ok or (family == "mmac" and not fit.wide):
        return ()
    sched = cluster_schedule(fit.clusters, family)
    layers = 1
    if (family != "mmac" and shape.layers > 1
            and sched.switches.steps_per_input_gemm(shape.steps) < shape.steps):
        layers = shape.layers   # chunked: every layer's launch resident at once
        fit = layer_share_fit(shape.cell, shape.hidden, shape.batch, props, layers, fit, family)
    out = []
    for n in extra_cluster_counts(shape.batch, fit.clusters,
                                  cap_of(fit, shape.dtype).clusters // layers):
        f = family_fit(family, shape.cell, shape.hidden, shape.batch, props, clusters=n,
                       dtype=shape.dtype)
        if f.ok and n <= cap_of(f, shape.dtype).clusters // layers:
            out.append(cluster_schedule(n, family))
    return tuple(out)
