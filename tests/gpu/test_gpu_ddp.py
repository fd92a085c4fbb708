"""examples/train_ddp.py on CUDA (marker gpu; skipped without a GPU):

- one process on one GPU (rnnrt.nn's CUDA path in a training loop, the data built on the
  device): a few SGD steps end where the same run on the CPU in float64 ends (fp32
  tolerance), no torch operation in the timed steps synchronises with the host
  (torch.cuda.set_sync_debug_mode), and no warning is raised;
- with two GPUs, two NCCL processes (the example's own main, launched as torchrun would)
  end where one GPU on the same global batch ends (fp32 tolerance); skipped with one GPU.
experiments/scripts/ddp_bench.py measures the same at larger shapes and times it.

Run on the device: pytest -m gpu tests/gpu/test_gpu_ddp.py
"""
from __future__ import annotations

import pytest

from rnnrt.device import gpu_available

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU with CuPy")]

torch = pytest.importorskip("torch")

from rnnrt.check import FP32_ATOL, FP32_RTOL  # noqa: E402
from testkit import example_module  # noqa: E402

ddp_bench = example_module("ddp_bench")   # the spawned workers import these by name too
train_ddp = example_module("train_ddp")

SMALL = dict(hidden=64, layers=2, batch=8, seq=16, steps=6, warmup=2, optim="sgd", lr=1.0,
             clip=5.0, val_chunks=0, log_every=0, shuffle=False, text=("README.md",))


def _argv(cfg: dict) -> list:
    """train_ddp's command line for the Config fields ``cfg`` (its flags: --no-shuffle for
    shuffle=False, --text taking several globs)."""
    argv = []
    for name, value in cfg.items():
        if name == "shuffle":
            argv += [] if value else ["--no-shuffle"]
        elif name == "text":
            argv += ["--text", *value]
        else:
            argv += ["--" + name.replace("_", "-"), str(value)]
    return argv


ARGS = _argv(SMALL)   # the same run on the command line


def _assert_states_close(got: dict, want: dict, what: str):
    c = ddp_bench.compare_states(got, want, "float32", what)   # fp32 tolerances
    assert c["ok"], c["worst"]["text"]


def test_one_gpu_matches_the_cpu_float64_run_without_host_syncs():
    gpu_cfg = train_ddp.Config(device="cuda", dtype="float32", sync_debug=True, **SMALL)
    cpu_cfg = train_ddp.Config(device="cpu", dtype="float64", **SMALL)
    cuda = torch.device("cuda", torch.cuda.current_device())
    got = train_ddp.train(gpu_cfg, train_ddp.Dist(0, 1, cuda, None))
    want = train_ddp.train(cpu_cfg, train_ddp.Dist(0, 1, torch.device("cpu"), None))
    assert got["warnings"] == [], got["warnings"]  # sync-debug warnings would be here
    start = train_ddp.build_model(cpu_cfg, got["vocab_size"], "cpu", torch.float64)
    for name, w in want["state"].items():  # the comparison is not of untouched weights
        assert float((w - start.state_dict()[name]).abs().max()) > 1e-3, name
    _assert_states_close(got["state"], want["state"], "1 GPU (fp32) vs CPU (float64)")
    for a, b in zip(got["train_loss"], want["train_loss"], strict=True):
        assert abs(a - b) <= FP32_ATOL + FP32_RTOL * abs(b), (got["train_loss"],
                                                               want["train_loss"])


def _launch(rank, world, tmp):
    env = {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank)}
    train_ddp.main([*ARGS, "--device", "cuda", "--init-method", f"file://{tmp}/store",
                    "--results-dir", f"{tmp}/two", "--save-params", f"{tmp}/two.pt"], env=env)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_two_gpus_nccl_equal_one_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off on the lent machines
    ddp_bench.spawn_with_deadline(_launch, (2, str(tmp_path)), 2, 180)
    one = train_ddp.main([*ARGS, "--device", "cuda", "--results-dir", str(tmp_path / "one"),
                          "--save-params", str(tmp_path / "one.pt")], env={})
    assert one["warnings"] == []
    _assert_states_close(torch.load(tmp_path / "two.pt"), torch.load(tmp_path / "one.pt"),
                         "2 GPUs (NCCL) vs 1")
