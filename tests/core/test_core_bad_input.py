"""Bad input through the Python API, the careful user's way: every case must raise the
documented error type, with a message naming the argument, before any work (a spy on the
work it would do must not run, and it must come at once), leaving the caller's arrays and the
model byte-for-byte unchanged. Sizes are judged against a 1 GiB host (RNNRT_HOST_BYTES), so
the cases do not depend on this machine. The commands' and records' cases are in
tests/bench/test_bench_bad_input.py; the examples of issue 21 are marked (issue)."""
from __future__ import annotations

import numpy as np
import pytest

import rnnrt
from rnnrt import reference
from rnnrt.bench.ladder import LadderConfig
from rnnrt.bench.sweep import SweepConfig
from rnnrt.bench.trace import TraceConfig
from rnnrt.cells import backward_flops, forward_flops, tflops
from rnnrt.models import GRU, LSTM, RNN
from rnnrt.plan.forward import ForwardBuilder
from rnnrt.plan.switches import Switches, ladder
from rnnrt.sizes import SizeError
from testkit import Spy, assert_refused
from testkit import cpu_plan_key as PlanKey

I, H, L, T, B = 3, 4, 2, 5, 2
rng = np.random.default_rng(0)


@pytest.fixture(autouse=True)
def small_host(monkeypatch):
    monkeypatch.setenv("RNNRT_HOST_BYTES", str(1 << 30))


@pytest.fixture
def spies(monkeypatch):
    """Spies on the work: the reference's passes, the model's layout, the plan builders."""
    s = {"forward": Spy("reference.forward"), "backward": Spy("reference.backward"),
         "build": Spy("a plan build")}
    monkeypatch.setattr(reference, "forward", s["forward"])
    monkeypatch.setattr(reference, "backward", s["backward"])
    monkeypatch.setattr(ForwardBuilder, "build", s["build"])
    return s


