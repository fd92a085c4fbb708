"""rnnrt.nn at a precision (issue 23, nn/precision.py), on the CPU: which precision a call
runs in (autocast, 16-bit modules); the CPU path at bfloat16 / float16 against torch.nn's
CPU modules in that dtype (both against float64); and the CUDA backend's plumbing end to
end on CPU tensors (conftest's ``cuda_on_cpu``): the runner asked for the
precision, inputs in as float32, outputs in the autocast / module dtype, gradients in each
parameter's and input's dtype, as torch.nn.LSTM's on CUDA (its CPU autocast is not a
guide: there its output dtype depends on whether the input needs a gradient). The numbers at 16-bit
storage are the GPU's (tests/gpu/test_gpu_nn_precision.py, against cuDNN)."""
from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")


import rnnrt.nn
import rnnrt.nn.cuda as nn_cuda
import rnnrt.nn.precision as nn_prec

T, B, I, H = 5, 3, 4, 6


def _x(dtype=torch.float32):
    return torch.randn(T, B, I, generator=torch.Generator().manual_seed(1)).to(dtype)


def test_call_precision_follows_torch_nn_rules(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert nn_prec.call_precision(cuda, torch.float32) is None          # fp32: as before
    assert nn_prec.call_precision(cuda, torch.bfloat16) == nn_prec.CallPrecision(
        "bfloat16", torch.bfloat16, False)
    assert nn_prec.call_precision(cuda, torch.float16).name == "float16"
    assert nn_prec.call_precision(cpu, torch.float32) is None
    assert nn_prec.call_precision(cpu, torch.float64) is None
    assert nn_prec.call_precision(cpu, torch.float16).name == "float16"   # as on CUDA
    assert nn_prec.call_precision(torch.device("meta"), torch.bfloat16) is None
    monkeypatch.setattr(nn_prec, "autocast_dtype",
                        lambda t: torch.float16 if t == "cuda" else None)
    assert nn_prec.call_precision(cuda, torch.float32) == nn_prec.CallPrecision(
        "float16", torch.float16, True)
    assert nn_prec.call_precision(cuda, torch.bfloat16).name == "float16"   # autocast wins
    assert nn_prec.call_precision(cpu, torch.float32) is None   # cuda autocast, cpu tensors


@pytest.fixture
def recorded(cuda_on_cpu, monkeypatch):
    """The CUDA backend on CPU tensors (autocast('cpu') stands in for CUDA's); each runner
    made is recorded with the precision asked for and built at float32 (the plumbing is
    under test here, not the 16-bit arithmetic)."""
    made = []

    def make_runner(model, precision, **kw):
        made.append(precision)
        return real(model, "float32", **kw)

    real = nn_cuda.make_runner
    monkeypatch.setattr(nn_cuda, "make_runner", make_runner)
    return made


@pytest.mark.parametrize("cls", ["LSTM", "GRU"])
@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_autocast_outputs_in_its_dtype_gradients_in_the_parameters(recorded, cls, dt):
    torch.manual_seed(0)
    ref = getattr(torch.nn, cls)(I, H, num_layers=2)
    ours = getattr(rnnrt.nn, cls)(I, H, num_layers=2)
    ours.load_state_dict(ref.state_dict())
    x = _x().requires_grad_()
    h0 = torch.randn(2, B, H)                        # fp32 state with autocast: accepted
    hx = (h0, torch.randn(2, B, H)) if cls == "LSTM" else h0
    with torch.autocast("cpu", dtype=dt):
        y, hn = ours(x, hx)
    assert recorded == [{torch.bfloat16: "bfloat16", torch.float16: "float16"}[dt]]
    hn = hn if isinstance(hn, tuple) else (hn,)
    assert y.dtype == dt and all(t.dtype == dt for t in hn)
    with torch.no_grad():                            # the fp32 run, rounded once to dt
        y32, _ = ours(x, hx)
    assert torch.equal(y, y32.to(dt))
    y.float().sum().backward()
    assert x.grad.dtype == torch.float32
    assert all(p.grad.dtype == torch.float32 for p in ours.parameters())


def test_a_16bit_module_runs_at_its_dtype_from_an_exact_fp32_copy(recorded):
    torch.manual_seed(0)
    ref = torch.nn.LSTM(I, H, num_layers=2).to(torch.bfloat16)
    ours = rnnrt.nn.LSTM(I, H, num_layers=2).to(torch.bfloat16)
    ours.load_state_dict(ref.state_dict())
    x = _x(torch.bfloat16).requires_grad_()
    y, (h, c) = ours(x)
    assert recorded == ["bfloat16"]
    assert y.dtype == h.dtype == c.dtype == torch.bfloat16
    (site,) = nn_cuda_sites(ours)
    flat = torch.from_dlpack(site.runner.params)
    for e, p in zip(site.entries, ours.parameters()):   # the fp32 master: the values exactly
        assert torch.equal(flat[e.offset:e.end].view(e.shape), p.detach().float())
    assert site.adopted_ptrs is None and site.copies == 1
    y.float().sum().backward()
    assert x.grad.dtype == torch.bfloat16
    assert all(p.grad is not None and p.grad.dtype == torch.bfloat16 for p in ours.parameters())
    with pytest.raises(ValueError, match="input dtype"):   # as torch.nn: input = weights
        ours(_x())
    # autocast and fp32 calls of one module have runners of their own
    f = rnnrt.nn.GRU(I, H).float()
    f(_x())
    with torch.autocast("cpu", dtype=torch.float16):
        f(_x())
    assert recorded[1:] == ["float32", "float16"]


def nn_cuda_sites(module):
    backend = rnnrt.nn.inputs.backend_for(torch.device("cpu"), torch.float32)
    first = id(module._flat_weights[0])
    return [s for k, s in backend._sites.items() if k[0] == first]


def test_autocast_refuses_a_float64_input_naming_it(recorded):
    m = rnnrt.nn.LSTM(I, H)
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(ValueError, match="input"):
        m(_x(torch.float64))
    assert recorded == []




def _all(module, x, hx, dy, autocast=None):
    """Outputs and gradients (x, the states, every parameter) by name as float64, with the
    dtypes they came in."""
    x = x.clone().requires_grad_()
    hx = tuple(t.clone().requires_grad_() for t in hx)
    with torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None):
        y, hn = module(x, hx if len(hx) == 2 else hx[0])
    hn = hn if isinstance(hn, tuple) else (hn,)
    params = list(module.named_parameters())
    grads = torch.autograd.grad(y, [x, *hx, *(p for _, p in params)], dy.to(y.dtype))
    out = {"y": y, **{f"h_n{i}": t for i, t in enumerate(hn)}, "dx": grads[0],
           **{f"dhx{i}": t for i, t in enumerate(grads[1:1 + len(hx)])},
           **{f"d{n}": t for (n, _), t in zip(params, grads[1 + len(hx):])}}
    return ({k: v.detach().double() for k, v in out.items()},
            {k: v.dtype for k, v in out.items()})


