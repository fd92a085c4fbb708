"""rnnrt.nn on CUDA tensors (marker gpu; skipped without a GPU): against torch.nn (cuDNN, fp32
with TF32 off) on the same weights — output, final states and every gradient — for every
cell, 1-3 layers, bidirectional on and off, batch_first on and off, with and without h0,
plain and padded-to-one-length packed input; the work runs on PyTorch's current stream (a
side stream here); what the CUDA path does not run yet is refused by name.

Run on the device: pytest -m gpu tests/gpu/test_gpu_nn.py
"""
from __future__ import annotations

import numpy as np
import pytest

from rnnrt.device import gpu_available

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU with CuPy")]

torch = pytest.importorskip("torch")

import rnnrt.nn  # noqa: E402
from rnnrt.check import FP32_ATOL, FP32_RTOL, assert_close, reduction_atol  # noqa: E402

T, B, I, H = 6, 5, 12, 16
CELLS = [("LSTM", {}), ("GRU", {}), ("RNN", {"nonlinearity": "tanh"}),
         ("RNN", {"nonlinearity": "relu"})]


@pytest.fixture(scope="module", autouse=True)
def no_tf32():
    old = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = old


def _pair(name, kw, layers, bidirectional, batch_first, seed=0):
    torch.manual_seed(seed)
    ref = getattr(torch.nn, name)(I, H, num_layers=layers, bidirectional=bidirectional,
                                  batch_first=batch_first, **kw).cuda()
    ours = getattr(rnnrt.nn, name)(I, H, num_layers=layers, bidirectional=bidirectional,
                                   batch_first=batch_first, **kw).cuda()
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def _close(a, b, what, atol=FP32_ATOL):
    assert_close(a.detach().cpu().numpy(), b.detach().cpu().numpy(), atol, FP32_RTOL,
                 name=what)


@pytest.mark.parametrize("name, kw", CELLS, ids=["lstm", "gru", "rnn_tanh", "rnn_relu"])
@pytest.mark.parametrize("layers", [1, 3])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("batch_first", [False, True], ids=["tbi", "bti"])
@pytest.mark.parametrize("with_h0", [False, True], ids=["no-h0", "h0"])
def test_equals_torch_nn_on_cuda(name, kw, layers, bidirectional, batch_first, with_h0):
    ref, ours = _pair(name, kw, layers, bidirectional, batch_first)
    g = torch.Generator(device="cuda").manual_seed(1)
    shape = (B, T, I) if batch_first else (T, B, I)
    x = torch.randn(shape, device="cuda", generator=g)
    D = 2 if bidirectional else 1
    hx = None
    if with_h0:
        h0 = 0.5 * torch.randn(D * layers, B, H, device="cuda", generator=g)
        hx = (h0, 0.5 * torch.randn_like(h0)) if name == "LSTM" else h0
    outs = []
    for m in (ref, ours):
        xi = x.clone().requires_grad_(True)
        hxi = None if hx is None else (tuple(t.clone().requires_grad_(True) for t in hx)
                                       if isinstance(hx, tuple) else
                                       hx.clone().requires_grad_(True))
        side = torch.cuda.Stream()   # the module must run on the caller's current stream
        with torch.cuda.stream(side):
            y, hn = m(xi, hxi)
            hn_t = hn if isinstance(hn, tuple) else (hn,)
            loss = (y * y).sum() + sum((h * h).sum() for h in hn_t)
            loss.backward()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        grads = {n: p.grad for n, p in m.named_parameters()}
        hgrads = [] if hxi is None else [t.grad for t in
                                         (hxi if isinstance(hxi, tuple) else (hxi,))]
        outs.append((y, hn_t, xi.grad, hgrads, grads))
    (y0, hn0, dx0, dh0, g0), (y1, hn1, dx1, dh1, g1) = outs
    _close(y1, y0, "y")
    for a, b in zip(hn1, hn0):
        _close(a, b, "h_n / c_n")
    _close(dx1, dx0, "dx")
    for a, b in zip(dh1, dh0):
        _close(a, b, "dh0 / dc0")
    for n in g0:
        _close(g1[n], g0[n], f"d {n}", atol=reduction_atol(T * B))


def test_packed_one_length_and_no_grad(cp):
    ref, ours = _pair("LSTM", {}, 2, True, False)
    x = torch.randn(T, B, I, device="cuda")
    lengths = torch.full((B,), T)
    packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths)
    with torch.no_grad():
        y0, _ = ref(packed)
        y1, _ = ours(packed)
    assert isinstance(y1, torch.nn.utils.rnn.PackedSequence) and y1.data.grad_fn is None
    _close(y1.data, y0.data, "packed y")


def test_what_cuda_does_not_run_yet_is_refused_by_name(cp):
    _, ours = _pair("GRU", {}, 1, False, False)
    x = torch.randn(T, B, I, device="cuda")
    lengths = torch.tensor([6, 5, 5, 3, 2])
    packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths)
    with pytest.raises(NotImplementedError, match="different lengths"):
        ours(packed)
    with pytest.raises(NotImplementedError, match="float64"):
        ours.double()(x.double())


def test_training_loop_reuses_plans_and_memory_stays_bounded(cp):
    """Twenty SGD steps over four lengths: the loss falls, and CuPy's pool does not grow
    after the first two rounds (every plan and workspace built by then)."""
    torch.manual_seed(0)
    m = rnnrt.nn.LSTM(I, H, num_layers=2).cuda()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    target = torch.randn(H, device="cuda")
    pool = cp.get_default_memory_pool()
    losses, used = [], []
    for i in range(20):
        x = torch.randn(5 + i % 4, B, I, device="cuda")
        y, _ = m(x)
        loss = ((y - target) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss))
        torch.cuda.synchronize()
        used.append(pool.total_bytes())
    assert np.mean(losses[-4:]) < np.mean(losses[:4])
    assert max(used[8:]) <= 1.1 * used[7], used
