"""examples/train_charlm.py on the CPU: its tiny run learns (the loss falls well below
the first steps' and the uniform guess) and writes its figure and record; its own head /
softmax cross-entropy gradient and the whole chunk's gradient (head + LSTM glue) agree
with central differences in float64; clipping and Adam do what they say."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

import rnnrt
from testkit import example_module


@pytest.fixture(scope="module")
def tc():
    return example_module("train_charlm")


def test_tiny_cpu_run_learns_and_writes_its_outputs(tc, tmp_path, monkeypatch):
    calls = []  # (train, hx given, (h_n, c_n) returned) of every forward
    real = tc.make_backend

    def spying(cfg, model):
        backend = real(cfg, model)
        forward = backend.forward

        def spy(x, hx, train):
            out = forward(x, hx, train)
            calls.append((train, hx, out[1]))
            return out

        backend.forward = spy
        return backend

    monkeypatch.setattr(tc, "make_backend", spying)
    rec = tc.main(["--device", "cpu", "--tiny", "--figures-dir", str(tmp_path / "fig"),
                   "--results-dir", str(tmp_path / "res")], progress=lambda m: None)
    losses = np.array(rec["train_loss"])
    V = rec["data"]["vocab_size"]
    assert len(losses) == tc.TINY["steps"] and np.all(np.isfinite(losses))
    first, last = losses[:3].mean(), losses[-30:].mean()
    # At the start the model guesses almost uniformly: ln V.
    assert abs(losses[0] - math.log(V)) < 0.2, (losses[0], math.log(V))
    assert last < first - 0.8, (first, last)
    assert last < math.log(V) - 0.7, (last, math.log(V))
    assert rec["final"]["val_loss"] < math.log(V) - 0.7, rec["val"]

    # Truncated BPTT: each chunk starts from the previous chunk's final state (the tiny run
    # stays inside the first pass over the text, so the state is never reset).
    assert rec["data"]["chunks_per_pass"] > tc.TINY["steps"]
    steps = [c for c in calls if c[0]]
    assert len(steps) == tc.TINY["steps"] and steps[0][1] is None
    for prev, cur in zip(steps, steps[1:]):
        for given, returned in zip(cur[1], prev[2]):
            np.testing.assert_array_equal(given, returned)
    assert any(not c[0] for c in calls)  # validation ran

    fig = Path(rec["figure"])
    assert fig.parent == tmp_path / "fig" and fig.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    res = Path(rec["record"])
    assert res.parent == tmp_path / "res"
    saved = json.loads(res.read_text())
    assert saved["train_loss"] == rec["train_loss"]
    assert saved["config"]["hidden"] == tc.TINY["hidden"] and saved["config"]["device"] == "cpu"
    for key in ("final", "wall_s", "val", "data", "sample"):
        assert key in saved
    assert saved["data"]["chars"] > 10_000
    assert saved["sample"]["text"].startswith("def ")
    assert len(saved["sample"]["text"]) == len("def ") + tc.TINY["sample_chars"]


def _fd(f, a, idx, eps):
    """Central difference of scalar f() w.r.t. a.flat[idx] (a modified in place, restored)."""
    old = a.flat[idx]
    a.flat[idx] = old + eps
    up = f()
    a.flat[idx] = old - eps
    down = f()
    a.flat[idx] = old
    return (up - down) / (2 * eps)


def test_head_gradient_matches_finite_differences(tc):
    rng = np.random.default_rng(1)
    T, B, H, V = 3, 2, 5, 7
    y = rng.standard_normal((T, B, H))
    head = {"weight": rng.standard_normal((V, H)), "bias": rng.standard_normal(V)}
    targets = rng.integers(0, V, T * B)
    loss, dy, g = tc.head_loss_grads(np, y, head, targets)
    assert dy.dtype == np.float64 and g["weight"].shape == (V, H)

    # The loss itself: mean over rows of -log softmax(logits)[target], computed plainly.
    logits = y.reshape(T * B, H) @ head["weight"].T + head["bias"]
    plain = np.mean([np.log(np.exp(r).sum()) - r[t] for r, t in zip(logits, targets)])
    assert abs(float(loss) - plain) < 1e-12
    assert abs(float(tc.head_loss(np, y, head, targets)) - plain) < 1e-12

    def f():
        return float(tc.head_loss_grads(np, y, head, targets)[0])

    for arr, grad in ((y, dy), (head["weight"], g["weight"]), (head["bias"], g["bias"])):
        num = np.array([_fd(f, arr, i, 1e-6) for i in range(arr.size)]).reshape(arr.shape)
        np.testing.assert_allclose(grad, num, rtol=1e-6, atol=1e-9)


def test_chunk_gradient_matches_finite_differences(tc):
    """The training step's composition (one-hot input, LSTM, head, dy passed back in the
    time-major order the head flattened it) against central differences, float64."""
    rng = np.random.default_rng(2)
    T, B, H, V, L = 4, 3, 5, 6, 2
    model = rnnrt.LSTM(V, H, num_layers=L, dtype=np.float64, seed=3)
    backend = tc.CpuBackend(model)
    head = {k: v.astype(np.float64) for k, v in tc.init_head(rng, H, V, np.float64).items()}
    streams = rng.integers(0, V, (B, T + 1)).astype(np.int32)
    x, targets = tc.chunk(np, streams, 0, T, np.eye(V))
    assert x.shape == (T, B, V) and np.array_equal(targets, streams[:, 1:].T.reshape(-1))
    hx = (rng.standard_normal((L, B, H)), rng.standard_normal((L, B, H)))
    loss, gflat, dhead, (h_n, c_n) = tc.loss_and_grads(backend, head, x, targets, hx)

    def f():
        y, _ = model.forward(x, hx)
        return float(tc.head_loss(np, y, head, targets))

    assert abs(f() - float(loss)) < 1e-12
    live = np.concatenate([np.arange(e.offset, e.end) for e in model.layout.entries])
    for i in rng.choice(live, 40, replace=False):
        assert abs(_fd(f, model.flat, i, 1e-6) - gflat[i]) < 1e-7 + 1e-5 * abs(gflat[i]), i
    pad = np.setdiff1d(np.arange(model.layout.size), live)
    assert np.all(gflat[pad] == 0)
    for k in ("weight", "bias"):
        for i in rng.choice(head[k].size, min(10, head[k].size), replace=False):
            assert abs(_fd(f, head[k], i, 1e-6) - dhead[k].flat[i]) < 1e-8 + 1e-5 * abs(
                dhead[k].flat[i]), (k, i)


def test_clip_and_adam(tc):
    g = [np.full(3, 3.0), np.full(1, 4.0 * math.sqrt(3))]  # joint norm sqrt(27 + 48) = sqrt(75)
    norm = tc.clip_global_norm(np, g, 1.0)
    assert abs(float(norm) - math.sqrt(75)) < 1e-12
    assert abs(math.sqrt(sum(float((a * a).sum()) for a in g)) - 1.0) < 1e-5
    small = [np.full(2, 0.1)]
    tc.clip_global_norm(np, small, 1.0)
    assert np.all(small[0] == 0.1)  # below the limit: untouched

    # Adam's first step moves every parameter with a nonzero gradient by lr against its
    # sign, and leaves zero-gradient elements (the flat buffer's padding) exactly alone.
    p = np.array([1.0, 0.0, -2.0])
    opt = tc.Adam(np, [p], lr=0.1, beta1=0.9, beta2=0.999, eps=1e-8)
    opt.step([np.array([0.5, 0.0, -3.0])])
    np.testing.assert_allclose(p, [0.9, 0.0, -1.9], rtol=1e-6)


def test_verify_step_accepts_the_reference_and_refuses_a_wrong_result(tc):
    """The GPU run's guard, exercised with the CPU backend standing in for the GPU one."""
    rng = np.random.default_rng(4)
    T, B, H, V, L = 5, 2, 8, 6, 2
    backend = tc.CpuBackend(rnnrt.LSTM(V, H, num_layers=L, seed=5))
    head = tc.init_head(rng, H, V, np.float32)
    x, targets = tc.chunk(np, rng.integers(0, V, (B, T + 1)).astype(np.int32), 0, T,
                          np.eye(V, dtype=np.float32))
    hx = tuple(rng.standard_normal((L, B, H)).astype(np.float32) for _ in range(2))
    got = tc.loss_and_grads(backend, head, x, targets, hx)
    check = tc.verify_step(backend, head, x, targets, hx, got, 1)
    assert check["grad_flat"] < 1e-6 and check["loss_abs"] < 1e-6
    loss, gflat, dhead, state = got
    wrong = gflat.copy()
    wrong[backend.model.layout.entry("weight_hh_l1").offset] += 0.01 * np.abs(gflat).max()
    with pytest.raises(RuntimeError, match="grad_flat"):
        tc.verify_step(backend, head, x, targets, hx, (loss, wrong, dhead, state), 1)


