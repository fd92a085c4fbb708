"""Bad arguments: constructor, forward and backward inputs. Each must raise the documented
exception type with a message naming the argument and what was expected, and leave the
model (its flat buffer) bitwise unchanged."""
from __future__ import annotations

import numpy as np
import pytest

from rnnrt.models import GRU, LSTM, RNN, RNNBase
from rnnrt.validate import check_backward_inputs, check_forward_inputs, split_hx

I, H, L, T, B = 3, 4, 2, 5, 2
f32 = np.float32


def z(*shape, dtype=f32):
    return np.zeros(shape, dtype)


class FakeDeviceArray:
    """Duck-typed like a CuPy array (ndim, shape, dtype) without being a NumPy array."""

    def __init__(self, shape, dtype=f32):
        self.shape, self.dtype, self.ndim = tuple(shape), np.dtype(dtype), len(shape)


def assert_raises_unchanged(model, exc, words, fn):
    """fn() raises ``exc`` whose message contains every string of ``words``; model.flat is
    bitwise unchanged."""
    before = model.flat.tobytes()
    with pytest.raises(exc) as info:
        fn()
    for w in words:
        assert w in str(info.value), (w, str(info.value))
    assert model.flat.tobytes() == before


# --------------------------------------------------------------------------- constructor

@pytest.mark.parametrize("make, exc, words", [
    (lambda: LSTM(0, H), ValueError, ["input_size", "positive integer", "0"]),
    (lambda: LSTM(I, -2), ValueError, ["hidden_size", "positive integer"]),
    (lambda: GRU(I, H, 0), ValueError, ["num_layers", "positive integer"]),
    (lambda: GRU(2.5, H), TypeError, ["input_size", "positive integer", "float"]),
    (lambda: RNN(I, "4"), TypeError, ["hidden_size", "positive integer", "str"]),
    (lambda: LSTM(I, H, True), TypeError, ["num_layers", "bool"]),
    (lambda: LSTM(I, H, dtype=np.float16), TypeError, ["dtype", "float32", "float64"]),
    (lambda: GRU(I, H, dtype=np.int32), TypeError, ["dtype", "float32"]),
    (lambda: RNN(I, H, dtype="complex64"), TypeError, ["dtype"]),
    (lambda: RNN(I, H, dtype="nonsense"), TypeError, ["dtype"]),
    (lambda: RNN(I, H, dtype=None), TypeError, ["dtype"]),
    (lambda: RNN(I, H, nonlinearity="sigmoid"), ValueError, ["nonlinearity", "'tanh'", "'relu'"]),
    (lambda: RNN(I, H, nonlinearity=None), ValueError, ["nonlinearity"]),
    (lambda: LSTM(I, H, bias="yes"), TypeError, ["bias", "True or False"]),
    (lambda: GRU(I, H, batch_first=1), TypeError, ["batch_first", "True or False"]),
    (lambda: RNNBase("LSTMX", I, H), ValueError, ["mode", "'LSTM'", "'GRU'"]),
    (lambda: RNNBase(3, I, H), TypeError, ["mode"]),
    (lambda: RNNBase("LSTM", I, H, nonlinearity="tanh"), ValueError, ["nonlinearity"]),
    (lambda: RNNBase("RNN_TANH", I, H, nonlinearity="relu"), ValueError,
     ["nonlinearity", "contradicts"]),
])
def test_constructor_rejects(make, exc, words):
    with pytest.raises(exc) as info:
        make()
    for w in words:
        assert w in str(info.value), (w, str(info.value))


def test_constructor_accepts_numpy_ints_and_dtype_strings():
    m = LSTM(np.int64(I), np.int32(H), num_layers=np.int8(2), dtype="float64",
             bias=np.bool_(False))
    assert (m.input_size, m.hidden_size, m.num_layers, m.bias) == (I, H, 2, False)
    assert m.dtype == np.float64 and type(m.input_size) is int


# --------------------------------------------------------------------------- forward

