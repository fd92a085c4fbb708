"""Models and the flat parameter buffer (CPU): layout, views, init, state_dict in and out,
forward/backward through the model against the reference, and, where torch is installed,
against torch.nn.LSTM / GRU / RNN (outputs and gradients, both weight directions)."""
from __future__ import annotations

import numpy as np
import pytest

from rnnrt import reference
from rnnrt.cells import CELLS, backward_flops, forward_flops, get_cell
from rnnrt.models import GRU, LSTM, RNN, Grads, RNNBase, StateDictError, Tape
from rnnrt.params import ALIGN, KINDS, make_layout, per_layer, views

ALL_CELLS = sorted(CELLS)
I, H = 5, 7  # unequal, and neither a multiple of ALIGN, so padding really occurs


def make(cell, input_size=I, hidden_size=H, num_layers=2, **kw):
    """A model of ``cell`` ('lstm', 'gru', 'rnn_tanh', 'rnn_relu') through its public class."""
    if cell == "lstm":
        return LSTM(input_size, hidden_size, num_layers, **kw)
    if cell == "gru":
        return GRU(input_size, hidden_size, num_layers, **kw)
    return RNN(input_size, hidden_size, num_layers, nonlinearity=cell[4:], **kw)


def covered(layout) -> np.ndarray:
    """[layout.size] bool: True where some parameter lives, False on padding."""
    mask = np.zeros(layout.size, bool)
    for e in layout.entries:
        mask[e.offset:e.end] = True
    return mask


def inputs(model, steps=4, batch=3, seed=1):
    """Random x (in the model's layout), hx (torch's structure) for ``model``."""
    rng = np.random.default_rng(seed)
    dt = model.dtype
    x_shape = (batch, steps, model.input_size) if model.batch_first else (steps, batch,
                                                                          model.input_size)
    x = rng.standard_normal(x_shape).astype(dt)
    state = (model.num_layers, batch, model.hidden_size)
    h0 = (0.5 * rng.standard_normal(state)).astype(dt)
    if model.cell.has_cell_state:
        return x, (h0, (0.5 * rng.standard_normal(state)).astype(dt))
    return x, h0


def finals(model, hn_out) -> list:
    """forward's second value as a list: [h_n, c_n] for LSTM, [h_n] otherwise."""
    return list(hn_out) if model.cell.has_cell_state else [hn_out]


def out_grads(model, y, seed=2):
    """Random dy shaped like y and dhx shaped like hx."""
    rng = np.random.default_rng(seed)
    dy = rng.standard_normal(y.shape).astype(model.dtype)
    state = (model.num_layers, y.shape[0 if model.batch_first else 1], model.hidden_size)
    dh = rng.standard_normal(state).astype(model.dtype)
    if model.cell.has_cell_state:
        return dy, (dh, rng.standard_normal(state).astype(model.dtype))
    return dy, dh


# --------------------------------------------------------------------------- layout

@pytest.mark.parametrize("cell", ALL_CELLS)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("num_layers", [1, 3])
def test_layout_aligned_ordered_no_overlap(cell, bias, num_layers):
    lay = make_layout(cell, I, H, num_layers, bias)
    g = get_cell(cell).gates
    kinds = KINDS if bias else KINDS[:2]
    assert lay.names() == tuple(f"{k}_l{l}" for l in range(num_layers) for k in kinds)
    assert lay.entries[0].offset == 0
    assert lay.size % ALIGN == 0 and lay.entries[-1].end <= lay.size < lay.entries[-1].end + ALIGN
    for a, b in zip(lay.entries, lay.entries[1:]):
        assert a.end <= b.offset < a.end + ALIGN, (a, b)  # no overlap, no wasted alignment
    for e in lay.entries:
        assert e.offset % ALIGN == 0, e
        i_l = I if e.layer == 0 else H
        want = {"weight_ih": (g * H, i_l), "weight_hh": (g * H, H),
                "bias_ih": (g * H,), "bias_hh": (g * H,)}[e.kind]
        assert e.shape == want and e.name == f"{e.kind}_l{e.layer}"
        assert lay.entry(e.name) == e and lay.layer(e.layer)[e.kind] == e
    assert set(lay.layer(0)) == set(kinds)


def test_layout_lookup_errors():
    lay = make_layout("gru", I, H, 2, True)
    with pytest.raises(KeyError, match="weight_ih_l2"):
        lay.entry("weight_ih_l2")
    with pytest.raises(IndexError, match="layer"):
        lay.layer(2)
    with pytest.raises(ValueError, match="cell"):
        make_layout("lstmx", I, H, 1, True)
    with pytest.raises(ValueError, match="hidden_size"):
        make_layout("lstm", I, 0, 1, True)


