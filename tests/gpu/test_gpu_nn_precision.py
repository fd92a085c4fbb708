"""rnnrt.nn at bfloat16 / float16 on CUDA (issue 23; marker gpu, skipped without a GPU):
under torch.autocast('cuda', dtype) with float32 modules, and as 16-bit modules
(``.to(torch.bfloat16)`` / ``.half()``), against torch.nn (cuDNN) doing the same on the same
weights and inputs. Both are measured against the float64 torch.nn (CPU) on the same values:
rnnrt's relative error (bench/precision_error.rel_errors: |a - r| / (|r| + rms r)) on every
output and gradient must be no worse than 2x cuDNN's (plus a tenth of the precision's atol,
precision.get_precision), the outputs in torch.nn's dtypes, the gradients in the
parameters' dtypes, and the run really 16-bit (it differs from rnnrt's float32 run).
(torch's TF32 flags do not matter here: cuDNN runs 16-bit, rnnrt.nn does not read them.)

Run on the device: pytest -m gpu tests/gpu/test_gpu_nn_precision.py
"""
from __future__ import annotations

import pytest

from rnnrt.device import gpu_available

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU with CuPy")]

torch = pytest.importorskip("torch")

import rnnrt.nn  # noqa: E402
from rnnrt.bench.precision_error import rel_errors  # noqa: E402
from rnnrt.precision import get_precision  # noqa: E402

T, B, I, H, L = 40, 16, 32, 64, 2
CELLS = [("LSTM", {}), ("GRU", {}), ("RNN", {"nonlinearity": "tanh"})]
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def _modules(name, kw, bidirectional, dtype=torch.float32):
    torch.manual_seed(0)
    ref = getattr(torch.nn, name)(I, H, num_layers=L, bidirectional=bidirectional, **kw)
    ours = getattr(rnnrt.nn, name)(I, H, num_layers=L, bidirectional=bidirectional, **kw)
    ours.load_state_dict(ref.state_dict())
    ref, ours = ref.cuda().to(dtype), ours.cuda().to(dtype)
    f64 = getattr(torch.nn, name)(I, H, num_layers=L, bidirectional=bidirectional, **kw)
    f64.load_state_dict({k: v.double().cpu() for k, v in ref.state_dict().items()})
    return ref, ours, f64.double()


def _inputs(name, bidirectional, dtype):
    g = torch.Generator().manual_seed(1)
    D = 2 if bidirectional else 1
    x = torch.randn(T, B, I, generator=g).to(dtype)
    h0 = (0.5 * torch.randn(L * D, B, H, generator=g)).to(dtype)
    c0 = (0.5 * torch.randn(L * D, B, H, generator=g)).to(dtype)
    dy = torch.randn(T, B, D * H, generator=g).to(dtype)
    return x, ((h0, c0) if name == "LSTM" else h0), dy


def _run(module, x, hx, dy, device, autocast=None):
    """Outputs and gradients (x, h0, every parameter) by name, as float64 on the CPU, and
    the dtypes they came in."""
    x = x.to(device).requires_grad_()
    hx = tuple(t.to(device).requires_grad_() for t in hx) if isinstance(hx, tuple) else \
        hx.to(device).requires_grad_()
    with torch.autocast("cuda", dtype=autocast, enabled=autocast is not None):
        y, hn = module(x, hx)
    hn = hn if isinstance(hn, tuple) else (hn,)
    states = list(hx) if isinstance(hx, tuple) else [hx]
    params = list(module.named_parameters())
    grads = torch.autograd.grad(y, [x, *states, *(p for _, p in params)],
                                dy.to(device=device, dtype=y.dtype))
    out = {"y": y, **{f"h_n{i}": t for i, t in enumerate(hn)}, "dx": grads[0],
           **{f"dh0_{i}": t for i, t in enumerate(grads[1:1 + len(states)])},
           **{f"d{n}": t for (n, _), t in zip(params, grads[1 + len(states):])}}
    dtypes = {k: v.dtype for k, v in out.items()}
    return {k: v.detach().double().cpu() for k, v in out.items()}, dtypes


