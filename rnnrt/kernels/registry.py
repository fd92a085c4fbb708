"""The CUDA kernels: one registry, their launch geometry and arguments, and the loader.

``REGISTRY`` is the one list of kernels; ``KERNELS`` (by name) and everything else derive
from it. Each kernel lives in a file of cuda_src/ whose header lists it with its arguments
(a test holds registry, headers and code to each other), and has a NumPy twin
(``twins.py``; the persistent kernels' in ``emulate.py``, ``stack.py``, ``stack_mma.py``,
``stack_bwd.py`` and ``stack_mma_bwd.py``).

Calling convention, uniform for every kernel (as registered: fp32; every non-persistent
kernel also has a typed twin with one element type per pointer, fp32 / bf16 / fp16, which a
plan with 16-bit buffers runs: ``typed.py``)::

    kernel(int rows, int cols, float* out0, int ld_out0, ..., const float* in0, int ld_in0, ...,
           int scalar0, ...)

outputs first, then inputs, each a row-major view passed as a (pointer, ld) pair: element
(r, c) at p[r*ld + c]; ld = 0 broadcasts one row (bias vectors handed to [B, G*H] problems);
then the kernel's int scalars, if it has any (``KernelInfo.scalars``: the persistent kernels'
T and units_per_block). Argument shapes are written in terms of the problem: 'R,4C' is
[rows, 4*cols]; a factor may name a scalar: 'T*R,4C' is [T*rows, 4*cols], '(T+1)*R,C' is
[(T+1)*rows, cols]; a bare number is a fixed extent ('1,2').

The persistent kernels (``persistent=True``) run T steps of a layer (all of them, or one
input-batching chunk in a chunked plan), of a whole stack, or of one layer's backward in one
launch whose grid, block and dynamic shared memory come from a fit (``persistent.Fit``,
``stack.StackFit``, ``stack_bwd.StackBwdFit``, ``persistent_bwd.BwdFit``):
``launch_persistent(fit)``, not ``launch(rows, cols)``. Their barrier counters ``sync`` are
the one pointer that is not float* (``uint_args``).

Nothing here needs CuPy: ``sources.py`` reads the CUDA files, ``library.py`` compiles them.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from . import emulate, emulate_bwd, emulate_regs, mma, mma_bwd, mmac
from . import persistent as pk
from . import regs, regs_bwd
from . import solo
from . import stack
from . import stack_bwd
from . import stack_mma
from . import stack_mma_bwd
from . import twins as knp

POINTWISE_BLOCK = 256
"""Threads per block of the grid-stride kernels (all but transpose)."""
MAX_POINTWISE_BLOCKS = 4096
"""Grid cap of the grid-stride kernels: ~4 waves of 256-thread blocks on an H100 (132 SMs x 8
resident); larger problems loop, so the grid never depends on the time-batched sizes."""
TILE = 32
"""Transpose tile edge (must match TILE in transpose.cu); block (TILE, TILE_ROWS)."""
TILE_ROWS = 8
"""Transpose block rows (must match TILE_ROWS in transpose.cu: its loops count on it)."""
_MAX_GRID_X, _MAX_GRID_Y = 2**31 - 1, 65535
_INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class KernelInfo:
    """One CUDA kernel: where it lives, its arguments, its NumPy twin and its launch geometry.

    outs, ins: ((argument name, shape), ...) in call order; the names are the kernel's pointer
    parameters, the shapes are in terms of the problem ('R,C', 'R,4C', 'C,R' ...).
    tiled: launched as 32x32 tiles with block (32, 8) (transpose), else as a 1-D grid-stride
    loop over rows*cols with 256-thread blocks.
    scalars: names of the int arguments after the pairs, in call order (shapes may use them).
    uint_args: pointer arguments that are unsigned int*, not float* (barrier counters).
    persistent: launched from a persistent.Fit (``launch_persistent``).
    """

    name: str
    file: str
    outs: tuple[tuple[str, str], ...]
    ins: tuple[tuple[str, str], ...]
    numpy_fn: Callable
    tiled: bool = False
    scalars: tuple[str, ...] = ()
    uint_args: tuple[str, ...] = ()
    persistent: bool = False
    # the shapes parsed once: per argument, its rows' and its cols' terms
    # (multiple, scalar name or None, added to the scalar, 'R' / 'C' / None)
    _dims: tuple = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        dims = tuple(tuple(_parse_term(t) for t in spec.split(","))
                     for _, spec in self.outs + self.ins)
        for (arg, spec), d in zip(self.outs + self.ins, dims):
            if len(d) != 2:
                raise ValueError(f"{self.name}: {arg} shape {spec!r} is not 'rows,cols'")
            for _, named, _ in d:
                for scalar, _ in named:
                    if scalar not in self.scalars:
                        raise ValueError(f"{self.name}: {arg} shape {spec!r} names "
                                         f"{scalar!r}, not one of its scalars {self.scalars}")
        names = [a for a, _ in self.outs + self.ins]
        for u in self.uint_args:
            if u not in names:
                raise ValueError(f"{self.name}: uint_args names {u!r}, not an argument")
        object.__setattr__(self, "_dims", dims)

    @property
    def n_outs(self) -> int:
        return len(self.outs)

    @property
    def n_ins(self) -> int:
        return len(self.ins)

    def arg_shapes(self, rows: int, cols: int, **scalars):
        """([(view rows, view cols) per output], [... per input]) of a [rows, cols] problem
        (and the kernel's scalars by name, e.g. T=7, where its shapes use them)."""
        size = {"R": rows, "C": cols}

        def extent(k, named, dims):
            for scalar, add in named:
                if scalar not in scalars:
                    raise ValueError(f"{self.name}: its shapes need the scalar {scalar}")
                k *= int(scalars[scalar]) + add
            for d in dims:
                k *= size[d]
            return k

        shapes = [tuple(extent(*term) for term in dims) for dims in self._dims]
        return shapes[:self.n_outs], shapes[self.n_outs:]

    def launch(self, rows: int, cols: int) -> tuple[tuple, tuple]:
        """(grid, block) of a [rows, cols] problem; kernels loop over what the grid leaves."""
        if self.persistent:
            raise ValueError(f"{self.name}: a persistent kernel; its grid, block and shared "
                             f"memory come from persistent.persistent_fit(): use "
                             f"launch_persistent(fit)")
        _check_problem(self.name, rows, cols)
        if self.tiled:
            tiles_r, tiles_c = -(-rows // TILE), -(-cols // TILE)
            return ((min(tiles_c, _MAX_GRID_X), min(tiles_r, _MAX_GRID_Y), 1),
                    (TILE, TILE_ROWS, 1))
        blocks = -(-(rows * cols) // POINTWISE_BLOCK)
        return (min(blocks, MAX_POINTWISE_BLOCKS), 1, 1), (POINTWISE_BLOCK, 1, 1)

    def launch_persistent(self, fit) -> tuple[tuple, tuple, int]:
        """(grid, block, dynamic shared memory bytes) of a persistent kernel from its
        ``persistent.Fit``; refuses a fit that does not fit (with its reason) or is for
        another kernel."""
        if not self.persistent:
            raise ValueError(f"{self.name}: not a persistent kernel; use launch(rows, cols)")
        if fit.kernel != self.name:
            raise ValueError(f"{self.name}: the fit is for {fit.kernel}")
        if not fit.ok:
            raise ValueError(f"{self.name}: refused, does not fit: {fit.reason}")
        return fit.grid, fit.block, fit.smem_bytes


_FACTOR = re.compile(r"\s*(?:(\d+)?\s*([RC])|(\d+)|\(\s*([A-Za-z_]\w*)\s*\+\s*(\d+)\s*\)"
                     r"|([A-Za-z_]\w*))\s*")


def _parse_term(term: str) -> tuple[int, tuple[tuple[str, int], ...], tuple[str, ...]]:
    """One extent of an argument's shape, a product of factors ('*'), each an integer, R or
    C (optionally with a leading integer: '4C'), a scalar name or (scalar + integer) ->
    (k, ((scalar, add), ...), ('R' | 'C', ...)), the extent being k * prod(scalar + add) *
    prod(rows-or-cols): '4C' -> (4, (), ('C',)), '(T+1)*R' -> (1, (('T', 1),), ('R',)),
    'L*(T+1)*R' -> (1, (('L', 0), ('T', 1)), ('R',)), '4*C*C' -> (4, (), ('C', 'C'))."""
    k, scalars, dims = 1, [], []
    for factor in term.split("*"):
        m = _FACTOR.fullmatch(factor)
        if not m:
            raise ValueError(f"shape term {term!r}: expected factors joined by '*', each "
                             f"k, [k]R, [k]C, S or (S+m)")
        if m[2]:
            k *= int(m[1] or 1)
            dims.append(m[2])
        elif m[3]:
            k *= int(m[3])
        elif m[4]:
            scalars.append((m[4], int(m[5])))
        else:
            scalars.append((m[6], 0))
    return k, tuple(scalars), tuple(dims)


_BINARY = dict(outs=(("out", "R,C"),), ins=(("a", "R,C"), ("b", "R,C")))
_UNARY = dict(outs=(("out", "R,C"),), ins=(("a", "R,C"),))
_RNN = dict(outs=(("h", "R,C"),), ins=(("gx", "R,C"), ("gh", "R,C"), ("bw", "R,C"), ("br", "R,C")))
_DACT = dict(outs=(("out", "R,C"),), ins=(("dy", "R,C"), ("y", "R,C")))
_RNN_BWD = dict(outs=(("dg", "R,C"),), ins=(("dh_above", "R,C"), ("dh_rec", "R,C"), ("h", "R,C")))
# the masked variants (variable-length plans) take h_prev and a row mask [B, 1] besides
_MASK = ("mask", "R,1")
_RNN_MASK = dict(outs=(("h", "R,C"),), ins=_RNN["ins"] + (("h_prev", "R,C"), _MASK))
# the fused forward step kernels: LSTM's and GRU's ins (3H: GRU's gate blocks), and their
# outs without act (the _noact variants an inference plan runs: no gates saved)
_LSTM_FWD_INS = (("gx", "R,4C"), ("gh", "R,4C"), ("bw", "R,4C"), ("br", "R,4C"),
                 ("c_prev", "R,C"))
_GRU_FWD_INS = (("gx", "R,3C"), ("gh", "R,3C"), ("bw", "R,3C"), ("br", "R,3C"),
                ("h_prev", "R,C"))
_LSTM_STATE = (("h", "R,C"), ("c", "R,C"))
_ACT = ("act", "R,4C")
_RNN_BWD_MASK = dict(outs=(("dg", "R,C"), ("dh_prev", "R,C")), ins=_RNN_BWD["ins"] + (_MASK,))
# the split variants (*_bwd_split): dh_rec the sum's base, then the partial products [splits*B, H]
_PARTS = ("parts", "splits*R,C")
_RNN_BWD_SPLIT = dict(outs=_RNN_BWD["outs"],
                      ins=(_RNN_BWD["ins"][0], _RNN_BWD["ins"][1], _PARTS, _RNN_BWD["ins"][2]),
                      scalars=("splits",))
_MASK_PARTS = ("parts", "splits*part_rows,C")   # part_rows <= R: step t's rows
_MASK_SPLIT = ("splits", "part_rows")
_RNN_BWD_MASK_SPLIT = dict(outs=_RNN_BWD_MASK["outs"],
                           ins=(_RNN_BWD["ins"][0], _RNN_BWD["ins"][1], _MASK_PARTS,
                                _RNN_BWD["ins"][2], _MASK), scalars=_MASK_SPLIT)
# persistent kernels: one layer's whole sequence (rows = B, cols = H; scalars T, U, k_tile)
_PERSISTENT = dict(file="persistent.cu", scalars=("T", "units_per_block", "k_tile"),
                   uint_args=("sync",), persistent=True)
_H_SEQ = ("h", "(T+1)*R,C")       # h [T+1, B, H]: slot 0 (h0) read, slots 1..T written
_SYNC = ("sync", f"1,{pk.SYNC_WORDS}")   # the barrier counters (unsigned ints)


def _pins(gates):
    g = f"{gates}C" if gates > 1 else "C"
    return (("gx", f"T*R,{g}"), ("w_hh", f"{g},C"), ("bw", f"R,{g}"), ("br", f"R,{g}"))


REGISTRY: tuple[KernelInfo, ...] = (
    KernelInfo("ew_add", "elementwise.cu", numpy_fn=knp.ew_add, **_BINARY),
    KernelInfo("ew_sub", "elementwise.cu", numpy_fn=knp.ew_sub, **_BINARY),
    KernelInfo("ew_mul", "elementwise.cu", numpy_fn=knp.ew_mul, **_BINARY),
    KernelInfo("ew_sigmoid", "elementwise.cu", numpy_fn=knp.ew_sigmoid, **_UNARY),
    KernelInfo("ew_tanh", "elementwise.cu", numpy_fn=knp.ew_tanh, **_UNARY),
    KernelInfo("ew_relu", "elementwise.cu", numpy_fn=knp.ew_relu, **_UNARY),
    KernelInfo("ew_dsigmoid", "elementwise.cu", numpy_fn=knp.ew_dsigmoid, **_DACT),
    KernelInfo("ew_dtanh", "elementwise.cu", numpy_fn=knp.ew_dtanh, **_DACT),
    KernelInfo("ew_drelu", "elementwise.cu", numpy_fn=knp.ew_drelu, **_DACT),
    KernelInfo("transpose", "transpose.cu", outs=(("out", "C,R"),), ins=(("in", "R,C"),),
               numpy_fn=knp.transpose, tiled=True),
    KernelInfo("lstm_fwd", "lstm.cu", numpy_fn=knp.lstm_fwd, outs=_LSTM_STATE + (_ACT,),
               ins=_LSTM_FWD_INS),
    KernelInfo("gru_fwd", "gru.cu", numpy_fn=knp.gru_fwd, outs=(("h", "R,C"), _ACT),
               ins=_GRU_FWD_INS),
    KernelInfo("rnn_tanh_fwd", "rnn.cu", numpy_fn=knp.rnn_tanh_fwd, **_RNN),
    KernelInfo("rnn_relu_fwd", "rnn.cu", numpy_fn=knp.rnn_relu_fwd, **_RNN),
    KernelInfo("lstm_bwd", "lstm.cu", numpy_fn=knp.lstm_bwd,
               outs=(("dgx", "R,4C"), ("dc_prev", "R,C")),
               ins=(("dh_above", "R,C"), ("dh_rec", "R,C"), ("dc_next", "R,C"),
                    ("act", "R,4C"), ("c", "R,C"), ("c_prev", "R,C"))),
    KernelInfo("gru_bwd", "gru.cu", numpy_fn=knp.gru_bwd,
               outs=(("dgx", "R,3C"), ("dgh", "R,3C"), ("dh_prev", "R,C")),
               ins=(("dh_above", "R,C"), ("dh_rec", "R,C"), ("act", "R,4C"),
                    ("h_prev", "R,C"))),
    KernelInfo("rnn_tanh_bwd", "rnn.cu", numpy_fn=knp.rnn_tanh_bwd, **_RNN_BWD),
    KernelInfo("rnn_relu_bwd", "rnn.cu", numpy_fn=knp.rnn_relu_bwd, **_RNN_BWD),
    KernelInfo("ew_copy", "elementwise.cu", numpy_fn=knp.ew_copy, **_UNARY),
    # the fused backward kernels reading dh_rec as the split-K recurrent GEMM's partial
    # products summed in order (ew_sum_splits's sum, one launch a step fewer; plan/backward.py)
    KernelInfo("lstm_bwd_split", "lstm.cu", numpy_fn=knp.lstm_bwd_split,
               outs=(("dgx", "R,4C"), ("dc_prev", "R,C")),
               ins=(("dh_above", "R,C"), ("dh_rec", "R,C"), _PARTS, ("dc_next", "R,C"),
                    ("act", "R,4C"), ("c", "R,C"), ("c_prev", "R,C")), scalars=("splits",)),
    KernelInfo("gru_bwd_split", "gru.cu", numpy_fn=knp.gru_bwd_split,
               outs=(("dgx", "R,3C"), ("dgh", "R,3C"), ("dh_prev", "R,C")),
               ins=(("dh_above", "R,C"), ("dh_rec", "R,C"), _PARTS, ("act", "R,4C"),
                    ("h_prev", "R,C")), scalars=("splits",)),
    KernelInfo("rnn_tanh_bwd_split", "rnn.cu", numpy_fn=knp.rnn_tanh_bwd_split,
               **_RNN_BWD_SPLIT),
    KernelInfo("rnn_relu_bwd_split", "rnn.cu", numpy_fn=knp.rnn_relu_bwd_split,
               **_RNN_BWD_SPLIT),
    KernelInfo("ew_sum_splits", "elementwise.cu", numpy_fn=knp.ew_sum_splits,
               outs=(("out", "R,C"),), ins=(("base", "R,C"), ("parts", "splits*R,C")),
               scalars=("splits",)),
    KernelInfo("ew_select", "elementwise.cu", numpy_fn=knp.ew_select, outs=(("out", "R,C"),),
               ins=(_MASK, ("a", "R,C"), ("b", "R,C"))),
    KernelInfo("lstm_fwd_mask", "lstm.cu", numpy_fn=knp.lstm_fwd_mask,
               outs=_LSTM_STATE + (_ACT,), ins=_LSTM_FWD_INS + (("h_prev", "R,C"), _MASK)),
    KernelInfo("lstm_bwd_mask", "lstm.cu", numpy_fn=knp.lstm_bwd_mask,
               outs=(("dgx", "R,4C"), ("dc_prev", "R,C"), ("dh_prev", "R,C")),
               ins=(("dh_above", "R,C"), ("dh_rec", "R,C"), ("dc_next", "R,C"),
                    ("act", "R,4C"), ("c", "R,C"), ("c_prev", "R,C"), _MASK)),
    KernelInfo("gru_fwd_mask", "gru.cu", numpy_fn=knp.gru_fwd_mask,
               outs=(("h", "R,C"), _ACT), ins=_GRU_FWD_INS + (_MASK,)),
    KernelInfo("gru_bwd_mask", "gru.cu", numpy_fn=knp.gru_bwd_mask,
               outs=(("dgx", "R,3C"), ("dgh", "R,3C"), ("dh_prev", "R,C")),
               ins=(("dh_above", "R,C"), ("dh_rec", "R,C"), ("act", "R,4C"),
                    ("h_prev", "R,C"), _MASK)),
    KernelInfo("rnn_tanh_fwd_mask", "rnn.cu", numpy_fn=knp.rnn_tanh_fwd_mask, **_RNN_MASK),
    KernelInfo("rnn_relu_fwd_mask", "rnn.cu", numpy_fn=knp.rnn_relu_fwd_mask, **_RNN_MASK),
    KernelInfo("rnn_tanh_bwd_mask", "rnn.cu", numpy_fn=knp.rnn_tanh_bwd_mask, **_RNN_BWD_MASK),
    KernelInfo("rnn_relu_bwd_mask", "rnn.cu", numpy_fn=knp.rnn_relu_bwd_mask, **_RNN_BWD_MASK),
    # the masked kernels summing step t's split-K products over its part_rows rows
    KernelInfo("lstm_bwd_mask_split", "lstm.cu", numpy_fn=knp.lstm_bwd_mask_split,
               outs=(("dgx", "R,4C"), ("dc_prev", "R,C"), ("dh_prev", "R,C")),
               ins=(("dh_above", "R,C"), ("dh_rec", "R,C"), _MASK_PARTS, ("dc_next", "R,C"),
                    ("act", "R,4C"), ("c", "R,C"), ("c_prev", "R,C"), _MASK),
               scalars=_MASK_SPLIT),
    KernelInfo("gru_bwd_mask_split", "gru.cu", numpy_fn=knp.gru_bwd_mask_split,
               outs=(("dgx", "R,3C"), ("dgh", "R,3C"), ("dh_prev", "R,C")),
               ins=(("dh_above", "R,C"), ("dh_rec", "R,C"), _MASK_PARTS, ("act", "R,4C"),
                    ("h_prev", "R,C"), _MASK), scalars=_MASK_SPLIT),
    KernelInfo("rnn_tanh_bwd_mask_split", "rnn.cu", numpy_fn=knp.rnn_tanh_bwd_mask_split,
               **_RNN_BWD_MASK_SPLIT),
    KernelInfo("rnn_relu_bwd_mask_split", "rnn.cu", numpy_fn=knp.rnn_relu_bwd_mask_split,
               **_RNN_BWD_MASK_SPLIT),
    # the forward step kernels without act (inference plans, plan/forward.py)
    KernelInfo("lstm_fwd_noact", "lstm.cu", numpy_fn=knp.lstm_fwd_noact, outs=_LSTM_STATE,
               ins=_LSTM_FWD_INS),
    KernelInfo("gru_fwd_noact", "gru.cu", numpy_fn=knp.gru_fwd_noact, outs=(("h", "R,C"),),
               ins=_GRU_FWD_INS),
    KernelInfo("lstm_fwd_mask_noact", "lstm.cu", numpy_fn=knp.lstm_fwd_mask_noact,
               outs=_LSTM_STATE, ins=_LSTM_FWD_INS + (("h_prev", "R,C"), _MASK)),
    KernelInfo("gru_fwd_mask_noact", "gru.cu", numpy_fn=knp.gru_fwd_mask_noact,
               outs=(("h", "R,C"),), ins=_GRU_FWD_INS + (_MASK,)),
    KernelInfo("lstm_persistent_fwd", numpy_fn=emulate.lstm_persistent_fwd, **_PERSISTENT,
               outs=(_H_SEQ, ("c", "(T+1)*R,C"), ("act", "T*R,4C"), _SYNC), ins=_pins(4)),
    KernelInfo("gru_persistent_fwd", numpy_fn=emulate.gru_persistent_fwd, **_PERSISTENT,
               outs=(_H_SEQ, ("act", "T*R,4C"), _SYNC), ins=_pins(3)),
    KernelInfo("rnn_tanh_persistent_fwd", numpy_fn=emulate.rnn_tanh_persistent_fwd, **_PERSISTENT,
               outs=(_H_SEQ, _SYNC), ins=_pins(1)),
    KernelInfo("rnn_relu_persistent_fwd", numpy_fn=emulate.rnn_relu_persistent_fwd, **_PERSISTENT,
               outs=(_H_SEQ, _SYNC), ins=_pins(1)),
)
# the cluster kernels: the grid kernels' arguments (sync is not used), their twins with
# cluster=True (pk.kernel_name(cell, cluster=True) names them)
REGISTRY += tuple(
    replace(k, name=k.name.replace("_persistent_fwd", "_persistent_cluster_fwd"),
            numpy_fn=functools.partial(k.numpy_fn, cluster=True))
    for k in REGISTRY if k.persistent)

# the register-resident cluster kernels (persistent_regs.cu; regs.py, emulate_regs.py): the
# cluster kernels' arguments, R in registers
REGISTRY += tuple(
    replace(k, name=regs.kernel_name(k.name.split("_persistent")[0]), file="persistent_regs.cu",
            numpy_fn=emulate_regs.regs_twin(k.name.split("_persistent")[0]))
    for k in REGISTRY if k.persistent and k.name.endswith("_persistent_cluster_fwd"))

# the tensor-core grid kernels (persistent_mma.cu; mma.py): the grid kernels' arguments, bf16
# / fp16 instantiations only (typed.py), the grid kernel's emulation over their cut as twins
REGISTRY += tuple(
    replace(k, name=mma.kernel_name(k.name.split("_persistent")[0]), file="persistent_mma.cu",
            numpy_fn=mma.mma_twin(k.name.split("_persistent")[0]))
    for k in REGISTRY if k.persistent and k.name.endswith("_persistent_fwd")
    and k.file == "persistent.cu")

# the tensor-core cluster kernels (persistent_mmac.cu; mmac.py) and their grid form
# (persistent_mmag.cu: sync is its barrier's): the cluster kernels' arguments, bf16 / fp16
# instantiations only (typed.py), the emulation with their parts of the sum over k as twins
REGISTRY += tuple(
    replace(k, name=mmac.kernel_name(k.name.split("_persistent")[0], cn),
            file="persistent_mmag.cu" if cn == mmac.GRID_FORM else "persistent_mmac.cu",
            numpy_fn=mmac.mmac_twin(k.name.split("_persistent")[0], cn))
    for cn in mmac.MMAC_FORMS
    for k in REGISTRY if k.persistent and k.name.endswith("_persistent_cluster_fwd"))
# ... and their wide form (persistent_mmacw.cu: clusters of 8, up to mmac.MMAC_WNT n8 tiles)
REGISTRY += tuple(
    replace(k, name=mmac.kernel_name(k.name.split("_persistent")[0], wide=True),
            file="persistent_mmacw.cu",
            numpy_fn=mmac.mmac_twin(k.name.split("_persistent")[0], wide=True))
    for k in REGISTRY if k.name.endswith("_persistent_mmac_fwd"))

# the block-persistent kernels (persistent_solo.cu; solo.py): the cluster kernels' arguments,
# each block all of R and its own batches
REGISTRY += tuple(
    replace(k, name=solo.kernel_name(k.name.split("_persistent")[0]), file="persistent_solo.cu",
            numpy_fn=solo.solo_twin(k.name.split("_persistent")[0]))
    for k in REGISTRY if k.persistent and k.name.endswith("_persistent_cluster_fwd"))
# ... and their two-units-a-thread form (part of R in registers; the same arguments and sums)
REGISTRY += tuple(
    replace(k, name=solo.kernel_name(k.name.split("_persistent")[0], 2))
    for k in REGISTRY if k.name.endswith("_persistent_solo_fwd")
    and k.name.split("_persistent")[0] in solo.RR_CELLS)

# the stack kernels: every layer of an LSTM or GRU stack in one launch (stack.py)
REGISTRY += (
    KernelInfo(stack.STACK_KERNEL, "persistent_stack.cu",
               numpy_fn=stack.lstm_persistent_stack_fwd,
               scalars=("T", "L", "units_per_block", "groups"), uint_args=("sync",),
               persistent=True,
               outs=(("h", "L*(T+1)*R,C"), ("c", "L*(T+1)*R,C"), ("act", "L*T*R,4C"),
                     ("sync", f"groups,{pk.SYNC_WORDS}*L"),
                     # scratch the kernel writes: W^T of every layer, each batch group's
                     # k-major inputs
                     ("wt", "L*C,4C"), ("ht", f"groups*(L+1)*(T+1)*C,{stack.PS_BMAX}")),
               ins=(("x", "T*R,C"), ("w_ih", "L,4*C*C"), ("w_hh", "L,4*C*C"), ("bw", "L,4C"),
                    ("br", "L,4C"))),
    # GRU: no c; act r, z, n, hn; wt padded to 4H columns (n's R part has no W: zeros)
    KernelInfo(stack.STACK_KERNELS["gru"], "persistent_stack.cu",
               numpy_fn=stack.gru_persistent_stack_fwd,
               scalars=("T", "L", "units_per_block", "groups"), uint_args=("sync",),
               persistent=True,
               outs=(("h", "L*(T+1)*R,C"), ("act", "L*T*R,4C"),
                     ("sync", f"groups,{pk.SYNC_WORDS}*L"),
                     ("wt", "L*C,4C"), ("ht", f"groups*(L+1)*(T+1)*C,{stack.PS_BMAX}")),
               ins=(("x", "T*R,C"), ("w_ih", "L,3*C*C"), ("w_hh", "L,3*C*C"), ("bw", "L,3C"),
                    ("br", "L,3C"))),
)

# the tensor-core stack kernel (stack_mma.py): the stack kernel's arguments without its scratch
# (no transposed copies); bf16 / fp16 instantiations only (typed.py), h and x in the storage type
REGISTRY += (
    KernelInfo(stack_mma.STACK_MMA_KERNEL, "persistent_stack_mma.cu",
               numpy_fn=stack_mma.lstm_persistent_stack_mma_fwd,
               scalars=("T", "L", "units_per_block", "groups"), uint_args=("sync",),
               persistent=True,
               outs=(("h", "L*(T+1)*R,C"), ("c", "L*(T+1)*R,C"), ("act", "L*T*R,4C"),
                     ("sync", f"groups,{pk.SYNC_WORDS}*L")),
               ins=(("x", "T*R,C"), ("w_ih", "L,4*C*C"), ("w_hh", "L,4*C*C"), ("bw", "L,4C"),
                    ("br", "L,4C"))),
)

# the stack backward: every layer's backward chain of an LSTM stack in one launch (stack_bwd.py)
# (batch groups: a row of counters and a block of dgt each)
_STACK_BWD = (
    KernelInfo(stack_bwd.STACK_BWD_KERNEL, "persistent_stack_bwd.cu",
               numpy_fn=stack_bwd.lstm_persistent_stack_bwd,
               scalars=("T", "L", "units_per_block", "groups"), uint_args=("sync",),
               persistent=True,
               outs=(("dgx", "L*T*R,4C"), ("dhin", "L*T*R,C"), ("dx", "T*R,C"), ("dh0", "L*R,C"),
                     ("dc0", "L*R,C"), ("sync", f"groups,{pk.SYNC_WORDS}*L"),
                     # scratch the kernel writes: each layer's dg_t^T, two slots
                     ("dgt", f"groups*8*L*C,{stack_bwd.SB_BMAX}")),
               ins=(("dh_n", "L*R,C"), ("dc_n", "L*R,C"), ("act", "L*T*R,4C"),
                    ("c", "L*(T+1)*R,C"), ("w_ih", "L,4*C*C"), ("w_hh", "L,4*C*C"))),
)

# ... and its cluster-pair form (persistent_stack_bwd_pair.cu): the same arguments; GRU's
# kernels: dgh beside dgx (3H each), h for c, no dc0 / dc_n
_STACK_BWD_GRU = replace(
    _STACK_BWD[0], name=stack_bwd.STACK_BWD_GRU_KERNEL,
    numpy_fn=stack_bwd.gru_persistent_stack_bwd,
    outs=(("dgx", "L*T*R,3C"), ("dgh", "L*T*R,3C"), ("dhin", "L*T*R,C"), ("dx", "T*R,C"),
          ("dh0", "L*R,C"), ("sync", f"groups,{pk.SYNC_WORDS}*L"),
          ("dgt", f"groups*8*L*C,{stack_bwd.SB_BMAX}")),
    ins=(("dh_n", "L*R,C"), ("act", "L*T*R,4C"), ("h", "L*(T+1)*R,C"), ("w_ih", "L,3*C*C"),
         ("w_hh", "L,3*C*C")))


REGISTRY += _STACK_BWD + (
    replace(_STACK_BWD[0], name=stack_bwd.STACK_BWD_PAIR_KERNEL,
            file="persistent_stack_bwd_pair.cu",
            numpy_fn=stack_bwd.lstm_persistent_stack_bwd_pair),
    _STACK_BWD_GRU,
    replace(_STACK_BWD_GRU, name=stack_bwd.STACK_BWD_GRU_PAIR_KERNEL,
            file="persistent_stack_bwd_pair.cu",
            numpy_fn=stack_bwd.gru_persistent_stack_bwd_pair),
)

# the tensor-core stack backward (stack_mma_bwd.py): the stack backward's arguments without its
# scratch (dg_t is staged from dgx); bf16 / fp16 instantiations only (typed.py), dgx in the
# storage type
REGISTRY += (
    replace(_STACK_BWD[0], name=stack_mma_bwd.STACK_MMA_BWD_KERNEL,
            file="persistent_stack_mma_bwd.cu",
            numpy_fn=stack_mma_bwd.lstm_persistent_stack_mma_bwd,
            outs=_STACK_BWD[0].outs[:6]),
)

# the persistent backward kernels: one layer's recurrent chain, all T steps, last first
# (persistent_bwd.cu; twins in emulate_bwd.py); the st input is c (LSTM) or h (the others)
_BWD = dict(file="persistent_bwd.cu", scalars=("T", "units_per_block", "k_tile"),
            uint_args=("sync",), persistent=True)
_STATE = ("dh_n", "R,C")
REGISTRY += (
    KernelInfo("lstm_persistent_bwd", numpy_fn=emulate_bwd.lstm_persistent_bwd, **_BWD,
               outs=(("dgx", "T*R,4C"), ("dh0", "R,C"), ("dc0", "R,C"), _SYNC),
               ins=(("dhin", "T*R,C"), _STATE, ("dc_n", "R,C"), ("act", "T*R,4C"),
                    ("c", "(T+1)*R,C"), ("w_hh", "4C,C"))),
    KernelInfo("gru_persistent_bwd", numpy_fn=emulate_bwd.gru_persistent_bwd, **_BWD,
               outs=(("dgx", "T*R,3C"), ("dgh", "T*R,3C"), ("dh0", "R,C"), _SYNC),
               ins=(("dhin", "T*R,C"), _STATE, ("act", "T*R,4C"), ("h", "(T+1)*R,C"),
                    ("w_hh", "3C,C"))),
    KernelInfo("rnn_tanh_persistent_bwd", numpy_fn=emulate_bwd.rnn_tanh_persistent_bwd, **_BWD,
               outs=(("dgx", "T*R,C"), ("dh0", "R,C"), _SYNC),
               ins=(("dhin", "T*R,C"), _STATE, ("h", "(T+1)*R,C"), ("w_hh", "C,C"))),
    KernelInfo("rnn_relu_persistent_bwd", numpy_fn=emulate_bwd.rnn_relu_persistent_bwd, **_BWD,
               outs=(("dgx", "T*R,C"), ("dh0", "R,C"), _SYNC),
               ins=(("dhin", "T*R,C"), _STATE, ("h", "(T+1)*R,C"), ("w_hh", "C,C"))),
)

# the backward cluster kernels: the grid kernels' arguments, their twins with cluster=True
REGISTRY += tuple(
    replace(k, name=k.name.replace("_persistent_bwd", "_persistent_cluster_bwd"),
            numpy_fn=functools.partial(k.numpy_fn, cluster=True))
    for k in REGISTRY if k.file == "persistent_bwd.cu")

# the backward grid kernels in cluster pairs (persistent_bwd_pair.cu; persistent_bwd.py's
# PairBwdFit): the grid kernels' arguments, their twins emulate_bwd's pair ones
REGISTRY += tuple(
    replace(k, name=pair, file="persistent_bwd_pair.cu", numpy_fn=getattr(emulate_bwd, pair))
    for k in REGISTRY if k.file == "persistent_bwd.cu" and k.name.endswith("_persistent_bwd")
    for pair in (k.name.replace("_persistent_bwd", "_persistent_pair_bwd"),))

# the register-resident cluster backward kernels (persistent_regs_bwd.cu; regs_bwd.py,
# emulate_regs.py): the cluster backward kernels' arguments, R^T in registers
REGISTRY += tuple(
    replace(k, name=regs_bwd.kernel_name(k.name.split("_persistent")[0]),
            file="persistent_regs_bwd.cu",
            numpy_fn=emulate_regs.regs_bwd_twin(k.name.split("_persistent")[0]))
    for k in REGISTRY if k.file == "persistent_bwd.cu"
    and k.name.endswith("_persistent_cluster_bwd"))

# the tensor-core backward grid kernels (persistent_mma_bwd.cu; mma_bwd.py): the backward grid
# kernels' arguments, bf16 / fp16 instantiations only (typed.py), emulate_bwd's twin over
# their cut
REGISTRY += tuple(
    replace(k, name=mma_bwd.kernel_name(k.name.split("_persistent")[0]),
            file="persistent_mma_bwd.cu", numpy_fn=mma_bwd.mma_bwd_twin(k.name.split("_persistent")[0]))
    for k in REGISTRY if k.file == "persistent_bwd.cu" and k.name.endswith("_persistent_bwd"))

KERNELS: dict[str, KernelInfo] = {k.name: k for k in REGISTRY}


def get_kernel(name: str) -> KernelInfo:
    """The KernelInfo of ``name``, with a clear error for an unknown one."""
    try:
        return KERNELS[name]
    except KeyError:
        raise ValueError(f"kernel: expected one of {sorted(KERNELS)}, got {name!r}") from None


def kernel_files() -> list[str]:
    """The cuda_src files that hold registered kernels, in registry order."""
    return list(dict.fromkeys(k.file for k in REGISTRY))


# --- argument checks ----------------------------------------------------------------------

def _check_problem(name, rows, cols):
    for what, v in (("rows", rows), ("cols", cols)):
        if not 1 <= v <= _INT32_MAX:
            raise ValueError(f"{name}: {what} = {v} outside [1, 2^31-1] (passed as int32)")


def _check_ld(kinfo, arg, ld, shape, is_out):
    """ld of argument ``arg`` (an output when is_out) against its view shape (rows, cols)."""
    rows, cols = shape
    if not 0 <= ld <= _INT32_MAX:
        raise ValueError(f"{kinfo.name}: {arg} ld {ld} outside [0, 2^31-1] (passed as int32)")
    if ld == 0:
        if is_out and rows > 1:
            raise ValueError(f"{kinfo.name}: output {arg} with ld 0 would have {rows} rows "
                             f"written to one (a race); only inputs broadcast")
    elif ld < cols:
        raise ValueError(f"{kinfo.name}: {arg} ld {ld} < its {cols} columns (rows would overlap)")


def _check_scalars(kinfo, scalars) -> dict:
    """The kernel's scalars as {name: int}, each in [1, 2^31-1]; exactly its names."""
    scalars = dict(scalars or {})
    if set(scalars) != set(kinfo.scalars):
        raise ValueError(f"{kinfo.name}: takes scalars {list(kinfo.scalars)}, "
                         f"got {sorted(scalars)}")
    for name, v in scalars.items():
        if not 1 <= int(v) <= _INT32_MAX:
            raise ValueError(f"{kinfo.name}: {name} = {v} outside [1, 2^31-1] (passed as int32)")
    return {name: int(v) for name, v in scalars.items()}


def check_views(kinfo: KernelInfo, rows: int, cols: int, outs, ins, scalars=None) -> None:
    """Check views (anything with .rows, .cols, .ld, e.g. ops.View) against the kernel.

    Each must have the shape the kernel addresses (see its header); an ld = 0 input may have
    one row or the problem's rows. ``scalars``: {name: value} of a kernel with scalars (its
    shapes may use them). Called once per plan, not per launch.
    """
    _check_counts(kinfo, outs, ins)
    _check_problem(kinfo.name, rows, cols)
    scalars = _check_scalars(kinfo, scalars)
    want_outs, want_ins = kinfo.arg_shapes(rows, cols, **scalars)
    for views, specs, wants, is_out in ((outs, kinfo.outs, want_outs, True),
                                        (ins, kinfo.ins, want_ins, False)):
        for v, (arg, spec), want in zip(views, specs, wants):
            got = (v.rows, v.cols)
            ok = got == want or (not is_out and v.ld == 0 and got == (1, want[1]))
            if not ok:
                extra = "".join(f", {k}={v}" for k, v in scalars.items())
                raise ValueError(f"{kinfo.name}: {arg} is [{v.rows}, {v.cols}], expected "
                                 f"[{want[0]}, {want[1]}] ({spec} with R={rows}, C={cols}"
                                 f"{extra})")
            _check_ld(kinfo, arg, v.ld, want, is_out)


def _check_counts(kinfo, outs, ins):
    if len(outs) != kinfo.n_outs or len(ins) != kinfo.n_ins:
        raise ValueError(
            f"{kinfo.name}: takes {kinfo.n_outs} outputs ({', '.join(a for a, _ in kinfo.outs)}) "
            f"and {kinfo.n_ins} inputs ({', '.join(a for a, _ in kinfo.ins)}), "
            f"got {len(outs)} and {len(ins)}")


def kernel_args(kinfo: KernelInfo, rows: int, cols: int, out_ptrs_lds, in_ptrs_lds,
                scalars=None) -> tuple:
    """The argument tuple of a launch: (int32 rows, int32 cols, uint64 ptr, int32 ld, ...,
    int32 scalar, ...), outputs first, then the kernel's scalars (``scalars``: {name: value},
    for kernels that have them). Pointers go as np.uint64 so CuPy passes them by value as
    8-byte pointers."""
    _check_counts(kinfo, out_ptrs_lds, in_ptrs_lds)
    _check_problem(kinfo.name, rows, cols)
    scalars = _check_scalars(kinfo, scalars)
    want_outs, want_ins = kinfo.arg_shapes(rows, cols, **scalars)
    args = [np.int32(rows), np.int32(cols)]
    for pairs, specs, wants, is_out in ((out_ptrs_lds, kinfo.outs, want_outs, True),
                                        (in_ptrs_lds, kinfo.ins, want_ins, False)):
        for (ptr, ld), (arg, _), want in zip(pairs, specs, wants):
            if not 0 < int(ptr) < 2**64:
                raise ValueError(f"{kinfo.name}: {arg} pointer {ptr!r} is not a device address")
            _check_ld(kinfo, arg, int(ld), want, is_out)
            args += [np.uint64(ptr), np.int32(ld)]
    args += [np.int32(scalars[name]) for name in kinfo.scalars]
    return tuple(args)