@pytest.mark.parametrize("cell", ALL_CELLS)
@pytest.mark.parametrize("bias", [True, False])
def test_views_share_memory_and_padding_is_zero(cell, bias):
    m = make(cell, bias=bias, seed=0)
    assert m.flat.shape == (m.layout.size,) and m.flat.dtype == np.float32
    assert np.all(m.flat[~covered(m.layout)] == 0)
    named = m.named_parameters()
    assert list(named) == list(m.layout.names())
    layers = per_layer(m.flat, m.layout)
    for e in m.layout.entries:
        for v in (named[e.name], getattr(m, e.name), layers[e.layer][e.kind]):
            assert v.shape == e.shape and np.shares_memory(v, m.flat)
    if not bias:
        assert all(d["bias_ih"] is None and d["bias_hh"] is None for d in layers)
    # Writing through a view writes the buffer at the entry's offset, and vice versa.
    e = m.layout.entries[-1]
    getattr(m, e.name)[...] = 3.0
    assert np.all(m.flat[e.offset:e.end] == 3.0)
    m.flat[e.offset] = -1.0
    assert named[e.name].reshape(-1)[0] == -1.0


def test_views_reject_wrong_buffer():
    lay = make_layout("lstm", I, H, 1, True)
    with pytest.raises(ValueError, match=rf"flat: expected shape \({lay.size},\)"):
        views(np.zeros(lay.size + 1, np.float32), lay)
    with pytest.raises(ValueError, match="contiguous"):
        views(np.zeros(2 * lay.size, np.float32)[::2], lay)
    with pytest.raises(TypeError, match="flat"):
        per_layer([0.0] * lay.size, lay)


# --------------------------------------------------------------------------- init

@pytest.mark.parametrize("cell", ALL_CELLS)
def test_same_seed_same_weights_different_seed_differ(cell):
    a, b, c = make(cell, seed=5), make(cell, seed=5), make(cell, seed=6)
    assert np.array_equal(a.flat, b.flat)
    assert not np.array_equal(a.flat, c.flat)
    # One seed gives the same draw in both dtypes (rounded for float32).
    d = make(cell, seed=5, dtype=np.float64)
    assert d.flat.dtype == np.float64
    assert np.array_equal(d.flat.astype(np.float32), a.flat)