LSTM_CASES = [
    # (name, x, hx, exception, words in the message)
    ("list", [[[0.0] * I] * B] * T, None, TypeError, ["x", "array", "list"]),
    ("scalar", 1.0, None, TypeError, ["x", "array", "float"]),
    ("rank 2", z(T, I), None, ValueError, ["x", "3 dimensions", "[T, B, I]", "(5, 3)"]),
    ("rank 4", z(T, B, I, 1), None, ValueError, ["x", "3 dimensions"]),
    ("input size", z(T, B, I + 1), None, ValueError, ["x", "input size 3", "(5, 2, 4)"]),
    ("T = 0", z(0, B, I), None, ValueError, ["x", "empty sequence", "T = 0"]),
    ("B = 0", z(T, 0, I), None, ValueError, ["x", "empty batch", "B = 0"]),
    ("int x", z(T, B, I, dtype=np.int32), None, TypeError, ["x", "integer", "int32", "float32"]),
    ("uint x", z(T, B, I, dtype=np.uint8), None, TypeError, ["x", "unsigned integer"]),
    ("bool x", z(T, B, I, dtype=bool), None, TypeError, ["x", "bool"]),
    ("complex x", z(T, B, I, dtype=np.complex64), None, TypeError, ["x", "complex"]),
    ("float64 x", z(T, B, I, dtype=np.float64), None, TypeError,
     ["x", "float64", "does not match", "float32"]),
    ("hx not a tuple", z(T, B, I), z(L, B, H), TypeError, ["hx", "tuple (h, c)"]),
    ("hx of 3", z(T, B, I), (None, None, None), TypeError, ["hx", "tuple"]),
    ("h0 rank", z(T, B, I), (z(B, H), None), ValueError, ["h0", "3 dimensions", "(2, 2, 4)"]),
    ("h0 layers", z(T, B, I), (z(L + 1, B, H), None), ValueError, ["h0", "num_layers = 2"]),
    ("h0 batch", z(T, B, I), (z(L, B + 1, H), None), ValueError,
     ["h0", "batch 3", "x's batch 2"]),
    ("h0 hidden", z(T, B, I), (z(L, B, H + 1), None), ValueError, ["h0", "hidden size 4"]),
    ("h0 dtype", z(T, B, I), (z(L, B, H, dtype=np.float64), None), TypeError,
     ["h0", "float64", "float32"]),
    ("h0 list", z(T, B, I), ([[0.0]], None), TypeError, ["h0", "array", "list"]),
    ("c0 batch", z(T, B, I), (None, z(L, 1, H)), ValueError, ["c0", "batch 1", "x's batch 2"]),
    ("c0 dtype", z(T, B, I), (None, z(L, B, H, dtype=np.int64)), TypeError, ["c0", "integer"]),
]


@pytest.mark.parametrize("name, x, hx, exc, words", LSTM_CASES, ids=[c[0] for c in LSTM_CASES])
def test_lstm_forward_rejects(name, x, hx, exc, words):
    m = LSTM(I, H, L, seed=0)
    assert_raises_unchanged(m, exc, words, lambda: m(x, hx))
    assert_raises_unchanged(m, exc, words, lambda: m(x, hx, train=True))


def test_batch_first_messages_use_its_layout():
    m = GRU(I, H, L, batch_first=True, seed=0)
    assert_raises_unchanged(m, ValueError, ["x", "[B, T, I]", "batch_first=True"],
                            lambda: m(z(B, I)))
    assert_raises_unchanged(m, ValueError, ["empty sequence", "[B, T, I]"],
                            lambda: m(z(B, 0, I)))
    assert_raises_unchanged(m, ValueError, ["empty batch"], lambda: m(z(0, T, I)))
    # h0 stays [num_layers, B, H]: batch is x's first dimension here
    assert_raises_unchanged(m, ValueError, ["h0", "batch 5", "x's batch 2"],
                            lambda: m(z(B, T, I), z(L, T, H)))
    m(z(B, T, I), z(L, B, H))  # the right shapes pass


@pytest.mark.parametrize("model", [GRU(I, H, L, seed=0), RNN(I, H, L, seed=0),
                                   RNN(I, H, L, nonlinearity="relu", seed=0)],
                         ids=["gru", "rnn_tanh", "rnn_relu"])
def test_cells_without_cell_state_reject_c0(model):
    x, h0, c0 = z(T, B, I), z(L, B, H), z(L, B, H)
    assert_raises_unchanged(model, TypeError, ["hx", "one [num_layers, B, H] array", "tuple"],
                            lambda: model(x, (h0, c0)))
    assert_raises_unchanged(model, ValueError, ["c0", "no cell state", "None"],
                            lambda: check_forward_inputs(model, x, h0, c0))
    assert_raises_unchanged(model, ValueError, ["h0", "num_layers = 2"],
                            lambda: model(x, z(1, B, H)))
    assert check_forward_inputs(model, x, h0, None) == (T, B)


def test_duck_typed_arrays_pass_validation_but_not_the_numpy_path():
    m = LSTM(I, H, L, seed=0)
    x, h0 = FakeDeviceArray((T, B, I)), FakeDeviceArray((L, B, H))
    assert check_forward_inputs(m, x, h0, None) == (T, B)
    assert_raises_unchanged(m, ValueError, ["h0", "batch 3"],
                            lambda: check_forward_inputs(m, x, FakeDeviceArray((L, 3, H)), None))
    assert_raises_unchanged(m, TypeError, ["x", "NumPy reference", "FakeDeviceArray"],
                            lambda: m(x, (h0, None)))


