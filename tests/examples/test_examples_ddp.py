"""examples/train_ddp.py and experiments/scripts/ddp_bench.py on the CPU (gloo, float64):

- the example itself, launched as torchrun launches it (RANK / WORLD_SIZE / LOCAL_RANK, a
  file:// rendezvous instead of a TCP port that another process could take) in 2 processes,
  ends a few Adam steps with the parameters and the global loss curve of the 1-process run
  on the same global batch (float64: 1e-12 / 1e-10), with no warning raised while training;
  the same launch with the all-reduce left out (--skip-allreduce, a planted fault) does not;
- the benchmark's whole path (1 process, then 2 under DDP at the same global batch and at
  twice it, the equality check after the warm-up, the link probe) writes its records;
- bad arguments are refused by name before any work.
Processes are spawned with a deadline and terminated if they overrun it: nothing can hang."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the DDP example needs torch")

from rnnrt.check import compare  # noqa: E402
from testkit import example_module, record_name_match  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ddp_bench = example_module("ddp_bench")   # the spawned workers import these by name too
train_ddp = example_module("train_ddp")
load_corpus = example_module("charlm_parts").load_corpus

DEADLINE_S = 90
ARGS = ["--device", "cpu", "--dtype", "float64", "--hidden", "12", "--layers", "2",
        "--batch", "4", "--seq", "8", "--steps", "4", "--warmup", "1", "--optim", "adam",
        "--lr", "0.02", "--val-chunks", "2", "--log-every", "0", "--text", "README.md"]


def _assert_named_by_the_scheme(path: Path):
    assert record_name_match("training", path.name), path.name


def _launch(rank, world, tmp):
    """One process of a launch: the example's main, as torchrun would start it; then the
    same launch with the planted fault (a second rendezvous)."""
    env = {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank)}
    for name, extra in (("ddp", []), ("fault", ["--skip-allreduce"])):
        train_ddp.main([*ARGS, *extra, "--init-method", f"file://{tmp}/{name}.store",
                        "--results-dir", f"{tmp}/{name}",
                        "--save-params", f"{tmp}/{name}.pt"], env=env)


@pytest.fixture
def one_thread(monkeypatch):
    """One BLAS thread per spawned process: two processes share the CI's cores."""
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(var, "1")


def test_two_processes_equal_one_and_a_missing_allreduce_is_caught(tmp_path, one_thread):
    ddp_bench.spawn_with_deadline(_launch, (2, str(tmp_path)), 2, DEADLINE_S)
    single = train_ddp.main([*ARGS, "--results-dir", str(tmp_path / "one"),
                             "--save-params", str(tmp_path / "one.pt")], env={})
    cfg = train_ddp.config_from_args(train_ddp.parse_args(ARGS))
    vocab = len(load_corpus(ROOT, cfg.text, cfg.val_frac).vocab)
    start = train_ddp.build_model(cfg, vocab, "cpu", torch.float64).state_dict()
    want = torch.load(tmp_path / "one.pt")
    got = torch.load(tmp_path / "ddp.pt")
    faulty = torch.load(tmp_path / "fault.pt")
    for name, w in want.items():
        moved = float((w - start[name]).abs().max())
        assert moved > 1e-3, f"{name}: training barely moved it ({moved}); test too weak"
        c = compare(got[name].numpy(), w.numpy(), 1e-12, 1e-10,
                    name=f"{name}: 2 processes vs 1")
        assert c.ok, str(c)
    bad = [n for n, w in want.items()
           if not compare(faulty[n].numpy(), w.numpy(), 1e-12, 1e-10).ok]
    assert len(bad) >= len(want) // 2, f"the missing all-reduce went unnoticed: {bad}"

    rec2 = json.loads(next((tmp_path / "ddp").glob("*.json")).read_text())
    assert rec2["world"] == 2 and rec2["backend"] == "gloo" and rec2["batch_per_process"] == 2
    assert rec2["warnings"] == [] and single["warnings"] == []
    assert rec2["steps_per_s"] > 0 and rec2["timed_steps"] == 3
    # the global batch's loss curve: the 1-process run's, step for step
    for a, b in zip(rec2["train_loss"], single["train_loss"], strict=True):
        assert abs(a - b) <= 1e-12 * abs(b), (rec2["train_loss"], single["train_loss"])
    assert abs(rec2["val_loss"] - single["val_loss"]) <= 1e-12
    for rec in (rec2, single):
        _assert_named_by_the_scheme(Path(rec["record"]))


def test_bench_runs_its_phases_and_writes_its_records(tmp_path, one_thread):
    status, records = ddp_bench.main([
        "--device", "cpu", "--dtype", "float64", "--shapes", "L2-H12-B4-S3", "--seq", "8",
        "--warmup", "2", "--text", "README.md", "--out", str(tmp_path),
        "--deadline", str(DEADLINE_S)])
    assert status == 0
    scaling = [r for r in records if r["kind"] == "ddp-scaling"]
    (link,) = [r for r in records if r["kind"] == "ddp-link"]
    (r,) = scaling
    assert r["processes"] == [1, 2] and len(r["steps_per_s"]) == 2
    assert r["speedup"] == pytest.approx(r["steps_per_s"][1] / r["steps_per_s"][0])
    assert r["weak"]["global_batch"] == 8 and r["throughput_speedup"] > 0
    assert r["ok"] and r["replicas_identical"] and r["check"]["after_steps"] == 2
    assert 0 <= r["max_param_rel_diff"] < 1e-12 and r["warnings"] == []
    assert r["max_train_loss_diff"] < 1e-12
    assert {row["op"] for row in link["collectives"]} == {"all_reduce", "send_recv one way"}
    for rec in records:
        path = Path(rec["record"])
        assert path.parent == tmp_path and json.loads(path.read_text())["kind"] == rec["kind"]
        _assert_named_by_the_scheme(path)


def test_compare_states_reports_a_planted_difference():
    want = {"a": torch.ones(3, 4, dtype=torch.float64), "b": torch.full((5,), 2.0,
                                                                        dtype=torch.float64)}
    got = {k: v.clone() for k, v in want.items()}
    assert ddp_bench.compare_states(got, want, "float64", "same")["ok"]
    got["b"][3] += 1e-6
    c = ddp_bench.compare_states(got, want, "float64", "planted")
    assert not c["ok"] and c["worst_tensor"] == "b"
    assert c["max_param_rel_diff"] == pytest.approx(1e-6 / 2)


@pytest.mark.parametrize("change, world, word", [
    ({"batch": 5}, 2, "--batch"), ({"device": "cuda", "dtype": "float64"}, 1, "--dtype"),
    ({"warmup": 4, "steps": 4}, 1, "--warmup"), ({"optim": "lbfgs"}, 1, "--optim"),
    ({"hidden": 0}, 1, "--hidden")])
def test_bad_configs_are_refused_by_name(change, world, word):
    with pytest.raises(ValueError, match=word):
        train_ddp.check_config(train_ddp.Config(**change), world)


def test_bad_shapes_are_refused_by_name():
    assert ddp_bench.parse_shapes("L2-H8-B4-S3, L1-H4-B2", 7) == [
        {"layers": 2, "hidden": 8, "batch": 4, "steps": 3},
        {"layers": 1, "hidden": 4, "batch": 2, "steps": 7}]
    with pytest.raises(ValueError, match="--shapes"):
        ddp_bench.parse_shapes("H8-B4", 3)
