"""The NumPy twins of the step kernels (rnnrt/kernels/twins.py), checked without a GPU.

- the twins match formulas written here, on views with padding (ld > cols), broadcast
  biases (ld = 0) and in place, with outputs poisoned with NaN and nothing written outside;
- the backward twins, chained over time with the GEMMs between them, reproduce
  ``reference.backward``; the naive rung's ew_* kernels compose to the fused backward twins;
- the view helper.
"""
from __future__ import annotations

import numpy as np
import pytest

from rnnrt import reference
from rnnrt.cells import get_cell
from rnnrt.check import assert_close as check_close
from rnnrt.kernels import registry as K
from rnnrt.kernels import twins as knp


# --- NumPy twins against direct formulas --------------------------------------------------

def _sig(x):
    return 1.0 / (1.0 + np.exp(-x))


def _ref_lstm(x):
    pre = x["gx"] + x["bw"] + x["gh"] + x["br"]
    i, f, g, o = np.split(pre, 4, axis=1)
    i, f, g, o = _sig(i), _sig(f), np.tanh(g), _sig(o)
    c = f * x["c_prev"] + i * g
    return {"h": o * np.tanh(c), "c": c, "act": np.concatenate([i, f, g, o], axis=1)}


def _ref_gru(x):
    gx, gh = x["gx"] + x["bw"], x["gh"] + x["br"]
    xr, xz, xn = np.split(gx, 3, axis=1)
    hr, hz, hn = np.split(gh, 3, axis=1)
    r, z = _sig(xr + hr), _sig(xz + hz)
    n = np.tanh(xn + r * hn)
    return {"h": (1 - z) * n + z * x["h_prev"], "act": np.concatenate([r, z, n, hn], axis=1)}


def _ref_lstm_bwd(x):
    i, f, g, o = np.split(x["act"], 4, axis=1)
    dh = x["dh_above"] + x["dh_rec"]
    tc = np.tanh(x["c"])
    dc = x["dc_next"] + dh * o * (1 - tc**2)
    dgx = [dc * g * i * (1 - i), dc * x["c_prev"] * f * (1 - f), dc * i * (1 - g**2),
           dh * tc * o * (1 - o)]
    return {"dgx": np.concatenate(dgx, axis=1), "dc_prev": dc * f}


def _ref_gru_bwd(x):
    r, z, n, hn = np.split(x["act"], 4, axis=1)
    dh = x["dh_above"] + x["dh_rec"]
    dn = dh * (1 - z) * (1 - n**2)
    dr = dn * hn * r * (1 - r)
    dz = dh * (x["h_prev"] - n) * z * (1 - z)
    return {"dgx": np.concatenate([dr, dz, dn], axis=1),
            "dgh": np.concatenate([dr, dz, dn * r], axis=1), "dh_prev": dh * z}


REF = {
    "ew_add": lambda x: {"out": x["a"] + x["b"]},
    "ew_sub": lambda x: {"out": x["a"] - x["b"]},
    "ew_mul": lambda x: {"out": x["a"] * x["b"]},
    "ew_sigmoid": lambda x: {"out": _sig(x["a"])},
    "ew_tanh": lambda x: {"out": np.tanh(x["a"])},
    "ew_relu": lambda x: {"out": np.maximum(x["a"], 0)},
    "transpose": lambda x: {"out": x["in"].T},
    "lstm_fwd": _ref_lstm,
    "gru_fwd": _ref_gru,
    "rnn_tanh_fwd": lambda x: {"h": np.tanh(x["gx"] + x["bw"] + x["gh"] + x["br"])},
    "rnn_relu_fwd": lambda x: {"h": np.maximum(x["gx"] + x["bw"] + x["gh"] + x["br"], 0)},
    "ew_dsigmoid": lambda x: {"out": x["dy"] * x["y"] * (1 - x["y"])},
    "ew_dtanh": lambda x: {"out": x["dy"] * (1 - x["y"] ** 2)},
    "ew_drelu": lambda x: {"out": x["dy"] * (x["y"] > 0)},
    "lstm_bwd": _ref_lstm_bwd,
    "gru_bwd": _ref_gru_bwd,
    "rnn_tanh_bwd": lambda x: {"dg": (x["dh_above"] + x["dh_rec"]) * (1 - x["h"] ** 2)},
    "rnn_relu_bwd": lambda x: {"dg": (x["dh_above"] + x["dh_rec"]) * (x["h"] > 0)},
}