def test_torch_tensor_is_rejected_with_a_hint():
    torch = pytest.importorskip("torch", reason="only checks the message for torch tensors")
    m = LSTM(I, H, L, seed=0)
    assert_raises_unchanged(m, TypeError, ["x", "Tensor", ".numpy()"],
                            lambda: m(torch.zeros(T, B, I)))


def test_nan_inputs_are_not_checked_and_propagate():
    m = GRU(I, H, L, seed=0)
    x = np.random.default_rng(0).standard_normal((T, B, I)).astype(f32)
    x[2, 1, 0] = np.nan
    y, h_n = m(x)
    assert np.all(np.isnan(y[2:, 1])) and np.all(np.isfinite(y[:2])) and np.all(np.isfinite(y[:, 0]))
    assert np.all(np.isnan(h_n[:, 1])) and np.all(np.isfinite(h_n[:, 0]))


# --------------------------------------------------------------------------- backward

def _lstm_tape(batch_first=False):
    m = LSTM(I, H, L, batch_first=batch_first, seed=0)
    x = z(B, T, I) if batch_first else z(T, B, I)
    y, _, tape = m(x, train=True)
    return m, y, tape


BACKWARD_CASES = [
    # (name, dy, dhx, exception, words)
    ("dy shape", z(T, B, H + 1), None, ValueError, ["dy", "[T, B, H]", "(5, 2, 4)", "(5, 2, 5)"]),
    ("dy rank", z(T, B), None, ValueError, ["dy", "(5, 2, 4)"]),
    ("dy dtype", z(T, B, H, dtype=np.float64), None, TypeError, ["dy", "float64", "float32"]),
    ("dy int", z(T, B, H, dtype=np.int16), None, TypeError, ["dy", "integer"]),
    ("dy list", [[0.0]], None, TypeError, ["dy", "array"]),
    ("dhx not a tuple", z(T, B, H), z(L, B, H), TypeError, ["dhx", "tuple"]),
    ("dh_n batch", z(T, B, H), (z(L, 1, H), None), ValueError, ["dh_n", "batch 1"]),
    ("dh_n layers", z(T, B, H), (z(1, B, H), None), ValueError, ["dh_n", "num_layers = 2"]),
    ("dc_n hidden", z(T, B, H), (None, z(L, B, 1)), ValueError, ["dc_n", "hidden size 4"]),
    ("dc_n dtype", z(T, B, H), (None, z(L, B, H, dtype=np.complex128)), TypeError,
     ["dc_n", "complex"]),
]


@pytest.mark.parametrize("name, dy, dhx, exc, words", BACKWARD_CASES,
                         ids=[c[0] for c in BACKWARD_CASES])
def test_lstm_backward_rejects(name, dy, dhx, exc, words):
    m, y, tape = _lstm_tape()
    assert_raises_unchanged(m, exc, words, lambda: m.backward(tape, dy, dhx))
    m.backward(tape, np.ones_like(y))  # the tape is still good


def test_backward_batch_first_wants_y_layout():
    m, y, tape = _lstm_tape(batch_first=True)
    assert y.shape == (B, T, H)
    assert_raises_unchanged(m, ValueError, ["dy", "[B, T, H]", "batch_first=True"],
                            lambda: m.backward(tape, z(T, B, H)))
    m.backward(tape, z(B, T, H))


def test_gru_backward_rejects_dc_n():
    m = GRU(I, H, L, seed=0)
    y, _, tape = m(z(T, B, I), train=True)
    assert_raises_unchanged(m, TypeError, ["dhx", "tuple"],
                            lambda: m.backward(tape, y, (z(L, B, H), z(L, B, H))))
    assert_raises_unchanged(m, ValueError, ["dc_n", "no cell state"],
                            lambda: check_backward_inputs(m, T, B, y, None, z(L, B, H)))
    check_backward_inputs(m, T, B, y, z(L, B, H), None)
    check_backward_inputs(m, T, B, None, None, None)  # nothing reaches the loss: allowed


def test_split_hx_structure():
    lstm, gru = LSTM(I, H, L, seed=0), GRU(I, H, L, seed=0)
    h, c = z(L, B, H), z(L, B, H)
    assert split_hx(lstm, None) == (None, None) and split_hx(gru, None) == (None, None)
    assert split_hx(lstm, (h, c))[1] is c and split_hx(lstm, [None, c])[0] is None
    assert split_hx(gru, h)[0] is h and split_hx(gru, h)[1] is None
    with pytest.raises(TypeError, match="dhx: an LSTM takes a tuple"):
        split_hx(lstm, h, "dhx")
    with pytest.raises(TypeError, match="hx: a GRU takes one"):
        split_hx(gru, (h, c))


