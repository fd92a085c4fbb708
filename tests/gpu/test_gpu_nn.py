"""rnnrt.nn on CUDA tensors (marker gpu; skipped without a GPU): against torch.nn (cuDNN, fp32
with TF32 off) on the same weights — output, final states and every gradient — for every
cell, 1-3 layers, bidirectional on and off, batch_first on and off, with and without h0,
plain input; and packed sequences of different lengths (sorted, unsorted, padded with
lengths: rnnrt's variable-length plans, outputs zero past each sequence's end); the work runs
on PyTorch's current stream (a side stream here); the parameters are read in place after
.cuda() (no copy a call) and copied once they move; the charLM example's torch path trains
on the GPU; what the CUDA path does not run is refused by name; an LSTM with proj_size runs
torch's own LSTM (cuDNN), its results torch.nn's.

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


def _states(name, D, layers, g):
    """Random h0 (and c0 for LSTM) [D*layers, B, H] on the GPU."""
    h0 = 0.5 * torch.randn(D * layers, B, H, device="cuda", generator=g)
    return (h0, 0.5 * torch.randn_like(h0)) if name == "LSTM" else h0


def _both(ref, ours, x, hx, step):
    """``step(module, x, hx) -> (out, h_n tuple, loss)`` for torch.nn's module and ours, each
    on fresh leaves of x and hx, on a side stream (the module must run on the caller's
    current stream) -> [(out, h_n tuple, dx, [dh0, dc0], {name: grad})] for ref, ours."""
    outs = []
    for m in (ref, ours):
        xi = x.clone().requires_grad_(True)
        hxi = None if hx is None else (tuple(t.clone().requires_grad_(True) for t in hx)
                                       if isinstance(hx, tuple) else
                                       hx.clone().requires_grad_(True))
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            out, hn_t, loss = step(m, xi, hxi)
            loss.backward()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        hgrads = [] if hxi is None else [t.grad for t in
                                         (hxi if isinstance(hxi, tuple) else (hxi,))]
        outs.append((out, hn_t, xi.grad, hgrads, {n: q.grad for n, q in m.named_parameters()}))
    return outs


def _compare(outs, what=""):
    (o0, hn0, dx0, dh0, g0), (o1, hn1, dx1, dh1, g1) = outs
    _close(o1, o0, f"{what} output")
    for a, b in zip(hn1, hn0):
        _close(a, b, f"{what} h_n / c_n")
    _close(dx1, dx0, f"{what} dx")
    for a, b in zip(dh1, dh0):
        _close(a, b, f"{what} dh0 / dc0")
    for n in g0:
        _close(g1[n], g0[n], f"{what} d {n}", atol=reduction_atol(T * B))


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
    hx = _states(name, 2 if bidirectional else 1, layers, g) if with_h0 else None

    def step(m, xi, hxi):
        y, hn = m(xi, hxi)
        hn_t = hn if isinstance(hn, tuple) else (hn,)
        return y, hn_t, (y * y).sum() + sum((h * h).sum() for h in hn_t)

    _compare(_both(ref, ours, x, hx, step))


@pytest.mark.parametrize("name, kw", CELLS[:2], ids=["lstm", "gru"])
def test_recompute_in_chunks_equals_torch_nn(cp, monkeypatch, name, kw):
    """recompute=True, chunks of 2 steps forced (T 6: three): the chunks keep no gates,
    each chunk's backward remakes its own; output and every gradient as torch.nn's."""
    monkeypatch.setenv("RNNRT_CHUNK_STEPS", "2")
    ref, ours = _pair(name, kw, 2, False, False, seed=4)
    ours.recompute = True
    g = torch.Generator(device="cuda").manual_seed(5)
    x = torch.randn((T, B, I), device="cuda", generator=g)

    def step(m, xi, hxi):
        y, hn = m(xi, hxi)
        hn_t = hn if isinstance(hn, tuple) else (hn,)
        return y, hn_t, (y * y).sum() + sum((h * h).sum() for h in hn_t)

    _compare(_both(ref, ours, x, None, step), "recompute")


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


LENGTHS = {"packed_sorted": [6, 5, 5, 3, 2], "packed_unsorted": [3, 6, 1, 5, 6],
           "padded": [2, 6, 6, 1, 4]}
PACKED = [("packed_sorted", False), ("packed_unsorted", True), ("padded", True)]


@pytest.mark.parametrize("name, kw", CELLS, ids=["lstm", "gru", "rnn_tanh", "rnn_relu"])
@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("kind, with_h0", PACKED, ids=[k for k, _ in PACKED])
def test_packed_different_lengths_equal_torch_nn(name, kw, layers, bidirectional, kind,
                                                 with_h0):
    """A packed batch of different lengths (or a padded one with lengths): the per-step
    active batch, the reverse direction from each sequence's own end, h_n at each
    sequence's own last step, padded outputs zero past each end; every gradient."""
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
    ref, ours = _pair(name, kw, layers, bidirectional, False)
    g = torch.Generator(device="cuda").manual_seed(3)
    lengths = LENGTHS[kind]
    x = torch.randn(T, B, I, device="cuda", generator=g)
    D = 2 if bidirectional else 1
    hx = _states(name, D, layers, g) if with_h0 else None

    def step(m, xi, hxi):
        p = pack_padded_sequence(xi, torch.tensor(lengths),
                                 enforce_sorted=kind == "packed_sorted")
        y, hn = m(p, hxi)
        out = pad_packed_sequence(y, total_length=T)[0] if kind == "padded" else y.data
        hn_t = hn if isinstance(hn, tuple) else (hn,)
        w = torch.linspace(-1, 1, out.numel(), device="cuda").view(out.shape)
        return out, hn_t, (out * w).sum() + sum((h * h).sum() for h in hn_t)

    outs = _both(ref, ours, x, hx, step)
    what = f"{name} L{layers} D{D} {kind}"
    _compare(outs, what)
    if kind == "padded":
        for b, n in enumerate(lengths):
            assert torch.count_nonzero(outs[1][0][n:, b]) == 0, f"{what}: output past {b}'s end"


