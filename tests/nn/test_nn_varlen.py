"""rnnrt.varlen (NumPy, no torch): the packed, per-step-active-batch forward/backward.

Oracles, all from rnnrt.reference (the plain padded-batch forward/backward that is itself
held against torch.nn): a full batch (batch_sizes [B]*T) is the reference exactly; a packed
batch of different lengths is every sequence run alone through the reference -- forward on
the sequence, reverse on the sequence flipped -- with the parameter gradients summed over
sequences. Float64, random data, atol 1e-12 + rtol 1e-10, worst element reported.
"""
from __future__ import annotations

import numpy as np
import pytest

from rnnrt import check, reference, varlen
from rnnrt.cells import CELLS, get_cell

I, H = 3, 4
ATOL, RTOL = 1e-12, 1e-10
LENGTHS = [5, 4, 4, 2, 1]  # sorted, longest first; ties and a length-1 sequence
KINDS = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")


def close(name, got, want, atol=ATOL, rtol=RTOL):
    check.assert_close(got, want, atol, rtol, name=name)


def random_problem(cell, layers, lengths, dtype=np.float64, bias=True, seed=0):
    """-> (params, x [N, I] packed, batch_sizes [T], h0, c0 | None, dy [N, H], dh_n,
    dc_n | None), every array random (never zeros)."""
    rng = np.random.default_rng(seed)
    g = get_cell(cell).gates
    params = [{"weight_ih": rng.uniform(-.6, .6, (g * H, I if l == 0 else H)),
               "weight_hh": rng.uniform(-.6, .6, (g * H, H)),
               "bias_ih": rng.uniform(-.6, .6, g * H) if bias else None,
               "bias_hh": rng.uniform(-.6, .6, g * H) if bias else None}
              for l in range(layers)]
    params = [{k: None if v is None else v.astype(dtype) for k, v in p.items()} for p in params]
    bs = np.array([sum(n > t for n in lengths) for t in range(max(lengths))], np.int64)
    n, b = int(bs.sum()), len(lengths)
    lstm = get_cell(cell).has_cell_state

    def rand(*shape):
        return rng.standard_normal(shape).astype(dtype)

    return (params, rand(n, I), bs, rand(layers, b, H), rand(layers, b, H) if lstm else None,
            rand(n, H), rand(layers, b, H), rand(layers, b, H) if lstm else None)


def rows_of(bs, b):
    """Packed row indices of sequence b, step by step."""
    off = varlen.offsets(bs)
    return np.array([off[t] + b for t in range(len(bs)) if bs[t] > b])


@pytest.mark.parametrize("cell", sorted(CELLS))
def test_full_batch_is_the_reference(cell):
    T, B, L = 4, 3, 2
    params, x, bs, h0, c0, dy, dhn, dcn = random_problem(cell, L, [T] * B)
    y, hn, cn, cache = varlen.forward(cell, params, x, bs, h0, c0)
    ry, rhn, rcn, rcache = reference.forward(cell, params, x.reshape(T, B, I), h0, c0)
    close("y", y, ry.reshape(T * B, H))
    close("h_n", hn, rhn)
    if cn is not None:
        close("c_n", cn, rcn)
    g = varlen.backward(cache, dy, dhn, dcn)
    rg = reference.backward(cell, params, rcache, dy.reshape(T, B, H), dhn, dcn)
    close("dx", g["dx"], rg["dx"].reshape(T * B, I))
    close("dh0", g["dh0"], rg["dh0"])
    if cn is not None:
        close("dc0", g["dc0"], rg["dc0"])
    for layer in range(L):
        for k in KINDS:
            close(f"d{k}_l{layer}", g["params"][layer][k], rg["params"][layer][k])


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("reverse", [False, True], ids=["fwd", "rev"])
@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("cell", sorted(CELLS))
def test_packed_batch_is_each_sequence_alone(cell, layers, reverse, bias):
    params, x, bs, h0, c0, dy, dhn, dcn = random_problem(cell, layers, LENGTHS, bias=bias)
    y, hn, cn, cache = varlen.forward(cell, params, x, bs, h0, c0, reverse=reverse)
    g = varlen.backward(cache, dy, dhn, dcn)
    lstm = cn is not None
    dparams = [{k: None if p[k] is None else np.zeros_like(p[k]) for k in KINDS}
               for p in params]
    for b, n in enumerate(LENGTHS):
        rows = rows_of(bs, b)
        assert len(rows) == n
        order = rows[::-1] if reverse else rows  # a reverse direction is the flipped sequence
        sl = slice(b, b + 1)
        ry, rhn, rcn, rcache = reference.forward(cell, params, x[order][:, None], h0[:, sl],
                                                 None if c0 is None else c0[:, sl])
        tag = f"sequence {b} (length {n})"
        close(f"y of {tag}", y[order], ry[:, 0])
        close(f"h_n of {tag}", hn[:, sl], rhn)
        if lstm:
            close(f"c_n of {tag}", cn[:, sl], rcn)
        rg = reference.backward(cell, params, rcache, dy[order][:, None], dhn[:, sl],
                                None if dcn is None else dcn[:, sl])
        close(f"dx of {tag}", g["dx"][order], rg["dx"][:, 0])
        close(f"dh0 of {tag}", g["dh0"][:, sl], rg["dh0"])
        if lstm:
            close(f"dc0 of {tag}", g["dc0"][:, sl], rg["dc0"])
        for layer, d in enumerate(rg["params"]):
            for k in KINDS:
                if d[k] is not None:
                    dparams[layer][k] += d[k]
    for layer, d in enumerate(dparams):
        for k in KINDS:
            if d[k] is None:
                assert g["params"][layer][k] is None
            else:
                close(f"d{k}_l{layer} (summed over sequences)", g["params"][layer][k], d[k])


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_float32_computes_in_float32(cell):
    p64, x, bs, h0, c0, dy, dhn, dcn = random_problem(cell, 2, LENGTHS)
    f32 = {k: None if v is None else v.astype(np.float32) for k, v in p64[0].items()}
    p32 = [f32, {k: None if v is None else v.astype(np.float32) for k, v in p64[1].items()}]
    as32 = [None if a is None else a.astype(np.float32) for a in (x, h0, c0, dy, dhn, dcn)]
    y, hn, cn, cache = varlen.forward(cell, p32, as32[0], bs, as32[1], as32[2])
    g = varlen.backward(cache, *as32[3:])
    y64, hn64, _, cache64 = varlen.forward(cell, p64, x, bs, h0, c0)
    g64 = varlen.backward(cache64, dy, dhn, dcn)
    assert y.dtype == hn.dtype == g["dx"].dtype == g["params"][1]["weight_hh"].dtype == np.float32
    close("y fp32", y, y64, check.FP32_ATOL, check.FP32_RTOL)
    close("dx fp32", g["dx"], g64["dx"], check.FP32_ATOL, check.FP32_RTOL)
    close("dW fp32", g["params"][0]["weight_ih"], g64["params"][0]["weight_ih"],
          check.FP32_ATOL, check.FP32_RTOL)


