"""rnnrt.nn's CUDA backend (rnnrt/nn/cuda.py) end to end on the CPU: CuPy replaced by NumPy
(DLPack both ways works on CPU tensors), GpuRunner's session by testkit.CpuSession (NumPy
workspaces, the NumPy executor), so the backend's own logic — the fixed and the packed
paths, the reverse direction by row maps or by time reversal, the parameters adopted from
the module's flat buffer or copied, the gradients out — runs against torch.nn in float32
on CPU tensors. (What this cannot see, the CUDA kernels, streams and DLPack on the device,
tests/gpu/test_gpu_nn.py checks on a GPU.)"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from testkit import CpuSession

import rnnrt.nn
from rnnrt import check

T, B, I, H = 6, 5, 4, 7
CELLS = {"lstm": ("LSTM", {}), "gru": ("GRU", {}), "rnn_tanh": ("RNN", {"nonlinearity": "tanh"}),
         "rnn_relu": ("RNN", {"nonlinearity": "relu"})}
LENGTHS = {"plain": None, "packed_sorted": [6, 5, 5, 3, 2], "packed_unsorted": [3, 6, 1, 5, 6],
           "one_length": [6, 6, 6, 6, 6]}


def _pair(cell, layers, bidirectional, flat):
    cls, kw = CELLS[cell]
    torch.manual_seed(0)
    ref = getattr(torch.nn, cls)(I, H, num_layers=layers, bidirectional=bidirectional, **kw)
    ours = getattr(rnnrt.nn, cls)(I, H, num_layers=layers, bidirectional=bidirectional, **kw)
    ours.load_state_dict(ref.state_dict())
    if flat:   # what .cuda() does on a GPU
        rnnrt.nn.flat.relayout(ours)
    return ref, ours


def _run(m, x, kind, hx):
    from torch.nn.utils.rnn import pack_padded_sequence
    if kind == "plain":
        y, hn = m(x, hx)
    else:
        p = pack_padded_sequence(x, torch.tensor(LENGTHS[kind]),
                                 enforce_sorted=kind != "packed_unsorted")
        y, hn = m(p, hx)
        y = y.data
    return y, hn if isinstance(hn, tuple) else (hn,)


@pytest.mark.parametrize("flat", [True, False], ids=["adopted", "copied"])
@pytest.mark.parametrize("kind", sorted(LENGTHS))
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("cell", sorted(CELLS))
def test_the_cuda_backend_equals_torch_nn(cuda_on_cpu, cell, bidirectional, kind, flat):
    ref, ours = _pair(cell, 2, bidirectional, flat)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(T, B, I, generator=gen)
    D = 2 if bidirectional else 1
    hx = [torch.randn(2 * D, B, H, generator=gen) for _ in range(2 if cell == "lstm" else 1)]
    results = []
    for m in (ref, ours):
        xs = x.clone().requires_grad_()
        hs = [h.clone().requires_grad_() for h in hx]
        y, hn = _run(m, xs, kind, tuple(hs) if cell == "lstm" else hs[0])
        w = torch.randn(y.shape, generator=torch.Generator().manual_seed(2))
        loss = (y * w).sum() + sum((h * h).sum() for h in hn)
        grads = torch.autograd.grad(loss, [xs, *hs, *m.parameters()])
        results.append((y, hn, grads))
    (y0, hn0, g0), (y1, hn1, g1) = results
    tol = dict(atol=check.FP32_ATOL, rtol=check.FP32_RTOL)
    check.assert_close(y1.detach().numpy(), y0.detach().numpy(), name="y", **tol)
    for a, b in zip(hn1, hn0):
        check.assert_close(a.detach().numpy(), b.detach().numpy(), name="h_n/c_n", **tol)
    names = ["dx"] + ["dh0", "dc0"][:len(hx)] + [n for n, _ in ref.named_parameters()]
    for n, a, b in zip(names, g1, g0):
        check.assert_close(a.numpy(), b.numpy(), name=n, atol=check.reduction_atol(T * B),
                           rtol=check.FP32_RTOL)
    sites = list(cuda_on_cpu._sites.values())
    # the harness itself: every site ran on the CPU stand-in, not a real GPU session
    assert sites and all(isinstance(s.runner.session, CpuSession) for s in sites)
    assert all((s.adopted_ptrs is not None) == flat for s in sites)
    assert all(s.copies == (0 if flat else 1) for s in sites), [s.copies for s in sites]
    packed = kind.startswith("packed")
    assert any(st.ws.plan.key.varlen for s in sites for st in s.runner._states._states.values()
               ) == packed


def test_no_grad_runs_the_inference_plans(cuda_on_cpu):
    ref, ours = _pair("gru", 2, True, True)
    x = torch.randn(T, B, I)
    with torch.no_grad():
        y0, _ = _run(ref, x, "packed_unsorted", None)
        y1, _ = _run(ours, x, "packed_unsorted", None)
    check.assert_close(y1.numpy(), y0.numpy(), name="y")
    assert all(not st.ws.plan.key.train for s in cuda_on_cpu._sites.values()
               for st in s.runner._states._states.values())


def test_a_training_step_moves_only_its_data(cuda_on_cpu, monkeypatch):
    """What a steady training step (fixed batch, no h0, an input needing no gradient)
    does besides the two graph runs, counted: the workspace is loaded with x and dy only
    (h0, c0, dh_n, dc_n stay zero from the first step), five arrays are read out (y, h_n,
    c_n, dh0, dc0: no dx, whose GEMMs the backward plan leaves out), the parameters are not
    copied (adopted), the gradients come out in one copy."""
    from rnnrt.exec.workspace import Workspace
    counts = {}

    def counting(name, real):
        def fn(self, *a, **kw):
            counts[name] = counts.get(name, 0) + 1
            return real(self, *a, **kw)
        return fn

    for name in ("load", "read", "load_rows", "read_rows"):
        monkeypatch.setattr(Workspace, name, counting(name, getattr(Workspace, name)))
    _, ours = _pair("lstm", 2, False, True)
    opt = torch.optim.SGD(ours.parameters(), lr=0.1)
    clones = []
    real_clone = torch.Tensor.clone
    for i in range(3):
        counts.clear()
        y, _ = ours(torch.randn(T, B, I))
        monkeypatch.setattr(torch.Tensor, "clone", lambda t, *a, **k: (
            clones.append(1), real_clone(t, *a, **k))[1])
        y.sum().backward()
        monkeypatch.setattr(torch.Tensor, "clone", real_clone)
        opt.step()
        opt.zero_grad()
    assert counts == {"load": 2, "read": 5}, counts
    site = next(iter(cuda_on_cpu._sites.values()))
    assert site.copies == 0 and len(clones) == 3


def test_a_moved_parameter_gets_a_site_that_adopts_again(cuda_on_cpu, monkeypatch):
    """A no-op .float() on a laid-out module keeps its buffer (no relayout: the site keeps
    reading it in place); a parameter moved (p.data = ...) makes the call site a new runner
    that copies (the old runner, and the old buffer it adopted, are let go), and
    flatten_parameters() makes one that adopts the new buffer. Every call equals torch.nn."""
    import gc
    import weakref

    import rnnrt.nn.flat as flat
    monkeypatch.setattr(flat, "backend_reads", lambda params: True)   # CPU fp32: as CUDA
    ref, ours = _pair("lstm", 2, False, True)
    x = torch.randn(T, B, I)

    def call():
        with torch.no_grad():
            y0, y1 = ref(x)[0], ours(x)[0]
        check.assert_close(y1.numpy(), y0.numpy(), name="y")
        (site,) = cuda_on_cpu._sites.values()
        return site

    first = call()
    ptrs = [p.data_ptr() for p in ours.parameters()]
    ours.float()                                  # changes nothing: nothing moves
    assert [p.data_ptr() for p in ours.parameters()] == ptrs
    assert call() is first and first.copies == 0 and first.adopted_ptrs is not None
    with torch.no_grad():
        ours.weight_hh_l1.data = ours.weight_hh_l1.data.clone()
    old = weakref.ref(first.runner)
    copying = call()
    assert copying is not first and copying.adopted_ptrs is None and copying.copies == 1
    del first
    gc.collect()
    assert old() is None, "the replaced site's runner (and the old buffer) stays alive"
    ours.flatten_parameters()
    adopting = call()
    assert adopting is not copying and adopting.adopted_ptrs is not None
    assert adopting.copies == 0
    assert np.shares_memory(adopting.runner.params, ours.weight_ih_l0.detach().numpy())
    assert call() is adopting and adopting.copies == 0


def test_laid_out_says_whether_a_relayout_is_needed():
    m = rnnrt.nn.GRU(I, H, num_layers=2, bidirectional=True)
    assert not rnnrt.nn.flat.laid_out(m)
    rnnrt.nn.flat.relayout(m)
    assert rnnrt.nn.flat.laid_out(m)
    with torch.no_grad():
        m.bias_ih_l1_reverse.data = m.bias_ih_l1_reverse.data.clone()
    assert not rnnrt.nn.flat.laid_out(m)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_recompute_in_chunks_equals_torch_nn(cuda_on_cpu, monkeypatch, cell):
    """recompute=True with chunks of 2 steps forced (T 6: three chunks): outputs and every
    gradient as torch.nn's; the chunks' plans recompute and their states share the gates
    (each chunk's were overwritten by the later chunks before its backward ran)."""
    monkeypatch.setenv("RNNRT_CHUNK_STEPS", "2")
    ref, ours = _pair(cell, 2, False, True)
    ours.recompute = True
    assert "recompute=True" in repr(ours)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(T, B, I, generator=gen)
    results = []
    for m in (ref, ours):
        xs = x.clone().requires_grad_()
        y, hn = _run(m, xs, "plain", None)
        loss = (y * torch.randn(y.shape, generator=torch.Generator().manual_seed(4))).sum()
        results.append((y, torch.autograd.grad(loss, [xs, *m.parameters()])))
    (y0, g0), (y1, g1) = results
    check.assert_close(y1.detach().numpy(), y0.detach().numpy(), name="y",
                       atol=check.FP32_ATOL, rtol=check.FP32_RTOL)
    for n, a, b in zip(["dx"] + [n for n, _ in ref.named_parameters()], g1, g0):
        check.assert_close(a.numpy(), b.numpy(), name=n, atol=check.reduction_atol(T * B),
                           rtol=check.FP32_RTOL)
    (site,) = cuda_on_cpu._sites.values()
    chunk_states = [st for sts in site.runner.long._states.values() for st in sts]
    assert len(chunk_states) == 3 and all(st.ws.plan.key.recompute for st in chunk_states)
    a, b = chunk_states[0].ws.bufs, chunk_states[1].ws.bufs
    gates = [n for n in a if n.startswith("act")]
    assert gates and all(a[n] is b[n] for n in gates)


def test_recompute_must_be_a_bool():
    with pytest.raises(TypeError, match="recompute should be of type bool"):
        rnnrt.nn.LSTM(I, H, recompute=1)
    assert "recompute" not in repr(rnnrt.nn.GRU(I, H))


def _step(m, T_, gen):
    """A training step of module ``m`` on a random [T_, B, I] batch -> its output."""
    x = torch.randn(T_, B, I, generator=gen, requires_grad=True)
    y, _ = m(x)
    y.sum().backward()
    return y


def test_the_total_budget_drops_idle_states_of_the_least_recent_site(cuda_on_cpu,
                                                                     monkeypatch):
    """Two modules (two sites), many lengths: past TOTAL_CACHE_BYTES the idle states of the
    site used least recently go; the site being called keeps its own; a state a live tape
    holds is never dropped; results stay right after a dropped shape runs again."""
    import rnnrt.nn.cuda as nn_cuda
    gen = torch.Generator().manual_seed(5)
    ref, a = _pair("gru", 1, False, True)
    _, b = _pair("lstm", 1, False, True)
    _step(a, 3, gen)
    _step(a, 4, gen)
    (site_a,) = cuda_on_cpu._sites.values()
    held = a(torch.randn(5, B, I, generator=gen, requires_grad=True))[0]   # a live tape
    budget = site_a.runner.cached_bytes() - 1          # already past it: b's calls trim a's
    monkeypatch.setattr(nn_cuda, "TOTAL_CACHE_BYTES", budget)
    _step(b, 3, gen)
    site_b = [s for s in cuda_on_cpu._sites.values() if s is not site_a][0]
    assert cuda_on_cpu.trims >= 1 and site_b.runner.cached_states() >= 1
    assert site_a.runner.cached_states() == 1          # only the state the live tape holds
    held.sum().backward()                              # ... whose backward still runs
    # a dropped shape runs again, right
    x = torch.randn(3, B, I, generator=gen)
    with torch.no_grad():
        check.assert_close(a(x)[0].numpy(), ref(x)[0].numpy(), name="y after a trim",
                           atol=check.FP32_ATOL, rtol=check.FP32_RTOL)


def test_empty_cache_drops_what_no_live_tape_needs(cuda_on_cpu):
    gen = torch.Generator().manual_seed(6)
    ref, m = _pair("lstm", 2, False, True)
    _step(m, 3, gen)
    _step(m, 4, gen)
    (site,) = cuda_on_cpu._sites.values()
    x = torch.randn(5, B, I, generator=gen, requires_grad=True)
    y = m(x)[0]                                        # a live tape
    assert site.runner.cached_states() == 3
    assert cuda_on_cpu.empty_cache() == 2 and site.runner.cached_states() == 1
    (g,) = torch.autograd.grad(y.sum(), [x])
    x2 = x.detach().clone().requires_grad_()
    (g_ref,) = torch.autograd.grad(ref(x2)[0].sum(), [x2])
    check.assert_close(g.numpy(), g_ref.numpy(), name="dx after empty_cache",
                       atol=check.FP32_ATOL, rtol=check.FP32_RTOL)
    assert rnnrt.nn.empty_cache() >= 0   # the process-wide one (its own backend, if any)
