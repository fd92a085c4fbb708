"""torch.autograd.gradcheck on rnnrt.nn in float64: rnnrt's backward (the Function's) against
central differences of its own forward, for every cell, plain and packed (unsorted, with h0)
input, unidirectional and bidirectional, with and without training-mode dropout (the seed
is fixed inside the function, so every evaluation draws the same masks). A double backward
is refused with a clear error rather than silently wrong."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="rnnrt.nn needs torch (pip install torch)")

import rnnrt.nn  # noqa: E402
from torch.func import functional_call  # noqa: E402
from torch.nn.utils.rnn import pack_padded_sequence  # noqa: E402

T, B, I, H = 3, 3, 2, 2
LENGTHS = [2, 3, 1]


def module(cell, **kw):
    torch.manual_seed(0)
    if cell == "lstm":
        return rnnrt.nn.LSTM(I, H, dtype=torch.float64, **kw)
    if cell == "gru":
        return rnnrt.nn.GRU(I, H, dtype=torch.float64, **kw)
    return rnnrt.nn.RNN(I, H, nonlinearity=cell[4:], dtype=torch.float64, **kw)


def check(m, cell, packed, dropout_seed=None):
    names = [n for n, _ in m.named_parameters()]
    D = 2 if m.bidirectional else 1
    gen = torch.Generator().manual_seed(1)
    nstates = 2 if cell == "lstm" else 1
    x = torch.randn(T, B, I, generator=gen, dtype=torch.float64, requires_grad=True)
    states = [torch.randn(m.num_layers * D, B, H, generator=gen, dtype=torch.float64,
                          requires_grad=True) for _ in range(nstates)]
    params = [p.detach().clone().requires_grad_() for p in m.parameters()]

    def f(x, *rest):
        st, ps = rest[:nstates], rest[nstates:]
        hx = tuple(st) if cell == "lstm" else st[0]
        inp = pack_padded_sequence(x, torch.tensor(LENGTHS), enforce_sorted=False) \
            if packed else x
        if dropout_seed is not None:
            torch.manual_seed(dropout_seed)
        out, hn = functional_call(m, dict(zip(names, ps)), (inp, hx))
        out = out.data if packed else out
        return (out, *hn) if cell == "lstm" else (out, hn)

    assert torch.autograd.gradcheck(f, (x, *states, *params), eps=1e-6, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "packed"])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn_tanh", "rnn_relu"])
def test_gradcheck(cell, bidirectional, packed):
    check(module(cell, num_layers=2, bidirectional=bidirectional), cell, packed)


@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
def test_gradcheck_with_dropout(bidirectional):
    m = module("lstm", num_layers=2, bidirectional=bidirectional, dropout=0.4)
    m.train()
    check(m, "lstm", True, dropout_seed=7)


def test_double_backward_is_refused():
    m = module("gru", num_layers=1)
    x = torch.randn(T, B, I, dtype=torch.float64, requires_grad=True)
    out, _ = m(x)
    (g,) = torch.autograd.grad(out.sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable|does not require grad"):
        torch.autograd.grad(g.sum(), x)
