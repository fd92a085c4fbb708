"""rnnrt.nn.LSTM with proj_size > 0: torch's own LSTM runs it (rnnrt has no projection
kernels), so everything must be torch.nn.LSTM's exactly -- parameters (names, shapes, order,
initial values), outputs, final states and every gradient, bit for bit, in every input form
(plain, batch_first, unbatched, packed sorted / unsorted, padded back), with and without
h0, bidirectional, dropout -- and the module must say what runs it (a warning at
construction, ``implementation``). Bad states are refused before any work, naming the size
expected (h is proj_size wide, c hidden_size).
"""
from __future__ import annotations

import warnings
import zlib

import pytest

torch = pytest.importorskip("torch", reason="rnnrt.nn needs torch (pip install torch)")

import rnnrt.nn  # noqa: E402
from torch.nn.utils.rnn import (  # noqa: E402
    PackedSequence, pack_padded_sequence, pad_packed_sequence)

T, B, I, H, P = 5, 4, 3, 6, 2
LENGTHS = {"sorted": [5, 5, 3, 1], "unsorted": [3, 5, 1, 5]}


def make_pair(layers=2, bidirectional=True, batch_first=False, bias=True, dropout=0.0,
              dtype=torch.float64):
    """(torch.nn.LSTM, rnnrt.nn.LSTM) with proj_size P, the same seed."""
    args = dict(input_size=I, hidden_size=H, num_layers=layers, bias=bias,
                batch_first=batch_first, dropout=dropout, bidirectional=bidirectional,
                proj_size=P, dtype=dtype)
    torch.manual_seed(0)
    ref = torch.nn.LSTM(**args)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mine = rnnrt.nn.LSTM(**args)
    return ref, mine


def test_parameters_and_repr_are_torch_nns():
    for bias in (True, False):
        ref, mine = make_pair(layers=3, bias=bias)
        got = [(n, tuple(p.shape)) for n, p in mine.named_parameters()]
        assert got == [(n, tuple(p.shape)) for n, p in ref.named_parameters()]
        assert ("weight_hr_l2_reverse", (P, H)) in got and ("weight_hh_l1", (4 * H, P)) in got
        assert ("weight_ih_l1", (4 * H, 2 * P)) in got
        for (n, a), b in zip(ref.named_parameters(), mine.parameters()):
            assert torch.equal(a, b), n
        assert repr(mine) == repr(ref)
        assert len(mine.all_weights) == 6 and len(mine.all_weights[0]) == (5 if bias else 3)


def test_says_what_runs_it():
    with pytest.warns(UserWarning, match=r"proj_size=2.*torch's own LSTM") as w:
        m = rnnrt.nn.LSTM(I, H, proj_size=P)
    assert w[0].filename == __file__   # the warning points at the caller's line
    assert m.implementation == "torch" and m.out_size == P
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # no warning without projections
        plain = rnnrt.nn.LSTM(I, H)
    assert plain.implementation == "rnnrt" and plain.out_size == H
    with pytest.raises(ValueError, match="recompute"):
        rnnrt.nn.LSTM(I, H, proj_size=P, recompute=True)
    m.recompute = True   # set later: refused at the call, before any work
    with pytest.raises(ValueError, match="recompute"):
        m(torch.randn(T, B, I))


def run(module, kind, x, hx, batch_first, lengths):
    """module on x in the form ``kind`` -> (output tensor, (h_n, c_n), packed or None)."""
    if kind in ("plain", "unbatched"):
        out, states = module(x, hx)
        return out, states, None
    p = pack_padded_sequence(x, torch.tensor(lengths), batch_first=batch_first,
                             enforce_sorted=kind == "packed_sorted")
    packed, states = module(p, hx)
    assert isinstance(packed, PackedSequence)
    if kind == "padded":
        out, _ = pad_packed_sequence(packed, batch_first=batch_first, total_length=T)
        return out, states, packed
    return packed.data, states, packed


@pytest.mark.parametrize("h0", [False, True], ids=["noh0", "h0"])
@pytest.mark.parametrize("kind", ["plain", "unbatched", "packed_sorted", "packed_unsorted",
                                  "padded"])
@pytest.mark.parametrize("batch_first", [False, True], ids=["tmajor", "bfirst"])
@pytest.mark.parametrize("layers, bidirectional, dropout",
                         [(1, False, 0.0), (2, True, 0.0), (3, False, 0.5)],
                         ids=["L1", "L2bi", "L3drop"])