def arr(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


# --------------------------------------------------------------------------- constructors

CONSTRUCT = [
    ("layers-1e9 (issue)", lambda: LSTM(8, 16, num_layers=10**9), SizeError,
     ["num_layers=1000000000", "GiB", "available"]),
    ("hidden-1e7 (issue)", lambda: LSTM(8, 10**7), SizeError,
     ["hidden_size=10000000", "GiB"]),
    ("input-1e8", lambda: GRU(10**8, 16), SizeError, ["input_size=100000000", "GiB"]),
    ("demo-hidden-1e5", lambda: LSTM(8, 100000, num_layers=2), SizeError,
     ["hidden_size=100000", "host memory"]),
    ("input-0", lambda: LSTM(0, 4), ValueError, ["input_size", "positive"]),
    ("hidden-negative", lambda: GRU(3, -4), ValueError, ["hidden_size", "positive"]),
    ("layers-float", lambda: RNN(3, 4, num_layers=2.5), TypeError, ["num_layers"]),
    ("layers-bool", lambda: LSTM(3, 4, True), TypeError, ["num_layers", "bool"]),
    ("hidden-str", lambda: LSTM(3, "4"), TypeError, ["hidden_size"]),
    ("bias-str", lambda: LSTM(3, 4, bias="yes"), TypeError, ["bias", "True or False"]),
    ("batch_first-int", lambda: GRU(3, 4, batch_first=1), TypeError, ["batch_first"]),
    ("dtype-int", lambda: LSTM(3, 4, dtype=np.int32), TypeError, ["dtype"]),
    ("dtype-half", lambda: LSTM(3, 4, dtype=np.float16), TypeError, ["dtype"]),
    ("nonlinearity", lambda: RNN(3, 4, nonlinearity="sigmoid"), ValueError,
     ["nonlinearity", "'tanh'"]),
]


@pytest.mark.parametrize("make, exc, words", [c[1:] for c in CONSTRUCT],
                         ids=[c[0] for c in CONSTRUCT])
def test_constructor_refuses(make, exc, words, monkeypatch):
    layout = Spy("the model's layout (a loop over layers)")
    monkeypatch.setattr(rnnrt.models, "make_layout", layout)
    assert_refused(make, exc, words, spies=[layout], within_s=1.0)


# --------------------------------------------------------------------------- forward

def _lstm():
    return LSTM(I, H, num_layers=L, seed=0)


FORWARD = [
    ("x-float64", lambda m: m(arr(T, B, I, dtype=np.float64)), TypeError, ["x", "float64"]),
    ("x-int", lambda m: m(np.ones((T, B, I), np.int64)), TypeError, ["x", "integer"]),
    ("x-list", lambda m: m([[[0.0] * I] * B] * T), TypeError, ["x", "list"]),
    ("x-2d", lambda m: m(arr(T, I)), ValueError, ["x", "3 dimensions"]),
    ("x-input-size", lambda m: m(arr(T, B, I + 1)), ValueError, ["x", f"input size {I}"]),
    ("x-no-steps", lambda m: m(arr(0, B, I)), ValueError, ["x", "empty sequence"]),
    ("x-no-batch", lambda m: m(arr(T, 0, I)), ValueError, ["x", "empty batch"]),
    ("hx-not-tuple", lambda m: m(arr(T, B, I), arr(L, B, H)), TypeError, ["hx", "tuple"]),
    ("h0-layers", lambda m: m(arr(T, B, I), (arr(L + 1, B, H), None)), ValueError,
     ["h0", "num_layers"]),
    ("h0-batch", lambda m: m(arr(T, B, I), (arr(L, B + 1, H), None)), ValueError,
     ["h0", "batch"]),
    ("c0-dtype", lambda m: m(arr(T, B, I), (None, arr(L, B, H, dtype=np.float64))),
     TypeError, ["c0", "float64"]),
    ("train-str (issue)", lambda m: m(arr(T, B, I), train="no"), TypeError,
     ["train", "True or False"]),
    ("train-int", lambda m: m(arr(T, B, I), train=1), TypeError, ["train"]),
    ("train-none", lambda m: m(arr(T, B, I), train=None), TypeError, ["train"]),
    ("reference-too-large", lambda m: LSTM(I, 256, num_layers=4)(arr(1000, 100, I)),
     SizeError, ["batch=100 steps=1000", "GiB", "host memory"]),
]


@pytest.mark.parametrize("call, exc, words", [c[1:] for c in FORWARD],
                         ids=[c[0] for c in FORWARD])
def test_forward_refuses(call, exc, words, spies):
    m = _lstm()
    assert_refused(lambda: call(m), exc, words, arrays=[m.flat], spies=[spies["forward"]])


def test_gru_refuses_a_cell_state(spies):
    m = GRU(I, H, num_layers=L)
    x, h0 = arr(T, B, I), arr(L, B, H)
    assert_refused(lambda: m(x, (h0, h0)), TypeError, ["hx", "no cell state"],
                   arrays=[x, h0, m.flat], spies=[spies["forward"]])


def test_inputs_are_unchanged_when_refused(spies):
    m = _lstm()
    x, h0, c0 = arr(T, B, I), arr(L, B, H), arr(L, B + 1, H)
    assert_refused(lambda: m(x, (h0, c0)), ValueError, ["c0", "batch"],
                   arrays=[x, h0, c0, m.flat], spies=[spies["forward"]])


# --------------------------------------------------------------------------- backward

@pytest.fixture
def trained():
    m = _lstm()
    x = arr(T, B, I)
    y, _, tape = m(x, train=True)
    return m, x, y, tape


BACKWARD = [
    ("tape-type", lambda m, y, t: m.backward("tape", y), TypeError, ["tape", "Tape"]),
    ("tape-float64 (issue)", lambda m, y, t: m.backward(
        LSTM(I, H, L, dtype=np.float64)(arr(T, B, I, dtype=np.float64), train=True)[2], y),
     TypeError, ["tape", "float64"]),
    ("tape-other-layout", lambda m, y, t: LSTM(I, H + 1, L).backward(t, y), ValueError,
     ["tape", "configuration"]),
    ("dy-shape", lambda m, y, t: m.backward(t, y[:-1]), ValueError, ["dy", "shape of y"]),
    ("dy-dtype", lambda m, y, t: m.backward(t, y.astype(np.float64)), TypeError, ["dy"]),
    ("dhx-not-tuple", lambda m, y, t: m.backward(t, y, arr(L, B, H)), TypeError,
     ["dhx", "tuple"]),
    ("dh_n-batch", lambda m, y, t: m.backward(t, y, (arr(L, B + 3, H), None)), ValueError,
     ["dh_n", "batch"]),
]


@pytest.mark.parametrize("call, exc, words", [c[1:] for c in BACKWARD],
                         ids=[c[0] for c in BACKWARD])
def test_backward_refuses(call, exc, words, trained, monkeypatch):
    m, x, y, tape = trained
    spy = Spy("reference.backward")
    monkeypatch.setattr(reference, "backward", spy)
    assert_refused(lambda: call(m, y, tape), exc, words, arrays=[y, x, m.flat, tape.flat],
                   spies=[spy])


def test_a_tape_from_another_device_is_refused(trained, monkeypatch):
    import dataclasses
    m, _, y, tape = trained
    spy = Spy("reference.backward")
    monkeypatch.setattr(reference, "backward", spy)
    assert_refused(lambda: m.backward(dataclasses.replace(tape, device="cuda:0"), y),
                   ValueError, ["tape", "cuda:0"], arrays=[y], spies=[spy])


# --------------------------------------------------------------------------- state dicts

def test_state_dict_problems_are_all_named_and_nothing_loads():
    m = _lstm()
    sd = m.state_dict()
    sd["weight_hh_l0"] = sd["weight_hh_l0"][:-1]
    sd["bias_ih_l1"] = sd["bias_ih_l1"].astype(np.int32)
    sd["weight_ih_l1"] = np.full_like(sd["weight_ih_l1"], np.nan)
    arrays = list(sd.values())
    e = assert_refused(lambda: m.load_state_dict(sd), ValueError,
                       ["weight_hh_l0", "bias_ih_l1", "weight_ih_l1", "nothing was loaded"],
                       arrays=arrays + [m.flat])
    assert len(e.problems) == 3
    assert_refused(lambda: m.load_state_dict([1, 2]), TypeError, ["state_dict", "mapping"],
                   arrays=[m.flat])


# --------------------------------------------------------------------------- FLOPs and rates

RATES = [
    ("flops-negative-batch (issue)", lambda: forward_flops("lstm", 8, 8, 1, -64, 10),
     ValueError, ["batch", "positive"]),
    ("flops-float-steps", lambda: forward_flops("lstm", 8, 8, 1, 4, 10.0), TypeError,
     ["steps"]),
    ("flops-bool-layers", lambda: forward_flops("gru", 8, 8, True, 4, 10), TypeError,
     ["num_layers"]),
    ("flops-cell", lambda: forward_flops("xlstm", 8, 8, 1, 4, 10), ValueError, ["cell"]),
    ("bwd-flops-hidden-0", lambda: backward_flops("lstm", 8, 0, 1, 4, 10), ValueError,
     ["hidden_size"]),
    ("model-flops-batch", lambda: _lstm().flops(batch=0, steps=3), ValueError, ["batch"]),
    ("model-flops-backward-str", lambda: _lstm().flops(4, 3, backward="no"), TypeError,
     ["backward"]),
    ("load-strict-str", lambda: _lstm().load_state_dict({}, strict="no"), TypeError,
     ["strict"]),
    ("tflops-zero-ms (issue)", lambda: tflops(10**9, 0), ValueError, ["ms", "> 0"]),
    ("tflops-negative-ms (issue)", lambda: tflops(10**9, -2.0), ValueError, ["ms"]),
    ("tflops-nan-ms (issue)", lambda: tflops(10**9, float("nan")), ValueError, ["ms"]),
    ("tflops-inf-ms", lambda: tflops(10**9, float("inf")), ValueError, ["ms"]),
    ("tflops-negative-flops", lambda: tflops(-1, 1.0), ValueError, ["flops"]),
    ("tflops-str", lambda: tflops("1e9", 1.0), TypeError, ["flops"]),
]


@pytest.mark.parametrize("call, exc, words", [c[1:] for c in RATES],
                         ids=[c[0] for c in RATES])
def test_rates_refuse(call, exc, words):
    assert_refused(call, exc, words, within_s=0.5)


def test_flops_of_a_huge_layer_count_is_closed_form():
    # nothing loops over a user-given count: 10**12 layers costs no time
    f = forward_flops("lstm", 8, 8, 10**12, 1, 1)
    assert f == 2 * 4 * 8 * 1 * 1 * ((8 + 8) + (10**12 - 1) * 16)


# --------------------------------------------------------------------------- plans, switches

WAVE = ladder()[6].switches
PLANS = [
    ("plan-1e6-steps-naive (issue)", lambda: rnnrt.plan.forward_plan(
        PlanKey("lstm", 10**6, 64, 512, 512, 4, True, Switches())), SizeError,
     ["steps=1000000", "GiB", "host memory"]),
    ("plan-index-range", lambda: rnnrt.plan.forward_plan(
        PlanKey("rnn_tanh", 2**20, 2**12, 1, 1, 1, True,
                Switches(grouped=True, fused=True, input_batch="all"))), SizeError,
     ["steps x batch", "2**31"]),
    ("plan-steps-0", lambda: PlanKey("lstm", 0, 4, 8, 8, 1, True, WAVE), ValueError,
     ["steps"]),
    ("plan-switches-type", lambda: PlanKey("lstm", 4, 4, 8, 8, 1, True, "fast"), TypeError,
     ["switches"]),
    ("plan-family-without-persistent", lambda: PlanKey("lstm", 4, 4, 8, 8, 1, True, WAVE,
                                                       family="grid"), ValueError, ["family"]),
    ("backward-plan-inference-key", lambda: rnnrt.plan.backward_plan(
        PlanKey("lstm", 4, 4, 8, 8, 1, True, WAVE)), ValueError, ["train"]),
    ("switches-wavefront-alone", lambda: Switches(wavefront=True), ValueError,
     ["wavefront", "streams"]),
    ("switches-input-batch-0", lambda: Switches(input_batch=0), ValueError, ["input_batch"]),
    ("switches-str", lambda: Switches(grouped="yes"), TypeError, ["grouped"]),
]


@pytest.mark.parametrize("call, exc, words", [c[1:] for c in PLANS], ids=[c[0] for c in PLANS])
def test_plans_refuse(call, exc, words, spies):
    assert_refused(call, exc, words, spies=[spies["build"]], within_s=1.0)


def test_host_cap_must_be_a_number(monkeypatch):
    monkeypatch.setenv("RNNRT_HOST_BYTES", "lots")
    assert_refused(lambda: LSTM(3, 4), SizeError, ["RNNRT_HOST_BYTES", "'lots'"])


# --------------------------------------------------------------------------- configurations

CONFIGS = [
    ("ladder-layers-0", lambda: LadderConfig(layers=0), ValueError, ["layers"]),
    ("ladder-warmup-negative (issue)", lambda: LadderConfig(warmup=-5), ValueError, ["warmup"]),
    ("ladder-executor", lambda: LadderConfig(executors=("fast",)), ValueError, ["executors"]),
    ("ladder-rungs", lambda: LadderConfig(rungs=("+turbo",)), ValueError, ["rungs"]),
    ("ladder-input-batch", lambda: LadderConfig(input_batch=0), ValueError, ["input_batch"]),
    ("sweep-hidden-empty", lambda: SweepConfig(hidden=()), ValueError, ["hidden"]),
    ("sweep-pass", lambda: SweepConfig(passes=("bwd",)), ValueError, ["passes"]),
    ("sweep-budget", lambda: SweepConfig(time_budget=0), ValueError, ["time_budget"]),
    ("trace-steps", lambda: TraceConfig(steps=0), ValueError, ["steps"]),
    ("trace-cell", lambda: TraceConfig(cell="xlstm"), ValueError, ["cell"]),
]


@pytest.mark.parametrize("call, exc, words", [c[1:] for c in CONFIGS],
                         ids=[c[0] for c in CONFIGS])
def test_configurations_refuse(call, exc, words):
    assert_refused(call, exc, words, within_s=0.5)


def test_gpu_path_without_a_gpu_names_the_extra():
    from rnnrt.device import GpuUnavailable, gpu_available
    if gpu_available():
        pytest.skip("checks the message shown without a GPU")
    from rnnrt.gpu import GpuRunner
    assert_refused(lambda: GpuRunner(_lstm()), GpuUnavailable, ["pip install -e '.[cuda13]'"])
