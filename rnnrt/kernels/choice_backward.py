"""The persistent backward of a training plan key: which kernel runs it and how it is cut
(``choose_persistent_backward``), and the cost models' verdict on whether it pays
(``prefers_persistent_backward``). Part of the one place that decides which kernel runs
(``choice.py``, which re-exports every name here: its callers import them from there too).

``choose_persistent_backward(key)``: for a training key that names the persistent backward
(``PlanKey.backward``; 'regs': the register-resident cluster backward, ``regs_backward``),
the kernel's fit and the steps one launch covers (a multi-layer
cluster plan runs each layer in chunks that overlap the layers beside it along the reverse
wavefront: ``backward_steps_per_launch``), or why the plan keeps the per-step backward.
Where the forward runs the stack kernel (every layer in one launch) and the stack backward
fits (``stack_bwd.stack_bwd_fit``; after the tensor-core stack forward, at bfloat16 / float16,
the tensor-core stack backward: ``stack_mma_bwd.stack_mma_bwd_fit``), 'persistent' and
'stack' take the stack backward: every layer's chain in one launch (``stack_backward``).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ..precision import get_precision
from .mma import MMA_DTYPES
from .mma_bwd import mma_bwd_fit
from .persistent_bwd import BwdFit, PairBwdFit, persistent_bwd_fit
from .regs_bwd import regs_bwd_fit
from .schedules import Schedule
from .stack_bwd import StackBwdFit, stack_bwd_fit
from .stack_mma_bwd import stack_mma_bwd_fit

if TYPE_CHECKING:   # the Shape of selector.py, for the annotations only
    from .selector import Shape


@dataclass(frozen=True)
class BackwardChoice:
    """What ``PlanKey.backward`` runs: the persistent backward kernel's ``fit`` where it
    runs, else ``fallback`` (why the plan keeps the per-step backward). steps_per_launch:
    the steps k one launch covers where it runs (``backward_steps_per_launch``; T: one
    launch a layer); chunked: k < T (each layer's chain as launches of k steps, last chunk
    first, overlapping the layers beside it along the reverse wavefront)."""

    fit: BwdFit | None
    fallback: str | None = None
    steps_per_launch: int = 0
    chunked: bool = False
    stack: StackBwdFit | None = None   # the stack backward runs (then fit is None)

    @property
    def runs(self) -> bool:
        return self.fallback is None

    def describe(self) -> str:
        """The backward plan's ``fit`` string (the chunking too, so records show it)."""
        if self.stack is not None:
            return f"{self.stack.describe()}; {self.stack.reason}"
        if self.fit is None:
            return self.fallback or ""
        s = self.fit.describe() + (f"; {self.fit.reason}" if self.fit.ok else "")
        if self.chunked:
            s += f"; along the reverse wavefront, launches of {self.steps_per_launch} steps"
        return s


def overlapping_layers(key) -> int:
    """The layers whose cluster backward launches overlap along the reverse wavefront for
    ``key`` (the cluster kernel's rule count is then their 1/layers share of the SMs): the
    stack's with the wavefront, else 1 (backward_steps_per_launch's condition)."""
    return key.num_layers if key.switches.wavefront else 1


def backward_steps_per_launch(key, fit: BwdFit) -> int:
    """The steps k one persistent backward launch covers for ``key`` (a training PlanKey)
    with ``fit`` (its kernel's): the switches' input-batching chunk
    (``steps_per_input_gemm(T)``, as the chunked forward) where the cluster kernel runs a
    stack of several layers with the wavefront, so that layer l-1's chunk starts as soon as
    layer l's launch and dx GEMM of that chunk are done instead of after layer l's whole
    chain (issue 22: at LSTM L4 H128 B32 the four 260 us launches ran back to back); at one
    layer, where ``key.wgrad_steps`` asks for the weight gradients in chunks, launches of that
    chunk: each chunk's dx and weight GEMMs then run beside the rest of the chain on the SMs
    the clusters leave idle (LSTM L1 H128 B256: 64 of 132 SMs busy, the tail after the chain a
    quarter of the backward). Measured slower (H200, fwd+bwd, one launch / chunks of 50, 25,
    10, 5 steps; `kernels/backward-probe-l1-wgrad-launches-...-20261128T181500.json`): LSTM
    H128 B256 1.424 / 1.451 / 1.530 / 1.644 / 1.843 ms, B128 0.918 / 0.953 / 0.989 / 1.084 /
    1.238, GRU H128 B256 1.049 / 1.074 / 1.141 / 1.273 / 1.399: the launches' starts (R^T
    into shared memory, the pipeline's fill; not profiled) cost more than the tail they hide,
    so the rule (``wgrad_rule_steps``: one chunk) keeps one launch. Else T, one launch a
    layer: the grid kernel needs every SM (two launches may never run at once, so chunks
    would only add launches), and without the wavefront the layers share one recurrence
    stream."""
    T = key.steps
    if fit.cluster and key.num_layers == 1 and key.wgrad_steps is not None:
        return max(1, min(T, key.wgrad_steps))
    if not fit.cluster or key.num_layers < 2 or not key.switches.wavefront:
        return T
    return key.switches.steps_per_input_gemm(T)


