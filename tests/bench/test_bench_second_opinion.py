"""The large-size check of tf32 / 16-bit ladders (issue 24): where no float64 reference runs,
a rung held to cuDNN's same-precision output may still pass a second opinion against cuDNN
at float32 — its worst absolute error at most 2x cuDNN-at-dtype's, array by array
(check.compare_with_peer, bench/second_opinion.py). Here on the CPU: the rule itself, the
verdict a ladder row records, the ladder's rows with a planted cuDNN output, and cuDNN's
float32 run putting torch's TF32 flags back. The GPU ladder: test_bench_ladder.py."""
from __future__ import annotations

import json

import numpy as np
import pytest

from rnnrt.bench import cudnn
from rnnrt.bench import ladder as lb
from rnnrt.bench import second_opinion as so
from rnnrt.bench.dtypes import tolerance
from rnnrt.bench.timing import time_cpu
from rnnrt.check import compare_all, compare_with_peer, max_abs_errors
from rnnrt.kernels.limits import H100_SXM


def _zeros():
    return {"y": np.zeros((2, 3, 4)), "grads": np.zeros(10)}


def _judge(got, peer_out, ref=None, **kw):
    ref = _zeros() if ref is None else ref
    return compare_with_peer(got, ref, max_abs_errors(peer_out, ref, "fp32"), "fp32",
                             "cuDNN bfloat16", **kw)


def _off(where: dict) -> dict:
    """The reference (zeros) with an error planted per array: name -> (index, value)."""
    out = _zeros()
    for name, (idx, value) in where.items():
        out[name][idx] = value
    return out


def test_a_result_within_twice_the_peers_error_in_every_array_passes():
    peer = _off({"y": ((1, 2, 3), 0.25), "grads": ((4,), -0.5)})
    got = _off({"y": ((0, 0, 0), 0.5), "grads": ((9,), 0.125)})      # 2x (the limit), 0.25x
    c = _judge(got, peer)
    assert c.ok and all(a["ok"] for a in c.arrays.values())
    assert c.arrays["y"]["ratio"] == 2.0 and c.arrays["grads"]["ratio"] == 0.25
    assert c.arrays["y"]["worst_index"] == [0, 0, 0] and c.arrays["grads"]["worst_index"] == [9]
    json.dumps(c.as_dict(), allow_nan=False)                          # a record's JSON


def test_one_array_worse_than_twice_the_peers_refuses_and_names_its_worst_element():
    peer = _off({"y": ((1, 2, 3), 0.25), "grads": ((4,), 0.1)})
    got = _off({"y": ((0, 0, 0), 0.25), "grads": ((6,), -0.3)})       # grads 3x cuDNN's
    c = _judge(got, peer)
    assert not c.ok and c.arrays["y"]["ok"] and not c.arrays["grads"]["ok"]
    g = c.arrays["grads"]
    assert (g["worst_index"], g["worst_actual"], g["worst_ref"]) == ([6], -0.3, 0.0)
    assert g["max_abs_err"] == pytest.approx(0.3) and g["peer_max_abs_err"] == 0.1
    assert "MISMATCH" in str(c) and "grads 0.3 vs 0.1 WORSE (worst at (6,)" in str(c)
    assert "y 0.25 vs 0.25," in str(c)                                # y is not called worse
    # just past the limit is refused too
    assert not _judge(_off({"y": ((0, 0, 0), 0.5000001)}), _off({"y": ((0, 0, 0), 0.25)})).ok


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_or_inf_in_the_result_never_passes(bad):
    peer = _off({"y": ((0, 0, 0), 1e30), "grads": ((0,), 1e30)})     # a huge yardstick
    got = _off({"grads": ((3,), bad)})
    c = _judge(got, peer)
    assert not c.ok and not c.arrays["grads"]["ok"] and c.arrays["grads"]["worst_index"] == [3]
    # not even where the reference (and the peer) has the same NaN: compare() calls that
    # no error, and the peer's other error is finite
    ref = _off({"grads": ((3,), np.nan)})
    peer = _off({"y": ((0, 0, 0), 1e30), "grads": ((3,), np.nan)})
    peer["grads"][0] = 1e30
    assert np.isfinite(max_abs_errors(peer, ref)["grads"].max_abs_err)
    assert not _judge(_off({"grads": ((3,), np.nan)}), peer, ref=ref).ok


def test_a_peer_whose_error_is_not_finite_is_no_yardstick():
    c = _judge(_zeros(), _off({"y": ((0, 1, 2), np.nan)}))
    assert not c.ok and not c.arrays["y"]["ok"] and c.arrays["grads"]["ok"]


