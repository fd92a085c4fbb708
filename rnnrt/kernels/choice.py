"""Which kernel and which schedule run for a shape: the one place that decides.

Three decisions live here.

``choose_persistent(key)``: given a plan key whose switches ask for persistent kernels, which
family runs — the stack kernel (every layer of an LSTM stack in one launch, ``stack.py``),
the cluster kernel or the grid kernel (one launch a layer, ``persistent.py``) — whether
cluster launches are cut into input chunks that overlap along the wavefront, and, where
nothing fits, why the plan falls back to the schedule without the switch. A key may name the
family (``PlanKey.family``: the register-resident cluster kernel, 'regs', and the tensor-core
grid and cluster kernels, 'mma' and 'mmac', run only where named, as the selector's candidates name them); else the
rules below pick one. The plan builders follow the answer; they decide nothing about kernels themselves.

``choose_persistent_backward(key)``: for a training key that names the persistent backward
(``PlanKey.backward``), the kernel's fit and the steps a launch covers (chunked along the
reverse wavefront for a multi-layer cluster plan), or why the plan keeps the per-step
backward. It and the backward's cost model live in ``choice_backward.py`` (imported here:
``choice.choose_persistent_backward`` and the rest are the same objects).

``candidates(shape, device)`` and ``heuristic(shape, device)``: the schedules the selector
(``selector.py``, which times them and remembers the fastest) may run for a shape -- the best
paper rung, input-batching variants and every persistent family that fits, and for training
shapes those with the persistent backward kernel -- and the deterministic choice it takes
with timing off. ``shape`` is a ``selector.Shape``.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ..plan.model import CLUSTER_FAMILIES
from ..precision import get_precision
from .counts import count_schedules, layer_share_fit
from .persistent import Fit, persistent_fit
# the backward's decisions (re-exported: callers and tests name them through this module)
from .choice_backward import (CUBLAS_BWD_LAYER_STEP_US, CUBLAS_BWD_STEP_US,  # noqa: F401
                              CUBLAS_SLOW_ROWS, BackwardChoice, backward_fit,
                              backward_steps_per_launch, choose_persistent_backward,
                              grid_pair_alternatives, prefers_persistent_backward,
                              prefers_stack_backward)
from .mma import MMA_DTYPES, mma_fit
from .mmac import mmac_fit
from .regs import regs_fit
from .regs_bwd import regs_bwd_fit
from .schedules import (Schedule, paper_schedule, paper_schedules, persistent_schedule,
                        varlen_schedules)
from .solo import solo_fit
from .stack import PS_BMAX, StackFit, stack_fit
from .stack_mma import stack_mma_fit

if TYPE_CHECKING:   # selector.py imports this module at its top
    from .selector import Shape

PERSISTENT_STORAGE_REASON = ("the register-resident backward runs fp32 only (its typed "
                             "instantiations, dg in the storage type and operands rounded as the "
                             "rungs read them, are not written yet); the grid, cluster, "
                             "register-resident and block-persistent (solo) forward kernels run "
                             "every dtype, the stack kernels float32, bfloat16 and float16")
FP32_ONLY_FAMILIES = ("regs_bwd",)
"""The persistent families without typed instantiations ('regs_bwd': the register-resident
backward, PlanKey.backward 'regs'; the forward families all have them)."""
"""Why a tf32, bfloat16 or float16 key runs no register-resident backward. The per-layer kernels
(grid, cluster, register-resident and solo forward; forward and backward) run every precision
with the rungs' math: under the storage rule every product operand is rounded to the storage
type (bf16 / fp16 stored; tf32: TF32-rounded as read), and the product of two such values is
exact in fp32 (8 x 8, 11 x 11 significand bits), so fp32 FMAs over operands rounded where the
rungs round them (h, and R, rounded as the typed kernels read them; dg in the backward) are the
cuBLAS rungs' products with fp32 accumulation, up to summation order -- the difference the fp32
persistent kernels already have. The switch changes the schedule, not the math."""
STACK_TF32_REASON = ("the stack family runs float32 (FMAs: persistent_stack.cu) and bfloat16 / "
                     "float16 (tensor cores: persistent_stack_mma.cu); no stack kernel reads "
                     "TF32-rounded operands")
"""Why a tf32 key runs no stack kernel."""


def persistent_storage_declines(dtype, family: str) -> str | None:
    """Why ``family`` ('stack', 'grid', 'cluster', 'regs', 'solo', 'regs_bwd' or another
    backward) cannot run precision ``dtype``, or None: PERSISTENT_STORAGE_REASON for the
    FP32_ONLY_FAMILIES at every precision but float32; STACK_TF32_REASON for the stack at tf32
    (bfloat16 / float16 keys run the tensor-core stack kernel, ``stack_fit_of``); None
    otherwise (the forward kernels' typed instantiations run every dtype)."""
    name = get_precision(dtype).name
    if family == "stack":
        return STACK_TF32_REASON if name == "tf32" else None
    if family not in FP32_ONLY_FAMILIES or name == "float32":
        return None
    return PERSISTENT_STORAGE_REASON


def stack_fit_of(cell: str, hidden: int, batch: int, layers: int, input_size: int,
                 props: dict, dtype="float32", steps: int = 1) -> StackFit:
    """The stack family's kernel for precision ``dtype`` and its fit: the tensor-core stack
    kernel (``stack_mma.stack_mma_fit``: mma.sync on bf16 / fp16 operands) for bfloat16 and
    float16, the fp32 stack kernel (``stack.stack_fit``) for float32 (tf32: its fit, which
    ``persistent_storage_declines`` refuses before it runs)."""
    if get_precision(dtype).name in MMA_DTYPES:
        return stack_mma_fit(cell, hidden, batch, layers, input_size, props, dtype, steps)
    return stack_fit(cell, hidden, batch, layers, input_size, props, steps=steps)

# --------------------------------------------------------------------------------------------
# The persistent family of a plan key


@dataclass(frozen=True)
class PersistentChoice:
    """What the persistent switch runs for one plan key.

    family: 'stack', 'grid', 'cluster', 'regs', 'mma', 'mmac' or 'solo' — what runs — or None:
    nothing persistent fits and the plan is the schedule without the switch (``fallback``
    says why).
    fit: the per-layer fit (grid or cluster kernel; for the stack, the per-layer fit the
    rules looked at, if any). stack: the stack kernel's fit when it runs (then no per-layer
    launches and no input GEMMs); ``stack_note`` says why it was not taken where it was
    considered. chunked: cluster launches one per input chunk of ``steps_per_launch`` steps,
    layer l+1's chunk after layer l's (they wait on nothing outside their clusters, so layers
    overlap); otherwise one launch a layer over all T steps.
    steps_per_launch: the steps one input GEMM and one per-layer launch cover (k).
    """

    family: str | None
    fit: Fit | None
    stack: StackFit | None
    chunked: bool
    steps_per_launch: int
    stack_note: str = ""
    fallback: str | None = None

    @property
    def runs(self) -> bool:
        """Whether a persistent kernel runs (else the plan falls back)."""
        return self.family is not None

    def describe(self) -> str:
        """The plan's ``fit`` string: the kernel that runs and why, or what was declined."""
        if self.stack is not None:
            return f"{self.stack.describe()}; {self.stack.reason}"
        if self.fit is None:
            return self.fallback or ""
        s = self.fit.describe() + (f"; {self.fit.reason}" if self.fit.ok else "")
        if self.chunked:
            s += (f"; layers overlap along the wavefront, launches of {self.steps_per_launch} "
                  f"steps")
        return s + self.stack_note


def choose_persistent(key) -> PersistentChoice:
    """The persistent choice for ``key`` (a plan.PlanKey with ``switches.persistent`` and a
    ``device``). With ``key.family`` named, that family if it fits (for the stack: any batch
    it can hold), else a fallback saying why. Otherwise the rules, in order:
      1. The per-layer fit (``persistent_fit``: the cluster kernel where it fits and pays,
         else the grid kernel). Nothing fits: fall back, saying why.
      2. Where the per-layer fit is the grid kernel (one layer at a time on every SM), the
         wavefront is on and there are several layers: the stack kernel of the key's
         precision (fp32 FMAs, or tensor cores for bfloat16 / float16), if it fits and (fp32)
         the batch fills more than a quarter of its lanes (``stack_choice``).
      3. Cluster kernels with the wavefront, several layers and input chunks shorter than T
         run chunked, each layer on its 1/L share of the SMs where that still fits and pays.
    """
    sw, T, B, H, L = key.switches, key.steps, key.batch, key.hidden_size, key.num_layers
    props = key.device.props()
    k = sw.steps_per_input_gemm(T)
    family = key.family

    def declined(why, fit=None):
        return PersistentChoice(None, fit, None, False, k, fallback=(
            f"persistent declined on {key.device.name}: {why}; ran the schedule without it"))

    if key.batch_sizes is not None:
        return declined("a per-step active batch (variable lengths): the persistent kernels "
                        "run the whole batch at every step")
    if family == "stack":
        storage = persistent_storage_declines(key.dtype, "stack")
        if storage is not None:
            return declined(f"{key.dtype}: {storage}")
        st = _stack_fit(key)
        return (PersistentChoice("stack", None, st, False, T) if st.ok
                else declined(st.reason))
    if family == "regs":
        return _regs_choice(key, declined)
    if family == "mma":
        return _mma_choice(key, declined)
    if family == "mmac":
        return _mmac_choice(key, declined)
    if family == "solo":
        return _solo_choice(key, declined)
    kind = family if family in ("grid", "cluster") else None
    # PlanKey.clusters (family 'cluster' only): exactly that count, wherever it fits
    fit = persistent_fit(key.cell, H, B, props, kind=kind, clusters=key.clusters)
    if not fit.ok:
        return declined(fit.reason, fit)
    given = given_count(key)
    stack, note = None, ""
    if family is None and not fit.cluster and sw.wavefront and L > 1:
        storage = persistent_storage_declines(key.dtype, "stack")
        if storage is None:
            stack, note = stack_choice(key)
        else:
            note = f"; stack kernel not used: {key.dtype}: {storage}"
    if stack is not None:
        return PersistentChoice("stack", fit, stack, False, T, note)
    # A grid kernel needs every SM, so two never run at once: one launch per layer over all
    # T steps after one input GEMM (chunks would only add launches). Cluster kernels wait on
    # nothing outside their cluster, so layers can overlap: with the wavefront and several
    # layers, each layer runs as one launch per input_batch chunk, layer l+1's after layer l's.
    name = "cluster" if fit.cluster else "grid"
    chunked = bool(fit.cluster) and sw.wavefront and L > 1 and k < T
    if not chunked:
        return PersistentChoice(name, fit, None, False, T, note + given)
    if key.clusters is None:
        fit = layer_share_fit(key.cell, H, B, props, L, fit)
    return PersistentChoice(name, fit, None, True, k, note + given)


def given_count(key) -> str:
    """The fit string's note of an explicit cluster count (PlanKey.clusters), else ''."""
    if key.clusters is None:
        return ""
    return (f"; {key.clusters} cluster{'' if key.clusters == 1 else 's'} as the key names "
            f"(PlanKey.clusters)")


def _regs_choice(key, declined) -> PersistentChoice:
    """The register-resident cluster kernel for ``key`` (named as its family), at
    ``key.clusters`` clusters where given: one launch a layer, or, like the cluster kernel (it
    too waits on nothing outside its clusters), one per input chunk with the wavefront and
    several layers, each layer on its 1/L share of the SMs where that still fits (unless the
    key names the count)."""
    sw, T, B, L = key.switches, key.steps, key.batch, key.num_layers
    props = key.device.props()
    k = sw.steps_per_input_gemm(T)
    storage = persistent_storage_declines(key.dtype, "regs")
    if storage is not None:
        return declined(f"{key.dtype}: {storage}")
    fit = regs_fit(key.cell, key.hidden_size, B, props, clusters=key.clusters)
    if not fit.ok:
        return declined(fit.reason, fit)
    chunked = sw.wavefront and L > 1 and k < T
    if chunked and key.clusters is None:
        fit = layer_share_fit(key.cell, key.hidden_size, B, props, L, fit, "regs")
    return PersistentChoice("regs", fit, None, chunked, k if chunked else T, given_count(key))


def _mma_choice(key, declined) -> PersistentChoice:
    """The tensor-core grid kernel for ``key`` (named as its family): bfloat16 / float16 keys
    only (mma.MMA_DTYPES_REASON says why not the others). A grid kernel: one launch a layer
    over all T steps (it needs every SM, so layers never overlap), as the grid family."""
    fit = mma_fit(key.cell, key.hidden_size, key.batch, key.device.props(), key.dtype)
    if not fit.ok:
        return declined(fit.reason, fit)
    return PersistentChoice("mma", fit, None, False, key.steps)


def _mmac_choice(key, declined) -> PersistentChoice:
    """The tensor-core cluster kernel for ``key`` (named as its family), at ``key.clusters``
    clusters where given (else ``mmac.cluster_count``'s): bfloat16 / float16 keys only
    (mma.MMA_DTYPES_REASON). One launch a layer over all T steps after one W.x GEMM a layer,
    never chunked: layers of this family overlapping along the wavefront are not built (the
    count's cap is one launch's, ``counts.count_schedules``)."""
    fit = mmac_fit(key.cell, key.hidden_size, key.batch, key.device.props(), key.dtype,
                   clusters=key.clusters)
    if not fit.ok:
        return declined(fit.reason, fit)
    return PersistentChoice("mmac", fit, None, False, key.steps, given_count(key))


def _solo_choice(key, declined) -> PersistentChoice:
    """The block-persistent kernel for ``key`` (named as its family): one launch a layer over
    all T steps, never chunked, even with the wavefront (each launch wants every SM: its
    blocks hold all of R for their batches, so a layer's share of the SMs would only cut
    its batch into more waves), after one W.x GEMM a layer."""
    storage = persistent_storage_declines(key.dtype, "solo")
    if storage is not None:
        return declined(f"{key.dtype}: {storage}")
    fit = solo_fit(key.cell, key.hidden_size, key.batch, key.device.props())
    if not fit.ok:
        return declined(fit.reason, fit)
    return PersistentChoice("solo", fit, None, False, key.steps)


def _stack_fit(key) -> StackFit:
    return stack_fit_of(key.cell, key.hidden_size, key.batch, key.num_layers, key.input_size,
                        key.device.props(), key.dtype, steps=key.steps)


def stack_choice(key) -> tuple[StackFit | None, str]:
    """(StackFit or None, a note for the plan's fit string): the stack kernel of the key's
    precision (``stack_fit_of``) where it fits and, for the fp32 kernel, the batch fills
    more than a quarter of its lanes (its FMAs are sized for PS_BMAX batches whatever B is:
    LSTM four layers, H100, stack vs per-layer grid kernels: H 512 B 32 3.08 vs 3.81 ms, B
    16 3.03 vs 2.94, B 8 3.04 vs 2.63; H 256 the stack was faster at B 8-32 too; GRU four
    layers, H200, stack vs the selector's best other: H 256 B 8 1.22 vs 1.04 ms, B 32 1.27 vs
    1.42, B 64 1.79 vs 1.81; H 512 B 8 2.05 vs 1.50, B 32 2.09 vs 2.72, B 64 3.14 vs 3.72; then
    without multiplying its zero row groups, B 32 / 64: H 256 1.09 / 1.49, H 512 1.79 / 2.59
    ms, B 8 not re-measured). The
    tensor-core stack kernel skips its n8 tiles past B, so its work falls with the batch: no
    batch rule (not measured yet)."""
    st = _stack_fit(key)
    if not st.ok:
        return None, f"; stack kernel not used: {st.reason}"
    if not st.storage_io and 4 * key.batch <= PS_BMAX:
        return None, (f"; stack kernel not used: batch {key.batch} <= {PS_BMAX // 4} "
                      f"(its lanes cover {PS_BMAX} batches)")
    return st, ""


# --------------------------------------------------------------------------------------------
# Candidates (the schedules themselves: schedules.py)


def fitting_families(shape: "Shape", device) -> dict[str, str]:
    """{family: why it fits} for every persistent family that fits ``shape`` on ``device``
    (a kernels.limits.DeviceLimits), as the fits see the shape (its callers handle variable
    lengths first: the persistent kernels run the whole batch every step, choose_persistent
    declines a pattern). No stack kernel for tf32 (STACK_TF32_REASON; bfloat16 /
    float16 take the tensor-core stack kernel: ``stack_fit_of``); the tensor-core grid
    kernels ('mma', 'mmac': grid and cluster) for bfloat16 / float16 only
    (mma.MMA_DTYPES_REASON)."""
    props = device.props()
    out = {}
    st = stack_fit_of(shape.cell, shape.hidden, shape.batch, shape.layers, shape.input_size,
                      props, shape.dtype, steps=shape.steps)
    if st.ok and not persistent_storage_declines(shape.dtype, "stack"):
        out["stack"] = st.reason
    for kind in ("cluster", "grid"):
        f = persistent_fit(shape.cell, shape.hidden, shape.batch, props, kind=kind)
        if f.ok:
            out[kind] = f.reason
    rf = regs_fit(shape.cell, shape.hidden, shape.batch, props)
    if rf.ok and not persistent_storage_declines(shape.dtype, "regs"):
        out["regs"] = rf.reason
    mf = mma_fit(shape.cell, shape.hidden, shape.batch, props, shape.dtype)
    if mf.ok:
        out["mma"] = mf.reason
    mc = mmac_fit(shape.cell, shape.hidden, shape.batch, props, shape.dtype)
    if mc.ok:
        out["mmac"] = mc.reason
    so = solo_fit(shape.cell, shape.hidden, shape.batch, props)
    if so.ok and not persistent_storage_declines(shape.dtype, "solo"):
        out["solo"] = so.reason
    return out


def with_persistent_backward(schedule: Schedule) -> Schedule:
    """``schedule`` with the persistent backward kernel its cost model prefers (a training
    shape's candidate; PlanKey.backward 'persistent')."""
    return replace(schedule, name=f"{schedule.name}+pbwd", backward="persistent")


def with_regs_backward(schedule: Schedule) -> Schedule:
    """``schedule`` (a regs forward's) with the register-resident cluster backward
    (PlanKey.backward 'regs'; 'regs/8+rbwd')."""
    return replace(schedule, name=f"{schedule.name}+rbwd", backward="regs")


def regs_backward_candidates(shape: "Shape", device,
                             regs: tuple[Schedule, ...]) -> tuple[Schedule, ...]:
    """The ``regs`` forward schedules (the rule's count and the others) with the
    register-resident backward, for a training shape whose precision it runs (float32)
    where its fit (the layers overlapping along the reverse wavefront, as the candidates
    run) accepts the shape; else none. Timed beside the '+pbwd' ones: the selector takes
    it only where it is faster."""
    if not shape.train or not regs or persistent_storage_declines(shape.dtype, "regs_bwd"):
        return ()
    fit = regs_bwd_fit(shape.cell, shape.hidden, shape.batch, device.props(),
                       layers=shape.layers)
    return tuple(with_regs_backward(s) for s in regs) if fit.ok else ()


def candidates(shape: "Shape", device, cluster_cap=None) -> tuple[Schedule, ...]:
    """Every schedule worth timing for ``shape``: the persistent families that fit (solo,
    stack, mmac and mma (bf16 / fp16), cluster, regs, grid: each runs the recurrence with R
    on chip)
    and the cluster families at other counts (``counts.count_schedules``, capped by
    ``cluster_cap(fit, dtype)``: an
    occupancy.ClusterCap, default derived from the properties), then the paper schedules. For
    a training shape where the persistent backward fits, also each persistent family with
    it (or, where none fits, ib10 with it), and with the other of the grid kernel and its
    cluster-pair form (``grid_pair_alternatives``): first where its cost model expects it to
    win (``prefers_persistent_backward``), else after the persistent families; and the regs
    forwards with the register-resident backward ('+rbwd', ``regs_backward_candidates``)
    after those. A variable-length shape: ``varlen_schedules`` (the persistent kernels
    decline a per-step batch). The order
    is the order of timing (the likeliest winners first, so a spent budget cuts the least
    likely)."""
    if shape.varlen:
        return varlen_schedules()
    fams = fitting_families(shape, device)
    # solo first: it fits at hidden <= 128 only, where it is expected to win at batch >= 128
    persistent = tuple(persistent_schedule(f)
                       for f in ("solo", "stack", "mmac", "cluster", "regs", "mma", "grid")
                       if f in fams)
    counts = tuple(c for f in CLUSTER_FAMILIES if f in fams
                   for c in count_schedules(shape, device, f, cluster_cap))
    # the regs forwards (the rule's count first) with the register-resident backward
    rbwd = regs_backward_candidates(shape, device, tuple(
        s for s in persistent + counts if s.family == "regs"))
    fit = backward_fit(shape, device) if shape.train else None
    if fit is None or not fit.ok:
        if "stack" in fams and prefers_stack_backward(shape, device):   # its own fit
            return (with_persistent_backward(persistent_schedule("stack")),) + rbwd \
                + persistent + counts + paper_schedules()
        return rbwd + persistent + counts + paper_schedules()
    forwards = persistent or (paper_schedule("ib10"),)
    # and the other of the grid kernel and its pair form, each timed (grid_pair_alternatives)
    pbwd = tuple(with_persistent_backward(s) for s in forwards) \
        + grid_pair_alternatives(shape, device, fit, forwards)
    # the other counts once each, with the backward the cost model prefers (the count is
    # the forward kernel's: the backward does not change which count is fastest)
    if prefers_persistent_backward(shape, device, fit):
        return pbwd + rbwd + tuple(with_persistent_backward(s) for s in counts) \
            + persistent + paper_schedules()
    return persistent + counts + pbwd + rbwd + paper_schedules()


MMAC_HEURISTIC_BATCH = 128
"""The most batches at which the heuristic takes the tensor-core cluster kernel (one layer;
``forward_heuristic`` rule 2: its wide form past 64, and a tie with cuBLAS at B 256)."""

GRID_MAX_WORK = 16384
"""hidden x batch up to which the heuristic takes the grid kernel: past it (more h tiles a
step, more cells a thread) cuBLAS wins (LSTM L4 H1024 B64 forward: grid 31.7 ms, the paper
rung 12.5)."""


def heuristic(shape: "Shape", device) -> Schedule:
    """The deterministic choice without timing (``RNNRT_AUTOTUNE=0``): the forward's
    (``forward_heuristic``), with the persistent backward kernel for a training shape where
    the cost models prefer it: after the stack forward the stack backward
    (``prefers_stack_backward``), else ``prefers_persistent_backward``."""
    sched = forward_heuristic(shape, device)
    if sched.family == "stack" and prefers_stack_backward(shape, device):
        return with_persistent_backward(sched)
    if prefers_persistent_backward(shape, device):
        return with_persistent_backward(sched)
    return sched


def forward_heuristic(shape: "Shape", device) -> Schedule:
    """The forward's deterministic choice, a decision table fitted
    to the wide sweep's timings of every candidate (H100, 200 points; taking it instead of the
    timed choice costs 5% in geometric mean there):
      1. the stack kernel where it fits, the batch fills more than a quarter of its lanes and
         hidden >= 256 (LSTM, several layers), float32 only (the tensor-core stack kernel at
         bf16 / fp16 is a candidate the selector times: H100, paper shape, bf16 1.78 ms
         against cuBLAS rungs' 1.46-1.98, `kernels/stack-bench-mma-paper-...-20261128T021723.json`:
         not a clear win to take untimed); past 64 batches in batch groups where they fit
         (H200, L4 H 256 B 128 forward: LSTM 1.77 ms against ib10's 2.81, GRU 1.50 against
         2.57);
      2. the tensor-core cluster kernel ('mmac', bfloat16 / float16) where it fits, one
         layer and batch <= MMAC_HEURISTIC_BATCH (H200, float16, forward: LSTM H 256 B 8 / 32
         / 64 0.26 / 0.27 / 0.27 ms against the FMA cluster kernel's 0.92 / 0.93 / - and
         cuBLAS's 0.49-0.57; at H 128 B 8 0.19 against the cluster kernel's 0.30,
         `sweep/sweep-wide-float16-l1-h128-256-mmac-lstm-gru-nvidia-h200-20261129T082936.jsonl`;
         B 128 in its wide form: LSTM H 128 / 256 0.28 / 0.37 ms against the
         register-resident kernel's 0.40 and cuBLAS's 0.66; at B 256 H 256 a tie with
         cuBLAS, `sweep/sweep-wide-float16-l1-h128-256-b128-256-mmacw-*-nvidia-h200-*.jsonl`);
         its grid form (no cluster holds R) too, wherever it fits (batch <= 32; H200, float16,
         H 1024, its blocks in pairs sharing the staging of h_t: B 8 LSTM / GRU 0.40 / 0.37
         ms against the cuBLAS rungs' best 0.69 / 0.63; B 32 0.67 / 0.63 against 0.80 /
         0.73, `sweep/sweep-wide-float16-l1-h1024-b8-32-mmacg-pairs-lstm-gru-nvidia-h200-
         20261129T175752.jsonl`; before the pairs B 32 was a tie, 0.78 / 0.76 against 0.80 /
         0.72, and the rule took the rung there);
      3. the cluster kernel where it fits and hidden <= 128;
      4. the grid kernel where it fits and hidden x batch <= GRID_MAX_WORK;
      5. cuBLAS: the paper rung (pre-transposed weights) at batch >= 128, else chunks of 10
         without the transposition (at batch 8 cuBLAS's kernel for the transposed product of
         so few rows is slow: 3.4 against 0.8 ms at LSTM L1 H128 B8)."""
    if shape.varlen:   # the pre-transposed paper rung: fast at the few rows of late steps
        return paper_schedule("paper")
    fams = fitting_families(shape, device)
    if ("stack" in fams and 4 * shape.batch > PS_BMAX and shape.hidden >= 256
            and shape.dtype == "float32"):
        return persistent_schedule("stack")
    if "mmac" in fams and shape.layers == 1 and shape.batch <= MMAC_HEURISTIC_BATCH:
        return persistent_schedule("mmac")
    if "cluster" in fams and shape.hidden <= 128:
        return persistent_schedule("cluster")
    if "grid" in fams and shape.hidden * shape.batch <= GRID_MAX_WORK:
        return persistent_schedule("grid")
    return paper_schedule("paper" if shape.batch >= 128 else "ib10")


def with_family(key, schedule: Schedule):
    """``key`` (a PlanKey) running ``schedule``: its switches, family and cluster count, and
    for a training key the backward it names."""
    return replace(key, switches=schedule.switches, family=schedule.family,
                   backward=schedule.backward if key.train else None,
                   clusters=schedule.clusters)