def stack_backward(key) -> tuple[StackBwdFit | None, str]:
    """(the stack backward's fit where it runs for ``key``, else None; why not): it runs
    where the key's forward runs the stack kernel (kernels/choice.py ``choose_persistent``:
    it reads the act and c that kernel saved, all layers in one buffer each) and the stack
    backward of the forward's family accepts the shape: after the fp32 stack kernel
    ``stack_bwd_fit``, after the tensor-core one (bfloat16 / float16) ``stack_mma_bwd_fit``
    (the tensor-core stack backward, in cluster pairs)."""
    from .choice import choose_persistent   # choice.py imports this module at its top
    if not key.switches.persistent:
        return None, "the forward runs no persistent kernel (the persistent switch is off)"
    fwd = choose_persistent(key)
    if fwd.stack is None:
        return None, f"the forward does not run the stack kernel ({fwd.describe()})"
    fit = _stack_backward_fit(key.cell, key.hidden_size, key.batch, key.num_layers,
                              key.input_size, key.device.props(), key.dtype, key.steps,
                              fwd.stack.storage_io)
    return (fit, "") if fit.ok else (None, fit.reason)


def grouped_stack_backward_pays(fit) -> bool:
    """Whether the stack backward's fit ``fit`` is one the plans take for 'persistent' (and
    the heuristic): any of one batch group; in batch groups (B = 64 x groups) the cluster
    pairs (either cell) or LSTM's one-block kernel where the groups fill at least three
    quarters of the SMs. Measured on the H200 (L4, T 100, fwd+bwd, graph, the stack forward
    then each backward in one process, `kernels/backward-probe-stack-bwd-batch-groups-...-20261128T200949.json`): the
    pairs in groups against the best other backward, LSTM H 256 B 128 (128 of 132 SMs) 5.00
    ms / 5.92 (the cluster kernel), H 128 B 256 3.20 / 3.83; GRU H 256 B 128 4.56 / 4.95 (the
    per-step one), H 128 B 256 2.95 / 3.10; at 64 SMs (H 128 B 128) they lost: LSTM 2.83 /
    2.65, GRU 2.63 / 2.23. The one-block kernel in groups
    (`sweep/sweep-wide-l4-h128-256-b128-256-groupsbwd-...-20261128T194319.jsonl`): LSTM H 256
    B 128 5.59 / 5.96, H 128 B 256 3.61 / 3.85; GRU lost at all three, as at B <= 64."""
    if fit.groups <= 1:
        return True
    return (fit.pair or fit.cell == "lstm") and 4 * fit.blocks >= 3 * fit.sms


def _after_stack_forward(key) -> bool:
    """Whether ``key``'s forward runs a stack kernel (kernels/choice.py choose_persistent)."""
    from .choice import choose_persistent   # choice.py imports this module at its top
    return bool(key.switches.persistent and choose_persistent(key).stack is not None)


def _stack_backward_fit(cell, hidden, batch, layers, input_size, props, dtype, steps,
                        tensor_cores: bool) -> StackBwdFit:
    """The stack backward's fit after a stack forward: the tensor-core one after the
    tensor-core forward (``tensor_cores``: the key's precision is bfloat16 / float16), else
    the fp32 one."""
    if tensor_cores:
        return stack_mma_bwd_fit(cell, hidden, batch, layers, input_size, props, dtype,
                                 steps=steps)
    return stack_bwd_fit(cell, hidden, batch, layers, input_size, props, steps=steps)