@pytest.mark.parametrize("cell", ALL_CELLS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_init_bounds_like_torch(cell, dtype):
    m = make(cell, input_size=16, hidden_size=32, dtype=dtype, seed=0)
    bound = dtype(1.0 / np.sqrt(32))
    for name, v in m.named_parameters().items():
        assert np.all(np.abs(v) <= bound) and np.all(v != 0), name
    # uniform on the whole interval, not a narrower one, and centred: every tenth of it is
    # hit about equally often (thousands of draws here)
    w = m.flat[covered(m.layout)]
    counts = np.histogram(w, bins=10, range=(-bound, bound))[0]
    assert counts.min() > 0.7 * w.size / 10, counts


# --------------------------------------------------------------------------- state_dict

@pytest.mark.parametrize("cell", ALL_CELLS)
@pytest.mark.parametrize("bias", [True, False])
def test_state_dict_round_trip(cell, bias):
    a, b = make(cell, bias=bias, seed=1), make(cell, bias=bias, seed=2)
    sd = a.state_dict()
    assert list(sd) == list(a.layout.names())
    for k, v in sd.items():
        assert not np.shares_memory(v, a.flat), k  # copies
    sd[next(iter(sd))][...] = 9.0
    assert not np.any(a.flat == 9.0)
    res = b.load_state_dict(a.state_dict())
    assert res.missing_keys == [] and res.unexpected_keys == []
    assert np.array_equal(a.flat, b.flat)
    assert np.all(b.flat[~covered(b.layout)] == 0)


def test_load_casts_float64_into_float32_model():
    a64, b32 = make("lstm", dtype=np.float64, seed=1), make("lstm", seed=2)
    b32.load_state_dict(a64.state_dict())
    assert b32.flat.dtype == np.float32
    assert np.array_equal(b32.flat, a64.flat.astype(np.float32))


def _load_fails(model, sd, *words, **kw):
    """Assert loading ``sd`` raises StateDictError mentioning ``words`` and changes nothing."""
    before = model.flat.copy()
    with pytest.raises(StateDictError) as info:
        model.load_state_dict(sd, **kw)
    for w in words:
        assert w in str(info.value), (w, str(info.value))
    assert model.flat.tobytes() == before.tobytes()
    return info.value


@pytest.mark.parametrize("cell", ALL_CELLS)
def test_failed_load_leaves_weights_unchanged(cell):
    m, src = make(cell, seed=0), make(cell, seed=1)
    good = src.state_dict()

    sd = dict(good)
    del sd["weight_hh_l1"]
    _load_fails(m, sd, "missing key 'weight_hh_l1'")

    _load_fails(m, {**good, "weight_ih_l2": good["weight_ih_l1"]},
                "unexpected key 'weight_ih_l2'")

    e = m.layout.entry("weight_ih_l0")
    _load_fails(m, {**good, "weight_ih_l0": np.zeros((e.shape[1], e.shape[0]), np.float32)},
                "'weight_ih_l0': shape", f"expected {e.shape}")

    for bad in (np.int64, np.bool_, np.complex64):
        _load_fails(m, {**good, "bias_hh_l0": good["bias_hh_l0"].astype(bad)},
                    "'bias_hh_l0': dtype", "floating")

    nan = good["weight_hh_l0"].copy()
    nan[0, 0] = np.nan
    _load_fails(m, {**good, "weight_hh_l0": nan}, "'weight_hh_l0'", "non-finite")

    # Every problem at once, all listed; the good keys earlier in the dict are not copied.
    err = _load_fails(m, {k: v for k, v in good.items() if k != "bias_ih_l1"}
                      | {"bias_hh_l1": good["bias_hh_l1"][:-1], "extra": np.zeros(1)},
                      "missing key 'bias_ih_l1'", "unexpected key 'extra'", "'bias_hh_l1': shape")
    assert len(err.problems) == 3 and isinstance(err, ValueError)

    with pytest.raises(TypeError, match="state_dict: expected a mapping"):
        m.load_state_dict(list(good.items()))


def test_load_non_strict_and_nonfinite_opt_in():
    m, src = make("gru", seed=0), make("gru", seed=1)
    sd = src.state_dict()
    del sd["weight_ih_l0"]
    sd["foo"] = np.zeros(3)
    before = m.weight_ih_l0.copy()
    res = m.load_state_dict(sd, strict=False)
    assert res.missing_keys == ["weight_ih_l0"] and res.unexpected_keys == ["foo"]
    assert np.array_equal(m.weight_ih_l0, before)
    assert np.array_equal(m.weight_hh_l1, src.weight_hh_l1)
    # shapes are checked even when not strict
    _load_fails(m, {"weight_hh_l0": np.zeros(3, np.float32)}, "'weight_hh_l0': shape",
                strict=False)
    sd = src.state_dict()
    sd["bias_ih_l0"][0] = np.inf
    m.load_state_dict(sd, allow_nonfinite=True)
    assert np.isinf(m.bias_ih_l0[0])


def test_parameters_cannot_be_rebound_and_config_is_read_only():
    m = make("lstm", seed=0)
    with pytest.raises(AttributeError, match="weight_ih_l0"):
        m.weight_ih_l0 = np.zeros_like(m.weight_ih_l0)
    with pytest.raises(AttributeError, match="hidden_size"):
        m.hidden_size = 3
    with pytest.raises(AttributeError, match="weight_ih_l9"):
        m.weight_ih_l9
    assert m.hidden_size == H


# --------------------------------------------------------------------------- forward/backward

@pytest.mark.parametrize("cell", ALL_CELLS)
@pytest.mark.parametrize("bias", [True, False])
def test_forward_backward_equal_reference(cell, bias):
    m = make(cell, bias=bias, dtype=np.float64, seed=3)
    x, hx = inputs(m)
    h0, c0 = hx if m.cell.has_cell_state else (hx, None)
    y, hn_out, tape = m(x, hx, train=True)
    assert isinstance(tape, Tape)
    ry, rh, rc, rcache = reference.forward(cell, per_layer(m.flat, m.layout), x, h0, c0)
    if m.cell.has_cell_state:
        h_n, c_n = hn_out
        assert np.array_equal(c_n, rc)
    else:
        h_n = hn_out
        assert rc is None
    assert np.array_equal(y, ry) and np.array_equal(h_n, rh)
    # inference returns the same, without a tape
    inf = m.forward(x, hx)
    assert len(inf) == 2 and np.array_equal(inf[0], y)

    dy, dhx = out_grads(m, y)
    dh, dc = dhx if m.cell.has_cell_state else (dhx, None)
    g = m.backward(tape, dy, dhx)
    r = reference.backward(cell, per_layer(m.flat, m.layout), rcache, dy, dh, dc)
    assert isinstance(g, Grads)
    assert np.array_equal(g.dx, r["dx"]) and np.array_equal(g.dh0, r["dh0"])
    if m.cell.has_cell_state:
        assert np.array_equal(g.dc0, r["dc0"])
    else:
        assert g.dc0 is None
    for e in m.layout.entries:
        assert np.array_equal(g.params[e.name], r["params"][e.layer][e.kind]), e.name


@pytest.mark.parametrize("cell", ALL_CELLS)
def test_grads_flat_matches_named_grads(cell):
    m = make(cell, seed=3)
    x, hx = inputs(m)
    y, _, tape = m(x, hx, train=True)
    g = m.backward(tape, *out_grads(m, y))
    assert g.flat.shape == m.flat.shape and g.flat.dtype == m.dtype
    assert list(g.params) == list(m.layout.names())
    for e in m.layout.entries:
        assert np.array_equal(g.flat[e.offset:e.end].reshape(e.shape), g.params[e.name])
        assert np.shares_memory(g.params[e.name], g.flat)
        assert np.any(g.params[e.name] != 0), e.name
    assert np.all(g.flat[~covered(m.layout)] == 0)


@pytest.mark.parametrize("cell", ALL_CELLS)
def test_batch_first_is_the_transpose(cell):
    tm = make(cell, dtype=np.float64, seed=4)
    bf = make(cell, dtype=np.float64, seed=4, batch_first=True)
    x, hx = inputs(tm)
    xb = np.ascontiguousarray(x.transpose(1, 0, 2))
    y, hn, tape = tm(x, hx, train=True)
    yb, hnb, tapeb = bf(xb, hx, train=True)
    assert yb.shape == (x.shape[1], x.shape[0], H)
    assert np.array_equal(yb, y.transpose(1, 0, 2))
    for a, b in zip(finals(tm, hn), finals(bf, hnb), strict=True):
        assert np.array_equal(a, b)
    dy, dhx = out_grads(tm, y)
    g = tm.backward(tape, dy, dhx)
    gb = bf.backward(tapeb, np.ascontiguousarray(dy.transpose(1, 0, 2)), dhx)
    assert np.array_equal(gb.dx, g.dx.transpose(1, 0, 2))
    assert np.array_equal(gb.dh0, g.dh0) and np.array_equal(gb.flat, g.flat)


def test_tape_is_a_snapshot_and_dy_none_is_zeros():
    m = make("lstm", dtype=np.float64, seed=0)
    x, hx = inputs(m)
    y, _, tape = m(x, hx, train=True)
    dy, dhx = out_grads(m, y)
    before = m.backward(tape, dy, dhx)
    m.flat[:] *= 2.0   # later writes to the weights ...
    x[...] = 0.0       # ... and to x do not change the tape's gradients
    after = m.backward(tape, dy, dhx)
    assert np.array_equal(before.flat, after.flat) and np.array_equal(before.dx, after.dx)

    only_state = m.backward(tape, None, dhx)
    zeros = m.backward(tape, np.zeros_like(y), dhx)
    assert np.array_equal(only_state.flat, zeros.flat)

    other = make("gru", seed=0)
    with pytest.raises(ValueError, match="tape"):
        other.backward(tape, dy)
    with pytest.raises(TypeError, match="tape"):
        m.backward(None, dy)


def test_flops_and_repr():
    m = LSTM(32, 64, 3)
    assert m.flops(8, 10) == forward_flops("lstm", 32, 64, 3, 8, 10)
    assert m.flops(8, 10, backward=True) == backward_flops("lstm", 32, 64, 3, 8, 10)
    assert repr(m) == "LSTM(32, 64, num_layers=3)"
    assert repr(GRU(3, 4, bias=False, batch_first=True)) == "GRU(3, 4, bias=False, batch_first=True)"
    assert repr(RNN(3, 4, nonlinearity="relu", dtype=np.float64)) == \
        "RNN(3, 4, nonlinearity='relu', dtype=np.float64)"
    assert RNN(3, 4).cell_name == "rnn_tanh" and RNN(3, 4, nonlinearity="relu").cell_name == "rnn_relu"
    assert RNNBase("RNN_RELU", 3, 4).cell_name == "rnn_relu"


# --------------------------------------------------------------------------- against torch

def _torch_model(torch, cell, bias, batch_first, num_layers=2):
    cls = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}.get(cell)
    kw = dict(num_layers=num_layers, bias=bias, batch_first=batch_first, dtype=torch.float64)
    if cls is None:
        return torch.nn.RNN(I, H, nonlinearity=cell[4:], **kw)
    return cls(I, H, **kw)