def _masked_ref(plain, frozen):
    """The reference of a masked kernel: ``plain``'s formula on rows with mask != 0; on the
    frozen rows, frozen(x) -> {output: value} (a pass-through or 0)."""
    def ref(x):
        out = REF[plain](x)
        on = x["mask"][:, 0] != 0
        if plain.endswith("_bwd") and "dh_prev" not in out:
            out["dh_prev"] = np.zeros_like(x["dh_rec"])      # the direct part, zero
        for name, v in frozen(x).items():
            out[name] = np.where(on[:, None], out[name], v)
        return out
    return ref


REF.update({
    "ew_copy": lambda x: {"out": x["a"]},
    "ew_sum_splits": lambda x: {"out": x["base"] + x["parts"].reshape(
        SCALARS["ew_sum_splits"]["splits"], len(x["base"]), -1).sum(axis=0)},
    "ew_select": lambda x: {"out": np.where(x["mask"] != 0, x["a"], x["b"])},
    "lstm_fwd_mask": _masked_ref("lstm_fwd", lambda x: {"h": x["h_prev"], "c": x["c_prev"],
                                                         "act": 0}),
    "gru_fwd_mask": _masked_ref("gru_fwd", lambda x: {"h": x["h_prev"], "act": 0}),
    "rnn_tanh_fwd_mask": _masked_ref("rnn_tanh_fwd", lambda x: {"h": x["h_prev"]}),
    "rnn_relu_fwd_mask": _masked_ref("rnn_relu_fwd", lambda x: {"h": x["h_prev"]}),
    "lstm_bwd_mask": _masked_ref("lstm_bwd", lambda x: {"dgx": 0, "dc_prev": x["dc_next"],
                                                         "dh_prev": x["dh_rec"]}),
    "gru_bwd_mask": _masked_ref("gru_bwd", lambda x: {"dgx": 0, "dgh": 0,
                                                       "dh_prev": x["dh_rec"]}),
    "rnn_tanh_bwd_mask": _masked_ref("rnn_tanh_bwd", lambda x: {"dg": 0,
                                                                 "dh_prev": x["dh_rec"]}),
    "rnn_relu_bwd_mask": _masked_ref("rnn_relu_bwd", lambda x: {"dg": 0,
                                                                 "dh_prev": x["dh_rec"]}),
})


def _split_ref(kernel):
    """The reference of a *_split kernel of ``kernel`` (a plain or a masked backward
    kernel): its formula on dh_rec = base + the parts' sum on the first part_rows rows (all
    rows without that scalar), base alone past them."""
    def ref(x):
        rows = len(x["dh_rec"])
        scalars = _scalars(f"{kernel}_split", rows)
        n, p = scalars["splits"], scalars.get("part_rows", rows)
        rec = x["dh_rec"].copy()
        rec[:p] += x["parts"].reshape(n, p, -1).sum(axis=0)
        return REF[kernel]({**x, "dh_rec": rec})
    return ref


REF.update({f"{k}{m}_split": _split_ref(f"{k}{m}")
            for k in ("lstm_bwd", "gru_bwd", "rnn_tanh_bwd", "rnn_relu_bwd")
            for m in ("", "_mask")})
# the forward kernels without act: their act twin's formula (the outputs they have)
NOACT = {f"{k}_noact": k for k in ("lstm_fwd", "gru_fwd", "lstm_fwd_mask", "gru_fwd_mask")}
REF.update({noact: REF[k] for noact, k in NOACT.items()})
TOL = {np.float32: (2e-6, 2e-5), np.float64: (1e-13, 1e-12)}   # (atol, rtol)
# The fused backward kernels multiply up to four N(0, 4) inputs after sums that may cancel
# (dh_above + dh_rec, dc_next + t, 1 - tanh(c)^2, dh - dh*z): fp32 rounding of terms near
# 100 is ~1e-5 absolute (seen: 5.6e-6 over 200 seeds at the base tolerance).
TOL_FP32_BWD = (2e-5, 1e-4)