class FakeRunner:
    """rnnrt.gpu.GpuRunner's training API on the NumPy reference, with its own parameter
    buffer (as on the device): the calls the script makes on the GPU path, run on the CPU.
    accumulate: backward adds into one gradient buffer instead of returning this call's."""

    calls: list = []
    accumulate = False

    def __init__(self, model, switches=None, executor="graph"):
        assert isinstance(switches, rnnrt.Switches) and executor in ("graph", "eager")
        self.model = model
        self.params = model.flat.copy()
        self._grad = np.zeros_like(self.params)
        FakeRunner.calls.append(("init", executor))

    def forward(self, x, hx=None, train=False):
        assert x.dtype == np.float32 and x.flags.c_contiguous
        FakeRunner.calls.append(("forward", train))
        self.model.flat[...] = self.params  # the model's buffer is not what trains
        return self.model.forward(x, hx, train=train)

    def backward(self, tape, dy, dhx=None):
        FakeRunner.calls.append(("backward", dy.shape))
        g = self.model.backward(tape, dy, dhx)
        if not self.accumulate:
            return g
        self._grad += g.flat
        return rnnrt.Grads(g.dx, g.dh0, g.dc0, self._grad, g.params)


@pytest.fixture
def fake_gpu(tc, monkeypatch):
    import types

    import rnnrt.device
    import rnnrt.gpu
    import rnnrt.session

    fake_cp = types.ModuleType("fake_cupy")
    fake_cp.__dict__.update({k: getattr(np, k) for k in dir(np) if not k.startswith("__")})
    fake_cp.asnumpy = np.asarray
    monkeypatch.setattr(rnnrt.device, "require_gpu", lambda: fake_cp)
    monkeypatch.setattr(rnnrt.session, "device_info", lambda: {"device": "Fake GPU"})
    monkeypatch.setattr(rnnrt.device, "gpu_status", lambda: (True, "Fake GPU"))
    monkeypatch.setattr(rnnrt.gpu, "GpuRunner", FakeRunner)
    monkeypatch.setattr(FakeRunner, "calls", [])
    return FakeRunner


