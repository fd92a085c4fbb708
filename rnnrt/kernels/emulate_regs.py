"""A NumPy emulation of the register-resident cluster kernels' cut (regs.py's fit; the
backward's: regs_bwd.py's), and the registry's NumPy twins of those kernels.

``emulate_regs`` runs a layer through ``emulate.emulate`` (block by block, step by step, each
(b, j) written by exactly one thread, checked at every step's barrier) with the kernel's own
order of the sums over k (``lane_tree``: each lane's 4-column partial, then the butterfly
tree over the 32 lanes) and its own cell owners (``regs.lane_cells``). ``emulate_regs_bwd`` likewise runs a layer's
backward through ``emulate_bwd.emulate_bwd`` with the backward kernel's order of the sums
(``lane_tree_bwd``: each lane's chain over its 4 rows of every gate, then the same tree) and
cell owners (``regs_bwd.lane_cells``).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..cells import get_cell
from .budget import ceil_div
from .emulate import emulate, twin_of
from .persistent import CLUSTER_BATCH
from .emulate_bwd import emulate_bwd
from .emulate_bwd import twin_of as bwd_twin_of
from .regs import BLOCK_SIZES, RG_K, RegsFit, kernel_name, lane_cells, regs_geometry
from .regs_bwd import BLOCK_SIZES as BWD_BLOCK_SIZES
from .regs_bwd import RegsBwdFit, regs_bwd_geometry
from .regs_bwd import kernel_name as bwd_kernel_name
from .regs_bwd import lane_cells as bwd_lane_cells


def lane_chain_tree(rl: np.ndarray, hl: np.ndarray) -> np.ndarray:
    """[M, B] sums of rows rl [M, 32, E] times rows hl [B, 32, E] (lane l's E columns of each,
    in the order its chain takes them), summed as the register-resident kernels sum: lane
    l's chain (a product, then E - 1 FMAs, each rounded once: computed in float64 and
    rounded to the working dtype, exactly an fp32 FMA but for rare double roundings), then
    the reduce-scatter's tree: lanes l and l + 16 added, then l and l + 8, ..., l and l + 1
    (every value of the butterfly meets this same tree)."""
    dtype = np.result_type(rl, hl)
    r = rl[:, None].astype(np.float64)     # [M, 1, 32, E]
    h = hl[None].astype(np.float64)        # [1, B, 32, E]
    p = (r[..., 0] * h[..., 0]).astype(dtype)                   # [M, B, 32]
    for e in range(1, rl.shape[-1]):
        p = (p.astype(np.float64) + r[..., e] * h[..., e]).astype(dtype)
    for half in (16, 8, 4, 2, 1):
        p = p[..., :half] + p[..., half:2 * half]
    return p[..., 0]


def _lanes(a: np.ndarray, blocks: int) -> np.ndarray:
    """a [M, blocks*H] (``blocks`` blocks of H <= RG_K columns: the gates, column q*H + j) as
    the lanes hold it: [M, 32, 4*blocks]. Gate-interleaved (element m = j*blocks + q, zeros
    past blocks*H: the backward's dg buffers), lane l's float4 chunks l, l + 32, ... in that
    order (elements 4(l + 32k) .. 4(l + 32k) + 3). With one block: columns 4l .. 4l + 3 (the
    forward's)."""
    M, K = a.shape
    H = K // blocks
    inter = np.zeros((M, RG_K, blocks), a.dtype)
    inter[:, :H, :] = a.reshape(M, blocks, H).transpose(0, 2, 1)
    return inter.reshape(M, blocks, 32, 4).transpose(0, 2, 1, 3).reshape(M, 32, 4 * blocks)


def lane_tree(rs: np.ndarray, ht: np.ndarray) -> np.ndarray:
    """gh [G, Ub, B] of a block's rows rs [G, Ub, H] and h_t ht [B, H], summed as the forward
    kernel sums (``lane_chain_tree``: lane l's partial over columns 4l..4l+3, then the
    butterfly's tree)."""
    G, Ub, H = rs.shape
    sums = lane_chain_tree(_lanes(rs.reshape(G * Ub, H), 1), _lanes(ht, 1))
    return sums.reshape(G, Ub, ht.shape[0])


def lane_tree_bwd(gates: int):
    """The register-resident backward's products(rs, dg) for emulate_bwd: dh_rec [Ub, Bc] of
    a block's rows of R^T rs [Ub, G*H] and dg_{t+1} [Bc, G*H], lane l's chain over its
    chunks of the gate-interleaved row (``_lanes``), then the butterfly's tree."""
    def products(rs, dg):
        return lane_chain_tree(_lanes(rs, gates), _lanes(dg, gates))
    return products


def emulate_regs(cell: str, fit: RegsFit, gx, R, bw, br, h0, c0=None, train: bool = True):
    """``emulate.emulate`` with the register-resident kernel's sums and cells (same
    arguments and results: (h [T+1, B, H], c, act))."""
    return emulate(cell, fit, gx, R, bw, br, h0, c0, train, products=lane_tree,
                   owners=lane_cells)


def twin_fit(cell: str, batch: int, hidden: int, units_per_block: int | None = None,
             geometry=regs_geometry, block_sizes=BLOCK_SIZES):
    """The fit the twins assume (the forward's; with regs_bwd's ``geometry`` and
    ``block_sizes`` the backward's): one cluster per CLUSTER_BATCH batches, the first block
    size that fits (neither changes the order of any sum)."""
    tries = [geometry(cell, hidden, batch, t, ceil_div(batch, CLUSTER_BATCH), units_per_block)
             for t in block_sizes]
    return next((f for f in tries if f.ok), tries[0])


def _k_tile_checked(fit, k_tile):
    """``fit``, declined where the launch's k_tile is not RG_K (the kernels trap on it)."""
    if fit.ok and k_tile != RG_K:
        return replace(fit, ok=False, reason=f"k_tile {k_tile} != RG_K {RG_K}")
    return fit


def _fit_of(cell, B, H, units_per_block, k_tile, cluster):
    fit = _k_tile_checked(twin_fit(cell, B, H, units_per_block), k_tile)
    return kernel_name(cell), fit, {"products": lane_tree, "owners": lane_cells}


def regs_twin(cell: str):
    """The registry's NumPy twin of ``cell``'s register-resident kernel."""
    return twin_of(get_cell(cell).name, _fit_of, kernel_name(cell))


# --- the backward -----------------------------------------------------------------------------

def emulate_regs_bwd(cell: str, fit: RegsBwdFit, dhin, dh_n, R, act=None, st=None, dc_n=None,
                     block_order=None) -> dict:
    """``emulate_bwd.emulate_bwd`` with the register-resident backward's sums and cells (same
    arguments and results: {"dgx", "dgh", "dh0", "dc0"}; fp32 only, as the kernel)."""
    return emulate_bwd(cell, fit, dhin, dh_n, R, act, st, dc_n, block_order,
                       products=lane_tree_bwd(fit.gates), owners=bwd_lane_cells)


def _bwd_fit_of(cell, B, H, units_per_block, k_tile, cluster):
    fit = twin_fit(cell, B, H, units_per_block, regs_bwd_geometry, BWD_BLOCK_SIZES)
    return bwd_kernel_name(cell), _k_tile_checked(fit, k_tile), {
        "products": lane_tree_bwd(fit.gates), "owners": bwd_lane_cells}


def regs_bwd_twin(cell: str):
    """The registry's NumPy twin of ``cell``'s register-resident backward kernel."""
    return bwd_twin_of(get_cell(cell).name, _bwd_fit_of, bwd_kernel_name(cell))
