"""`rnnrt ladder --dtype` / `rnnrt sweep --dtype` on the CPU (issue 23): the flag's checks,
the record's dtype, names and tables per precision, the ceilings per precision, and (with
the plans' dtype merged) a 16-bit ladder whose persistent rung declines and says why."""
from __future__ import annotations

import json

import pytest
from testkit import record_name_match

from rnnrt import cli
from rnnrt.bench import ceilings, dtypes
from rnnrt.bench import ladder as lad
from rnnrt.bench import ladder_report
from rnnrt.bench import sweep as sw
from rnnrt.precision import DTYPES

TINY = ["--cpu", "--layers", "2", "--hidden", "8", "--batch", "2", "--steps", "3",
        "--repeats", "1", "--warmup", "0"]


@pytest.mark.parametrize("cmd", ["ladder", "sweep"])
def test_a_bad_dtype_is_one_line_naming_the_allowed_ones(cmd, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main([cmd, "--cpu", "--dtype", "fp8"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--dtype" in err and "'fp8'" in err
    assert all(d in err for d in DTYPES)


def test_configs_refuse_a_bad_dtype_naming_the_field():
    with pytest.raises(ValueError, match=r"LadderConfig\.dtype: expected one of"):
        lad.LadderConfig(dtype="bf16")
    with pytest.raises(ValueError, match=r"SweepConfig\.dtype: expected one of"):
        sw.SweepConfig(dtype="half")


def test_float32_ladder_record_names_its_dtype_and_keeps_its_name(tmp_path, capsys):
    out = tmp_path / "l.json"
    assert cli.main(["ladder", *TINY, "--rungs", "naive,+fused", "--out", str(out)]) == 0
    rec = json.loads(out.read_text())
    assert rec["dtype"] == "float32" and rec["config"]["dtype"] == "float32"
    assert {r["dtype"] for r in rec["rows"]} == {"float32"}
    table = capsys.readouterr().out
    assert "steps, fp32; input batching" in table           # the float32 table as before
    name = ladder_report.default_path(rec).name
    assert name.startswith("ladder-lstm-L2-H8-B2-T3-fwd-cpu-")
    assert record_name_match("ladder", name)


def test_names_and_tables_say_a_non_float32_precision():
    rec = {"config": {"cell": "lstm", "layers": 4, "hidden": 512, "batch": 64, "steps": 100,
                      "input_size": 512, "input_batch": 10, "repeats": 20},
           "pass": "fwd+bwd", "dtype": "bfloat16", "created": "2026-11-25T09:00:00+00:00",
           "device": {"device": "NVIDIA H100 80GB HBM3"},
           "ceiling": {"what": "bfloat16 GEMM", "tflops": 700.0},
           "cudnn": {"rung": "cudnn", "ms_median": 9.9, "tflops": 30.0,
                     "share_of_ceiling": 30 / 700, "ms_median_per_timing": [9.8, 10.0],
                     "dtype": "bfloat16"},
           "rows": [{"rung": "+persistent", "executor": "graph", "ms_median": 3.0,
                     "tflops": 100.0, "speedup_vs_naive": None, "ratio_vs_cudnn": 3.3,
                     "share_of_ceiling": 0.14, "dtype": "bfloat16",
                     "fallback": "the persistent kernels take fp32 storage only"}]}
    name = ladder_report.default_path(rec).name
    assert name.startswith("ladder-lstm-L4-H512-B64-T100-fwdbwd-bfloat16-nvidia-h100-80gb-hbm3-")
    assert record_name_match("ladder", name)
    table = ladder_report.markdown_table(rec)
    assert "bfloat16 storage, fp32 accumulation" in table
    assert "cuDNN (torch.nn, module and inputs bfloat16)" in table
    assert "+persistent (beyond the paper) (fell back)" in table
    assert "fp32 storage only" in table
    for d in DTYPES:   # every precision has its words; float32's name adds nothing
        assert d in dtypes.PRECISION_WORDS and d in dtypes.CUDNN_MODE
        assert (dtypes.dtype_suffix(d) == "") == (d == "float32")


def test_sweep_file_names_points_and_rows_carry_the_dtype():
    cfg = sw.SweepConfig(hidden=(8,), batch=(2,), layers=(1,), dtype="float16", cpu=True)
    assert sw.default_stem(cfg) == "sweep-float16-lstm"
    assert sw.default_stem(sw.SweepConfig(cpu=True)) == "sweep-lstm"          # as before
    assert record_name_match("sweep", sw.default_path(cfg, "NVIDIA H100 80GB HBM3").name)
    (p,) = sw.grid(cfg)
    assert p.dtype == "float16" and p.ladder_config(cfg).dtype == "float16"
    assert p.key()[-1] == "float16" and "float16" in p.label()
    # a point of another precision in the same file is not taken as done
    line = {"type": "row", **p.as_dict()}
    assert sw.key_of(line) == p.key()
    assert sw.key_of({**line, "dtype": "float32"}) != p.key()
    old = {k: v for k, v in line.items() if k != "dtype"}    # lines written before issue 23
    assert sw.key_of(old)[-1] == "float32"


def test_cpu_sweep_rows_say_float32_and_plots_leave_other_precisions_out(tmp_path):
    from rnnrt.bench.plots import load_rows, plot_all
    out = tmp_path / "s.jsonl"
    assert cli.main(["sweep", "--cpu", "--hidden", "6,8", "--batch", "2", "--layers", "1",
                     "--steps", "3", "--repeats", "1", "--warmup", "0", "--rungs", "naive",
                     "--out", str(out)]) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert {r["dtype"] for r in rows if r["type"] == "row"} == {"float32"}
    rows = load_rows([out])
    notes = []
    alone = plot_all(rows, tmp_path / "a", layers=1, note=notes.append)
    assert alone and not any("other precisions" in n for n in notes)
    # the same points at another precision (twice as fast) are not drawn beside them
    other = [{**r, "dtype": "bfloat16", "ms_median": r["ms_median"] / 2} for r in rows]
    mixed = plot_all(rows + other, tmp_path / "b", layers=1, note=notes.append)
    assert [p.name for p in mixed] == [p.name for p in alone]
    assert any("other precisions" in n for n in notes)
    assert all((tmp_path / "a" / p.name).read_bytes() == p.read_bytes()
               for p in mixed if p.suffix == ".png")


def test_ceilings_per_precision(monkeypatch):
    assert ceilings.datasheet_tflops("NVIDIA H100 80GB HBM3", "bfloat16") == 989.4
    assert ceilings.datasheet_tflops("NVIDIA H100 80GB HBM3", "tf32") == 494.7
    assert ceilings.datasheet_tflops("NVIDIA A100-SXM4-80GB", "float16") is None
    c = ceilings.with_datasheet({"tflops": 600.0}, "NVIDIA H100 80GB HBM3", "float16")
    assert c["datasheet_tflops"] == 989.4 and "datasheet" in c["datasheet_source"]
    with pytest.raises(ValueError, match="dtype"):
        ceilings.torch_gemm_ceiling(None, "float32")
    # a session measures each precision's ceiling once; float32's is the SGEMM's
    calls = []
    monkeypatch.setattr(ceilings, "torch_gemm_ceiling",
                        lambda torch, d: calls.append(d) or {"what": d, "tflops": 500.0})
    s = object.__new__(lad.BenchSession)
    s._info, s.progress = {"device": "NVIDIA H100 80GB HBM3"}, lambda m: None
    s.ceiling = {"what": "fp32 SGEMM", "tflops": 51.6}
    s._ceilings = {"float32": s.ceiling}
    assert s.ceiling_for("float32") is s.ceiling
    assert s.ceiling_for("bfloat16")["tflops"] == 500.0
    assert s.ceiling_for("bfloat16")["datasheet_tflops"] == 989.4
    assert calls == ["bfloat16"]


@pytest.mark.parametrize("dtype", ["tf32", "bfloat16", "float16"])
def test_cpu_ladder_at_a_precision_checks_every_rung_and_says_what_declined(dtype, tmp_path):
    out = tmp_path / "l.json"
    assert cli.main(["ladder", *TINY, "--dtype", dtype, "--backward", "--out", str(out)]) == 0
    rec = json.loads(out.read_text())
    assert rec["dtype"] == dtype and ladder_report.default_path(rec).name.find(f"-{dtype}-") > 0
    rows = [r for r in rec["rows"] if r["rung"] != "cudnn"]
    assert rows and all("refused" not in r and r["check"]["ok"] for r in rows)
    assert {r["dtype"] for r in rows} == {dtype}
    assert "rounding" in rows[0]["check"]["against"] or dtype == "tf32"
    pers = next(r for r in rows if r["rung"] == "+persistent")
    assert not pers.get("fallback"), pers.get("fallback")   # typed kernels ran (issue 24)
