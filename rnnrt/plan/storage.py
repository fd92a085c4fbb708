"""Where a plan's buffers hold the storage type (rnnrt/precision.py is the design).

``store_names(builder)``: the buffers some GEMM of a key's passes reads as an operand (a or
b) -- x, the h sequences, the weights as the GEMMs read them (the params, their transposes
wT / rT, or their 16-bit copies wS / rS), the backward's gate gradients dgx / dgh and the
ones of the bias sums. Both passes of a training key label a buffer alike (one workspace
serves both), so the forward's labels count the backward's GEMMs too. ``labelled`` applies
them; plan/model.py ``validate`` checks them against the plans' GEMMs.
"""
from __future__ import annotations

import dataclasses

from ..kernels.choice import choose_persistent_backward
from .recompute import recomputes


def store_names(b) -> set:
    """The names of the buffers that hold the storage type (plan/model.py Buffer) in the
    plans of ``b`` (a forward.ForwardBuilder, or the backward's): those some GEMM of the
    key's passes reads as an operand -- the forward's and, for a training key, the
    backward's (one workspace serves both, so both passes label a buffer alike)."""
    L, train, stack = b.L, b.key.train, b.stack is not None
    names = set()
    # the tensor-core stack kernel reads x and h in the storage type and stores h rounded
    typed_stack = stack and b.stack.storage_io
    if not stack or train or typed_stack:   # layer 0's W.x (the fp32 stack kernel reads x
        names.add("x")                      # itself, fp32), dW
    if stack:
        names |= {"h"} if train or typed_stack else set()
    else:   # R.h (a GEMM's or a persistent kernel's product), the next W.x, dR and dW
        names |= {f"h{lyr}" for lyr in range(L)}
    # a persistent kernel reads R from the params, never rT / rS (the typed ones round it
    # as they load it: the copy's values), so R's copy is an operand only of the per-step
    # GEMMs
    step_bwd = train and not (b.key.backward is not None
                              and choose_persistent_backward(b.key).runs)
    r_read = {lyr for lyr in range(L) if not b.persist or step_bwd}
    if b.xposed():
        names |= {f"wT{lyr}" for lyr in range(L)}
        names |= {f"rT{lyr}" for lyr in r_read}
    elif b.copies:
        names |= {f"wS{lyr}" for lyr in range(L)} | {f"rS{lyr}" for lyr in r_read}
    elif (not stack or train) and not b.stack_backward:   # the stack kernels read params
        names.add("params")                                 # themselves, fp32
    if recomputes(b.key):   # its GEMMs read the weights from the fp32 params
        names.add("params")     # (plan/recompute.py; fp32 storage keys only)
    if train:   # the backward's gate gradients (and the ones of the bias sums); the stack
        # backward's, every layer's, in one buffer
        names |= {"dgx"} if b.stack_backward else {f"dgx{lyr}" for lyr in range(L)}
        if b.cell.name == "gru":
            names |= {"dgh"} if b.stack_backward else {f"dgh{lyr}" for lyr in range(L)}
        if b.key.bias:
            names.add("ones")
    return names


def labelled(builder, bufs) -> tuple:
    """``bufs`` (Buffers of ``builder``'s key) with the store buffers (``store_names``)
    labelled 'store'."""
    store = store_names(builder)
    return tuple(dataclasses.replace(b, dtype="store") if b.name in store else b
                 for b in bufs)