def choose_persistent_backward(key) -> BackwardChoice:
    """The persistent backward for ``key`` (a training plan.PlanKey with ``backward`` set):
    for 'stack', or 'persistent' where the forward runs the stack kernel, the stack backward
    where it fits (``stack_backward``; 'stack' falls back to the per-step backward with the
    reason where not); else the kernel's fit on ``key.device`` (persistent_bwd.persistent_bwd_fit:
    the grid or the cluster kernel as ``key.backward`` names it, or for 'persistent' the one
    whose step its cost model makes shorter) where it fits and the sequence fits its barrier
    counter, with the steps a launch covers (``backward_steps_per_launch``), else a fallback
    saying why. (A key with ``backward`` has no ``batch_sizes``: PlanKey refuses the pair,
    the kernel running the whole batch every step.)
    A key of the tensor-core family (``family`` 'mma') with ``backward`` 'persistent' runs the
    tensor-core backward grid kernel (mma_bwd.mma_bwd_fit) where it fits, else the above with
    the reason it was not used in the fit string (``mma_backward``); 'grid', 'pair' and
    'cluster' name the FMA kernels whatever the family ('pair': the grid kernel in cluster
    pairs, fp32 on sm_90+; where it declines, the per-step backward with the reason; with
    ``bwd_units`` 'grid' and 'pair' run that U). 'regs' names the register-resident
    cluster backward (``regs_backward``), whatever the forward runs."""
    if key.backward == "regs":
        return regs_backward(key)
    note = ""   # why the plan's backward is not the one its forward's family would take
    # a cluster count (PlanKey.bwd_clusters) names the cluster kernel
    if key.backward == "stack" or (key.backward == "persistent" and key.bwd_clusters is None):
        st, why = stack_backward(key)
        if (st is not None and key.backward == "persistent"
                and not grouped_stack_backward_pays(st)):
            form = "cluster-pair" if st.pair else "one-block"
            st, why = None, (f"{st.groups} batch groups of the {form} {st.cell.upper()} "
                             f"kernel on {st.blocks} of {st.sms} SMs (grouped_stack_backward_"
                             f"pays: measured slower than the per-layer backward)")
        if st is not None:
            return BackwardChoice(None, stack=st, steps_per_launch=key.steps)
        if key.backward == "stack":
            return BackwardChoice(None, f"stack backward declined on {key.device.name}: {why}; "
                                        f"ran the per-step backward")
        if _after_stack_forward(key):   # the stack forward ran, its backward declines
            note = f"; stack backward not used: {why}"
    kind = None if key.backward == "persistent" else key.backward
    clusters = key.bwd_clusters   # PlanKey refuses it with 'grid' and 'stack'
    if clusters is not None:
        kind = "cluster"
    if key.family == "mma" and kind is None:
        mma, mma_note = mma_backward(key)
        if mma is not None:
            return mma
        note += mma_note
    fit = persistent_bwd_fit(key.cell, key.hidden_size, key.batch, key.device.props(),
                             kind=kind, clusters=clusters, layers=overlapping_layers(key),
                             dtype=get_precision(key.dtype).name,
                             units_per_block=key.bwd_units)   # PlanKey: 'grid' / 'pair' only
    why = _declines(fit, key.steps)
    if why is not None:
        return BackwardChoice(fit, f"persistent backward declined on {key.device.name}: {why}"
                                   f"{note}; ran the per-step backward")
    if note:
        fit = replace(fit, reason=f"{fit.reason}{note}")
    k = backward_steps_per_launch(key, fit)
    return BackwardChoice(fit, steps_per_launch=k, chunked=k < key.steps)


def regs_backward(key) -> BackwardChoice:
    """The register-resident cluster backward (regs_bwd.regs_bwd_fit) for ``key`` (backward
    'regs'; its bwd_clusters the count where given, else the rule's with the layers that
    overlap along the reverse wavefront) where it fits and the key is float32 (the kernel
    has no typed instantiations), chunked as the cluster backward
    (``backward_steps_per_launch``); else a fallback to the per-step backward saying why."""
    from .choice import persistent_storage_declines   # choice.py imports this module
    fit = regs_bwd_fit(key.cell, key.hidden_size, key.batch, key.device.props(),
                       clusters=key.bwd_clusters, layers=overlapping_layers(key))
    why = persistent_storage_declines(key.dtype, "regs_bwd") or _declines(fit, key.steps)
    if why is not None:
        return BackwardChoice(fit, f"register-resident backward declined on "
                                   f"{key.device.name}: {why}; ran the per-step backward")
    k = backward_steps_per_launch(key, fit)
    return BackwardChoice(fit, steps_per_launch=k, chunked=k < key.steps)


def mma_backward(key) -> tuple[BackwardChoice | None, str]:
    """(the tensor-core backward grid kernel's choice for ``key`` where its fit holds and the
    sequence fits its barrier counter, else None; '' or the note saying why not). One
    launch a layer over all T steps (a grid kernel: it needs every SM)."""
    fit = mma_bwd_fit(key.cell, key.hidden_size, key.batch, key.device.props(), key.dtype)
    why = _declines(fit, key.steps)
    if why is not None:
        return None, f"; tensor-core backward not used: {why}"
    return BackwardChoice(fit, steps_per_launch=key.steps), ""


