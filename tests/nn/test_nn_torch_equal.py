"""rnnrt.nn against torch.nn on the CPU in float64: for every cell (and nonlinearity), 1-3
layers, bidirectional on and off, batch_first on and off, plain / packed sorted / packed
unsorted / padded-with-lengths input, with and without h0: the output, the final states and
EVERY gradient (input, h0, c0, each parameter) equal torch.nn's to atol 1e-10 + rtol 1e-9.

Both modules get the same weights (one seed: rnnrt.nn initialises exactly as torch.nn), the
same random inputs, and the same loss: a random linear functional of every output, so every
gradient path is driven by a random cotangent (never zeros).
"""
from __future__ import annotations

import zlib

import pytest

torch = pytest.importorskip("torch", reason="rnnrt.nn needs torch (pip install torch)")

import rnnrt.nn  # noqa: E402
from rnnrt import check  # noqa: E402
from torch.nn.utils.rnn import (  # noqa: E402
    PackedSequence, pack_padded_sequence, pad_packed_sequence)

T, B, I, H = 5, 4, 3, 3
ATOL, RTOL = 1e-10, 1e-9
LENGTHS = {"sorted": [5, 5, 3, 1], "unsorted": [3, 5, 1, 5]}  # ties, T itself and 1 included

CELLS = {"lstm": ("LSTM", {}), "gru": ("GRU", {}), "rnn_tanh": ("RNN", {"nonlinearity": "tanh"}),
         "rnn_relu": ("RNN", {"nonlinearity": "relu"})}


def close(name, got, want):
    """|got - want| <= ATOL + RTOL*|want| elementwise; the failure names the worst element."""
    assert got.shape == want.shape, f"{name}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    check.assert_close(got.detach().numpy(), want.detach().numpy(), ATOL, RTOL, name=name)


def make_pair(cell, layers, bidirectional, batch_first, bias=True):
    """(torch.nn module, rnnrt.nn module) with identical float64 weights."""
    cls, kw = CELLS[cell]
    args = dict(input_size=I, hidden_size=H, num_layers=layers, bidirectional=bidirectional,
                batch_first=batch_first, bias=bias, dtype=torch.float64, **kw)
    torch.manual_seed(0)
    ref = getattr(torch.nn, cls)(**args)
    torch.manual_seed(0)
    mine = getattr(rnnrt.nn, cls)(**args)
    for (n1, p1), (n2, p2) in zip(ref.named_parameters(), mine.named_parameters()):
        assert n1 == n2 and torch.equal(p1, p2)  # same seed, same procedure: same values
    return ref, mine


def run(module, kind, x, lengths, hx, batch_first):
    """module on x in the form ``kind``. -> (out tensor to compare, states tuple, packed out
    or None)."""
    if kind == "plain":
        out, states = module(x, hx)
        packed = None
    else:
        p = pack_padded_sequence(x, torch.tensor(lengths), batch_first=batch_first,
                                 enforce_sorted=kind == "packed_sorted")
        packed, states = module(p, hx)
        assert isinstance(packed, PackedSequence)
        if kind == "padded":
            out, out_lens = pad_packed_sequence(packed, batch_first=batch_first,
                                                total_length=T)
            assert out_lens.tolist() == list(lengths)
        else:
            out = packed.data
    return out, (states if isinstance(states, tuple) else (states,)), packed


@pytest.mark.parametrize("h0", [False, True], ids=["noh0", "h0"])
@pytest.mark.parametrize("kind", ["plain", "packed_sorted", "packed_unsorted", "padded"])
@pytest.mark.parametrize("batch_first", [False, True], ids=["tmajor", "bfirst"])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("layers", [1, 2, 3], ids=["L1", "L2", "L3"])
@pytest.mark.parametrize("cell", sorted(CELLS))
def test_matches_torch_nn_float64(cell, layers, bidirectional, batch_first, kind, h0,
                                  bias=True):
    ref, mine = make_pair(cell, layers, bidirectional, batch_first, bias)
    D = 2 if bidirectional else 1
    lengths = LENGTHS["sorted" if kind == "packed_sorted" else "unsorted"]
    seed = zlib.crc32(f"{cell}{layers}{bidirectional}{kind}".encode())  # stable across runs
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    x = rand(*((B, T, I) if batch_first else (T, B, I)))
    states0 = []
    if h0:
        states0 = [rand(layers * D, B, H) for _ in range(2 if cell == "lstm" else 1)]
    results = []
    for module in (ref, mine):
        xs = x.clone().requires_grad_()
        ss = [s.clone().requires_grad_() for s in states0]
        hx = None if not ss else (tuple(ss) if cell == "lstm" else ss[0])
        out, states, packed = run(module, kind, xs, lengths, hx, batch_first)
        results.append((out, states, packed, xs, ss, module))

    (r_out, r_states, r_packed, *_), (m_out, m_states, m_packed, *_) = results
    close("output", m_out, r_out)
    for i, (m, r) in enumerate(zip(m_states, r_states)):
        close(("h_n", "c_n")[i], m, r)
    if r_packed is not None:
        assert torch.equal(m_packed.batch_sizes, r_packed.batch_sizes)
        for attr in ("sorted_indices", "unsorted_indices"):
            a, b = getattr(m_packed, attr), getattr(r_packed, attr)
            assert (a is None and b is None) or torch.equal(a, b), attr
    if kind == "padded":  # outputs are zero past each sequence's own end
        for b, n in enumerate(lengths):
            tail = m_out[b, n:] if batch_first else m_out[n:, b]
            assert torch.count_nonzero(tail) == 0, (b, n)

    # One random cotangent per output, shared by both: the loss <out, w_y> + <h_n, w_h> ...
    weights = [rand(*r_out.shape)] + [rand(*s.shape) for s in r_states]
    grads = []
    for out, states, _, xs, ss, module in results:
        loss = sum((o * w).sum() for o, w in zip((out, *states), weights))
        inputs = [xs, *ss, *module.parameters()]
        grads.append(torch.autograd.grad(loss, inputs))
    names = ["d_input"] + [f"d_{n}0" for n in ("h", "c")[:len(states0)]] + \
        [f"d_{n}" for n, _ in ref.named_parameters()]
    assert len(names) == len(grads[0]) == len(grads[1])
    for name, m, r in zip(names, grads[1], grads[0]):
        close(name, m, r)
        # A zero reference would let a wrong zero pass. ReLU's recurrent weight gradient may
        # be legitimately zero at these tiny sizes: every unit of h_{t-1} can be dead.
        if not (cell == "rnn_relu" and "weight_hh" in name):
            assert torch.count_nonzero(r) > 0, f"{name}: torch's gradient is all zero"


@pytest.mark.parametrize("kind", ["plain", "packed_unsorted"])
@pytest.mark.parametrize("cell", sorted(CELLS))
def test_matches_torch_nn_float64_without_bias(cell, kind):
    test_matches_torch_nn_float64(cell, 2, True, False, kind, True, bias=False)