def _cuda_backend():
    from rnnrt.nn.backend import backend_for
    return backend_for(torch.device("cuda", 0), torch.float32)


def test_parameters_are_read_in_place_until_they_move(cp):
    """After .cuda() the module's parameters lie in one flat buffer its runners adopt: a
    training loop copies no parameter; once one is replaced (p.data = ...), the call site is
    replaced by one that copies them each call (the adopting one is let go), and the result
    follows the new values."""
    torch.manual_seed(0)
    ours = rnnrt.nn.GRU(I, H, num_layers=2).cuda()
    ref = torch.nn.GRU(I, H, num_layers=2).cuda()
    ref.load_state_dict(ours.state_dict())
    opt = torch.optim.SGD(ours.parameters(), lr=0.1)
    for _ in range(3):
        ours(torch.randn(T, B, I, device="cuda"))[0].sum().backward()
        opt.step()
        opt.zero_grad()
    first = ours.weight_ih_l0
    sites = [s for (wid, *_), s in _cuda_backend()._sites.items() if wid == id(first)]
    assert len(sites) == 1 and sites[0].adopted_ptrs is not None and sites[0].copies == 0
    with torch.no_grad():
        ours.weight_hh_l1.data = ours.weight_hh_l1.data * 0.5
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(T, B, I, device="cuda")
    _close(ours(x)[0], ref(x)[0], "after a parameter moved")
    now = [s for (wid, *_), s in _cuda_backend()._sites.items() if wid == id(first)]
    assert len(now) == 1 and now[0] is not sites[0], "the moved parameters kept the old site"
    assert now[0].adopted_ptrs is None and now[0].copies == 1