def _declines(fit: BwdFit, steps: int) -> str | None:
    """Why ``fit`` cannot run a launch of ``steps`` steps (it does not fit, or the sequence
    overflows its barrier counter), or None."""
    if not fit.ok:
        return fit.reason
    try:
        fit.check_steps(steps)
    except ValueError as e:
        return str(e)
    return None


def backward_fit(shape: "Shape", device) -> BwdFit:
    """The persistent backward kernel's fit for ``shape`` on ``device`` (DeviceLimits)."""
    return persistent_bwd_fit(shape.cell, shape.hidden, shape.batch, device.props(),
                              layers=shape.layers,   # the candidates run the wavefront
                              dtype=get_precision(shape.dtype).name)


def grid_pair_alternatives(shape: "Shape", device, fit: BwdFit | None,
                           schedules: tuple[Schedule, ...]) -> tuple[Schedule, ...]:
    """The selector's other one of the grid kernel and its cluster-pair form for a training
    shape, so that both are timed: where the cost model's backward (``fit``,
    ``backward_fit``: PlanKey.backward 'persistent', the '+pbwd' candidates) is the pair
    kernel, each of ``schedules`` (the forwards, the stack kernel's left out: after it
    'persistent' is the stack backward) with the grid kernel ('+gbwd', backward 'grid');
    where it is the grid kernel and the pair fits, with the pair ('+ppbwd', backward 'pair');
    else none (where the cost model takes the cluster kernel, at small H, its step has no
    staging for the pair to halve: not worth the selector's budget). The selector keeps
    the fastest: with timing on the pair
    runs only where it measured faster; with timing off the heuristic takes 'persistent',
    whose cost model takes the pair where its modelled step, its exchange included
    (persistent_bwd.PAIR_EXCHANGE_US), is shorter than the grid kernel's."""
    if not shape.train or shape.varlen or fit is None or not fit.ok or fit.cluster:
        return ()
    kind, tag = ("grid", "gbwd") if isinstance(fit, PairBwdFit) else ("pair", "ppbwd")
    other = persistent_bwd_fit(shape.cell, shape.hidden, shape.batch, device.props(),
                               kind=kind, dtype=get_precision(shape.dtype).name)
    if not other.ok:
        return ()
    return tuple(replace(s, name=f"{s.name}+{tag}", backward=kind) for s in schedules
                 if s.family != "stack")


def prefers_stack_backward(shape: "Shape", device) -> bool:
    """For a training shape whose forward runs the stack kernel: the stack backward (every
    layer's chain in one launch) wherever it fits, a GRU's in cluster pairs only: at float32
    the fp32 stack backward, at bfloat16 / float16 the tensor-core one (stack_mma_bwd.py: not
    yet measured, issue 24; the selector's candidates time it first, the per-layer backward
    after). Measured on the H100 (LSTM L4, T 100,
    fwd+bwd, the selector's candidates; the cluster-pair kernel with its 32-batch path,
    `sweep/sweep-wide-l4-h256-512-b8-32-pair32-...-20261128T020139.jsonl`,
    `sweep-wide-l4-h128-512-b8-64-stackpairs-...-20261128T014229.jsonl`): stack+pbwd against
    the stack forward with the per-step backward, H 256 B 32 3.57 / 3.83 ms, H 512 B 32
    6.46 / 7.18, H 512 B 64 8.66 / ~10.1 (the forward heuristic takes the stack kernel from
    B 17; at B 8 the selector took cuBLAS schedules, the stack forward spanning 64 lanes).
    GRU, on the H200 (L4, T 100, fwd+bwd, graph, the selector's candidates, stack+pbwd against
    the stack forward with the per-step backward): the one-block kernel lost at all six points
    (H 256 B 8 / 32 / 64 3.58 / 3.89 / 4.80 ms against 2.78 / 3.12 / 4.16, H 512 B 8 / 32 / 64
    6.09 / 6.79 / 8.98 against 4.40 / 5.48 / 8.87: `ladder/ladder-gru-L4-H*-B*-T100-fwdbwd-
    nvidia-h200-20261128T1724*`); the pair kernel wins at three of the four points the forward
    rule takes the stack at (H 256 B 32 3.05 / 3.13, H 512 B 32 5.21 / 5.46, B 64 8.35 / 8.84)
    and loses 5% at H 256 B 64 (4.37 / 4.15; `...T1747*`, `...T1748*`). In batch groups (B
    over 64): ``grouped_stack_backward_pays``."""
    fit = stack_backward_fit_of(shape, device)
    if fit is None or not fit.ok or not grouped_stack_backward_pays(fit):
        return False
    return shape.cell != "gru" or fit.pair


