"""rnnrt.nn's modules as torch.nn modules: construction (torch's arguments, checks and
errors; proj_size on GRU / RNN refused by name), parameters (names, shapes, order and initial values
equal to torch.nn's for one seed), state_dict both ways, repr, unbatched input, empty batch,
float32, devices and dtypes without a backend, and torch imported by rnnrt.nn only."""
from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="rnnrt.nn needs torch (pip install torch)")

import rnnrt.nn  # noqa: E402
from rnnrt import check  # noqa: E402
from rnnrt.nn.backend import backend_for  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
KINDS = [("LSTM", {}), ("GRU", {}), ("RNN", {"nonlinearity": "tanh"}),
         ("RNN", {"nonlinearity": "relu"})]
IDS = ["lstm", "gru", "rnn_tanh", "rnn_relu"]


def pair(kind, kw, seed=0, **args):
    torch.manual_seed(seed)
    ref = getattr(torch.nn, kind)(**kw, **args)
    torch.manual_seed(seed)
    return ref, getattr(rnnrt.nn, kind)(**kw, **args)


def close(name, got, want, atol=1e-12, rtol=1e-10):
    check.assert_close(got.detach().numpy(), want.detach().numpy(), atol, rtol, name=name)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("kind, kw", KINDS, ids=IDS)
def test_parameters_and_initial_values_are_torch_nns(kind, kw, bias):
    args = dict(input_size=5, hidden_size=7, num_layers=3, bias=bias, bidirectional=True)
    ref, mine = pair(kind, kw, **args)
    assert [n for n, _ in mine.named_parameters()] == [n for n, _ in ref.named_parameters()]
    bound = 1 / math.sqrt(7)
    for (name, p), q in zip(mine.named_parameters(), ref.parameters()):
        assert p.shape == q.shape and p.dtype == q.dtype and p.requires_grad, name
        assert torch.equal(p, q), f"{name}: not torch.nn's initial value for the same seed"
        assert float(p.detach().abs().max()) <= bound
    # The distribution itself (torch's procedure is what makes the values equal above):
    # uniform(-b, b) has mean 0 and variance b^2/3.
    allp = torch.cat([p.detach().flatten() for p in mine.parameters()]).double()
    n = allp.numel()
    assert abs(float(allp.mean())) < 5 * bound / math.sqrt(3 * n)
    assert abs(float(allp.var()) / (bound ** 2 / 3) - 1) < 5 * math.sqrt(0.8 / n)
    assert mine.cell == {"LSTM": "lstm", "GRU": "gru"}.get(kind, "rnn_" + kw.get(
        "nonlinearity", ""))
    assert mine._all_weights == ref._all_weights
    assert [[p.shape for p in ws] for ws in mine.all_weights] == \
        [[p.shape for p in ws] for ws in ref.all_weights]


@pytest.mark.parametrize("kind, kw", KINDS, ids=IDS)
def test_state_dict_both_ways(kind, kw):
    args = dict(input_size=3, hidden_size=4, num_layers=2, bidirectional=True,
                dtype=torch.float64)
    ref, mine = pair(kind, kw, seed=1, **args)
    _, other = pair(kind, kw, seed=2, **args)
    x = torch.randn(5, 2, 3, dtype=torch.float64)
    assert list(mine.state_dict()) == list(ref.state_dict())

    # torch.nn -> rnnrt.nn: a module with other weights becomes torch's.
    assert not torch.equal(other.weight_hh_l1_reverse, ref.weight_hh_l1_reverse)
    res = other.load_state_dict(ref.state_dict())
    assert not res.missing_keys and not res.unexpected_keys
    close("output after torch -> rnnrt.nn", other(x)[0], ref(x)[0])

    # rnnrt.nn -> torch.nn
    _, mine2 = pair(kind, kw, seed=3, **args)
    ref.load_state_dict(mine2.state_dict())
    close("output after rnnrt.nn -> torch", ref(x)[0], mine2(x)[0])
    for (n, a), b in zip(ref.state_dict().items(), mine2.state_dict().values()):
        assert torch.equal(a, b), n

    # strict loading refuses what torch.nn refuses
    bad = dict(ref.state_dict())
    bad["weight_hh_l0"] = bad["weight_hh_l0"][:, :2]
    with pytest.raises(RuntimeError, match="weight_hh_l0"):
        mine.load_state_dict(bad)


@pytest.mark.parametrize("kind, kw", KINDS, ids=IDS)
def test_repr_is_torch_nns(kind, kw):
    args = dict(input_size=3, hidden_size=4, num_layers=2, bias=False, batch_first=True,
                dropout=0.25, bidirectional=True)
    ref, mine = pair(kind, kw, **args)
    assert repr(mine) == repr(ref)


@pytest.mark.parametrize("kind, args", [
    (kind, args) for kind in ("LSTM", "GRU") for args in (
        dict(dropout=1.5), dict(dropout=True), dict(bias=1), dict(batch_first="yes"),
        dict(hidden_size=0), dict(num_layers=0), dict(input_size=2.0))
] + [("LSTM", dict(proj_size=-1)), ("LSTM", dict(proj_size=4)), ("GRU", dict(proj_size=2))])
def test_constructor_errors_are_torch_nns(kind, args):
    full = dict(input_size=3, hidden_size=4)
    full.update(args)
    with pytest.raises(Exception) as want:
        getattr(torch.nn, kind)(**full)
    with pytest.raises(Exception) as got:
        getattr(rnnrt.nn, kind)(**full)
    assert type(got.value) is type(want.value), (got.value, want.value)