def test_gpu_path_glue_on_a_fake_runner(tc, tmp_path, fake_gpu):
    """--device gpu with GpuRunner replaced by a NumPy stand-in: the runner's parameters
    (not the model's) train, the first steps are verified, the outputs are written."""
    rec = tc.main(["--device", "gpu", "--tiny", "--steps", "60", "--eval-every", "30",
                   "--figures-dir", str(tmp_path), "--results-dir", str(tmp_path)],
                  progress=lambda m: None)
    assert [c["step"] for c in rec["verify"]] == [1, 2]
    assert rec["device"]["device"] == "Fake GPU" and "Fake GPU" in rec["device_label"]
    losses = rec["train_loss"]
    assert np.mean(losses[-10:]) < losses[0] - 0.5
    kinds = [c[0] for c in fake_gpu.calls]
    assert kinds[0] == "init" and fake_gpu.calls[0][1] == "graph"
    assert kinds.count("backward") == 60 and ("forward", True) in fake_gpu.calls
    assert ("forward", False) in fake_gpu.calls  # validation: forward without a tape
    assert "-fake-gpu-" in Path(rec["record"]).name


def test_gpu_verification_catches_accumulated_gradients(tc, tmp_path, fake_gpu, monkeypatch):
    monkeypatch.setattr(fake_gpu, "accumulate", True)
    with pytest.raises(RuntimeError, match="step 2: .*disagrees with the NumPy reference"):
        tc.main(["--device", "gpu", "--tiny", "--steps", "5", "--figures-dir",
                 str(tmp_path), "--results-dir", str(tmp_path)], progress=lambda m: None)