def test_matches_torch_nn_bit_for_bit(layers, bidirectional, dropout, batch_first, kind, h0):
    ref, mine = make_pair(layers, bidirectional, batch_first, dropout=dropout)
    D = 2 if bidirectional else 1
    gen = torch.Generator().manual_seed(zlib.crc32(f"{layers}{kind}{batch_first}".encode()))

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    unbatched = kind == "unbatched"
    nb = 1 if unbatched else B
    shape = (T, I) if unbatched else ((B, T, I) if batch_first else (T, B, I))
    x = rand(*shape)
    sizes = [(layers * D, P), (layers * D, H)] if unbatched else \
        [(layers * D, nb, P), (layers * D, nb, H)]
    states0 = [rand(*s) for s in sizes] if h0 else []
    lengths = LENGTHS["sorted" if kind == "packed_sorted" else "unsorted"]
    results = []
    for module in (ref, mine):
        xs = x.clone().requires_grad_()
        ss = [s.clone().requires_grad_() for s in states0]
        torch.manual_seed(1)   # the same dropout masks
        out, states, packed = run(module, kind, xs, tuple(ss) if ss else None, batch_first,
                                  lengths)
        results.append((out, states, packed, xs, ss, module))
    (r_out, r_states, r_packed, *_), (m_out, m_states, m_packed, *_) = results
    assert torch.equal(m_out, r_out)
    assert m_out.shape[-1] == D * P
    for m, r in zip(m_states, r_states):
        assert m.shape == r.shape and torch.equal(m, r)
    if r_packed is not None:
        for attr in ("batch_sizes", "sorted_indices", "unsorted_indices"):
            a, b = getattr(m_packed, attr), getattr(r_packed, attr)
            assert (a is None and b is None) or torch.equal(a, b), attr
    weights = [rand(*r_out.shape)] + [rand(*s.shape) for s in r_states]
    grads = []
    for out, states, _, xs, ss, module in results:
        loss = sum((o * w).sum() for o, w in zip((out, *states), weights))
        grads.append(torch.autograd.grad(loss, [xs, *ss, *module.parameters()]))
    names = ["d_input", *(["d_h0", "d_c0"] if h0 else [])] + \
        [f"d_{n}" for n, _ in ref.named_parameters()]
    for name, m, r in zip(names, grads[1], grads[0]):
        assert torch.equal(m, r), name
        assert torch.count_nonzero(r) > 0, f"{name}: torch's gradient is all zero"


def test_state_dict_both_ways():
    ref, mine = make_pair()
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(1.0)
    mine.load_state_dict(ref.state_dict())
    x = torch.randn(T, B, I, dtype=torch.float64)
    assert torch.equal(mine(x)[0], ref(x)[0])
    fresh, _ = make_pair()
    fresh.load_state_dict(mine.state_dict())
    assert torch.equal(fresh(x)[0], ref(x)[0])


def test_bad_states_refused_naming_the_size():
    _, mine = make_pair(layers=2, bidirectional=True)
    x = torch.randn(T, B, I, dtype=torch.float64)
    h = torch.randn(4, B, P, dtype=torch.float64)
    c = torch.randn(4, B, H, dtype=torch.float64)
    keep = [t.clone() for t in (x, h, c)]
    with pytest.raises(RuntimeError, match=r"hidden\[0\] size \(4, 4, 2\)"):
        mine(x, (torch.randn(4, B, H, dtype=torch.float64), c))   # h as wide as c
    with pytest.raises(RuntimeError, match=r"hidden\[1\] size \(4, 4, 6\)"):
        mine(x, (h, torch.randn(4, B, P, dtype=torch.float64)))   # c as narrow as h
    with pytest.raises(RuntimeError, match="input_size"):
        mine(torch.randn(T, B, I + 1, dtype=torch.float64), (h, c))
    for a, b in zip((x, h, c), keep):
        assert torch.equal(a, b)   # nothing written


def test_cpu_autocast_as_torch_nns():
    """torch.nn.LSTM's rules under CPU autocast (where rnnrt's own path refuses CPU autocast
    for a module it runs, torch's takes it as torch.nn does)."""
    ref, mine = make_pair(dtype=torch.float32)
    x = torch.randn(T, B, I)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want, (wh, wc) = ref(x)
        got, (gh, gc) = mine(x)
    assert got.dtype == want.dtype and torch.equal(got, want)
    assert torch.equal(gh, wh) and torch.equal(gc, wc)