def _judge(ours, cudnn, ref, dtype):
    """rnnrt's error <= 2x cuDNN's + atol/10 on every array; the worst ratio reported."""
    floor = 0.1 * get_precision(dtype).atol
    bad = []
    for k, r in ref.items():
        eo = rel_errors(ours[k].numpy(), r.numpy())
        ec = rel_errors(cudnn[k].numpy(), r.numpy())
        assert eo["nonfinite"] == 0, f"{k}: {eo['nonfinite']} non-finite"
        if ec["nonfinite"]:
            continue
        for stat in ("max_rel_err", "mean_rel_err"):
            if eo[stat] > 2 * ec[stat] + floor:
                bad.append(f"{k} {stat}: rnnrt {eo[stat]:.3g} > 2 x cuDNN {ec[stat]:.3g}")
    assert not bad, "; ".join(bad)


@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("name,kw", CELLS, ids=[c[0] + c[1].get("nonlinearity", "")
                                                for c in CELLS])
def test_autocast_matches_torch_nn_and_errs_no_more_than_2x_cudnn(name, kw, dtype,
                                                                     bidirectional):
    dt = DTYPES[dtype]
    ref, ours, f64 = _modules(name, kw, bidirectional)
    x, hx, dy = _inputs(name, bidirectional, torch.float32)
    dy = dy.to(dt).float()                     # one seed for all: representable in dt
    got, got_dt = _run(ours, x, hx, dy, "cuda", autocast=dt)
    theirs, their_dt = _run(ref, x, hx, dy, "cuda", autocast=dt)
    exact, _ = _run(f64, x.double(), tuple(t.double() for t in hx) if isinstance(hx, tuple)
                    else hx.double(), dy.double(), "cpu")
    # torch.nn's dtypes: outputs in the autocast dtype, gradients in their leaves' (fp32) --
    # except that torch's cuDNN RNN under autocast(bfloat16) runs and returns float16 (seen
    # with torch 2.11 on the H100): rnnrt runs the precision asked for, and its error is
    # judged against cuDNN's in that precision (the module and inputs cast to it)
    assert got_dt["y"] == dt and got_dt["dweight_hh_l0"] == torch.float32
    assert {k: v for k, v in got_dt.items() if k != "y" and not k.startswith("h_n")} == \
        {k: v for k, v in their_dt.items() if k != "y" and not k.startswith("h_n")}
    if their_dt["y"] != dt:
        ref16, _, _ = _modules(name, kw, bidirectional, dt)
        x16, hx16, _ = _inputs(name, bidirectional, dt)
        theirs, _ = _run(ref16, x16, hx16, dy.to(dt), "cuda")
    _judge(got, theirs, exact, dtype)
    fp32, _ = _run(ours, x, hx, dy, "cuda")     # really 16-bit: not the float32 run rounded
    assert not torch.equal(got["y"], fp32["y"].to(dt).double())


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("name,kw", CELLS[:2], ids=["LSTM", "GRU"])
def test_16bit_modules_match_torch_nn_and_err_no_more_than_2x_cudnn(name, kw, dtype):
    dt = DTYPES[dtype]
    ref, ours, f64 = _modules(name, kw, False, dt)
    x, hx, dy = _inputs(name, False, dt)
    got, got_dt = _run(ours, x, hx, dy, "cuda")
    theirs, their_dt = _run(ref, x, hx, dy, "cuda")
    exact, _ = _run(f64, x.double(), tuple(t.double() for t in hx) if isinstance(hx, tuple)
                    else hx.double(), dy.double(), "cpu")
    assert got_dt == their_dt and set(got_dt.values()) == {dt}
    _judge(got, theirs, exact, dtype)
    assert all(p.dtype == dt for p in ours.parameters())


def test_autocast_on_packed_sequences_keeps_dtypes_and_finite():
    from torch.nn.utils.rnn import pack_padded_sequence
    ref, ours, _ = _modules("LSTM", {}, True)
    x, _, _ = _inputs("LSTM", True, torch.float32)
    lengths = torch.tensor([T - 2 * i for i in range(B)])   # 40 .. 10
    p = pack_padded_sequence(x.cuda(), lengths, enforce_sorted=False)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y, (h, c) = ours(p)
        yr, _ = ref(p)
    assert y.data.dtype == h.dtype == c.dtype == torch.bfloat16   # (torch's: float16)
    assert torch.isfinite(y.data.float()).all()
    diff = (y.data.float() - yr.data.float()).abs().max().item()
    assert diff < 0.1, diff
