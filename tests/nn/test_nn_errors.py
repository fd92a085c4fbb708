"""Bad arguments: rnnrt.nn raises the kind of error torch.nn raises for the same call, before
any work (the backend is never reached), naming what is wrong, with the caller's tensors
(input, states, packed data and batch_sizes) and the module's parameters byte-for-byte
untouched and no gradient written."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="rnnrt.nn needs torch (pip install torch)")

import rnnrt.nn  # noqa: E402
import rnnrt.nn.inputs  # noqa: E402
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence  # noqa: E402

T, B, I, H, L = 5, 3, 4, 6, 2


def rand(*shape, **kw):
    return torch.randn(*shape, **kw)


def lstm_hx(batch=B, layers=L, hidden=H, **kw):
    return rand(layers, batch, hidden, **kw), rand(layers, batch, hidden, **kw)


def packed(batch_sizes, rows=None, feat=I, **indices):
    rows = sum(batch_sizes) if rows is None else rows
    return PackedSequence(rand(rows, feat), torch.tensor(batch_sizes), **indices)


# (id, module kind, input, hx, what the message must name); torch.nn must raise for each.
CASES = [
    ("input-size", "LSTM", lambda: rand(T, B, I + 1), lambda: None, "input_size"),
    ("input-1d", "LSTM", lambda: rand(T), lambda: None, "2D or 3D"),
    ("input-4d", "GRU", lambda: rand(T, B, I, 1), lambda: None, "2D or 3D"),
    ("input-dtype", "LSTM", lambda: rand(T, B, I, dtype=torch.float64), lambda: None, "dtype"),
    ("input-int", "GRU", lambda: torch.ones(T, B, I, dtype=torch.int64), lambda: None,
     "dtype"),
    ("no-steps", "GRU", lambda: rand(0, B, I), lambda: None, "sequence length"),
    ("h0-batch", "LSTM", lambda: rand(T, B, I), lambda: lstm_hx(batch=B + 1), "hidden[0]"),
    ("h0-layers", "GRU", lambda: rand(T, B, I), lambda: rand(L + 1, B, H), "hidden size"),
    ("h0-hidden", "RNN", lambda: rand(T, B, I), lambda: rand(L, B, H + 1), "hidden size"),
    ("c0-shape", "LSTM", lambda: rand(T, B, I),
     lambda: (rand(L, B, H), rand(L, B, H - 1)), "hidden[1]"),
    ("h0-rank", "GRU", lambda: rand(T, B, I), lambda: rand(B, H), "3-D"),
    ("h0-rank-unbatched", "GRU", lambda: rand(T, I), lambda: rand(L, 1, H), "2-D"),
    ("h0-dtype", "GRU", lambda: rand(T, B, I), lambda: rand(L, B, H, dtype=torch.float64),
     "dtype"),
    ("c0-dtype", "LSTM", lambda: rand(T, B, I),
     lambda: (rand(L, B, H), rand(L, B, H, dtype=torch.float64)), "dtype"),
    ("h0-device", "GRU", lambda: rand(T, B, I), lambda: rand(L, B, H, device="meta"),
     "same device"),
    ("input-device", "LSTM", lambda: rand(T, B, I, device="meta"), lambda: None,
     "same device"),
    ("packed-increasing", "LSTM", lambda: packed([2, 2, 3]), lambda: None, "batch_sizes"),
    ("packed-sum", "GRU", lambda: packed([3, 2, 2], rows=6), lambda: None, "batch_sizes"),
    ("packed-3d", "LSTM", lambda: PackedSequence(rand(7, 1, I), torch.tensor([3, 2, 2])),
     lambda: None, "2 dimensions"),
    ("packed-h0-batch", "LSTM", lambda: packed([3, 2, 2]), lambda: lstm_hx(batch=2),
     "hidden[0]"),
    ("packed-bad-indices", "GRU",
     lambda: packed([2, 2, 1], sorted_indices=torch.tensor([0, 1, 2]),
                    unsorted_indices=torch.tensor([0, 1, 2])),
     lambda: rand(L, 2, H), "sorted_indices"),
]


def snapshot(*objs):
    """Bytes of every tensor reachable in objs (tensors, tuples, PackedSequences)."""
    out = []
    for o in objs:
        if isinstance(o, torch.Tensor):
            out.append((o.device.type, None if o.device.type == "meta" else
                        o.detach().clone().numpy().tobytes()))
        elif isinstance(o, (tuple, list)):
            out.extend(snapshot(*o))
    return out


@pytest.fixture
def backend_calls(monkeypatch):
    """Every backend run_forward the module starts, recorded (there must be none)."""
    calls = []
    real = rnnrt.nn.inputs.backend_for

    def recording(device, dtype):
        backend = real(device, dtype)

        class Recording:
            def run_forward(self, *a, **k):
                calls.append(a)
                return backend.run_forward(*a, **k)

            def run_backward(self, *a, **k):
                return backend.run_backward(*a, **k)
        return Recording()

    monkeypatch.setattr(rnnrt.nn.inputs, "backend_for", recording)
    return calls


def make(kind, seed=0):
    """(torch.nn module, rnnrt.nn module), same weights."""
    torch.manual_seed(seed)
    ref = getattr(torch.nn, kind)(I, H, num_layers=L)
    torch.manual_seed(seed)
    return ref, getattr(rnnrt.nn, kind)(I, H, num_layers=L)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_same_error_kind_as_torch_nn_and_nothing_touched(case, backend_calls):
    _, kind, make_input, make_hx, names = case
    ref, mine = make(kind)
    torch.manual_seed(1)
    inp, hx = make_input(), make_hx()
    with pytest.raises(Exception) as want:
        ref(inp, hx)
    params = list(mine.parameters())
    before = snapshot(inp, hx, params)
    with pytest.raises(Exception) as got:
        mine(inp, hx)
    assert type(got.value) is type(want.value), (
        f"rnnrt.nn raised {type(got.value).__name__}: {got.value}; torch.nn raised "
        f"{type(want.value).__name__}: {want.value}")
    assert names.lower() in str(got.value).lower(), got.value
    assert backend_calls == [], "the backend ran before the arguments were checked"
    assert snapshot(inp, hx, params) == before
    assert all(p.grad is None for p in params)


@pytest.mark.parametrize("kind, hx, error", [
    ("LSTM", lambda: rand(L, B, H), TypeError),           # torch.nn: RuntimeError (via dims)
    ("LSTM", lambda: (rand(L, B, H),), TypeError),
    ("GRU", lambda: (rand(L, B, H),), TypeError),         # torch.nn: AttributeError
    ("RNN", lambda: [rand(L, B, H), rand(L, B, H)], TypeError),
])
def test_hx_structure_is_a_type_error(kind, hx, error, backend_calls):
    _, mine = make(kind)
    with pytest.raises(error, match="hx"):
        mine(rand(T, B, I), hx())
    assert backend_calls == []


def test_packed_checks_torch_nn_does_not_make(backend_calls):
    """Where torch.nn runs on silently (or reads past an array), rnnrt.nn refuses."""
    _, mine = make("LSTM")
    with pytest.raises(RuntimeError, match="at least one sequence"):
        mine(packed([2, 2, 0]))  # a step with no sequence: a length-0 entry
    with pytest.raises(RuntimeError, match="int64 CPU tensor"):
        mine(PackedSequence(rand(5, I), torch.tensor([3.0, 2.0])))
    with pytest.raises(RuntimeError, match="permutation"):
        mine(packed([2, 2, 1], sorted_indices=torch.tensor([0, 0]),
                    unsorted_indices=torch.tensor([0, 1])))
    assert backend_calls == []


def test_parameters_of_mixed_dtypes_are_refused(backend_calls):
    _, mine = make("GRU")
    mine.weight_hh_l1 = torch.nn.Parameter(mine.weight_hh_l1.detach().double())
    with pytest.raises(RuntimeError, match="weight_hh_l1: torch.float64"):
        mine(rand(T, B, I))
    assert backend_calls == []


def test_lengths_out_of_range_and_unsorted():
    """Lengths are packed by pack_padded_sequence (the module sees batch_sizes). torch's
    refuses length 0 and unsorted lengths under enforce_sorted=True; rnnrt.nn's wrapper
    refuses those (through torch's) and, unlike torch's, a length past T."""
    x = rand(T, B, I)
    before = snapshot(x)
    for lengths, match in (([5, 3, 0], "greater than 0"), ([3, 5, 2], "sorted"),
                           ([5, 3], "batch_size")):
        with pytest.raises(RuntimeError, match=match):
            pack_padded_sequence(x, torch.tensor(lengths))
        with pytest.raises(RuntimeError):
            rnnrt.nn.pack_padded_sequence(x, torch.tensor(lengths))
    with pytest.raises(RuntimeError, match=r"\[1, 5\]"):
        rnnrt.nn.pack_padded_sequence(x, torch.tensor([6, 3, 2]))
    with pytest.raises(RuntimeError, match=r"\[1, 5\]"):
        rnnrt.nn.pack_padded_sequence(x, [2, 6, 1], enforce_sorted=False)
    assert snapshot(x) == before
    # and the happy path is torch's function's result exactly
    ours = rnnrt.nn.pack_padded_sequence(x, [2, 5, 1], enforce_sorted=False)
    theirs = pack_padded_sequence(x, [2, 5, 1], enforce_sorted=False)
    for a, b in zip(ours, theirs):
        assert torch.equal(a, b)