def test_reduction_atol_grows_with_the_square_root_of_the_terms():
    from rnnrt.check import FP32_ATOL, compare, reduction_atol
    assert reduction_atol(1) == reduction_atol(64) == FP32_ATOL
    assert reduction_atol(25600) == pytest.approx(20 * FP32_ATOL)
    with pytest.raises(ValueError, match="terms"):
        reduction_atol(0)
    # a weight gradient of 25,600 terms of size ~0.1 that lost one of them is still caught
    rng = np.random.default_rng(0)
    terms = 0.1 * rng.standard_normal((25600, 8))
    ref = terms.sum(axis=0)
    lost = ref - terms[123]
    assert not compare(lost, ref, reduction_atol(25600), 1e-3).ok
    # while fp32 rounding of the same sum passes
    fp32 = terms.astype(np.float32).sum(axis=0, dtype=np.float32)
    assert compare(fp32, ref, reduction_atol(25600), 1e-3).ok


def test_reduction_atol_grows_with_the_size_of_the_sums():
    """check.reduction_atol's scale: atol x the sums' rms on top of the random walk of
    unit terms. A bfloat16-like case (800 rows, sums of rms ~6, an error of 1.4% of the rms
    as an H200 had at GRU 1 x 2048 B 8): outside the unscaled tolerance, inside the scaled
    one; an fp32 sum that lost one of its 25,600 terms still fails with its scale; a scale
    that is not a number >= 0 is refused."""
    from rnnrt.check import FP32_ATOL, compare, reduction_atol, rms
    rng = np.random.default_rng(7)
    assert reduction_atol(64, 0.02, scale=3.0) == pytest.approx(0.02 * 4.0)
    ref = 6.2 * rng.standard_normal(1000)
    off = ref.copy()
    off[17] += 0.014 * 6.2
    assert not compare(off, ref, reduction_atol(800, 0.02), 0.0).ok
    assert compare(off, ref, reduction_atol(800, 0.02, scale=rms(ref)), 0.0).ok
    terms = 0.1 * rng.standard_normal((25600, 8))
    ref = terms.sum(axis=0)
    lost = ref - terms[123]
    assert not compare(lost, ref, reduction_atol(25600, FP32_ATOL, scale=rms(ref)), 1e-3).ok
    assert rms(np.array([3.0, -4.0, np.nan])) == pytest.approx(12.5 ** 0.5) and rms([]) == 0.0
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="scale"):
            reduction_atol(64, scale=bad)


def test_compare_all_returns_the_worst_comparison():
    """check.compare_all: every array of the reference compared (None skipped), the worst
    returned and named; 'grads' gets the widened tolerance of its rows; a planted error in
    any one array is what comes back."""
    from rnnrt.check import FP32_ATOL, FP32_RTOL, compare_all, reduction_atol
    rng = np.random.default_rng(1)
    ref = {"y": rng.standard_normal((3, 4)), "h_n": rng.standard_normal((2, 4)), "c_n": None,
           "grads": 0.01 * rng.standard_normal(10)}
    got = {k: None if v is None else v.copy() for k, v in ref.items()}
    c = compare_all(got, ref, "the reference")
    assert c.ok and c.max_abs_err == 0
    for name, at in (("y", (2, 1)), ("h_n", (1, 3))):
        bad = {**got, name: got[name].copy()}
        bad[name][at] += 1.0
        c = compare_all(bad, ref, "planted")
        assert not c.ok and c.name == f"{name} vs planted" and c.worst_index == at, c
    # a 'grads' error between atol and its rows' tolerance passes only with those rows
    off = {**got, "grads": got["grads"] + 2 * FP32_ATOL + FP32_RTOL * abs(ref["grads"])}
    assert not compare_all(off, ref, "r").ok
    assert reduction_atol(64 * 16) == 4 * FP32_ATOL and compare_all(off, ref, "r", rows=64 * 16).ok
    # ... and their own size widens it: the same error passes for gradients 100x larger
    big = {k: None if v is None else 100 * v for k, v in ref.items()}
    assert compare_all({**big, "grads": big["grads"] + 2 * FP32_ATOL}, big, "r").ok
    # a NaN (an unwritten element) is the worst of all, whatever else is off
    nan = {**off, "y": got["y"].copy()}
    nan["y"][0, 0] = np.nan
    assert compare_all(nan, ref, "r").name == "y vs r"
    assert compare_all(got, {"c_n": None}, "r") is None