def _tol(name, dtype):
    fused_bwd = ("lstm_bwd", "gru_bwd", "lstm_bwd_mask", "gru_bwd_mask", "lstm_bwd_split",
                 "gru_bwd_split", "rnn_tanh_bwd_split", "rnn_relu_bwd_split",
                 "lstm_bwd_mask_split", "gru_bwd_mask_split", "rnn_tanh_bwd_mask_split",
                 "rnn_relu_bwd_mask_split")
    return TOL_FP32_BWD if dtype is np.float32 and name in fused_bwd else TOL[dtype]
BIAS = ("bw", "br")
# Inputs that the "bcast" layout hands over with ld = 0: the biases, and in the backward the
# gradients from step t+1 (a caller may pass one zero row for them at t = T-1).
BCAST = {"lstm_bwd": ("dh_rec", "dc_next"), "gru_bwd": ("dh_rec",),
         "rnn_tanh_bwd": ("dh_rec",), "rnn_relu_bwd": ("dh_rec",)}
BCAST.update({f"{k}_mask": v for k, v in list(BCAST.items())})


def _bcast_args(name):
    return BCAST.get(name, BIAS)


def assert_close(got, ref, atol, rtol, what):
    """|got - ref| <= atol + rtol*|ref| everywhere (NaN fails); reports the worst element."""
    got = np.asarray(got, np.float64)
    assert got.shape == ref.shape, f"{what}: shape {got.shape} != {ref.shape}"
    allowed = atol + rtol * np.abs(ref)
    err = np.abs(got - ref)
    bad = ~(err <= allowed)
    if bad.any():
        excess = np.where(np.isnan(err), np.inf, err - allowed)
        idx = np.unravel_index(np.argmax(excess), ref.shape)
        pytest.fail(f"{what}: {bad.sum()} of {bad.size} elements off; worst at {idx}: got "
                    f"{got[idx]!r}, want {ref[idx]!r} (|err| {err[idx]:.3g}, "
                    f"allowed {allowed[idx]:.3g})")


# the scalars of the step kernels that take any
SCALARS = {"ew_sum_splits": {"splits": 3}, "lstm_bwd_split": {"splits": 2},
           "gru_bwd_split": {"splits": 3}, "rnn_tanh_bwd_split": {"splits": 3},
           "rnn_relu_bwd_split": {"splits": 1},
           # the masked kernels' parts cover the first part_rows rows (a later step's)
           "lstm_bwd_mask_split": {"splits": 2, "part_rows": lambda rows: max(1, rows - 2)},
           "gru_bwd_mask_split": {"splits": 3, "part_rows": lambda rows: max(1, rows - 1)},
           "rnn_tanh_bwd_mask_split": {"splits": 1, "part_rows": lambda rows: rows},
           "rnn_relu_bwd_mask_split": {"splits": 2, "part_rows": lambda rows: max(1, rows - 3)}}


def _scalars(name, rows):
    """Kernel ``name``'s scalars for a launch of ``rows`` rows (SCALARS: a value, or a
    function of the rows)."""
    return {k: (v(rows) if callable(v) else v) for k, v in SCALARS.get(name, {}).items()}


