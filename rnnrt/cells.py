"""The four recurrent cells: names, gate counts, gate order, and FLOP accounting.

Everything that differs between LSTM, GRU, RNN-tanh and RNN-ReLU *as a description*
lives here; the math of a step lives in ``reference.py`` (plain NumPy) and in the
kernels (``cuda_src/*.cu`` with their NumPy twins in ``kernels/twins.py``).

Gate order follows torch.nn exactly:
  LSTM  i, f, g, o        c' = f*c + i*g,  h' = o*tanh(c')
  GRU   r, z, n           n = tanh(W_in x + b_in + r*(W_hn h + b_hn)),  h' = (1-z)*n + z*h
  RNN   (one gate)        h' = tanh(W x + b_ih + R h + b_hh)   (or relu)

FLOPs follow the paper's convention (docs/paper.md): GEMM work only,
2*M*N*K per GEMM; per layer per step M = G*hidden, N = minibatch, K = layer input + hidden;
backward = 2x forward (data gradients + weight gradients); pointwise work is not counted.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass


@dataclass(frozen=True)
class Cell:
    """Static description of one cell type.

    name:       'lstm', 'gru', 'rnn_tanh' or 'rnn_relu' (the key used everywhere)
    mode:       torch's mode string ('LSTM', 'GRU', 'RNN_TANH', 'RNN_RELU')
    gates:      G, the number of gate blocks stacked in weight_ih / weight_hh (rows = G*hidden)
    gate_names: gate order inside those blocks, as torch orders them
    has_cell_state: True for LSTM only (it carries c besides h)
    saved_gates: columns per hidden unit that a training forward keeps per step for the
                backward pass (LSTM: i,f,g,o activated; GRU: r,z,n and W_hn h + b_hn; RNN: 0,
                its derivative is a function of h itself)
    """

    name: str
    mode: str
    gates: int
    gate_names: tuple[str, ...]
    has_cell_state: bool
    saved_gates: int


CELLS: dict[str, Cell] = {
    "lstm": Cell("lstm", "LSTM", 4, ("i", "f", "g", "o"), True, 4),
    "gru": Cell("gru", "GRU", 3, ("r", "z", "n"), False, 4),
    "rnn_tanh": Cell("rnn_tanh", "RNN_TANH", 1, ("h",), False, 0),
    "rnn_relu": Cell("rnn_relu", "RNN_RELU", 1, ("h",), False, 0),
}


def get_cell(name: str) -> Cell:
    """Return the Cell for ``name`` ('lstm', 'gru', 'rnn_tanh', 'rnn_relu'); clear error otherwise."""
    try:
        return CELLS[name]
    except (KeyError, TypeError):
        raise ValueError(f"cell: expected one of {sorted(CELLS)}, got {name!r}") from None


def layer_input_size(layer: int, input_size: int, hidden_size: int) -> int:
    """Input width of ``layer``: the model's input size for layer 0, hidden size above it."""
    return input_size if layer == 0 else hidden_size


def forward_flops(cell: str, input_size: int, hidden_size: int, num_layers: int,
                  batch: int, steps: int) -> int:
    """GEMM FLOPs of one forward pass, by the paper's convention.

    Sum over layers and steps of 2*M*N*K with M = G*hidden, N = batch,
    K = (layer input size) + hidden. Pointwise work is not counted. The sizes are positive
    integers (TypeError / ValueError naming the argument otherwise).
    """
    from .params import positive_int   # (params imports this module)
    g = get_cell(cell).gates
    i, h, n_layers, b, t = (positive_int(n, v) for n, v in (
        ("input_size", input_size), ("hidden_size", hidden_size), ("num_layers", num_layers),
        ("batch", batch), ("steps", steps)))
    # layer 0 reads the input, the layers above it read h: a closed form, no loop over layers
    k_total = (i + h) + (n_layers - 1) * (h + h)
    return 2 * g * h * b * t * k_total


def backward_flops(cell: str, input_size: int, hidden_size: int, num_layers: int,
                   batch: int, steps: int) -> int:
    """GEMM FLOPs of one backward pass (data + weight gradients): 2x the forward's."""
    return 2 * forward_flops(cell, input_size, hidden_size, num_layers, batch, steps)


def tflops(flops: int, ms: float) -> float:
    """Rate in TFLOPS of ``flops`` (a count >= 0) done in ``ms`` milliseconds (a finite
    time > 0); TypeError / ValueError naming the argument otherwise."""
    for name, v in (("flops", flops), ("ms", ms)):
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise TypeError(f"{name}: expected a number, got {v!r} of type {type(v).__name__}")
    if not math.isfinite(flops) or flops < 0:
        raise ValueError(f"flops: expected a finite count >= 0, got {flops!r}")
    if not math.isfinite(ms) or ms <= 0:
        raise ValueError(f"ms: expected a finite time > 0 in milliseconds, got {ms!r}")
    return flops / (ms * 1e-3) / 1e12
