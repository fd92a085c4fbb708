"""The autograd Function: inference (torch.no_grad(), or nothing requiring a gradient) saves
nothing and builds no graph; training saves the backend's state in the Function's context;
needs_input_grad is respected (frozen parameters, inputs without gradients); unused outputs
reach rnnrt's backward as None; in-place changes to saved tensors are refused as torch.nn
refuses them; retain_graph backwards repeat."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="rnnrt.nn needs torch (pip install torch)")

import rnnrt.nn  # noqa: E402
import rnnrt.nn.inputs  # noqa: E402
from rnnrt import check, varlen  # noqa: E402

T, B, I, H = 4, 3, 3, 5


@pytest.fixture
def seam(monkeypatch):
    """The backend calls, recorded: ('forward', train, saved) and ('backward', need_dx,
    need_weights, which of dy / dh_n / dc_n were given)."""
    calls = []
    real = rnnrt.nn.inputs.backend_for

    def recording(device, dtype):
        backend = real(device, dtype)

        class Recording:
            def run_forward(self, *a, train, **k):
                out = backend.run_forward(*a, train=train, **k)
                calls.append(("forward", train, out[3]))
                return out

            def run_backward(self, saved, dy, dh_n, dc_n, *, need_dx, need_weights):
                calls.append(("backward", need_dx, need_weights,
                              tuple(g is not None for g in (dy, dh_n, dc_n))))
                return backend.run_backward(saved, dy, dh_n, dc_n, need_dx=need_dx,
                                            need_weights=need_weights)
        return Recording()

    monkeypatch.setattr(rnnrt.nn.inputs, "backend_for", recording)
    return calls


def pair(kind="LSTM", **kw):
    torch.manual_seed(0)
    ref = getattr(torch.nn, kind)(I, H, dtype=torch.float64, **kw)
    torch.manual_seed(0)
    return ref, getattr(rnnrt.nn, kind)(I, H, dtype=torch.float64, **kw)


def close(name, a, b):
    check.assert_close(a.detach().numpy(), b.detach().numpy(), 1e-10, 1e-9, name=name)


@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
def test_no_grad_saves_nothing(seam, bidirectional):
    _, m = pair(num_layers=2, bidirectional=bidirectional)
    x = torch.randn(T, B, I, dtype=torch.float64, requires_grad=True)
    with torch.no_grad():
        out, (hn, cn) = m(x)
    assert out.grad_fn is None and hn.grad_fn is None and cn.grad_fn is None
    assert not out.requires_grad
    assert seam and all(c == ("forward", False, None) for c in seam)
    seam.clear()
    for p in m.parameters():  # grad mode on, but nothing requires a gradient
        p.requires_grad_(False)
    out, _ = m(x.detach())
    assert out.grad_fn is None and seam and all(c == ("forward", False, None) for c in seam)


def test_training_forward_saves_the_backend_state_in_the_context(seam):
    _, m = pair("GRU", num_layers=2)
    out, hn = m(torch.randn(T, B, I, dtype=torch.float64))
    assert seam == [("forward", True, seam[0][2])]
    node = out.grad_fn
    while type(node).__name__ != "RNNFunctionBackward":  # through the view to the Function
        node = node.next_functions[0][0]
    assert isinstance(node.saved, varlen.Cache) and len(node.saved.layers) == 2
    assert node.saved is seam[0][2]


@pytest.mark.parametrize("frozen", ["none", "all", "layer0"])
@pytest.mark.parametrize("x_grad", [False, True], ids=["x-const", "x-grad"])
def test_needs_input_grad_is_respected(seam, x_grad, frozen):
    ref, mine = pair("LSTM", num_layers=2)
    for m in (ref, mine):
        for n, p in m.named_parameters():
            p.requires_grad_(not (frozen == "all" or (frozen == "layer0" and n.endswith("l0"))))
    x = torch.randn(T, B, I, dtype=torch.float64)
    h0 = torch.randn(2, B, H, dtype=torch.float64)
    c0 = torch.randn(2, B, H, dtype=torch.float64)
    grads = []
    for m in (ref, mine):
        xs = x.clone().requires_grad_(x_grad)
        hs = h0.clone().requires_grad_()  # h0 always needs one: the graph always exists
        out, (hn, cn) = m(xs, (hs, c0))
        (out.sin().sum() + hn.sum()).backward()
        grads.append((xs, hs, m))
    (rx, rh, rm), (mx, mh, mm) = grads
    assert (mx.grad is None) == (not x_grad)
    if x_grad:
        close("dx", mx.grad, rx.grad)
    close("dh0", mh.grad, rh.grad)
    for (n, p), q in zip(mm.named_parameters(), rm.parameters()):
        assert (p.grad is None) == (not p.requires_grad), n
        if p.requires_grad:
            close(f"d{n}", p.grad, q.grad)
    backward = [c for c in seam if c[0] == "backward"]
    assert backward == [("backward", x_grad, frozen != "all", (True, True, False))]


def test_unused_outputs_reach_the_backward_as_none(seam):
    ref, mine = pair("LSTM", num_layers=2)
    x = torch.randn(T, B, I, dtype=torch.float64)
    grads = []
    for m in (ref, mine):
        xs = x.clone().requires_grad_()
        _, (_, cn) = m(xs)
        grads.append(torch.autograd.grad((cn ** 2).sum(), [xs, *m.parameters()]))
    assert [c[3] for c in seam if c[0] == "backward"] == [(False, False, True)]
    for i, (a, b) in enumerate(zip(grads[1], grads[0])):
        close(f"gradient {i} from c_n alone", a, b)


@pytest.mark.parametrize("what", ["input", "weight", "output"])
def test_in_place_changes_to_saved_tensors_are_refused(what):
    """rnnrt's backward reads x, the weights and y where they lie (no copies), so changing
    one in place between forward and backward must be an error, not a wrong gradient.
    torch.nn refuses the same for the input and weights; for the output, its CPU path
    (which does not keep y) lets it pass, its cuDNN path (which does) refuses as here."""
    ref, mine = pair("GRU")
    for m in (ref, mine) if what != "output" else (mine,):
        x = torch.randn(T, B, I, dtype=torch.float64, requires_grad=True)
        xx = x * 1.0  # a non-leaf, so it may be modified in place
        out, _ = m(xx)
        with torch.no_grad():
            {"input": xx, "weight": m.weight_hh_l0, "output": out}[what].mul_(2)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.sum().backward()


def test_retain_graph_backward_repeats():
    _, m = pair("RNN", num_layers=2, bidirectional=True)
    x = torch.randn(T, B, I, dtype=torch.float64, requires_grad=True)
    out, _ = m(x)
    loss = (out * out).sum()
    loss.backward(retain_graph=True)
    first = x.grad.clone()
    loss.backward()
    close("second backward's dx", x.grad, 2 * first)