def run_twin(name, rows, cols, dtype, strided=False, bcast=False, alias=None, seed=0):
    """Lay every argument of a [rows, cols] launch of ``name`` out in one NaN-filled flat
    buffer (with padding between rows and views when ``strided``; biases with ld 0 when
    ``bcast`` (and _bcast_args); output alias[0] on top of input alias[1]), run the twin,
    check it against REF
    and check that nothing outside the outputs changed."""
    kinfo = K.KERNELS[name]
    rng = np.random.default_rng(seed)
    scalars = _scalars(name, rows)
    out_shapes, in_shapes = kinfo.arg_shapes(rows, cols, **scalars)
    args = ([(a, s, False) for (a, _), s in zip(kinfo.ins, in_shapes)]
            + [(a, s, True) for (a, _), s in zip(kinfo.outs, out_shapes)])
    place, offset = {}, 3
    for arg, (r, c), is_out in args:
        if is_out and alias and arg == alias[0]:
            place[arg] = place[alias[1]]
            continue
        ld = 0 if (bcast and arg in _bcast_args(name)) else c + (5 if strided else 0)
        place[arg] = (offset, r, c, ld)
        offset += (r - 1) * ld + c + (7 if strided else 0)
    buf = np.full(offset + 3, np.nan, dtype)

    x = {}
    for arg, (r, c), is_out in args:
        if is_out:
            continue
        off, _, _, ld = place[arg]
        data = rng.standard_normal((1 if ld == 0 else r, c)) * 2.0
        if arg == "mask":   # rows that run (1) and frozen rows (0), both present
            data = (np.arange(r)[:, None] + seed) % 3 != 1
        knp.view(buf, off, data.shape[0], c, ld or c)[...] = data
        x[arg] = np.asarray(knp.view(buf, off, r, c, ld), np.float64).copy()
    written = np.zeros(buf.size, bool)
    for a, _ in kinfo.outs:
        off, r, c, ld = place[a]
        for i in range(r):
            written[off + i * ld:off + i * ld + c] = True
    before = buf.copy()

    outs = [knp.view(buf, *place[a]) for a, _ in kinfo.outs]
    ins = [knp.view(buf, *place[a]) for a, _ in kinfo.ins]
    with np.errstate(over="raise", divide="raise", invalid="raise"):
        kinfo.numpy_fn(rows, cols, outs, ins, *[scalars[n] for n in kinfo.scalars])

    atol, rtol = _tol(name, dtype)
    for (a, _), got in zip(kinfo.outs, outs):
        assert_close(got, REF[name](x)[a], atol, rtol, f"{name} {a}")
    np.testing.assert_array_equal(buf[~written], before[~written],
                                  err_msg=f"{name} wrote outside its outputs")


# The persistent kernels' twins run whole sequences: test_kernels_persistent_twins.py.
STEP_KERNELS = {name: kinfo for name, kinfo in K.KERNELS.items() if not kinfo.persistent}
CASES = [(name, layout) for name, kinfo in STEP_KERNELS.items()
         for layout in ("packed", "strided")
         + (("strided+bcast",) if any(a in _bcast_args(name) for a, _ in kinfo.ins) else ())]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rows, cols", [(5, 7), (1, 3)])
@pytest.mark.parametrize("name, layout", CASES)
def test_twin_matches_formula(name, layout, rows, cols, dtype):
    run_twin(name, rows, cols, dtype, strided="strided" in layout, bcast="bcast" in layout)


IN_PLACE = {"ew_add": ("out", "a"), "ew_sub": ("out", "b"), "ew_mul": ("out", "a"),
            "ew_sigmoid": ("out", "a"), "ew_tanh": ("out", "a"), "ew_relu": ("out", "a"),
            "lstm_fwd": ("c", "c_prev"), "gru_fwd": ("h", "h_prev"),
            "rnn_tanh_fwd": ("h", "gx"), "rnn_relu_fwd": ("h", "gx"),
            "ew_dsigmoid": ("out", "y"), "ew_dtanh": ("out", "dy"), "ew_drelu": ("out", "y"),
            "lstm_bwd": ("dgx", "act"), "gru_bwd": ("dh_prev", "dh_rec"),
            "rnn_tanh_bwd": ("dg", "h"), "rnn_relu_bwd": ("dg", "dh_above"),
            "ew_copy": ("out", "a"), "ew_select": ("out", "b"), "ew_sum_splits": ("out", "base"),
            "lstm_fwd_mask": ("c", "c_prev"), "gru_fwd_mask": ("h", "h_prev"),
            "rnn_tanh_fwd_mask": ("h", "h_prev"), "rnn_relu_fwd_mask": ("h", "gx"),
            "lstm_bwd_mask": ("dgx", "act"), "gru_bwd_mask": ("dh_prev", "dh_rec"),
            "rnn_tanh_bwd_mask": ("dh_prev", "dh_rec"), "rnn_relu_bwd_mask": ("dg", "h"),
            "lstm_fwd_noact": ("c", "c_prev"), "gru_fwd_noact": ("h", "h_prev"),
            "lstm_fwd_mask_noact": ("h", "h_prev"), "gru_fwd_mask_noact": ("h", "h_prev"),
            "lstm_bwd_split": ("dgx", "act"), "gru_bwd_split": ("dh_prev", "dh_rec"),
            "rnn_tanh_bwd_split": ("dg", "h"), "rnn_relu_bwd_split": ("dg", "dh_above"),
            "lstm_bwd_mask_split": ("dgx", "act"), "gru_bwd_mask_split": ("dh_prev", "dh_rec"),
            "rnn_tanh_bwd_mask_split": ("dh_prev", "dh_rec"),
            "rnn_relu_bwd_mask_split": ("dg", "h")}
