"""The CLI of `rnnrt sweep | plot | trace` on the CPU (rnnrt/cli.py): a sweep resumed, plotted
and traced through the command line, the flags it refuses, the messages without a GPU."""
from __future__ import annotations

from pathlib import Path

import pytest

from rnnrt import cli
from rnnrt.device import gpu_available


def test_cli_cpu_sweep_resume_plot_and_trace(tmp_path, capsys):
    out = tmp_path / "s.jsonl"
    argv = ["sweep", "--cpu", "--hidden", "6,8", "--batch", "2", "--layers", "1,2",
            "--steps", "3", "--repeats", "1", "--warmup", "0", "--out", str(out)]
    assert cli.main(argv) == 0
    assert "4 points done" in capsys.readouterr().out
    assert cli.main(argv) == 2                                   # exists: needs --resume
    assert "--resume" in capsys.readouterr().err
    assert cli.main(argv + ["--resume"]) == 0
    assert "4 were already there" in capsys.readouterr().out
    assert cli.main(argv + ["--dry-run"]) == 0
    assert "4 points, 4 done" in capsys.readouterr().out
    figs = tmp_path / "figs"
    assert cli.main(["plot", str(out), "--out-dir", str(figs), "--layers", "2"]) == 0
    printed = capsys.readouterr().out.split()
    assert len(printed) == 6 and all(Path(p).exists() for p in printed)
    assert cli.main(["trace", "--cpu", "--layers", "2", "--hidden", "8", "--batch", "2",
                     "--steps", "4", "--out", str(tmp_path / "t.json"), "--fig-dir",
                     str(figs)]) == 0
    o = capsys.readouterr().out
    assert "+wavefront" in o and (tmp_path / "t.json").exists()
    assert len(list(figs.glob("trace-*.png"))) == 1 and len(list(figs.glob("trace-*.svg"))) == 1
    assert cli.main(["trace", "--cpu", "--layers", "2", "--hidden", "8", "--batch", "2",
                     "--steps", "4", "--rungs", "+pretranspose, +fused", "--out",
                     str(tmp_path / "t2.json"), "--fig-dir", str(figs), "--overwrite"]) == 0
    o = capsys.readouterr().out
    assert [ln.split()[0] for ln in o.splitlines()[:2]] == ["+fused", "+pretranspose"]
    assert cli.main(["trace", "--cpu", "--rungs", "+fused,+fast"]) == 2
    assert "'+fast'" in capsys.readouterr().err


def test_cli_rejects_bad_flags(tmp_path, capsys):
    for argv in (["sweep", "--hidden", "0"], ["sweep", "--hidden", "a,b"],
                 ["sweep", "--batch", ","], ["sweep", "--cell", "lstm,xlstm"],
                 ["sweep", "--input-batch", "0"], ["sweep", "--time-budget", "0"],
                 ["sweep", "--time-budget", "soon"], ["sweep", "--executor", "fast"],
                 ["sweep", "--resume", "--overwrite"], ["plot"],
                 ["plot", "x.jsonl", "--layers", "0"], ["trace", "--steps", "0"],
                 ["trace", "--cell", "xlstm"]):
        with pytest.raises(SystemExit):
            cli.main(argv)
    for flag in ("--retry-errors", "--retry-refused"):
        assert cli.main(["sweep", "--cpu", flag, "--out", str(tmp_path / "a.jsonl")]) == 2
        assert f"{flag} goes with --resume" in capsys.readouterr().err
    assert cli.main(["plot", str(tmp_path / "missing.jsonl")]) == 2
    assert "no such file" in capsys.readouterr().err


@pytest.mark.skipif(gpu_available(), reason="checks the message shown without a GPU")
def test_sweep_and_trace_without_gpu_say_how(tmp_path, capsys):
    for cmd in ("sweep", "trace"):
        extra = ["--out", str(tmp_path / f"{cmd}.out")]
        assert cli.main([cmd] + extra) == 2
        err = capsys.readouterr().err
        assert f"rnnrt {cmd} --cpu" in err and "pip install -e '.[cuda12]'" in err
