"""A NumPy emulation of the register-resident cluster kernels' cut (regs.py's fit), and the
registry's NumPy twins of those kernels.

``emulate_regs`` runs a layer through ``emulate.emulate`` (block by block, step by step, each
(b, j) written by exactly one thread, checked at every step's barrier) with the kernel's own
order of the sums over k (``lane_tree``: each lane's 4-column partial, then the butterfly
tree over the 32 lanes) and its own cell owners (``regs.lane_cells``).
"""
from __future__ import annotations

import numpy as np

from ..cells import get_cell
from .budget import ceil_div
from .emulate import emulate, twin_of
from .persistent import CLUSTER_BATCH
from .regs import BLOCK_SIZES, RG_K, RegsFit, kernel_name, lane_cells, regs_geometry


def lane_tree(rs: np.ndarray, ht: np.ndarray) -> np.ndarray:
    """gh [G, Ub, B] of a block's rows rs [G, Ub, H] and h_t ht [B, H], summed as the kernel
    sums: lane l's partial over columns 4l..4l+3 (a product, then three FMAs, each rounded
    once: computed in float64 and rounded to the working dtype, exactly an fp32 FMA but for
    rare double roundings), then the reduce-scatter's tree: lanes l and l + 16 added, then
    l and l + 8, ..., l and l + 1 (every value of the butterfly meets this same tree)."""
    dtype = np.result_type(rs, ht)
    G, Ub, H = rs.shape
    B = ht.shape[0]
    r4 = np.zeros((G, Ub, RG_K), dtype)
    r4[:, :, :H] = rs
    h4 = np.zeros((B, RG_K), dtype)
    h4[:, :H] = ht
    r4 = r4.reshape(G, Ub, 1, 32, 4).astype(np.float64)
    h4 = h4.reshape(1, 1, B, 32, 4).astype(np.float64)
    p = (r4[..., 0] * h4[..., 0]).astype(dtype)                 # [G, Ub, B, 32]
    for e in (1, 2, 3):
        p = (p.astype(np.float64) + r4[..., e] * h4[..., e]).astype(dtype)
    for half in (16, 8, 4, 2, 1):
        p = p[..., :half] + p[..., half:2 * half]
    return p[..., 0]


def emulate_regs(cell: str, fit: RegsFit, gx, R, bw, br, h0, c0=None, train: bool = True):
    """``emulate.emulate`` with the register-resident kernel's sums and cells (same
    arguments and results: (h [T+1, B, H], c, act))."""
    return emulate(cell, fit, gx, R, bw, br, h0, c0, train, products=lane_tree,
                   owners=lane_cells)


def twin_fit(cell: str, batch: int, hidden: int, units_per_block: int | None = None) -> RegsFit:
    """The fit the twins assume: one cluster per CLUSTER_BATCH batches, the first block
    size of BLOCK_SIZES that fits (neither changes the order of any sum)."""
    tries = [regs_geometry(cell, hidden, batch, t, ceil_div(batch, CLUSTER_BATCH),
                           units_per_block) for t in BLOCK_SIZES]
    return next((f for f in tries if f.ok), tries[0])


def _fit_of(cell, B, H, units_per_block, k_tile, cluster):
    fit = twin_fit(cell, B, H, units_per_block)
    if fit.ok and k_tile != RG_K:
        from dataclasses import replace
        fit = replace(fit, ok=False, reason=f"k_tile {k_tile} != RG_K {RG_K}")
    return kernel_name(cell), fit, {"products": lane_tree, "owners": lane_cells}


def regs_twin(cell: str):
    """The registry's NumPy twin of ``cell``'s register-resident kernel."""
    return twin_of(get_cell(cell).name, _fit_of, kernel_name(cell))
