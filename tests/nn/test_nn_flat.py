"""rnnrt.nn's flat parameter buffer (rnnrt/nn/flat.py) and the CUDA backend's use of it
(rnnrt/nn/cuda.py Site), on CPU tensors: the relayout keeps values and Parameter objects,
every call's parameters are one segment in rnnrt's layout (the whole unidirectional stack
too), an optimizer step and load_state_dict land in the buffer; a site whose runner adopted
the segment copies nothing until a parameter moves; gradients come back as views of one
copy of the runner's buffer."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from testkit import CpuSession

import rnnrt
import rnnrt.nn
from rnnrt.nn.backend import group_layers
from rnnrt.nn.cuda import Site
from rnnrt.nn.flat import flatten, layer_layouts, relayout, segment
from rnnrt.params import make_layout

I, H = 5, 6


def _call_params(m, layer, direction):
    names = m._all_weights[layer * m.num_directions + direction]
    return [getattr(m, n) for n in names]


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("cls, bias", [(rnnrt.nn.LSTM, True), (rnnrt.nn.GRU, False)])
def test_relayout_keeps_values_and_makes_every_call_one_segment(cls, bias, bidirectional):
    torch.manual_seed(0)
    m = cls(I, H, num_layers=3, bias=bias, bidirectional=bidirectional)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    ids = [id(p) for p in m.parameters()]
    assert all(segment(_call_params(m, 0, d), make_layout(m.cell, I, H, 1, bias)) is None
               for d in range(m.num_directions)), "a fresh module is not laid out yet"
    flat = relayout(m)
    assert [id(p) for p in m.parameters()] == ids
    for k, v in m.state_dict().items():
        assert torch.equal(v, before[k]), k
    for i, (names, layout) in enumerate(layer_layouts(m)):
        seg = segment([getattr(m, n) for n in names], layout)
        assert seg is not None and seg.numel() == layout.size
        assert seg.data_ptr() == getattr(m, names[0]).data_ptr()
    if not bidirectional:   # the one call of a whole stack: the L-layer layout
        whole = segment(list(m.parameters()), make_layout(m.cell, I, H, 3, bias))
        assert whole is not None and whole.data_ptr() == flat.data_ptr()
        assert whole.numel() == flat.numel()


def test_training_and_loading_write_into_the_buffer():
    torch.manual_seed(1)
    m = rnnrt.nn.LSTM(I, H, num_layers=2)
    flat = relayout(m)
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    y, _ = m(torch.randn(4, 3, I))
    y.sum().backward()
    opt.step()
    assert segment(list(m.parameters()), make_layout("lstm", I, H, 2, True)) is not None
    assert torch.equal(flat[:m.weight_ih_l0.numel()], m.weight_ih_l0.detach().flatten())
    ref = torch.nn.LSTM(I, H, num_layers=2)
    m.load_state_dict(ref.state_dict())
    assert torch.equal(flat[:m.weight_ih_l0.numel()], ref.weight_ih_l0.detach().flatten())
    x = torch.randn(4, 3, I)
    torch.testing.assert_close(m(x)[0], ref(x)[0])


def test_flatten_is_for_cuda_float32_only():
    m = rnnrt.nn.GRU(I, H)
    assert flatten(m) is False and segment(list(m.parameters()),
                                           make_layout("gru", I, H, 1, True)) is None


def test_a_moved_or_foreign_parameter_is_no_segment():
    torch.manual_seed(2)
    m = rnnrt.nn.RNN(I, H, num_layers=2)
    relayout(m)
    layout = make_layout("rnn_tanh", I, H, 2, True)
    assert segment(list(m.parameters()), layout) is not None
    with torch.no_grad():
        m.bias_hh_l1.data = m.bias_hh_l1.data.clone()
    assert segment(list(m.parameters()), layout) is None
    assert segment(list(m.parameters())[:3], layout) is None


@pytest.fixture
def runner(monkeypatch):
    import rnnrt.session
    monkeypatch.setattr(rnnrt.session, "GpuSession", CpuSession)
    from rnnrt.gpu import GpuRunner
    return GpuRunner


def test_an_adopting_site_copies_nothing_until_a_parameter_moves(runner):
    torch.manual_seed(3)
    m = rnnrt.nn.LSTM(I, H, num_layers=2)
    relayout(m)
    params = list(m.parameters())
    layout = make_layout("lstm", I, H, 2, True)
    seg = segment(params, layout)
    r = runner(rnnrt.LSTM(I, H, num_layers=2, seed=0), params=seg.numpy())
    site = Site(r, params, adopted=True)
    for _ in range(3):
        site.load_params(params)
    assert site.copies == 0 and np.shares_memory(r.params, seg.numpy())
    with torch.no_grad():
        m.weight_hh_l1.data = m.weight_hh_l1.data + 1.0   # moved: now copied each call
    params = list(m.parameters())
    site.load_params(params)
    assert site.copies == 1
    e = layout.layer(1)["weight_hh"]
    np.testing.assert_array_equal(r.params[e.offset:e.end].reshape(e.shape),
                                  m.weight_hh_l1.detach().numpy())


def test_a_copying_site_and_the_gradients(runner):
    torch.manual_seed(4)
    m = rnnrt.nn.GRU(I, H, num_layers=2, bias=True)   # not laid out: copied in each call
    params = list(m.parameters())
    r = runner(rnnrt.GRU(I, H, num_layers=2, seed=0))
    site = Site(r, params, adopted=False)
    site.load_params(params)
    assert site.copies == 1
    for (kind, e), p in zip(((e.kind, e) for e in r.model.layout.entries), params,
                            strict=True):
        np.testing.assert_array_equal(r.params[e.offset:e.end].reshape(e.shape),
                                      p.detach().numpy(), err_msg=kind)
    r.grads[...] = np.arange(r.grads.size, dtype=np.float32)
    got = site.grads_by_layer(2)
    r.grads[...] = -1   # the next backward reuses the buffer: the returned ones are a copy
    want = group_layers([torch.from_numpy(np.arange(r.grads.size, dtype=np.float32)[
        e.offset:e.end].reshape(e.shape)) for e in r.model.layout.entries], 2, True)
    assert len(got) == len(want) == 2, (len(got), len(want))
    for g_layer, w_layer in zip(got, want, strict=True):
        assert g_layer and len(g_layer) == len(w_layer)
        for g, w in zip(g_layer, w_layer, strict=True):
            assert torch.equal(g, w)