def test_inference_keeps_nothing_and_gradient_flags_skip_work():
    cell = "lstm"
    params, x, bs, h0, c0, dy, dhn, dcn = random_problem(cell, 2, LENGTHS)
    y0, hn0, cn0, none = varlen.forward(cell, params, x, bs, h0, c0, train=False)
    assert none is None
    y, hn, cn, cache = varlen.forward(cell, params, x, bs, h0, c0)
    for a, b in ((y0, y), (hn0, hn), (cn0, cn)):
        np.testing.assert_array_equal(a, b)
    full = varlen.backward(cache, dy, dhn, dcn)
    no_dx = varlen.backward(cache, dy, dhn, dcn, need_dx=False)
    no_p = varlen.backward(cache, dy, dhn, dcn, need_params=False)
    assert no_dx["dx"] is None and no_p["params"] is None
    np.testing.assert_array_equal(no_dx["dh0"], full["dh0"])
    np.testing.assert_array_equal(no_p["dx"], full["dx"])
    np.testing.assert_array_equal(no_dx["params"][0]["weight_ih"],
                                  full["params"][0]["weight_ih"])


def test_caller_arrays_are_not_written():
    params, x, bs, h0, c0, dy, dhn, dcn = random_problem("lstm", 2, LENGTHS)
    arrays = [x, bs, h0, c0, dy, dhn, dcn] + [v for p in params for v in p.values()]
    before = [a.tobytes() for a in arrays]
    _, _, _, cache = varlen.forward("lstm", params, x, bs, h0, c0, reverse=True)
    varlen.backward(cache, dy, dhn, dcn)
    assert [a.tobytes() for a in arrays] == before


def test_empty_batch_runs():
    params, *_ = random_problem("gru", 2, [1])
    y, hn, cn, cache = varlen.forward("gru", params, np.zeros((0, I)), [0, 0, 0])
    assert y.shape == (0, H) and hn.shape == (2, 0, H) and cn is None
    g = varlen.backward(cache)
    assert g["dx"].shape == (0, I) and np.all(g["params"][0]["weight_hh"] == 0)


@pytest.mark.parametrize("bs, rows, match", [
    ([2, 3], 5, "non-increasing"),
    ([2, -1], 1, "negative"),
    ([3, 2], 6, "sum to 5"),
    ([[3, 2]], 5, "1-D"),
    ([], 0, "1-D"),
    ([3.0, 2.0], 5, "integers"),
])
def test_batch_sizes_are_checked(bs, rows, match):
    with pytest.raises(ValueError, match=match):
        varlen.check_batch_sizes(np.array(bs), rows)


def test_lengths_and_offsets():
    bs = np.array([5, 3, 3, 1])
    np.testing.assert_array_equal(varlen.offsets(bs), [0, 5, 8, 11])
    np.testing.assert_array_equal(varlen.lengths(bs), [4, 3, 3, 1, 1])