# and a second output in place, for the kernels with more than one
IN_PLACE_2 = {"lstm_bwd": ("dc_prev", "dc_next"), "gru_bwd": ("dh_prev", "dh_above"),
              "lstm_bwd_mask": ("dc_prev", "dc_next"), "gru_bwd_mask": ("dh_prev", "dh_above"),
              "lstm_bwd_split": ("dc_prev", "dc_next"), "gru_bwd_split": ("dh_prev", "dh_above"),
              "lstm_bwd_mask_split": ("dc_prev", "dc_next"),
              "gru_bwd_mask_split": ("dh_prev", "dh_above")}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(IN_PLACE))
def test_twin_in_place(name, dtype):
    run_twin(name, 4, 6, dtype, strided=True, alias=IN_PLACE[name])


@pytest.mark.parametrize("name", sorted(IN_PLACE_2))
def test_twin_in_place_second_output(name):
    run_twin(name, 4, 6, np.float32, strided=True, alias=IN_PLACE_2[name])


def test_every_kernel_but_transpose_has_an_in_place_case():
    assert set(IN_PLACE) == set(STEP_KERNELS) - {"transpose"}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("noact", sorted(NOACT))
def test_noact_twin_is_its_act_twin_without_act(noact, dtype):
    """K_noact's outputs are K's outputs but act, bit for bit (the same arithmetic: an
    inference plan's h and c are a training plan's), on inputs with frozen rows (mask 0) for
    the masked ones; K_noact has exactly K's arguments less act."""
    k, kn = K.KERNELS[NOACT[noact]], K.KERNELS[noact]
    assert kn.ins == k.ins and kn.outs == tuple(o for o in k.outs if o[0] != "act")
    rows, cols, rng = 6, 5, np.random.default_rng(4)
    out_shapes, in_shapes = k.arg_shapes(rows, cols)
    ins = [(rng.standard_normal(s) * 2).astype(dtype) for s in in_shapes]
    if k.ins[-1][0] == "mask":
        ins[-1] = ((np.arange(rows) % 3 != 1)[:, None]).astype(dtype)
    want = [np.full(s, np.nan, dtype) for s in out_shapes]
    k.numpy_fn(rows, cols, want, [a.copy() for a in ins])
    got = [np.full(s, np.nan, dtype) for (a, _), s in zip(k.outs, out_shapes) if a != "act"]
    kn.numpy_fn(rows, cols, got, [a.copy() for a in ins])
    want = [w for (a, _), w in zip(k.outs, want) if a != "act"]
    for (a, _), g, w in zip(kn.outs, got, want):
        np.testing.assert_array_equal(g, w, err_msg=f"{noact} {a}")


def test_ew_add_in_place_same_view_twice():
    """out = a + a with all three the same view (the naive rung does pre = pre + ...)."""
    buf = np.arange(20, dtype=np.float32)
    v = knp.view(buf, 2, 3, 4, 6)
    want = 2 * np.asarray(v, np.float64)
    knp.ew_add(3, 4, [v], [v, v])
    assert_close(v, want, 0, 0, "ew_add")


