"""experiments/scripts/long_seq_bench.py on the CPU (--small: tiny shapes in chunks of 8
steps; rnnrt.session.GpuSession replaced by testkit.CpuSession, the NumPy executor): every
run is chunked, checked against the float64 reference (all rows: the weight gradients too)
and lands in one ``long-sequence`` record named by the scheme, one row per run with the
fields the issue lists; the plan-build times are there."""
from __future__ import annotations

import json

from testkit import CpuSession, example_module, record_name_match

bench = example_module("long_seq_bench")

FIELDS = {"cell", "layers", "input_size", "hidden", "batch", "steps", "pass", "plan_s",
          "capture_s", "ms_per_step", "peak_bytes", "cudnn", "check"}


def test_the_small_runs_write_one_checked_record(monkeypatch, tmp_path):
    import rnnrt.session
    monkeypatch.setattr(rnnrt.session, "GpuSession", CpuSession)
    monkeypatch.setenv("RNNRT_AUTOTUNE", "0")
    monkeypatch.delenv("RNNRT_CHUNK_STEPS", raising=False)
    status, _, path = bench.main(["--small", "--repeats", "1", "--check-rows", "2",
                                  "--check-steps", "30", "--recompute",
                                  "--out", str(tmp_path / "ls")])
    assert status == 0
    assert path.parent == tmp_path / "ls" and record_name_match("long-sequence", path.name)
    saved = json.loads(path.read_text())
    assert saved["kind"] == "long-sequence" and saved["device"]["device"].startswith("cpu")
    # --recompute: each fwd+bwd run twice, the second keeping no gates
    twice = sum(spec[6] == "fwd+bwd" for spec in bench.SMALL_RUNS)
    assert len(saved["rows"]) == len(bench.SMALL_RUNS) + twice
    assert sum(r["recompute"] for r in saved["rows"]) == twice
    assert all(r["pass"] == "fwd+bwd" for r in saved["rows"] if r["recompute"])
    for row in saved["rows"]:
        assert FIELDS <= set(row), FIELDS - set(row)
        assert row["pieces"] > 1 and row["chunk_steps"] == 8   # every run chunked
        names = {c["name"] for c in row["check"]}
        assert all(c["ok"] for c in row["check"])
        if row["pass"] == "fwd+bwd":
            assert {"dx", "dh0", "grads"} <= names
        assert ("h_n" in names) == (row["steps"] <= 30)           # T = 37: a prefix of 30
        assert ("dx past the prefix" in names) == (row["steps"] == 37 and
                                                   row["pass"] == "fwd+bwd")
    assert [b["steps"] for b in saved["plan_build"]] == [100, 200]


def test_a_wrong_result_fails_the_run(monkeypatch, tmp_path):
    """A planted fault (the forward's state carry between chunks dropped) fails the check:
    the record is written, the status is 1."""
    import rnnrt.session
    from rnnrt.exec.workspace import Workspace
    monkeypatch.setattr(rnnrt.session, "GpuSession", CpuSession)
    monkeypatch.setenv("RNNRT_AUTOTUNE", "0")
    real = Workspace.read
    monkeypatch.setattr(Workspace, "read", lambda self, name, copy=True:
                        real(self, name, copy) * (0 if name == "c_n" else 1))
    status, rec, path = bench.main(["--small", "--repeats", "1", "--plan-steps", "20",
                                    "--out", str(tmp_path)])
    assert status == 1 and path.exists()
    assert not any(r["check_ok"] for r in rec["rows"])