def test_a_peer_without_error_takes_only_an_exact_result():
    c = _judge(_zeros(), _zeros())
    assert c.ok and c.arrays["y"]["ratio"] is None                    # 0 / 0: no ratio
    assert not _judge(_off({"y": ((0, 0, 0), 1e-12)}), _zeros()).ok


def test_bad_arguments_name_themselves():
    for ratio in (0, -1.0, float("nan"), float("inf"), True, "2"):
        with pytest.raises(ValueError, match="ratio: expected a finite number > 0"):
            _judge(_zeros(), _zeros(), ratio=ratio)
    ref = _zeros()
    with pytest.raises(ValueError, match="peer: no error for 'grads'"):
        compare_with_peer(_zeros(), ref, max_abs_errors(_zeros(), {"y": ref["y"]}), "a", "b")
    with pytest.raises(ValueError, match="got: no array 'grads'"):
        max_abs_errors({"y": ref["y"]}, ref)


# --------------------------------------------------------------------------------------------
# The verdict a row records

def _first(got, peer_out):
    return compare_all(got, peer_out, "cuDNN output", **tolerance("bfloat16"))


def test_the_verdict_records_both_checks_and_which_accepted():
    exact, peer = _zeros(), _off({"grads": ((2,), 0.5)})              # cuDNN bf16 is off
    second = so.SecondOpinion(exact, peer, "bfloat16")
    same = _off({"grads": ((2,), 0.49)})                               # agrees with cuDNN
    v = so.verdict(_first(same, peer), same, second)
    assert v.ok and v.accepted_by == so.SAME_PRECISION and v.check["same_precision_ok"]
    assert v.check["second_opinion"]["ok"] is True                    # 0.49 <= 2 x 0.5
    v = so.verdict(_first(exact, peer), exact, second)                 # right, cuDNN wrong
    assert v.ok and v.accepted_by == so.SECOND_OPINION and v.check["ok"]
    assert not v.check["same_precision_ok"] and v.check["against"].startswith("grads vs")
    assert v.check["second_opinion"]["peer"] == "cuDNN bfloat16"
    wrong = _off({"y": ((1, 1, 1), 0.3)})                              # y: cuDNN's is exact
    v = so.verdict(_first(wrong, peer), wrong, second)
    assert not v.ok and v.accepted_by is None and not v.check["ok"]
    assert v.reason.startswith("grads vs cuDNN output: MISMATCH")     # both reasons
    assert "second opinion vs cuDNN float32 (TF32 off): MISMATCH" in v.reason
    assert "y 0.3 vs 0 WORSE (worst at (1, 1, 1)" in v.reason
    json.dumps(v.check)


def test_without_a_second_opinion_the_verdict_is_the_check_as_before():
    peer = _off({"grads": ((2,), 0.5)})
    c = _first(_zeros(), peer)
    v = so.verdict(c, _zeros(), None)
    assert (v.ok, v.check, v.reason, v.accepted_by) == (False, c.as_dict(), str(c), None)


def test_the_second_opinion_is_asked_only_off_float32(monkeypatch):
    asked = []

    def fp32(cfg, model, x, h0, c0, dy):
        asked.append(cfg.dtype)
        return {"y": np.ones(3)}

    monkeypatch.setattr(cudnn, "float32_outputs", fp32)
    say = []
    for dtype in ("float32", "tf32", "bfloat16", "float16"):
        cfg = lb.LadderConfig(dtype=dtype, layers=1, hidden=4, batch=1, steps=1)
        s = so.second_opinion(cfg, {"y": np.full(3, 1.5)}, None, (1, 2, 3, 4), say.append)
        assert (s is None) == (dtype == "float32")
        if s is not None:
            assert s.peer_name == f"cuDNN {dtype}"
            assert s.peer_record()["arrays"] == {"y": {"max_abs_err": 0.5, "worst_index": [0]}}
    assert asked == ["tf32", "bfloat16", "float16"] and len(say) == 3