def _torch_run(torch, tm, cell, x, hx, dy, dhx):
    """torch forward + autograd backward. -> (outputs list, grads dict) as NumPy."""
    lstm = get_cell(cell).has_cell_state
    tx = torch.from_numpy(x).requires_grad_()
    hs = [torch.from_numpy(a).requires_grad_() for a in (hx if lstm else (hx,))]
    ty, thn = tm(tx, tuple(hs) if lstm else hs[0])
    finals = list(thn) if lstm else [thn]
    loss = (ty * torch.from_numpy(dy)).sum()
    for t, d in zip(finals, dhx if lstm else (dhx,)):
        loss = loss + (t * torch.from_numpy(d)).sum()
    loss.backward()
    outs = [ty.detach().numpy()] + [t.detach().numpy() for t in finals]
    grads = {"dx": tx.grad.numpy(), "dh0": hs[0].grad.numpy()}
    if lstm:
        grads["dc0"] = hs[1].grad.numpy()
    grads.update({k: p.grad.numpy() for k, p in tm.named_parameters()})
    return outs, grads


@pytest.mark.parametrize("cell", ALL_CELLS)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("batch_first", [False, True])
def test_torch_state_dict_loads_and_matches(cell, bias, batch_first):
    torch = pytest.importorskip("torch", reason="torch is a comparison-only dependency")
    torch.manual_seed(0)
    tm = _torch_model(torch, cell, bias, batch_first)
    m = make(cell, bias=bias, batch_first=batch_first, dtype=np.float64, seed=9)
    tsd = {k: v.detach().numpy() for k, v in tm.state_dict().items()}
    assert list(tsd) == list(m.layout.names())  # same names, same order
    m.load_state_dict(tsd)
    for k, v in tsd.items():
        assert np.array_equal(getattr(m, k), v), k

    x, hx = inputs(m)
    y, hn_out, tape = m(x, hx, train=True)
    dy, dhx = out_grads(m, y)
    g = m.backward(tape, dy, dhx)
    ours = [y] + finals(m, hn_out)
    theirs, tg = _torch_run(torch, tm, cell, x, hx, dy, dhx)
    tol = dict(rtol=1e-10, atol=1e-12)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, **tol)
    np.testing.assert_allclose(g.dx, tg["dx"], **tol)
    np.testing.assert_allclose(g.dh0, tg["dh0"], **tol)
    if m.cell.has_cell_state:
        np.testing.assert_allclose(g.dc0, tg["dc0"], **tol)
    for k in m.layout.names():
        np.testing.assert_allclose(g.params[k], tg[k], err_msg=k, **tol)


