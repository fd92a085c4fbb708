"""The rounding-aware reference's own contract (rnnrt.reference and rnnrt.varlen with
``dtype``): fp32 storage rounds nothing (the plain reference, bit for bit), the 16-bit ones
round exactly at the documented points (checked by recomputing a layer by hand), a bad dtype
is refused naming the allowed ones, a backward at another precision than its forward is
refused, and the caller's arrays are untouched."""
from __future__ import annotations

from functools import partial

import numpy as np
import pytest

from rnnrt import reference, varlen
from rnnrt.params import make_layout, per_layer
from rnnrt.precision import DTYPES, round_to_storage

T, B, I, H = 4, 3, 5, 6


def _case(cell="gru", layers=1, seed=0):
    rng = np.random.default_rng(seed)
    layout = make_layout(cell, I, H, layers, True)
    flat = rng.uniform(-0.6, 0.6, layout.size)
    return (per_layer(flat, layout), rng.standard_normal((T, B, I)),
            0.5 * rng.standard_normal((layers, B, H)), rng.standard_normal((T, B, H)))


def test_fp32_storage_is_the_plain_reference():
    p, x, h0, dy = _case("lstm", 2)
    plain = reference.forward("lstm", p, x, h0)
    gp = reference.backward("lstm", p, plain[3], dy)
    out = reference.forward("lstm", p, x, h0, dtype="float32")
    for a, b in zip(out[:3], plain[:3]):
        assert np.array_equal(a, b)
    g = reference.backward("lstm", p, out[3], dy)
    assert np.array_equal(g["dx"], gp["dx"]) and np.array_equal(g["dh0"], gp["dh0"])


def test_tf32_rounds_the_gemm_operands_only():
    """tf32: a tanh RNN layer with every GEMM's operands TF32-rounded (x, W, R, each h as
    the next step's product reads it, the gate gradients in dx, dh, dW, dR and the bias
    sums) and nothing else: the stored h (y) is what the pointwise math made, not rounded."""
    from rnnrt.precision import round_to_tf32
    p, x, h0, dy = _case("rnn_tanh")
    t = lambda a: round_to_tf32(a).astype(np.float64)  # noqa: E731
    w, r, b = p[0]["weight_ih"], p[0]["weight_hh"], p[0]["bias_ih"] + p[0]["bias_hh"]
    h, ys = h0[0], []
    for step in range(x.shape[0]):
        h = np.tanh(t(x[step]) @ t(w).T + t(h) @ t(r).T + b)
        ys.append(h)
    y, *_, cache = reference.forward("rnn_tanh", p, x, h0, dtype="tf32")
    np.testing.assert_allclose(y, np.stack(ys), rtol=1e-12, atol=1e-12)
    plain = reference.forward("rnn_tanh", p, x, h0)[0]
    assert 1e-6 < np.abs(y - plain).max() < 1e-2, "tf32 did not round (or rounded too much)"
    assert not np.array_equal(y, round_to_tf32(y)), "the stored h was rounded"


@pytest.mark.parametrize("dtype", ("bfloat16", "float16"))
def test_one_rnn_layer_by_hand(dtype):
    """A tanh RNN layer recomputed with the rounding points written out: x, W, R, h0 and
    each h rounded; the gate gradients rounded before dx, dh, dW, dR and the bias sums."""
    p, x, h0, dy = _case("rnn_tanh")
    rd = partial(round_to_storage, dtype=dtype)
    w, r = rd(p[0]["weight_ih"]), rd(p[0]["weight_hh"])
    bi, bh = p[0]["bias_ih"], p[0]["bias_hh"]
    xs, h = rd(x), [rd(h0[0])]
    for t in range(T):
        h.append(rd(np.tanh(xs[t] @ w.T + bi + h[t] @ r.T + bh)))
    y, hn, _, cache = reference.forward("rnn_tanh", p, x, h0, dtype=dtype)
    assert np.array_equal(y, np.stack(h[1:])) and np.array_equal(hn[0], h[T])
    dh, dw, dr, db = np.zeros((B, H)), np.zeros_like(w), np.zeros_like(r), np.zeros(H)
    dx = np.empty_like(x)
    for t in reversed(range(T)):
        dg = rd((dy[t] + dh) * (1 - h[t + 1] ** 2))
        dx[t], dh = dg @ w, dg @ r
        dw, dr, db = dw + dg.T @ xs[t], dr + dg.T @ h[t], db + dg.sum(0)
    g = reference.backward("rnn_tanh", p, cache, dy)
    for got, want in ((g["dx"], dx), (g["dh0"][0], dh), (g["params"][0]["weight_ih"], dw),
                      (g["params"][0]["weight_hh"], dr), (g["params"][0]["bias_ih"], db)):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


def test_bad_dtypes_are_refused():
    p, x, h0, dy = _case()
    words = r"dtype: expected one of " + str(list(DTYPES)).replace("[", r"\[").replace(
        "]", r"\]")
    for bad in ("fp16", None, np.float16):
        with pytest.raises(ValueError, match=words):
            reference.forward("gru", p, x, h0, dtype=bad)
        with pytest.raises(ValueError, match=words):
            varlen.forward("gru", p, x.reshape(T * B, I), [B] * T, h0, dtype=bad)
    cache = reference.forward("gru", p, x, h0, dtype="bfloat16")[3]
    with pytest.raises(ValueError, match="the cache is from a 'bfloat16' forward"):
        reference.backward("gru", p, cache, dy, dtype="float16")
    assert reference.backward("gru", p, cache, dy, dtype="bfloat16")["dx"].shape == x.shape


def test_the_callers_arrays_are_untouched():
    p, x, h0, dy = _case("lstm")
    saved = [a.copy() for a in (x, h0, dy, p[0]["weight_ih"])]
    cache = reference.forward("lstm", p, x, h0, dtype="float16")[3]
    reference.backward("lstm", p, cache, dy)
    for a, b in zip((x, h0, dy, p[0]["weight_ih"]), saved):
        assert np.array_equal(a, b)
