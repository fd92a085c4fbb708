"""How the per-step backward splits its recurrent GEMM along K: ``dh_splits(key)``; and
its weight-gradient GEMMs along their K (the steps): ``wgrad_chunk_steps(key)`` (at the end).

The per-step backward's critical path is, every step of every layer, the pointwise backward
and then dh_{t-1} = dG_h[t] @ R: [B, G*H] @ [G*H, H]. Its output has only B x H elements
(64 x 512 at the paper's shape: ~8 output tiles of cuBLAS's 64 x 64), so cuBLAS runs it on a
handful of the GPU's SMs (44 us a step on the H100, 60% of the backward's time there) while
its K = G*H is long. Split along K into S slices, it is one strided-batched GEMM of S x as
many tiles, each S x shorter, writing S partial sums, and a small kernel adding them in a
fixed order (plan/backward.py ``split_dh``; the same bits every run, no atomics).

The rule, from measurements (forward + backward, graph executor, 100 steps, one GPU of 132
SMs; experiments/results/kernels/backward-probe-splits-*): split 16 ways, else 8, where each
slice keeps >= MIN_SLICE_K of K (a multiple of SLICE_ALIGN elements: 16-byte aligned at every
precision) and the split GEMM has <= SPLIT_CTAS_PER_SM x SMs tiles; else not at all. Where the
step is latency-bound (one layer, small batch) it pays: LSTM L1 H1024 B8 3.65 -> 2.84 ms (S 8),
L1 H512 B32 2.61 -> 2.50 (S 16); in a 4-layer wavefront the GPU is already busy with the
other layers and the dx / dW GEMMs, and 16 slices change little (paper shape 9.98 -> 9.98,
GRU L4 H512 B64 9.94 -> 9.56). Two or four slices were slower than one GEMM at every shape
measured (paper shape 12.8 and 11.1 ms), so the rule never takes them. ``PlanKey.bwd_splits``
sets S exactly (1: one GEMM), for tests and probes. A grouped plan only: ungrouped plans
already run one GEMM a gate.
"""
from __future__ import annotations

from ..cells import get_cell
from .limits import H100_SXM

SPLITS = (16, 8)
"""The split counts the rule takes, first that fits first."""
MAX_SPLITS = SPLITS[0]
MIN_SLICE_K = 64
SLICE_ALIGN = 8
SPLIT_CTAS_PER_SM = 2
TILE = 64
"""The output tile edge the rule assumes cuBLAS uses at these shapes (rows and columns)."""


def dh_splits(key) -> int:
    """S, the K slices of ``key``'s recurrent backward GEMM (1: not split): PlanKey.bwd_splits
    where set, else the rule (module docstring). A key without device limits (a CPU plan)
    is split as for the H100."""
    gh = get_cell(key.cell).gates * key.hidden_size
    if key.bwd_splits is not None:
        s = key.bwd_splits
        if gh % s:   # alignment is the rule's concern (speed), not correctness
            raise ValueError(f"PlanKey.bwd_splits: {s} does not divide K = gates x hidden = "
                             f"{gh} into equal slices")
        return s
    sms = (key.device or H100_SXM).sms
    tiles = -(-key.batch // TILE) * -(-key.hidden_size // TILE)
    for s in SPLITS:
        if (gh % s == 0 and gh // s >= MIN_SLICE_K and (gh // s) % SLICE_ALIGN == 0
                and s * tiles <= SPLIT_CTAS_PER_SM * sms):
            return s
    return 1


def wgrad_chunk_steps(key, granule: int = 1) -> int:
    """The steps of one chunk of ``key``'s weight-gradient GEMMs (plan/backward.py
    ``wgrad_chunks``): PlanKey.wgrad_steps where set, else the rule (``wgrad_rule_steps``:
    the whole sequence, one GEMM after the chain); rounded up to a multiple of ``granule`` (the
    steps a launch of the backward's chain covers: a chunk can start only once a launch has
    written its rows) and capped at the key's steps."""
    T = key.steps
    s = key.wgrad_steps if key.wgrad_steps is not None else wgrad_rule_steps(key)
    g = max(1, int(granule))
    return min(T, -(-s // g) * g)


def wgrad_rule_steps(key) -> int:
    """The rule's chunk (steps) where PlanKey.wgrad_steps is None: the whole sequence (one
    GEMM a weight matrix after the chain). Measured (H100, fp32, forward + backward, graph
    executor; experiments/results/kernels/backward-probe-splits-*-20261128T0736*.json), every
    chunking was slower, the more chunks the slower: LSTM L4 H2048 B64 T50 56.7 ms in one
    chunk, 56.7 / 57.5 / 59.6 in 2 / 4 / 10; L1 H2048 B32 9.85 -> 9.91 / 10.23 / 10.89; GRU
    L4 H2048 B8 15.5 -> 15.9 / 16.7 / 17.9; LSTM L4 H512 B128 T100 17.8 -> 17.9 / 18.2 / 19.2;
    GRU L4 H512 B256 24.9 -> 25.3 / 25.7 / 26.1; LSTM L4 H256 B128 7.10 -> 7.23 / 7.37 / 7.47;
    L4 H128 B256 4.97 -> 4.96 / 4.96 / 5.14. The per-step chain and its dx GEMMs (and the
    layers' chains along the wavefront) already keep the SMs busy: the chunks only compete
    with them and run shorter GEMMs. Where a persistent chain leaves SMs idle (the cluster
    backward of one layer, in launches of the chunk: choice_backward.backward_steps_per_launch)
    they were slower too (H200, LSTM L1 H128 B256 1.42 ms in one chunk, 1.45 / 1.53 / 1.64 in
    chunks of 50 / 25 / 10 steps)."""
    return key.steps


def wgrad_stream_count(key) -> int:
    """Where ``key``'s weight gradients run (plan/backward.py ``wgrad_placement``):
    PlanKey.wgrad_streams where set, else the rule: one layer, 3 (the W side and the R side
    each on a stream of its own, beside the layer's dx GEMMs: nothing else runs in that
    tail); several layers, 1 (the layer's input stream, after its dx GEMMs: the layers below
    run meanwhile). Measured (H100, fp32, forward + backward of the selector's schedule,
    median of 15; experiments/results/kernels/backward-probe-splits-*-20261128T0744*.json),
    placement 1 -> 3: one layer faster at all 8 shapes, by 0.5-2.4% (LSTM H128 B256 1.457 ->
    1.432 ms, H512 B64 3.681 -> 3.628, GRU H512 B64 3.215 -> 3.137, H1024 B8 2.061 ->
    2.039); four layers within +-1.1% either way (LSTM H256 B128 7.12 -> 7.04, H128 B128
    2.74 -> 2.76, GRU H512 B8 3.87 -> 3.91), so not taken there."""
    if key.wgrad_streams is not None:
        return key.wgrad_streams
    return 3 if key.num_layers == 1 else 1