def test_cudnns_float32_run_is_freed_and_puts_the_tf32_flags_back(monkeypatch):
    """A tf32 ladder's own cuDNN runs on TF32 flags that building a float32 module turns
    off (torch_module): they must come back, and the module must go, even on an error."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", True)
    made = []

    class FakeBench:
        def __init__(self, cfg, model, x, h0, c0, dy, dtype=None):
            self.dtype, self.closed = dtype, False
            made.append(self)
            torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False

        def outputs(self):
            if fail:
                raise RuntimeError("CUDA out of memory (planted)")
            return {"y": np.zeros(2)}

        def close(self):
            self.closed = True

    monkeypatch.setattr(cudnn, "CudnnBench", FakeBench)
    cfg = lb.LadderConfig(dtype="tf32", layers=1, hidden=4, batch=1, steps=1)
    for fail in (False, True):
        if fail:
            with pytest.raises(RuntimeError, match="planted"):
                cudnn.float32_outputs(cfg, None, 1, 2, 3, 4)
        else:
            assert list(cudnn.float32_outputs(cfg, None, 1, 2, 3, 4)) == ["y"]
        assert made[-1].dtype == "float32" and made[-1].closed
        assert torch.backends.cudnn.allow_tf32 and torch.backends.cuda.matmul.allow_tf32


# --------------------------------------------------------------------------------------------
# The ladder's rows (its GPU path's checking, on the NumPy executor)

def _ladder_rows(peer_of, second_of, rungs=("naive", "+fused")):
    """The rows of a tiny bfloat16 fwd+bwd ladder held to a planted 'cuDNN bf16 output'
    (``peer_of(exact)``), with the second opinion ``second_of(exact, peer)`` (or None); exact:
    the rounding-aware float64 reference, which the NumPy executor matches to ~1e-9."""
    cfg = lb.LadderConfig(cell="lstm", layers=2, hidden=8, batch=3, steps=4, repeats=1,
                          warmup=0, cpu=True, backward=True, dtype="bfloat16", rungs=rungs)
    model, inputs = lb.model_for(cfg, np.float32), lb.inputs_for(cfg, np.float32)
    exact = lb._reference(cfg, model, *inputs)
    peer = peer_of(exact)
    said = []
    rows = lb._ladder_rows(cfg, ("numpy",), lambda e, plan, ws: lb.NumpyExecutor(plan, ws), np,
                           model.flat, inputs, peer, "cuDNN output (planted)", 1.0, 1.0,
                           lambda rr: time_cpu(rr.run, 1, 0), lambda rr: None, said.append,
                           H100_SXM, second=second_of(exact, peer))
    return {r["rung"]: r for r in rows}, said


def _plus(arrays: dict, name: str, idx, value) -> dict:
    out = {k: v.copy() for k, v in arrays.items()}
    out[name][idx] += value
    return out


def _cudnn_off_everywhere(exact):
    """cuDNN bf16 0.5 off in one element of every array: outside the bf16 tolerance."""
    out = exact
    for name in ("y", "dx", "grads"):
        out = _plus(out, name, (0,) * exact[name].ndim, 0.5)
    return out


def test_a_rung_the_same_precision_check_refuses_is_accepted_by_the_second_opinion():
    by, said = _ladder_rows(_cudnn_off_everywhere,
                            lambda exact, peer: so.SecondOpinion(exact, peer, "bfloat16"))
    naive = by["naive"]
    assert "ms_median" in naive and "refused" not in naive
    c = naive["check"]
    assert c["ok"] and not c["same_precision_ok"] and c["accepted_by"] == so.SECOND_OPINION
    assert set(c["second_opinion"]["arrays"]) == {"y", "dx", "grads"}
    assert all(a["ratio"] < 1e-3 for a in c["second_opinion"]["arrays"].values())
    assert any("accepted by the float32 second opinion" in m for m in said)
    # the next rung is held to the naive rung's output, not to cuDNN: no second opinion
    assert "second_opinion" not in by["+fused"]["check"] and by["+fused"]["check"]["ok"]


def test_a_rung_both_checks_refuse_stays_refused_with_both_reasons():
    def cudnn_and_fp32(exact):   # cuDNN bf16 exact in y, off in grads
        return _plus(exact, "grads", (5,), 0.5)

    def fp32_off_in_y(exact, peer):   # fp32 cuDNN agrees with cuDNN bf16 in y ...
        ref = _plus(exact, "y", (1, 2, 3), 0.3)   # ... and both are 0.3 off ours there
        return so.SecondOpinion(ref, _plus(peer, "y", (1, 2, 3), 0.3), "bfloat16")

    by, said = _ladder_rows(cudnn_and_fp32, fp32_off_in_y, rungs=("naive",))
    naive = by["naive"]
    assert "ms_median" not in naive and not naive["check"]["ok"]
    assert naive["check"]["accepted_by"] is None
    y = naive["check"]["second_opinion"]["arrays"]["y"]
    assert not y["ok"] and y["worst_index"] == [1, 2, 3] and y["peer_max_abs_err"] == 0.0
    assert naive["refused"].startswith("grads vs cuDNN output (planted): MISMATCH")
    assert "second opinion vs cuDNN float32 (TF32 off): MISMATCH" in naive["refused"]
    assert any("REFUSED" in m and "second opinion" in m for m in said)


def test_without_a_second_opinion_the_ladder_refuses_as_before():
    by, _ = _ladder_rows(_cudnn_off_everywhere, lambda exact, peer: None, rungs=("naive",))
    assert "refused" in by["naive"] and "second opinion" not in by["naive"]["refused"]
    assert "second_opinion" not in by["naive"]["check"]
