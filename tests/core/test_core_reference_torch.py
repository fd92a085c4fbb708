"""The NumPy reference against torch.nn (CPU): same weights, same inputs, same outputs and
the same gradients as torch autograd, in float64 to ~1e-10 relative.

This pins the reference's math and parameter layout (gate order, GRU's r*(W_hn h + b_hn),
bias handling, layer stacking) to torch's, which the finite-difference tests cannot do:
those only show the backward matches the forward.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="torch not installed: the torch-equality tests need the CPU build "
                    "(pip install torch==2.13.0)")

from rnnrt import check
from rnnrt import reference  # noqa: E402
from rnnrt.cells import CELLS, get_cell  # noqa: E402

T, B, I, H = 5, 3, 6, 4
ATOL, RTOL = 1e-12, 1e-10
KEYS = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")


def assert_close(name, got, want, atol=ATOL, rtol=RTOL):
    """rnnrt.check.assert_close (|got - want| <= atol + rtol*|want|, worst element named),
    with the argument order these tests read best in."""
    check.assert_close(got, want, atol, rtol, name=name)


def torch_module(cell, num_layers, bias, dtype, seed=0):
    """A seeded torch.nn.LSTM / GRU / RNN(tanh | relu), time-major, in ``dtype``."""
    torch.manual_seed(seed)
    kwargs = dict(input_size=I, hidden_size=H, num_layers=num_layers, bias=bias, dtype=dtype)
    if cell == "lstm":
        return torch.nn.LSTM(**kwargs)
    if cell == "gru":
        return torch.nn.GRU(**kwargs)
    return torch.nn.RNN(nonlinearity=cell.removeprefix("rnn_"), **kwargs)


def params_from_torch(module, num_layers, bias):
    """torch's state_dict (weight_ih_l{k}, ...) -> the reference's params list of dicts."""
    sd = {k: v.detach().numpy().copy() for k, v in module.state_dict().items()}
    return [{key: sd[f"{key}_l{k}"] if (bias or key.startswith("weight")) else None
             for key in KEYS} for k in range(num_layers)]


def random_inputs(cell, num_layers, np_dtype, seed=1):
    """-> (x [T,B,I], h0 [L,B,H], c0 | None, dy [T,B,H], dhn [L,B,H], dcn | None)."""
    rng = np.random.default_rng(seed)
    lstm = get_cell(cell).has_cell_state

    def rand(*shape):
        return rng.standard_normal(shape).astype(np_dtype)

    return (rand(T, B, I), rand(num_layers, B, H), rand(num_layers, B, H) if lstm else None,
            rand(T, B, H), rand(num_layers, B, H), rand(num_layers, B, H) if lstm else None)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("num_layers", [1, 3], ids=["L1", "L3"])
@pytest.mark.parametrize("cell", sorted(CELLS))
def test_matches_torch_float64(cell, num_layers, bias):
    module = torch_module(cell, num_layers, bias, torch.float64)
    params = params_from_torch(module, num_layers, bias)
    x, h0, c0, dy, dhn, dcn = random_inputs(cell, num_layers, np.float64)
    lstm = c0 is not None
    tag = f"{cell} L={num_layers} bias={bias}"

    # torch: forward, then autograd of loss = <y, dy> + <h_n, dhn> [+ <c_n, dcn>]
    tx = torch.tensor(x, requires_grad=True)
    th0 = torch.tensor(h0, requires_grad=True)
    if lstm:
        tc0 = torch.tensor(c0, requires_grad=True)
        ty, (thn, tcn) = module(tx, (th0, tc0))
    else:
        ty, thn = module(tx, th0)
    tloss = (ty * torch.tensor(dy)).sum() + (thn * torch.tensor(dhn)).sum()
    if lstm:
        tloss = tloss + (tcn * torch.tensor(dcn)).sum()
    tloss.backward()

    y, h_n, c_n, cache = reference.forward(cell, params, x, h0, c0)
    assert_close(f"{tag} y", y, ty.detach().numpy())
    assert_close(f"{tag} h_n", h_n, thn.detach().numpy())
    if lstm:
        assert_close(f"{tag} c_n", c_n, tcn.detach().numpy())
    else:
        assert c_n is None, f"{tag}: c_n must be None without a cell state"

    got = reference.backward(cell, params, cache, dy, dhn, dcn)
    assert_close(f"{tag} dx", got["dx"], tx.grad.numpy())
    assert_close(f"{tag} dh0", got["dh0"], th0.grad.numpy())
    if lstm:
        assert_close(f"{tag} dc0", got["dc0"], tc0.grad.numpy())
    else:
        assert got["dc0"] is None, f"{tag}: dc0 must be None without a cell state"
    tgrads = {name: p.grad.numpy() for name, p in module.named_parameters()}
    assert len(got["params"]) == num_layers
    for k, dp in enumerate(got["params"]):
        for key in KEYS:
            name = f"{tag} params[{k}]['{key}']"
            if not bias and key.startswith("bias"):
                assert dp[key] is None, f"{name}: no bias, its gradient must be None"
                continue
            assert_close(name, dp[key], tgrads[f"{key}_l{k}"])


def test_lstm_forward_matches_torch_float32():
    """float32 in, float32 computed and returned, equal to torch's float32 LSTM to float32
    rounding (looser tolerance: different summation orders in single precision)."""
    num_layers = 2
    module = torch_module("lstm", num_layers, True, torch.float32)
    params = params_from_torch(module, num_layers, True)
    x, h0, c0, dy, dhn, dcn = random_inputs("lstm", num_layers, np.float32)
    with torch.no_grad():
        ty, (thn, tcn) = module(torch.tensor(x), (torch.tensor(h0), torch.tensor(c0)))

    y, h_n, c_n, cache = reference.forward("lstm", params, x, h0, c0)
    for name, got, want in (("y", y, ty), ("h_n", h_n, thn), ("c_n", c_n, tcn)):
        assert got.dtype == np.float32, f"float32 {name}: computed in {got.dtype}"
        assert_close(f"float32 {name}", got, want.numpy(), atol=1e-6, rtol=1e-5)

    # The backward stays in float32 too (no silent promotion through Python scalars).
    grads = reference.backward("lstm", params, cache, dy, dhn, dcn)
    for name in ("dx", "dh0", "dc0"):
        assert grads[name].dtype == np.float32, f"float32 {name}: {grads[name].dtype}"
    for dp in grads["params"]:
        for key in KEYS:
            assert dp[key].dtype == np.float32, f"float32 grad {key}: {dp[key].dtype}"
