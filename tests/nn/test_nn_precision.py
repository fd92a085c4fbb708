"""rnnrt.nn at a precision (issue 23, nn/precision.py), on the CPU: which precision a call
runs in (autocast, 16-bit modules), the CPU's refusal under autocast, and the CUDA backend's
plumbing end to end on CPU tensors (conftest's ``cuda_on_cpu``): the runner asked for the
precision, inputs in as float32, outputs in the autocast / module dtype, gradients in each
parameter's and input's dtype, as torch.nn.LSTM's on CUDA (its CPU autocast is not a
guide: there its output dtype depends on whether the input needs a gradient). The numbers at 16-bit
storage are the GPU's (tests/gpu/test_gpu_nn_precision.py, against cuDNN)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import rnnrt.nn
import rnnrt.nn.cuda as nn_cuda
import rnnrt.nn.precision as nn_prec

T, B, I, H = 5, 3, 4, 6


def _x(dtype=torch.float32):
    return torch.randn(T, B, I, generator=torch.Generator().manual_seed(1)).to(dtype)


def test_cpu_autocast_is_refused_before_any_work():
    m = rnnrt.nn.LSTM(I, H, num_layers=2)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    x = _x()
    with torch.autocast("cpu", dtype=torch.bfloat16), \
            pytest.raises(NotImplementedError, match=r"autocast\('cpu'.*enabled=False"):
        m(x)
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=False):
        y, _ = m(x)                                  # what the message says to do works
    assert y.dtype == torch.float32
    with pytest.raises(NotImplementedError, match="on CUDA, bfloat16 and float16 run"):
        rnnrt.nn.GRU(I, H).to(torch.bfloat16)(x.to(torch.bfloat16))


def test_call_precision_follows_torch_nn_rules(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert nn_prec.call_precision(cuda, torch.float32) is None          # fp32: as before
    assert nn_prec.call_precision(cuda, torch.bfloat16) == nn_prec.CallPrecision(
        "bfloat16", torch.bfloat16, False)
    assert nn_prec.call_precision(cuda, torch.float16).name == "float16"
    assert nn_prec.call_precision(cpu, torch.float32) is None
    monkeypatch.setattr(nn_prec, "autocast_dtype",
                        lambda t: torch.float16 if t == "cuda" else None)
    assert nn_prec.call_precision(cuda, torch.float32) == nn_prec.CallPrecision(
        "float16", torch.float16, True)
    assert nn_prec.call_precision(cuda, torch.bfloat16).name == "float16"   # autocast wins
    assert nn_prec.call_precision(cpu, torch.float32) is None   # cuda autocast, cpu tensors


@pytest.fixture
def recorded(cuda_on_cpu, monkeypatch):
    """The CUDA backend on CPU tensors, autocast('cpu') treated as CUDA's; each runner made
    is recorded with the precision asked for and built at float32 (the plumbing is under
    test here, not the 16-bit arithmetic)."""
    made = []

    def make_runner(model, precision, **kw):
        made.append(precision)
        return real(model, "float32", **kw)

    real = nn_cuda.make_runner
    monkeypatch.setattr(nn_prec, "RUNNER_DEVICES", ("cuda", "cpu"))
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