def test_other_constructor_errors():
    for cls in (rnnrt.nn.GRU, rnnrt.nn.RNN):
        with pytest.raises(ValueError, match="proj_size"):
            cls(3, 4, proj_size=2)
    with pytest.raises(ValueError, match="nonlinearity"):
        rnnrt.nn.RNN(3, 4, nonlinearity="sigmoid")
    assert rnnrt.nn.RNN(3, 4, 1, "relu").nonlinearity == "relu"  # torch's positional order
    with pytest.warns(UserWarning, match="num_layers greater than 1"):
        rnnrt.nn.GRU(3, 4, dropout=0.5)


@pytest.mark.parametrize("kind, kw", KINDS, ids=IDS)
def test_unbatched_input(kind, kw):
    ref, mine = pair(kind, kw, input_size=3, hidden_size=4, num_layers=2, bidirectional=True,
                     batch_first=True, dtype=torch.float64)
    x = torch.randn(6, 3, dtype=torch.float64)
    h = [torch.randn(4, 4, dtype=torch.float64) for _ in range(2 if kind == "LSTM" else 1)]
    outs = []
    for m in (ref, mine):
        xs, hs = x.clone().requires_grad_(), [t.clone().requires_grad_() for t in h]
        out, hn = m(xs, tuple(hs) if kind == "LSTM" else hs[0])
        hn = hn if isinstance(hn, tuple) else (hn,)
        loss = (out * torch.cos(out)).sum() + sum((t * t).sum() for t in hn)
        outs.append((out, hn, torch.autograd.grad(loss, [xs, *hs, *m.parameters()])))
    (ro, rh, rg), (mo, mh, mg) = outs
    assert mo.shape == ro.shape == (6, 8) and all(a.shape == (4, 4) for a in mh)
    close("output", mo, ro)
    for i, (a, b) in enumerate(zip(mh, rh)):
        close(f"state {i}", a, b)
    for i, (a, b) in enumerate(zip(mg, rg)):
        close(f"gradient {i}", a, b)


def test_empty_batch_as_torch_nn():
    ref, mine = pair("LSTM", {}, input_size=3, hidden_size=4, num_layers=2)
    x = torch.randn(5, 0, 3)
    (ro, (rh, rc)), (mo, (mh, mc)) = ref(x), mine(x)
    assert mo.shape == ro.shape and mh.shape == rh.shape and mc.shape == rc.shape


@pytest.mark.parametrize("kind, kw", KINDS, ids=IDS)
def test_float32_computes_in_float32(kind, kw):
    ref, mine = pair(kind, kw, input_size=4, hidden_size=8, num_layers=2, bidirectional=True)
    x = torch.randn(7, 3, 4)
    (ro, rh), (mo, mh) = ref(x.clone().requires_grad_()), mine(x.clone().requires_grad_())
    assert mo.dtype == torch.float32
    close("fp32 output", mo, ro, check.FP32_ATOL, check.FP32_RTOL)
    gr = torch.autograd.grad(ro.sum(), list(ref.parameters()))
    gm = torch.autograd.grad(mo.sum(), list(mine.parameters()))
    assert all(g.dtype == torch.float32 for g in gm)
    for (n, _), a, b in zip(ref.named_parameters(), gm, gr):
        close(f"fp32 d{n}", a, b, check.FP32_ATOL, check.FP32_RTOL)
    mine.double()  # module.to(dtype) converts every parameter; float64 inputs then run
    assert mine(x.double())[0].dtype == torch.float64


def test_devices_and_dtypes_without_a_backend_raise_not_implemented():
    from rnnrt.nn.cuda import CudaBackend
    cuda = backend_for(torch.device("cuda", 0), torch.float32)   # built without CuPy
    assert isinstance(cuda, CudaBackend)
    # what the CUDA backend does not run is refused before any work, naming it: 16-bit
    # tensors only with a precision (autocast or a 16-bit module: nn/precision.py), no float64
    with pytest.raises(NotImplementedError, match="bfloat16"):
        CudaBackend._check(torch.zeros(6, 3, dtype=torch.bfloat16), None)
    with pytest.raises(NotImplementedError, match="float64"):
        CudaBackend._check(torch.zeros(6, 3, dtype=torch.float64), None)
    CudaBackend._check(torch.zeros(6, 3), None)   # float32 runs, one length or several
    with pytest.raises(NotImplementedError, match="meta"):
        rnnrt.nn.GRU(3, 4, device="meta")(torch.randn(2, 1, 3, device="meta"))
    m = rnnrt.nn.LSTM(3, 4, dtype=torch.bfloat16)   # 16-bit modules run (test_nn_precision)
    m.flatten_parameters()  # torch.nn's call (a no-op off CUDA float32): exists for drop-in use


def test_torch_is_imported_by_rnnrt_nn_only():
    """Without torch: `import rnnrt` (and its NumPy modules, varlen included) works and
    imports no torch; `import rnnrt.nn` raises an ImportError naming the install step."""
    code = (
        "import sys; sys.modules['torch'] = None\n"  # makes `import torch` fail
        "import rnnrt, rnnrt.varlen, rnnrt.reference, rnnrt.models, rnnrt.plan\n"
        "assert not any(m == 'torch' or m.startswith('torch.') for m in sys.modules\n"
        "               if sys.modules[m] is not None), 'torch imported'\n"
        "try:\n"
        "    import rnnrt.nn\n"
        "except ImportError as e:\n"
        "    assert 'pip install torch' in str(e), e\n"
        "    print('refused:', e)\n"
        "else:\n"
        "    raise SystemExit('rnnrt.nn imported without torch')\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=60, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0 and "refused: rnnrt.nn needs PyTorch" in r.stdout, r.stderr
