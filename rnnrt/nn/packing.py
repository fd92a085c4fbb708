"""A padded batch with lengths -> PackedSequence, checked: torch's pack_padded_sequence with
the one range check it lacks.

torch.nn.utils.rnn.pack_padded_sequence refuses lengths < 1, a count of lengths other than
the batch, and unsorted lengths with enforce_sorted=True -- but not a length longer than the
padded sequence: torch 2.x then packs rows past the end of the input's storage without an
error. This wrapper refuses that too, then calls torch's function unchanged; the result is
an ordinary PackedSequence (rnnrt.nn's modules and torch.nn's take it alike).
"""
from __future__ import annotations

import torch
from torch.nn.utils import rnn as torch_rnn


def pack_padded_sequence(input, lengths, batch_first: bool = False,
                         enforce_sorted: bool = True):
    """torch.nn.utils.rnn.pack_padded_sequence, after checking every length is in
    [1, T]. Arguments and result exactly as torch's.

    input:   [T, B, *] padded sequences ([B, T, *] with batch_first)
    lengths: [B] integer tensor (CPU) or list, each sequence's length
    Raises RuntimeError (torch's kind) for a length outside [1, T] or a count other than B,
    before anything is packed.
    """
    if not isinstance(input, torch.Tensor) or input.dim() < 2:
        raise TypeError(f"input: expected a padded tensor [T, B, *] (or [B, T, *] with "
                        f"batch_first), got {getattr(input, 'shape', type(input).__name__)}")
    lens = torch.as_tensor(lengths, dtype=torch.int64, device="cpu")
    steps, batch = (input.size(1), input.size(0)) if batch_first else input.shape[:2]
    if lens.dim() != 1 or lens.numel() != batch:
        raise RuntimeError(f"Expected `len(lengths)` to be equal to batch_size, but got "
                           f"{lens.numel()} (batch_size={batch})")
    if lens.numel() and (int(lens.min()) < 1 or int(lens.max()) > steps):
        raise RuntimeError(f"lengths: every length must be in [1, {steps}] (the padded "
                           f"sequence length), got {lens.tolist()}")
    return torch_rnn.pack_padded_sequence(input, lens, batch_first=batch_first,
                                          enforce_sorted=enforce_sorted)
