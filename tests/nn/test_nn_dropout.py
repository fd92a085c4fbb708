"""Inter-layer dropout with torch.nn's semantics: only in training mode, after every layer
but the last, each element zeroed with probability p and the rest scaled by 1/(1-p), drawn
from torch's RNG (torch.manual_seed makes runs repeatable). Same distribution as torch.nn,
not the same random numbers -- so the train-mode comparison with torch.nn is made by
replaying rnnrt.nn's own masks through torch.nn single-layer modules."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="rnnrt.nn needs torch (pip install torch)")

import rnnrt.nn  # noqa: E402
import rnnrt.nn.inputs  # noqa: E402
from rnnrt import check  # noqa: E402
from torch.nn.utils.rnn import pack_padded_sequence  # noqa: E402

I, H = 3, 8


@pytest.fixture
def seam_calls(monkeypatch):
    """Every backend run_forward as (x [N, I_l], y [N, H], reverse, train), recorded."""
    calls = []
    real = rnnrt.nn.inputs.backend_for

    def recording(device, dtype):
        backend = real(device, dtype)

        class Recording:
            def run_forward(self, cell, layers, x, batch_sizes, h0, c0, *, reverse, train,
                            **kw):
                out = backend.run_forward(cell, layers, x, batch_sizes, h0, c0,
                                          reverse=reverse, train=train, **kw)
                calls.append((x.detach().clone(), out[0].detach().clone(), reverse, train))
                return out

            def run_backward(self, *a, **k):
                return backend.run_backward(*a, **k)
        return Recording()

    monkeypatch.setattr(rnnrt.nn.inputs, "backend_for", recording)
    return calls


def pair(kind, **kw):
    torch.manual_seed(0)
    ref = getattr(torch.nn, kind)(I, H, dtype=torch.float64, **kw)
    torch.manual_seed(0)
    return ref, getattr(rnnrt.nn, kind)(I, H, dtype=torch.float64, **kw)


@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
def test_eval_mode_is_deterministic_and_equals_torch_nn(bidirectional):
    ref, mine = pair("LSTM", num_layers=3, dropout=0.5, bidirectional=bidirectional)
    ref.eval()
    mine.eval()
    x = torch.randn(6, 4, I, dtype=torch.float64)
    a, b = mine(x)[0], mine(x)[0]
    assert torch.equal(a, b)
    check.assert_close(a.detach().numpy(), ref(x)[0].detach().numpy(), 1e-12, 1e-10,
                       name="eval output")


@pytest.mark.parametrize("p", [0.2, 0.6])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
def test_train_mode_masks(seam_calls, p, bidirectional):
    """Between layers: each element is 0 or y/(1-p) exactly, about p of them 0; the last
    layer's output is the module's output unchanged."""
    torch.manual_seed(3)
    L = 3
    m = rnnrt.nn.GRU(I, H, num_layers=L, dropout=p, bidirectional=bidirectional,
                     dtype=torch.float64)
    m.train()
    x = torch.randn(40, 16, I, dtype=torch.float64)
    out, _ = m(x)
    D = 2 if bidirectional else 1
    assert len(seam_calls) == L * D and all(c[3] for c in seam_calls)
    dropped = total = 0
    for layer in range(L - 1):
        below = [c[1] for c in seam_calls[layer * D:(layer + 1) * D]]
        y = torch.cat(below, dim=1)               # layer's output, [forward, reverse]
        nxt = seam_calls[(layer + 1) * D][0]      # the next layer's input
        for c in seam_calls[(layer + 1) * D:(layer + 2) * D]:
            assert torch.equal(c[0], nxt)         # both directions read the same input
        zero = nxt == 0
        assert not torch.any(y == 0)              # so every zero is a dropped element
        check.assert_close(nxt[~zero].numpy(), (y[~zero] / (1 - p)).numpy(), 0, 1e-15,
                           name=f"kept elements after layer {layer}")
        dropped += int(zero.sum())
        total += zero.numel()
    # Binomial(total, p): total >= 20480 here, std <= 0.0035; 0.03 is > 8 std (and the seed
    # is fixed, so the test is deterministic besides).
    assert abs(dropped / total - p) < 0.03, (dropped / total, p)
    top = torch.cat([c[1] for c in seam_calls[-D:]], dim=1)
    assert torch.equal(out.reshape(-1, D * H), top)  # the last layer's output is not dropped
    assert torch.count_nonzero(out) == out.numel()


def test_seeded_runs_repeat_and_seeds_differ():
    m = rnnrt.nn.LSTM(I, H, num_layers=2, dropout=0.5)
    x = torch.randn(5, 3, I)
    outs = []
    for seed in (1, 1, 2):
        torch.manual_seed(seed)
        outs.append(m(x)[0])
    assert torch.equal(outs[0], outs[1]) and not torch.equal(outs[0], outs[2])


def test_no_dropout_stack_is_one_call_and_dropout_is_per_layer(seam_calls):
    m = rnnrt.nn.LSTM(I, H, num_layers=3, dropout=0.5, dtype=torch.float64)
    x = torch.randn(4, 2, I, dtype=torch.float64)
    m.eval()
    m(x)
    assert len(seam_calls) == 1  # the whole unidirectional stack: one backend call
    m.train()
    m(x)
    assert len(seam_calls) == 1 + 3


@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
def test_train_mode_equals_torch_nn_layers_with_the_same_masks(seam_calls, bidirectional):
    """Replay: rnnrt.nn's masks (read off its seam calls) applied between torch.nn
    single-layer modules holding the same weights give rnnrt.nn's output, final states and
    every gradient (packed unsorted input with h0)."""
    L, p, D = 3, 0.4, 2 if bidirectional else 1
    ref, mine = pair("LSTM", num_layers=L, dropout=p, bidirectional=bidirectional)
    mine.train()
    x = torch.randn(6, 4, I, dtype=torch.float64)
    lengths = torch.tensor([3, 6, 1, 4])
    h0 = torch.randn(L * D, 4, H, dtype=torch.float64)
    c0 = torch.randn(L * D, 4, H, dtype=torch.float64)

    xs, hs, cs = (t.clone().requires_grad_() for t in (x, h0, c0))
    packed = pack_padded_sequence(xs, lengths, enforce_sorted=False)
    out, (hn, cn) = mine(packed, (hs, cs))
    masks = []
    for layer in range(L - 1):
        nxt = seam_calls[(layer + 1) * D][0]
        masks.append((nxt != 0).double() / (1 - p))

    # torch.nn, layer by layer, with the same masks
    layers = []
    for layer in range(L):
        m = torch.nn.LSTM(I if layer == 0 else D * H, H, bidirectional=bidirectional,
                          dtype=torch.float64)
        sfx = [""] + (["_reverse"] if bidirectional else [])
        m.load_state_dict({f"{k}_l0{s}": getattr(ref, f"{k}_l{layer}{s}") for s in sfx
                           for k in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")})
        layers.append(m)
    rxs, rhs, rcs = (t.clone().requires_grad_() for t in (x, h0, c0))
    rp = pack_padded_sequence(rxs, lengths, enforce_sorted=False)
    hns, cns = [], []
    for layer, m in enumerate(layers):
        rp, (h, c) = m(rp, (rhs[layer * D:(layer + 1) * D], rcs[layer * D:(layer + 1) * D]))
        hns.append(h)
        cns.append(c)
        if layer < L - 1:
            rp = rp._replace(data=rp.data * masks[layer])
    rhn, rcn = torch.cat(hns), torch.cat(cns)

    def close(name, a, b):
        check.assert_close(a.detach().numpy(), b.detach().numpy(), 1e-10, 1e-9, name=name)

    close("output", out.data, rp.data)
    close("h_n", hn, rhn)
    close("c_n", cn, rcn)
    gen = torch.Generator().manual_seed(5)
    w = [torch.randn(*t.shape, generator=gen, dtype=torch.float64) for t in (out.data, hn, cn)]
    gm = torch.autograd.grad((out.data * w[0]).sum() + (hn * w[1]).sum() + (cn * w[2]).sum(),
                             [xs, hs, cs, *mine.parameters()])
    gr = torch.autograd.grad((rp.data * w[0]).sum() + (rhn * w[1]).sum() + (rcn * w[2]).sum(),
                             [rxs, rhs, rcs] + [q for m in layers for q in m.parameters()])
    names = ["dx", "dh0", "dc0"] + [f"d{n}" for n, _ in mine.named_parameters()]
    for name, a, b in zip(names, gm, gr):
        close(name, a, b)
