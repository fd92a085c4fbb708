"""`rnnrt summary` (rnnrt/bench/summary.py) on the CPU: the verdict of synthetic sweep rows
(newest row per point and pass, devices and precisions apart, refused rows, the training
step's verdict and the share of the ceiling it would need, the backward alone against
cuDNN's where both passes are one run), the command's outputs and bad inputs, and the
README's grid figures against the committed records."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from rnnrt import cli
from rnnrt.bench import summary as S
from rnnrt.bench.plots import load_rows

ROOT = Path(__file__).resolve().parents[2]
H100 = "NVIDIA H100 80GB HBM3"


def row(cell="lstm", L=4, H=512, B=64, pass_="fwd", ratio=2.0, created="2026-11-20T00:00:00",
        device=H100, dtype="float32", share=0.5, schedule="stack", **kw):
    r = {"type": "row", "rung": "auto", "executor": "graph", "cell": cell, "layers": L,
         "hidden": H, "input_size": H, "batch": B, "steps": 100, "input_batch": 10,
         "pass": pass_, "ms_median": 1.0, "tflops": 10.0, "ratio_vs_cudnn": ratio,
         "share_of_ceiling": share, "created": created, "device": device, "dtype": dtype,
         "schedule": schedule}
    r.update(kw)
    return r


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_newest_row_of_each_point_and_pass_wins_whatever_the_order_read():
    new = row(ratio=3.0, created="2026-11-28T00:00:00")
    old = row(ratio=1.5, created="2026-11-21T00:00:00")
    for rows in ([old, new], [new, old]):
        (g,) = S.summarize(rows)
        assert g.ratios("fwd") == {S.point_of(new): 3.0}


def test_devices_and_precisions_are_summarized_apart():
    rows = [row(ratio=2.0), row(ratio=4.0, device="NVIDIA H200"),
            row(ratio=8.0, dtype="bfloat16")]
    got = {(g.device, g.dtype): g.ratios("fwd") for g in S.summarize(rows)}
    assert sorted(got) == [(H100, "bfloat16"), (H100, "float32"), ("NVIDIA H200", "float32")]
    assert [list(v.values()) for _, v in sorted(got.items())] == [[8.0], [2.0], [4.0]]


def test_geometric_means_below_one_and_refused():
    rows = [row(H=128, ratio=0.5), row(H=256, ratio=2.0), row(H=512, ratio=4.0),
            row(H=1024, refused="y disagreed with the reference"),
            row(H=2048, ratio=None),                 # cuDNN not timed: no say
            row(H=128, pass_="fwd+bwd", ratio=8.0)]
    (g,) = S.summarize(rows)
    d = g.as_dict()
    assert d["passes"]["fwd"]["points"] == 3
    assert d["passes"]["fwd"]["geomean"] == pytest.approx(4 ** (1 / 3))   # (0.5 * 2 * 4)^(1/3)
    assert d["geomean_all"] == pytest.approx((0.5 * 2 * 4 * 8) ** 0.25)
    assert [b["ratio"] for b in d["passes"]["fwd"]["below_one"]] == [0.5]
    assert [p["hidden"] for p in d["passes"]["fwd"]["refused"]] == [1024]
    text = "\n".join(g.text())
    assert "below 1.0 at 1, refused at 1" in text and "lstm L4 H1024 B64 T100" in text
    assert "H2048" not in text


def test_damaged_ratios_and_shares_have_no_say():
    rows = [row(H=128, ratio="fast"), row(H=256, ratio=float("nan")), row(H=512, ratio=-1.0),
            row(H=1024, ratio=2.0)]
    (g,) = S.summarize(rows)
    assert list(g.ratios("fwd").values()) == [2.0]
    bad_share = [row(ratio=3.0), row(pass_="fwd+bwd", ratio=2.0, share="high")]
    (g,) = S.summarize(bad_share)
    (m,) = g.misses()[1]
    assert m.share_now is None and m.share_needed is None


def test_training_step_verdict_and_the_share_it_would_need():
    rows = [row(H=128, ratio=3.0), row(H=128, pass_="fwd+bwd", ratio=2.0, share=0.6,
                                         schedule="stack+pbwd"),
            row(H=256, ratio=1.5), row(H=256, pass_="fwd+bwd", ratio=1.5),   # equal: met
            row(H=512, ratio=1.2), row(H=512, pass_="fwd+bwd", ratio=1.3),
            row(H=1024, ratio=2.0)]                                          # one pass only
    (g,) = S.summarize(rows)
    n, misses = g.misses()
    assert n == 3 and len(misses) == 1
    m = misses[0]
    assert (m.point[2], m.fwd, m.fwdbwd, m.schedule) == (128, 3.0, 2.0, "stack+pbwd")
    assert m.share_needed == pytest.approx(0.6 * 3.0 / 2.0)
    d = g.as_dict()
    assert (d["both_passes"], d["fwdbwd_at_least_fwd"]) == (3, 2)
    assert "at least the forward's ratio at 2 of 3" in "\n".join(g.text())


def test_backward_per_forward_time_ours_against_cudnns():
    """The miss as time: forward 1 ms at 3x (cuDNN 3 ms), training step 3 ms at 2x (cuDNN 6
    ms): our backward 2 ms a forward ms, cuDNN's 1. Over a grid of ratios the training step
    meets the forward's ratio exactly where ours is at most cuDNN's; a missing number has none."""
    rows = [row(H=128, ratio=3.0, ms_median=1.0),
            row(H=128, pass_="fwd+bwd", ratio=2.0, ms_median=3.0)]
    (g,) = S.summarize(rows)
    (m,) = g.misses()[1]
    assert (m.bwd_per_fwd, m.cudnn_bwd_per_fwd) == pytest.approx((2.0, 1.0))
    assert m.as_dict()["cudnn_backward_per_forward"] == pytest.approx(1.0)
    assert "2.00 vs 1.00" in "\n".join(g.text())
    for r_f in (1.0, 1.5, 2.5):
        for r_fb in (0.8, 1.5, 3.0):
            for t_f, t_fb in ((1.0, 2.0), (2.0, 7.0)):
                ours, cudnn = S.backward_per_forward({"ms_median": t_f, "ratio_vs_cudnn": r_f},
                                                     {"ms_median": t_fb,
                                                      "ratio_vs_cudnn": r_fb})
                assert (r_fb >= r_f) == (ours <= cudnn + 1e-12), (r_f, r_fb, t_f, t_fb)
    assert S.backward_per_forward({"ms_median": 1.0}, {"ms_median": 2.0,
                                                        "ratio_vs_cudnn": 1.0}) == (None, None)


def test_backward_alone_against_cudnns_where_both_passes_are_one_run():
    """Backward = training step less forward, each time ours and cuDNN's (ours x ratio):
    H 128 (fwd 1 ms at 3x, step 3 ms at 2x: cuDNN's backward 3 ms, ours 2) 1.5x; H 256
    (fwd 1 ms at 1x, step 4 ms at 0.5x: 1 ms against 3) below 1.0; H 512's passes from two
    runs, and H 1024's with no session, have no say."""
    one, other = "2026-11-29T10:00:00", "2026-11-29T11:00:00"
    rows = [row(H=128, ratio=3.0, ms_median=1.0, session=one),
            row(H=128, pass_="fwd+bwd", ratio=2.0, ms_median=3.0, session=one),
            row(H=256, ratio=1.0, ms_median=1.0, session=one),
            row(H=256, pass_="fwd+bwd", ratio=0.5, ms_median=4.0, session=one),
            row(H=512, ratio=1.0, ms_median=1.0, session=one),
            row(H=512, pass_="fwd+bwd", ratio=0.5, ms_median=4.0, session=other),
            row(H=1024, ratio=1.0, ms_median=1.0),
            row(H=1024, pass_="fwd+bwd", ratio=0.5, ms_median=4.0)]
    (g,) = S.summarize(rows)
    got = {p[2]: v for p, v in g.backward_ratios().items()}
    assert got == pytest.approx({128: 1.5, 256: 1.0 / 3.0})
    d = g.as_dict()["backward_alone"]
    assert d["points"] == 2 and d["geomean"] == pytest.approx(math.sqrt(0.5))
    assert [b["point"]["hidden"] for b in d["below_one"]] == [256]
    text = "\n".join(g.text())
    assert "backward alone" in text and "2 points" in text and "below 1.0 at 1" in text
    assert S.backward_vs_cudnn({"session": one, "ms_median": 2.0, "ratio_vs_cudnn": 1.0},
                               {"session": one, "ms_median": 1.0,
                                "ratio_vs_cudnn": 1.0}) is None   # no backward time


def test_cudnn_spread_of_a_point_below_one_across_its_runs():
    """A point below 1.0 timed in several runs shows cuDNN's fastest and slowest time over
    them (ours x ratio of each run; refused rows have no say); the verdict stays the newest
    run's; a point of one run shows none."""
    runs = [row(H=1024, ratio=0.80, ms_median=0.5, created="2026-11-21T00:00:00"),
            row(H=1024, ratio=1.20, ms_median=0.5, created="2026-11-22T00:00:00"),
            row(H=1024, refused="y disagreed", ms_median=0.1, created="2026-11-23T00:00:00"),
            row(H=1024, ratio=0.90, ms_median=0.45, created="2026-11-24T00:00:00"),
            row(H=2048, ratio=0.50, ms_median=2.0)]
    (g,) = S.summarize(runs)
    assert g.ratios("fwd") == {S.point_of(runs[0]): 0.90, S.point_of(runs[-1]): 0.50}
    lo, hi, n = g.cudnn_spread(S.point_of(runs[0]), "fwd")
    assert (round(lo, 6), round(hi, 6), n) == (0.4, 0.6, 3)
    assert g.cudnn_spread(S.point_of(runs[-1]), "fwd") is None
    below = {b["point"]["hidden"]: b for b in g.as_dict()["passes"]["fwd"]["below_one"]}
    assert below[1024]["cudnn_ms"]["runs"] == 3 and "cudnn_ms" not in below[2048]
    text = "\n".join(g.text())
    assert "lstm L4 H1024 B64 T100       0.90x   (cuDNN 0.400-0.600 ms over 3 runs)" in text
    assert re.search(r"H2048 B64 T100 +0\.50x\n", text + "\n")


def test_limit_cuts_each_list_and_says_how_many_more():
    rows = [row(H=h, ratio=0.5) for h in (128, 256, 512, 1024)]
    (g,) = S.summarize(rows)
    text = g.text(limit=1)
    assert sum(ln.strip().startswith("lstm L4") for ln in text) == 1
    assert any("... and 3 more" in ln for ln in text)


def test_executor_default_and_choice():
    rows = [row(ratio=2.0), row(ratio=5.0, executor="eager")]
    assert list(S.summarize(rows)[0].ratios("fwd").values()) == [2.0]
    assert list(S.summarize(rows, "eager")[0].ratios("fwd").values()) == [5.0]


def test_cli_prints_and_writes_json(tmp_path, capsys):
    src = write(tmp_path / "sweep-wide-lstm-nvidia-h100-20261128T000000.jsonl",
                [{"type": "session", "device": {"device": H100}},
                 row(ratio=3.0), row(pass_="fwd+bwd", ratio=2.0)])
    out = tmp_path / "s.json"
    assert cli.main(["summary", str(tmp_path), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "fwd+bwd at least the forward's ratio at 0 of 1" in printed
    rec = json.loads(out.read_text())
    assert rec["schema"] == "rnnrt.summary/1" and rec["inputs"] == [str(tmp_path)]
    assert rec["groups"][0]["misses"][0]["ratio_fwd"] == 3.0
    # an existing --json is refused before any reading (exit 2), kept as it was
    before = out.read_text()
    assert cli.main(["summary", str(src), "--json", str(out)]) == 2
    assert out.read_text() == before
    assert "--overwrite" in capsys.readouterr().err
    assert cli.main(["summary", str(src), "--json", str(out), "--overwrite"]) == 0


def test_cli_bad_inputs(tmp_path, capsys):
    assert cli.main(["summary", str(tmp_path / "nope.jsonl")]) == 2
    assert "RESULTS" in capsys.readouterr().err
    empty = write(tmp_path / "e.jsonl", [row(ratio=None)])
    assert cli.main(["summary", str(empty)]) == 1
    assert "no 'auto' rows" in capsys.readouterr().err
    src = write(tmp_path / "s.jsonl", [row()])
    assert cli.main(["summary", str(src), "--device", "a100"]) == 1
    with pytest.raises(SystemExit) as e:
        cli.main(["summary", str(src), "--dtype", "float8"])
    assert e.value.code == 2


def test_the_readme_grid_figures_are_the_committed_records():
    """The README's fp32 and bf16 grid figures are what `rnnrt summary` finds in the
    committed H100 sweep records (a README figure changes with the records, or this fails)."""
    groups = {(g.device, g.dtype): g.as_dict()
              for g in S.summarize(load_rows([ROOT / "experiments/results/sweep"],
                                             note=lambda m: None))}
    fp32, bf16 = groups[(H100, "float32")], groups[(H100, "bfloat16")]
    readme = " ".join((ROOT / "README.md").read_text().split())   # lines rewrap
    gm = re.search(r"`auto` \*\*([\d.]+)x cuDNN\*\* in geometric mean", readme)
    assert gm and float(gm.group(1)) == round(fp32["geomean_all"], 2)
    met = re.search(r"at least the forward's ratio at (\d+) of (\d+) points", readme)
    assert met and (int(met.group(1)), int(met.group(2))) == (
        fp32["fwdbwd_at_least_fwd"], fp32["both_passes"])
    below = re.search(r"below it at (\d+) points", readme)
    n_below = sum(len(fp32["passes"][p]["below_one"]) for p in S.PASSES)
    assert below and int(below.group(1)) == n_below
    bf = re.search(r"\*\*([\d.]+)x\*\* cuDNN\s+bf16 over all (\d+)", readme)
    assert bf and float(bf.group(1)) == round(bf16["geomean_all"], 1)
    assert int(bf.group(2)) == bf16["rows"]
    assert not any(bf16["passes"][p]["below_one"] for p in S.PASSES)
    assert math.isclose(fp32["rows"], 200)


def test_sweep_ends_with_its_files_verdict(tmp_path, capsys):
    """`rnnrt sweep` prints the verdict of its file at the end (auto rows with a cuDNN
    ratio; a CPU sweep has none, so the rows are given ratios here and the sweep resumed)."""
    out = tmp_path / "s.jsonl"
    argv = ["sweep", "--cpu", "--hidden", "8", "--batch", "2", "--layers", "1", "--steps", "3",
            "--rungs", "auto", "--repeats", "1", "--warmup", "0", "--out", str(out)]
    assert cli.main(argv) == 0
    assert "geometric mean" not in capsys.readouterr().out      # no cuDNN on the CPU
    lines = [json.loads(ln) for ln in out.read_text().splitlines()]
    for ln in lines:
        if ln.get("type") == "row" and ln.get("rung") == "auto":
            ln["ratio_vs_cudnn"] = 1.25
    write(out, lines)
    assert cli.main(argv + ["--resume"]) == 0
    printed = capsys.readouterr().out
    assert "1 point, geometric mean 1.25x, below 1.0 at 0" in printed