@pytest.mark.parametrize("cell", ALL_CELLS)
@pytest.mark.parametrize("bias", [True, False])
def test_our_state_dict_loads_into_torch(cell, bias):
    torch = pytest.importorskip("torch", reason="torch is a comparison-only dependency")
    m = make(cell, bias=bias, dtype=np.float64, seed=11)
    tm = _torch_model(torch, cell, bias, batch_first=False)
    tm.load_state_dict({k: torch.from_numpy(v) for k, v in m.state_dict().items()})
    x, hx = inputs(m)
    y, hn_out = m(x, hx)
    with torch.no_grad():
        hx_t = (tuple(torch.from_numpy(a) for a in hx) if m.cell.has_cell_state
                else torch.from_numpy(hx))
        ty, thn = tm(torch.from_numpy(x), hx_t)
    np.testing.assert_allclose(y, ty.numpy(), rtol=1e-10, atol=1e-12)
    for a, b in zip(finals(m, hn_out), finals(m, thn), strict=True):
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-10, atol=1e-12)
    if cell != "rnn_relu":  # torch's repr omits the nonlinearity, ours shows 'relu'
        assert repr(make(cell, bias=bias)) == repr(tm)


def test_torch_float32_state_dict_into_float32_model():
    torch = pytest.importorskip("torch", reason="torch is a comparison-only dependency")
    torch.manual_seed(1)
    tm = torch.nn.LSTM(I, H, 2)
    m = LSTM(I, H, 2)
    m.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()})
    x = np.random.default_rng(0).standard_normal((6, 3, I)).astype(np.float32)
    y, (h_n, c_n) = m(x)
    with torch.no_grad():
        ty, (th, tc) = tm(torch.from_numpy(x))
    np.testing.assert_allclose(y, ty.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(c_n, tc.numpy(), rtol=1e-5, atol=1e-6)


def test_deepcopy_and_pickle_own_their_buffer():
    import copy
    import pickle

    m = make("gru", seed=0)
    for c in (copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
        assert np.array_equal(c.flat, m.flat) and not np.shares_memory(c.flat, m.flat)
        assert np.shares_memory(c.weight_hh_l1, c.flat) and repr(c) == repr(m)