def test_activations_saturate_without_overflow():
    a = np.array([[-1e4, -200.0, -88.8, 0.0, 88.8, 200.0, 1e4]], np.float32)
    out = np.full_like(a, np.nan)
    with np.errstate(over="raise", divide="raise", invalid="raise"):
        knp.ew_sigmoid(1, 7, [out], [a])
    assert out[0, 0] == 0 and out[0, 1] == 0 and out[0, 3] == 0.5 and (out[0, 4:] == 1).all()
    assert 0 < out[0, 2] < 1e-38


def test_nan_propagates():
    a = np.array([[np.nan, -1.0, 2.0]], np.float32)
    for fn in (knp.ew_sigmoid, knp.ew_tanh, knp.ew_relu):
        out = np.zeros_like(a)
        fn(1, 3, [out], [a])
        assert np.isnan(out[0, 0]), fn.__name__
    out = np.zeros_like(a)
    knp.ew_relu(1, 3, [out], [a])
    assert out[0, 1] == 0 and out[0, 2] == 2


@pytest.mark.parametrize("name", ["rnn_relu_bwd", "ew_drelu"])
def test_relu_backward_edges(name):
    """y > 0 ? dy : 0 (torch's convention): 0 at y == 0 and -0; 0 where y <= 0 or y is NaN
    even if dy is NaN or Inf; dy (NaN and Inf included) passes where y > 0."""
    y = np.array([[-1.0, -0.0, 0.0, 1e-30, 2.0, 3.0, np.nan, -2.0, 4.0]], np.float32)
    dy = np.array([[1.0, 1.0, 1.0, 1.5, np.nan, np.inf, 1.0, np.nan, -2.5]], np.float32)
    want = np.array([[0.0, 0.0, 0.0, 1.5, np.nan, np.inf, 0.0, 0.0, -2.5]])
    out = np.full_like(y, 7.0)
    if name == "ew_drelu":
        knp.ew_drelu(1, 9, [out], [dy, y])
    else:   # the two incoming gradients summed: split dy as dy + 0
        knp.rnn_relu_bwd(1, 9, [out], [dy, np.zeros_like(dy), y])
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, want.astype(np.float32))
    assert not np.signbit(out[0, :3]).any(), "gradient at y <= 0 must be +0"


# --- backward twins chained over time against reference.backward ------------------------

def _reference_case(cell, seed=0, T=4, B=3, I=5, H=6):
    """A 1-layer float64 case: (params, x, cache, dy, dh_n, dc_n, reference gradients)."""
    rng = np.random.default_rng(seed)
    spec = get_cell(cell)
    G = spec.gates
    u = lambda *shape: rng.uniform(-0.8, 0.8, shape)   # large enough to leave the linear range
    params = [{"weight_ih": u(G * H, I), "weight_hh": u(G * H, H),
               "bias_ih": u(G * H), "bias_hh": u(G * H)}]
    x = rng.standard_normal((T, B, I))
    h0 = rng.standard_normal((1, B, H)) * 0.5
    c0 = rng.standard_normal((1, B, H)) * 0.5 if spec.has_cell_state else None
    _, _, _, cache = reference.forward(cell, params, x, h0, c0)
    dy = rng.standard_normal((T, B, H))
    dh_n = rng.standard_normal((1, B, H))
    dc_n = rng.standard_normal((1, B, H)) if spec.has_cell_state else None
    ref = reference.backward(cell, params, cache, dy, dh_n, dc_n)
    return params, cache, dy, dh_n, dc_n, ref


