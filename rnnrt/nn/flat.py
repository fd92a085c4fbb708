"""rnnrt.nn's parameters in one flat buffer, laid out as rnnrt's GPU runs read them, so the
CUDA backend reads them in place instead of copying them into its runners every call
(torch.nn does the same for cuDNN: ``flatten_parameters``).

The layout: per layer and direction, in torch's parameter order, the ``rnnrt.params``
layout of ONE layer (weight_ih, weight_hh, bias_ih, bias_hh, each on a 64-element boundary)
one after another. A one-layer layout's size is rounded to the same boundary, so layers
0..L-1 of a unidirectional stack laid end to end ARE the L-layer layout: the backend's one
call for a whole stack and its per-layer calls (bidirectional, or dropout between layers)
both find their parameters as one contiguous segment (``segment``).

    flatten(module)         relayout, for parameters on CUDA in float32 (module.cuda() etc.),
                            unless they are laid out so already
    laid_out(module)        whether the parameters already lie in one buffer in this layout
    relayout(module)        make every parameter a view of one new buffer in this layout
    segment(tensors, layout)  the 1-D tensor over a call's parameters, if they lie at the
                            layout's offsets in one storage; else None
"""
from __future__ import annotations

import torch

from ..params import make_layout


def layer_layouts(module) -> list[tuple[list[str], object]]:
    """[(parameter names, ParamLayout of one layer)] per layer and direction of ``module``
    (an rnnrt.nn.RNNBase), in torch's order."""
    out = []
    for i, names in enumerate(module._all_weights):
        layer = i // module.num_directions
        in_size = module.input_size if layer == 0 else module.hidden_size * module.num_directions
        out.append((names, make_layout(module.cell, in_size, module.hidden_size, 1,
                                       module.bias)))
    return out


def backend_reads(params) -> bool:
    """Whether the CUDA backend reads ``params`` (a module's parameters) as they are: every
    one on one CUDA device, in float32."""
    first = params[0]
    return (first.device.type == "cuda" and first.dtype == torch.float32
            and all(p.device == first.device and p.dtype == first.dtype for p in params))


def flatten(module) -> bool:
    """``relayout`` where the CUDA backend would read the result (``backend_reads``) and the
    parameters are not ``laid_out`` yet; -> whether they are laid out now. A module already
    laid out keeps its buffer: a ``.float()`` or ``.to()`` that changes nothing must not move
    every parameter (the backend's runners read the buffer in place)."""
    if not backend_reads(module._flat_weights):
        return False
    if not laid_out(module):
        relayout(module)
    return True


def laid_out(module) -> bool:
    """Whether ``module``'s parameters already lie in one storage in the flat layout (module
    docstring): each call's segment where ``relayout`` would put it."""
    first = module._flat_weights[0]
    item, base = first.element_size(), first.data_ptr()
    storage = first.untyped_storage().data_ptr()
    start = 0
    for names, layout in layer_layouts(module):
        seg = segment([getattr(module, n) for n in names], layout)
        if (seg is None or seg.data_ptr() != base + start * item
                or seg.untyped_storage().data_ptr() != storage):
            return False
        start += layout.size
    return True


def relayout(module) -> torch.Tensor:
    """Lay ``module``'s parameters out in one new flat buffer on their device (module
    docstring) and make each a view of it: values kept, the Parameter objects (and so the
    optimizers that hold them) the same. -> the buffer."""
    layouts = layer_layouts(module)
    first = module._flat_weights[0]
    flat = torch.zeros(sum(layout.size for _, layout in layouts), device=first.device,
                       dtype=first.dtype)
    start = 0
    with torch.no_grad():
        for names, layout in layouts:
            for name, e in zip(names, layout.entries):
                view = flat[start + e.offset:start + e.end].view(e.shape)
                param = getattr(module, name)
                view.copy_(param)
                param.data = view
            start += layout.size
    return flat


def segment(tensors, layout):
    """The [layout.size] 1-D tensor (detached) over the storage of ``tensors`` — a call's
    parameters in torch's order, one per entry of ``layout`` (an rnnrt.params layout) — if
    each is contiguous and lies at its entry's offset from the first in one storage that
    holds the whole layout; else None (the backend then copies them)."""
    tensors = list(tensors)
    if len(tensors) != len(layout.entries):
        return None
    first = tensors[0]
    item = first.element_size()
    storage = first.untyped_storage()
    for t, e in zip(tensors, layout.entries):
        if (t.dtype != first.dtype or t.device != first.device or not t.is_contiguous()
                or tuple(t.shape) != tuple(e.shape)
                or t.untyped_storage().data_ptr() != storage.data_ptr()
                or t.data_ptr() - first.data_ptr() != e.offset * item):
            return None
    if first.storage_offset() + layout.size > storage.nbytes() // item:
        return None
    return first.detach().as_strided((layout.size,), (1,), first.storage_offset())