@pytest.mark.parametrize("kind", ["plain", "packed", "autocast"])
def test_projection_runs_torchs_lstm_on_cuda(kind):
    """proj_size > 0 runs torch's own LSTM (cuDNN): torch.nn.LSTM's output, states and
    every gradient, packed (unsorted lengths) and under bf16 autocast too; .cuda() compacts
    the parameters for cuDNN (one storage), as torch.nn's does."""
    import warnings
    from torch.nn.utils.rnn import pack_padded_sequence
    torch.manual_seed(0)
    ref = torch.nn.LSTM(I, H, num_layers=2, bidirectional=True, proj_size=5).cuda()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = rnnrt.nn.LSTM(I, H, num_layers=2, bidirectional=True, proj_size=5).cuda()
    ours.load_state_dict(ref.state_dict())
    ours.flatten_parameters()   # load_state_dict copies in place: still one buffer
    assert ours.implementation == "torch"
    assert len({p.untyped_storage().data_ptr() for p in ours.parameters()}) == 1
    g = torch.Generator(device="cuda").manual_seed(2)
    x = torch.randn(T, B, I, device="cuda", generator=g)
    hx = (0.5 * torch.randn(4, B, 5, device="cuda", generator=g),
          0.5 * torch.randn(4, B, H, device="cuda", generator=g))
    lengths = torch.tensor([3, 6, 1, 6, 4])

    def step(m, xi, hxi):
        if kind == "packed":
            y, hn = m(pack_padded_sequence(xi, lengths, enforce_sorted=False), hxi)
            y = y.data
        else:
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=kind == "autocast"):
                y, hn = m(xi, hxi)
        assert y.shape[-1] == 10 and hn[0].shape == (4, B, 5) and hn[1].shape == (4, B, H)
        return y, hn, (y.float() ** 2).sum() + sum((h.float() ** 2).sum() for h in hn)

    outs = _both(ref, ours, x, hx, step)
    # under autocast the dtype is torch's choice (cuDNN's LSTM with projections gave float16
    # under bfloat16 autocast on the H200): the same as torch.nn's, whatever it is
    assert outs[1][0].dtype == outs[0][0].dtype
    assert outs[0][0].dtype in ((torch.float16, torch.bfloat16) if kind == "autocast"
                                else (torch.float32,))
    _compare(outs, f"proj {kind}")


def test_what_cuda_does_not_run_is_refused_by_name(cp):
    _, ours = _pair("GRU", {}, 1, False, False)
    x = torch.randn(T, B, I, device="cuda")
    with pytest.raises(NotImplementedError, match="float64"):
        ours.double()(x.double())


def test_charlm_torch_path_trains_on_the_gpu(cp, tmp_path):
    """examples/train_charlm.py --framework torch --device gpu --tiny: rnnrt.nn.LSTM on CUDA
    with torch.optim.Adam learns (the CPU test holds the same run to the rnnrt path)."""
    import math

    from testkit import example_module
    tc = example_module("train_charlm")
    rec = tc.main(["--framework", "torch", "--device", "gpu", "--tiny", "--figures-dir",
                   str(tmp_path / "f"), "--results-dir", str(tmp_path / "r")],
                  progress=lambda m: None)
    losses = np.array(rec["train_loss"])
    V = rec["data"]["vocab_size"]
    assert np.all(np.isfinite(losses)) and abs(losses[0] - math.log(V)) < 0.2
    assert losses[-30:].mean() < losses[:3].mean() - 0.8
    assert rec["final"]["val_loss"] < math.log(V) - 0.7
    assert "GPU" in rec["device_label"]


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


def test_empty_cache_gives_the_idle_workspaces_back(cp):
    """Four lengths trained, then rnnrt.nn.empty_cache(): CuPy's pool holds less (the idle
    workspaces and their graphs went), and the module trains on, its results as torch.nn's."""
    ref, ours = _pair("LSTM", {}, 2, False, False, seed=6)
    pool = cp.get_default_memory_pool()
    for t in (5, 6, 7, 8):
        ours(torch.randn(t, B, I, device="cuda"))[0].sum().backward()
    torch.cuda.synchronize()
    before = pool.total_bytes()
    assert rnnrt.nn.empty_cache() >= 3
    assert pool.total_bytes() < before
    ours.zero_grad()   # (the loop's gradients: _both compares one step's)
    x = torch.randn(T, B, I, device="cuda")

    def step(m, xi, hxi):
        y, hn = m(xi, hxi)
        return y, hn, (y * y).sum()

    _compare(_both(ref, ours, x, None, step), "after empty_cache")