def _twin_backward(cell, params, cache, dy, dh_n, dc_n, dtype):
    """Backprop through time of one layer with the fused backward twin per step and the GEMMs
    between steps as the GPU plan does them: dh_rec = dgh_{t+1} R (+ GRU's direct part)."""
    kinfo = K.KERNELS[f"{cell}_bwd"]
    lc = cache.layers[0]
    cast = lambda a: np.ascontiguousarray(a, dtype)
    w, r = cast(params[0]["weight_ih"]), cast(params[0]["weight_hh"])
    x, h, gates = cast(lc.x), cast(lc.h), None if lc.gates is None else cast(lc.gates)
    c = None if lc.c is None else cast(lc.c)
    dy = cast(dy)
    steps, batch, hidden = dy.shape
    out_shapes, _ = kinfo.arg_shapes(batch, hidden)
    dw, dr = np.zeros_like(w), np.zeros_like(r)
    db_ih, db_hh = np.zeros(w.shape[0], dtype), np.zeros(w.shape[0], dtype)
    dx = np.empty(x.shape, dtype)
    dh_rec = cast(dh_n[0])
    dc = None if dc_n is None else cast(dc_n[0])
    for t in reversed(range(steps)):
        outs = [np.full(s, np.nan, dtype) for s in out_shapes]
        direct = None
        with np.errstate(over="raise", divide="raise", invalid="raise"):
            if cell == "lstm":
                kinfo.numpy_fn(batch, hidden, outs, [dy[t], dh_rec, dc, gates[t], c[t + 1], c[t]])
                (dgx, dc), dgh = outs, outs[0]
            elif cell == "gru":
                kinfo.numpy_fn(batch, hidden, outs, [dy[t], dh_rec, gates[t], h[t]])
                dgx, dgh, direct = outs
            else:
                kinfo.numpy_fn(batch, hidden, outs, [dy[t], dh_rec, h[t + 1]])
                dgx = dgh = outs[0]
        dx[t] = dgx @ w
        dw += dgx.T @ x[t]
        dr += dgh.T @ h[t]
        db_ih += dgx.sum(axis=0)
        db_hh += dgh.sum(axis=0)
        dh_rec = dgh @ r
        if direct is not None:
            dh_rec = dh_rec + direct
    return {"dx": dx, "dh0": dh_rec[None], "dc0": None if dc is None else dc[None],
            "params": [{"weight_ih": dw, "weight_hh": dr, "bias_ih": db_ih, "bias_hh": db_hh}]}


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn_tanh", "rnn_relu"])
def test_backward_twins_chained_reproduce_reference(cell, dtype):
    params, cache, dy, dh_n, dc_n, ref = _reference_case(cell)
    got = _twin_backward(cell, params, cache, dy, dh_n, dc_n, dtype)
    # float64: the same math in another order; float32: the fp32 tolerances of every fast path
    atol, rtol = (1e-12, 1e-10) if dtype is np.float64 else (1e-4, 1e-3)
    if cell == "rnn_relu":
        assert 0 < (cache.layers[0].h[1:] > 0).mean() < 1, "the relu case must have both sides"
    for key in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
        check_close(got["params"][0][key], ref["params"][0][key], atol, rtol, f"{cell} {key}")
    check_close(got["dx"], ref["dx"], atol, rtol, f"{cell} dx")
    check_close(got["dh0"], ref["dh0"], atol, rtol, f"{cell} dh0")
    if cell == "lstm":
        check_close(got["dc0"], ref["dc0"], atol, rtol, f"{cell} dc0")
    # not vacuous: the gradients are not all ~0
    assert np.abs(ref["params"][0]["weight_hh"]).max() > 0.1


# --- the naive rung: ew_* kernels compose to the fused backward ---------------------------

def _ew(name, *ins):
    out = np.full(ins[0].shape, np.nan, ins[0].dtype)
    K.KERNELS[name].numpy_fn(*out.shape, [out], list(ins))
    return out


def _naive_lstm_bwd(dh_above, dh_rec, dc_next, act, c, c_prev):
    i, f, g, o = np.split(act, 4, axis=1)
    dh = _ew("ew_add", dh_above, dh_rec)
    tc = _ew("ew_tanh", c)
    dho = _ew("ew_mul", dh, o)
    t = _ew("ew_dtanh", dho, tc)
    dcc = _ew("ew_add", dc_next, t)
    do_ = _ew("ew_mul", dh, tc)
    di, df, dg = _ew("ew_mul", dcc, g), _ew("ew_mul", dcc, c_prev), _ew("ew_mul", dcc, i)
    dgx = [_ew("ew_dsigmoid", di, i), _ew("ew_dsigmoid", df, f), _ew("ew_dtanh", dg, g),
           _ew("ew_dsigmoid", do_, o)]
    return [np.concatenate(dgx, axis=1), _ew("ew_mul", dcc, f)]