@pytest.mark.parametrize("cls", ["LSTM", "GRU"])
@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("how", ["autocast", "module"])
def test_cpu_precision_errs_no_more_than_2x_torch_nn(cls, dt, how):
    """rnnrt.nn on the CPU under autocast / as a 16-bit module vs torch.nn's CPU module in
    that dtype: outputs in that dtype, parameter gradients in the parameters', and every
    array's relative error against float64 no worse than 2x torch's (+ atol / 10)."""
    from rnnrt.bench.precision_error import rel_errors
    from rnnrt.precision import get_precision
    torch.manual_seed(0)
    base = getattr(torch.nn, cls)(I, H, num_layers=2)
    ours = getattr(rnnrt.nn, cls)(I, H, num_layers=2)
    ours.load_state_dict(base.state_dict())
    theirs = getattr(torch.nn, cls)(I, H, num_layers=2).to(dt)
    theirs.load_state_dict(base.state_dict())
    exact = getattr(torch.nn, cls)(I, H, num_layers=2).double()
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3 * T, B, I, generator=g)
    hx = tuple(0.5 * torch.randn(2, B, H, generator=g) for _ in range(2 if cls == "LSTM" else 1))
    dy = torch.randn(3 * T, B, H, generator=g).to(dt)
    if how == "module":
        ours.to(dt)
        exact.load_state_dict({k: v.double() for k, v in theirs.state_dict().items()})
        x, hx = x.to(dt), tuple(t.to(dt) for t in hx)
        got, got_dt = _all(ours, x, hx, dy)
    else:
        exact.load_state_dict({k: v.double() for k, v in base.state_dict().items()})
        got, got_dt = _all(ours, x, hx, dy, autocast=dt)
    ref, ref_dt = _all(theirs, x.to(dt), tuple(t.to(dt) for t in hx), dy)
    want, _ = _all(exact, x.double(), tuple(t.double() for t in hx), dy.double())
    assert got_dt["y"] == dt and all(got_dt[k] == dt for k in got_dt if k.startswith("h_n"))
    if how == "module":                      # torch.nn's 16-bit module: the same dtypes
        assert got_dt == ref_dt
    pdt = dt if how == "module" else torch.float32
    assert all(got_dt[k] == pdt for k in got_dt if k.startswith("dweight"))
    floor = 0.1 * get_precision({torch.bfloat16: "bfloat16", torch.float16: "float16"}[dt]).atol
    bad = []
    for k, r in want.items():
        eo, et = rel_errors(got[k].numpy(), r.numpy()), rel_errors(ref[k].numpy(), r.numpy())
        assert eo["nonfinite"] == 0, k
        for stat in ("max_rel_err", "mean_rel_err"):
            if et[stat] is not None and eo[stat] > 2 * et[stat] + floor:
                bad.append(f"{k} {stat}: rnnrt {eo[stat]:.3g} > 2 x torch {et[stat]:.3g}")
    assert not bad, "; ".join(bad)
    # really 16-bit: not rnnrt's float32 run rounded once at the end
    f32 = copy.deepcopy(ours).float()
    with torch.no_grad():
        y32, _ = f32(x.float(), hx[0].float() if len(hx) == 1 else tuple(t.float() for t in hx))
    assert not torch.equal(got["y"], y32.to(dt).double())