def stack_backward_fit_of(shape: "Shape", device):
    """The stack backward's fit for ``shape``'s training pass after a stack forward (None where
    none applies: inference, variable lengths, tf32): at float32 the fp32 stack backward's, at
    bfloat16 / float16 the tensor-core stack backward's (after the tensor-core stack forward)."""
    if not shape.train or shape.varlen or shape.dtype not in ("float32",) + MMA_DTYPES:
        return None
    return _stack_backward_fit(shape.cell, shape.hidden, shape.batch, shape.layers,
                               shape.input_size, device.props(), shape.dtype, shape.steps,
                               shape.dtype != "float32")


CUBLAS_BWD_STEP_US = 9.2
"""The per-step backward (cuBLAS GEMM + fused pointwise kernel a step, graph-replayed) of one
layer never went below ~9.2 us a step in the wide sweep (LSTM and GRU L1 at H 128-256 B 8-64:
0.92-0.97 ms for 100 steps)."""
CUBLAS_BWD_LAYER_STEP_US = 3.7
"""With several layers the reverse wavefront overlaps them: ~3.7 us a layer-step at the
small shapes of the wide sweep (LSTM L4 H 128 B 32: 1.49 ms for 4 x 100)."""
CUBLAS_SLOW_ROWS = (8, 128, 6.0)
"""(batch, hidden, factor): at batch <= 8 and hidden <= 128 cuBLAS's kernels for the
per-step products of so few rows are slow in both layouts: ~55 us a step (LSTM and GRU L1
H 128 B 8: 5.4-5.9 ms for 100 steps of backward, L4 8.2-8.6 ms): 6 x the floor."""


CANDIDATE_CHUNK = 10
"""The input chunk k of the selector's persistent candidates (schedules.persistent_schedule:
input_batch 10): a chunked cluster backward's layers start k steps apart."""


def modelled_chain_us(shape: "Shape", fit: BwdFit) -> float:
    """The persistent backward's modelled recurrent chain: one layer's steps after another
    (layers x steps x ``BwdFit.step_us``) for the grid kernel or one layer; for the cluster
    kernel with several layers, chunked along the reverse wavefront (the candidates' chunk
    CANDIDATE_CHUNK; backward_steps_per_launch), the last layer finishes (layers - 1) chunks
    after the first: (steps + (layers - 1) x k) x step_us."""
    if fit.cluster and shape.layers > 1:
        k = min(CANDIDATE_CHUNK, shape.steps)
        return (shape.steps + (shape.layers - 1) * k) * fit.step_us()
    return shape.layers * shape.steps * fit.step_us()


def prefers_persistent_backward(shape: "Shape", device, fit: BwdFit | None = None) -> bool:
    """The cost models' verdict for a training shape: the persistent backward kernel when it
    fits and its modelled recurrent chain (``modelled_chain_us``: chunked along the reverse
    wavefront for the cluster kernel) is shorter than the per-step backward's (steps x the larger
    of CUBLAS_BWD_STEP_US and layers x CUBLAS_BWD_LAYER_STEP_US, times CUBLAS_SLOW_ROWS'
    factor at small batch and hidden). The GEMMs for dx and the weights are alike in both
    and left out. From the models (LSTM, 100 steps): L1 H 128 B 8 0.32 against 5.5 ms
    (taken: the cluster kernel), L4 H 128 B 32 0.42 against 1.5 (taken), L4 H 128 B 256
    1.07 against 1.5 (taken: measured on the H100, the chunked cluster+pbwd 5.04 ms against
    the per-step ib2 5.07), L4 H 512 B 64 7.5 against 1.5 (not: the grid kernel, staging
    dg_t [64, 2048] for 64 blocks a step). ``fit``: ``backward_fit(shape, device)`` where the
    caller has it (a search over units, block sizes and tiles), else computed here."""
    if not shape.train or shape.varlen:   # the kernel runs the whole batch every step
        return False
    if fit is None:
        fit = backward_fit(shape, device)
    if not fit.ok:
        return False
    kernel_us = modelled_chain_us(shape, fit)
    cublas_us = shape.steps * max(CUBLAS_BWD_STEP_US, shape.layers * CUBLAS_BWD_LAYER_STEP_US)
    rows, hidden, factor = CUBLAS_SLOW_ROWS
    if shape.batch <= rows and shape.hidden <= hidden:
        cublas_us *= factor
    return kernel_us < cublas_us
