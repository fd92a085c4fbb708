"""The NumPy reference's gradients against central finite differences (float64, CPU).

Every cell x {1, 3} layers x {bias, no bias}, with input size != hidden size, every element
of dx, dh0, dc0 and every parameter gradient checked. The loss touches every output
(y, h_n and, for LSTM, c_n) through random weights, so no gradient path is left untested.
"""
from __future__ import annotations

import numpy as np
import pytest

from rnnrt import check
from rnnrt import reference
from rnnrt.cells import CELLS, get_cell

T, B, I, H = 3, 2, 3, 4
EPS = 1e-6
ATOL, RTOL = 1e-7, 1e-5


def assert_close(name, got, want, atol=ATOL, rtol=RTOL):
    """rnnrt.check.assert_close (|got - want| <= atol + rtol*|want|, worst element named),
    with the argument order these tests read best in."""
    check.assert_close(got, want, atol, rtol, name=name)


def make_problem(cell, num_layers, bias, seed=0):
    """Random float64 inputs, states, weights and loss weights (none of them zero).

    -> (params [per-layer dict], x [T,B,I], h0 [L,B,H], c0 [L,B,H] | None,
        gy [T,B,H], gh [L,B,H], gc [L,B,H] | None)
    """
    rng = np.random.default_rng(seed)
    g = get_cell(cell).gates
    lstm = get_cell(cell).has_cell_state

    def rand(*shape):
        # Scale 0.5 keeps the nonlinearities out of saturation, so gradients are not tiny.
        return 0.5 * rng.standard_normal(shape)

    params = []
    for layer in range(num_layers):
        i_l = I if layer == 0 else H
        params.append({
            "weight_ih": rand(g * H, i_l),
            "weight_hh": rand(g * H, H),
            "bias_ih": rand(g * H) if bias else None,
            "bias_hh": rand(g * H) if bias else None,
        })
    x = rand(T, B, I)
    h0 = rand(num_layers, B, H)
    c0 = rand(num_layers, B, H) if lstm else None
    gy = rng.standard_normal((T, B, H))
    gh = rng.standard_normal((num_layers, B, H))
    gc = rng.standard_normal((num_layers, B, H)) if lstm else None
    return params, x, h0, c0, gy, gh, gc


def loss(cell, params, x, h0, c0, gy, gh, gc):
    """L = sum(y*gy) + sum(h_n*gh) [+ sum(c_n*gc)], a scalar every output feeds."""
    y, h_n, c_n, _ = reference.forward(cell, params, x, h0, c0)
    total = np.sum(y * gy) + np.sum(h_n * gh)
    if c_n is not None:
        total += np.sum(c_n * gc)
    return total


def numeric_grad(f, arr):
    """Central differences of scalar f() w.r.t. every element of ``arr`` (any shape),
    perturbing arr in place and restoring it."""
    grad = np.empty_like(arr)
    for idx in np.ndindex(arr.shape):
        orig = arr[idx]
        arr[idx] = orig + EPS
        up = f()
        arr[idx] = orig - EPS
        down = f()
        arr[idx] = orig
        grad[idx] = (up - down) / (2 * EPS)
    return grad


def analytic_and_numeric(cell, num_layers, bias):
    """-> list of (name, reference gradient, finite-difference gradient) for every input,
    initial state and parameter of one problem."""
    params, x, h0, c0, gy, gh, gc = make_problem(cell, num_layers, bias)
    _, _, _, cache = reference.forward(cell, params, x, h0, c0)
    got = reference.backward(cell, params, cache, gy, gh, gc)

    def f():
        return loss(cell, params, x, h0, c0, gy, gh, gc)

    pairs = [("dx", got["dx"], numeric_grad(f, x)),
             ("dh0", got["dh0"], numeric_grad(f, h0))]
    if c0 is not None:
        pairs.append(("dc0", got["dc0"], numeric_grad(f, c0)))
    else:
        assert got["dc0"] is None, f"{cell}: dc0 must be None without a cell state"
    for layer, (p, dp) in enumerate(zip(params, got["params"])):
        assert set(dp) == set(p), f"layer {layer}: grad keys {sorted(dp)} != {sorted(p)}"
        for key, value in p.items():
            name = f"params[{layer}]['{key}']"
            if value is None:
                assert dp[key] is None, f"{name}: parameter is None, its gradient must be too"
                continue
            pairs.append((name, dp[key], numeric_grad(f, value)))
    return pairs


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("num_layers", [1, 3], ids=["L1", "L3"])
@pytest.mark.parametrize("cell", sorted(CELLS))
def test_gradients_match_finite_differences(cell, num_layers, bias):
    for name, ref, fd in analytic_and_numeric(cell, num_layers, bias):
        assert_close(f"{cell} L={num_layers} bias={bias} {name}", ref, fd)


def test_check_catches_a_wrong_gradient_element():
    """The comparison must fail when one gradient element is off by more than tolerance:
    otherwise the test above could never fail."""
    pairs = analytic_and_numeric("lstm", 1, True)
    name, ref, fd = next(p for p in pairs if p[0] == "params[0]['weight_hh']")
    assert_close(name, ref, fd)  # passes untouched
    wrong = ref.copy()
    wrong[5, 2] += 1e-4  # well above atol + rtol*|ref| for O(1) gradients
    with pytest.raises(AssertionError, match=r"weight_hh.*worst at \(5, 2\).*1/64 outside"):
        assert_close(name, wrong, fd)
    wrong[5, 2] = np.nan
    with pytest.raises(AssertionError, match=r"worst at \(5, 2\)"):
        assert_close(name, wrong, fd)


@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn_tanh"])
def test_large_preactivations_stay_finite(cell):
    """Pre-activations of order +-1e4 must not overflow exp (stable sigmoid) nor produce NaN,
    forward or backward, in float32 and float64, and results keep x's dtype."""
    for dtype in (np.float32, np.float64):
        params, x, h0, c0, gy, gh, gc = make_problem(cell, 2, True, seed=1)
        params = [{k: None if v is None else (1e4 * v).astype(dtype) for k, v in p.items()}
                  for p in params]
        cast = [None if a is None else a.astype(dtype) for a in (x, h0, c0, gy, gh, gc)]
        x, h0, c0, gy, gh, gc = cast
        # Underflow to 0 in saturated derivatives is expected and harmless; overflow is not.
        with np.errstate(over="raise", invalid="raise", divide="raise"):
            y, h_n, c_n, cache = reference.forward(cell, params, x, h0, c0)
            grads = reference.backward(cell, params, cache, gy, gh, gc)
        outs = {"y": y, "h_n": h_n, "c_n": c_n, "dx": grads["dx"], "dh0": grads["dh0"],
                "dc0": grads["dc0"], "dW0": grads["params"][0]["weight_ih"]}
        for name, arr in outs.items():
            if arr is None:
                continue
            assert arr.dtype == dtype, f"{cell}: {name} is {arr.dtype}, expected {dtype}"
            assert np.all(np.isfinite(arr)), f"{cell} {dtype.__name__}: {name} not finite"