def _naive_gru_bwd(dh_above, dh_rec, act, h_prev):
    r, z, n, hn = np.split(act, 4, axis=1)
    dh = _ew("ew_add", dh_above, dh_rec)
    dhz = _ew("ew_mul", dh, z)
    dn = _ew("ew_sub", dh, dhz)
    dn_p = _ew("ew_dtanh", dn, n)
    d = _ew("ew_sub", h_prev, n)
    dz = _ew("ew_mul", dh, d)
    dz_p = _ew("ew_dsigmoid", dz, z)
    dhn = _ew("ew_mul", dn_p, r)
    dr = _ew("ew_mul", dn_p, hn)
    dr_p = _ew("ew_dsigmoid", dr, r)
    return [np.concatenate([dr_p, dz_p, dn_p], axis=1),
            np.concatenate([dr_p, dz_p, dhn], axis=1), dhz]


NAIVE_BWD = {
    "lstm_bwd": _naive_lstm_bwd,
    "gru_bwd": _naive_gru_bwd,
    "rnn_tanh_bwd": lambda a, b, h: [_ew("ew_dtanh", _ew("ew_add", a, b), h)],
    "rnn_relu_bwd": lambda a, b, h: [_ew("ew_drelu", _ew("ew_add", a, b), h)],
}


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", sorted(NAIVE_BWD))
def test_naive_chain_matches_fused_backward(name, dtype):
    """Same operations in the same order: identical results (+ - * round exactly, and tanh
    is applied to the same array), so the fused twin and the naive rung agree exactly."""
    rng = np.random.default_rng(1)
    B, H = 5, 7
    kinfo = K.KERNELS[name]
    out_shapes, in_shapes = kinfo.arg_shapes(B, H)
    ins = []
    for (arg, _), shape in zip(kinfo.ins, in_shapes):
        if arg == "act":   # the activated gates in their ranges; GRU's hn is unbounded
            kinds = "sstu" if name == "gru_bwd" else "ssts"   # r z n hn | i f g o
            a = np.concatenate([{"s": rng.uniform(0, 1, (B, H)), "t": rng.uniform(-1, 1, (B, H)),
                                 "u": rng.standard_normal((B, H)) * 2}[k] for k in kinds], axis=1)
        elif arg == "h" and name == "rnn_tanh_bwd":
            a = rng.uniform(-1, 1, shape)
        else:
            a = rng.standard_normal(shape) * 2
        ins.append(a.astype(dtype))
    outs = [np.full(s, np.nan, dtype) for s in out_shapes]
    kinfo.numpy_fn(B, H, outs, ins)
    naive = NAIVE_BWD[name](*ins)
    for (arg, _), fused, nv in zip(kinfo.outs, outs, naive):
        assert nv.dtype == dtype
        check_close(nv, fused, 0, 0, f"{name} {arg}: naive vs fused")


def test_view_helper():
    buf = np.arange(30, dtype=np.float64)
    v = knp.view(buf, 1, 3, 4, 10)
    assert v.shape == (3, 4) and v[2, 3] == 1 + 2 * 10 + 3
    v[1, 0] = -1
    assert buf[11] == -1
    b = knp.view(buf, 5, 4, 3, 0)
    assert (b == buf[5:8]).all() and not b.flags.writeable
    assert knp.view(buf, 5, 1, 3, 0).flags.writeable
    with pytest.raises(ValueError, match="past the buffer"):
        knp.view(buf, 1, 3, 4, 14)
    with pytest.raises(ValueError, match="ld 3 < cols 4"):
        knp.view(buf, 0, 2, 4, 3)
    with pytest.raises(ValueError, match="contiguous 1-D"):
        knp.view(buf.reshape(5, 6), 0, 2, 2, 2)
