"""DDP scaling of rnnrt.nn: steps per second on 1 and 2 GPUs, the equality check, and the
link between the GPUs (for docs/pipeline.md).

Usage (a host with 2 GPUs, from the repo root; about 1.5 minutes):
    NCCL_NVLS_ENABLE=0 python experiments/scripts/ddp_bench.py --out experiments/results/training
CPU (what CI runs: gloo, float64, a few steps; the timings mean nothing there):
    python experiments/scripts/ddp_bench.py --device cpu --dtype float64 \\
        --shapes L2-H16-B4-S3 --seq 8 --warmup 2 --text README.md --out /tmp/ddp

The model is examples/train_ddp.py's (the charLM: rnnrt.nn.LSTM + a Linear head on this
repository's text). This script spawns two processes (NCCL on CUDA, gloo on the CPU; a
deadline terminates them, so it cannot hang) and, for each shape of ``--shapes``
('L<layers>-H<hidden>-B<global batch>[-S<steps>]'), runs three phases:

  1 GPU        rank 0 alone: the plain module (no DDP) on the global batch B (rank 1 waits)
  2 GPUs       both ranks under DDP, B/2 streams each: the same global batch
  2 GPUs, 2B   both ranks under DDP, B streams each: the same work per GPU

  speedup            = steps/s (2 GPUs, B) / steps/s (1 GPU, B)        (the goal: >= 1.8)
  throughput_speedup = 2 * steps/s (2 GPUs, 2B) / steps/s (1 GPU, B)   (characters/s ratio)

The equality check: after ``--warmup`` steps (before the timed ones) rank 0's parameters of
the 2-GPU run must equal the 1-GPU run's within |p2 - p1| <= atol + rtol |p1| (fp32:
check.FP32_ATOL / FP32_RTOL; float64 on the CPU: 1e-12 / 1e-10), and the two ranks'
parameters must be bitwise identical (DDP keeps the replicas equal). ``max_param_rel_diff``
is the largest max|p2 - p1| / max|p1| over the parameter tensors (also given after the last
step). SGD, not Adam: Adam's first update is lr * sign(g), so an element whose gradient is
rounding noise moves by +-lr in one run and -+lr in the other; SGD's update is linear in the
gradient and the comparison measures DDP's averaging, not that amplification.

Records (``--out``): ddp-scaling-lstm-L..-H..-B..-T..-<device>-<stamp>.json per shape
(kind 'ddp-scaling': gpus, steps_per_s, speedup, max_param_rel_diff, device, ...) and
ddp-link-<device>-<stamp>.json (kind 'ddp-link': NCCL all-reduce and send/recv times by
size, and peer-copy times between the GPUs). NCCL_NVLS_ENABLE is set to 0 for the workers
(NVLink multicast stays off). A short table is printed last; the exit status is 1 when a
check fails or a worker fails.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import gc
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for _p in (ROOT, ROOT / "examples"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import train_ddp as td  # noqa: E402
from charlm_parts import load_corpus  # noqa: E402
from rnnrt.bench.records import now_iso, versions  # noqa: E402
from rnnrt.check import FP32_ATOL, FP32_RTOL, compare_all  # noqa: E402

DEFAULT_SHAPES = "L2-H256-B32-S200,L4-H1024-B256-S25,L4-H1024-B512-S20"
"""The charLM's own shape (latency-bound: little to split), and two where the step's work
grows with the batch (the sweep's fwd+bwd: L4 H1024 B256 / B128 = 1.84x)."""
GOAL = 1.8
WORLD = 2
SHAPE = re.compile(r"L(\d+)-H(\d+)-B(\d+)(?:-S(\d+))?")


def parse_shapes(text: str, steps: int) -> list[dict]:
    """'L2-H256-B32-S200,...' -> [{layers, hidden, batch, steps}]; ValueError naming
    --shapes for anything else."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        m = SHAPE.fullmatch(part)
        if not m:
            raise ValueError(f"--shapes: expected 'L<layers>-H<hidden>-B<batch>[-S<steps>]' "
                             f"items separated by commas, got {part!r}")
        L, H, B, S = m.groups()
        out.append({"layers": int(L), "hidden": int(H), "batch": int(B),
                    "steps": int(S) if S else steps})
    if not out:
        raise ValueError("--shapes: no shape given")
    return out


def tolerances(dtype: str) -> tuple[float, float]:
    return (1e-12, 1e-10) if dtype == "float64" else (FP32_ATOL, FP32_RTOL)


def compare_states(got: dict, want: dict, dtype: str, what: str) -> dict:
    """The parameters ``got`` against ``want`` ({name: CPU tensor}): the worst element over
    all tensors (check.compare) and max_param_rel_diff (max over tensors of max|got - want|
    / max|want|)."""
    atol, rtol = tolerances(dtype)
    want = {name: w.double().numpy() for name, w in want.items()}
    got = {name: got[name].double().numpy() for name in want}
    worst = compare_all(got, want, what, atol=atol, rtol=rtol)
    rel, worst_name = 0.0, None
    for name, r in want.items():
        scale = float(abs(r).max()) or 1.0
        d = float(abs(got[name] - r).max()) / scale
        if d >= rel:
            rel, worst_name = d, name
    return {"ok": worst.ok, "max_param_rel_diff": rel, "worst_tensor": worst_name,
            "atol": atol, "rtol": rtol, "worst": {**worst.as_dict(), "text": str(worst)}}


def digest(state: dict) -> str:
    h = hashlib.sha256()
    for name in sorted(state):
        h.update(name.encode())
        h.update(state[name].contiguous().numpy().tobytes())
    return h.hexdigest()


# --------------------------------------------------------------------------- link probe

def _seconds_per_call(fn, iters: int, sync) -> float:
    for _ in range(3):
        fn()
    sync()
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - t) / iters


def link_probe(d: td.Dist, host, small: bool) -> dict:
    """NCCL (gloo) all-reduce and send/recv ping-pong by size between the two ranks, and
    rank 0's peer copy cuda:0 -> cuda:1. Per row: bytes, us per operation, GB/s (bytes /
    time; for a 2-rank all-reduce this is also NCCL's bus bandwidth)."""
    cuda = d.device.type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize(d.device)
        dist.barrier(group=host)

    sizes = [4 << 10, 128 << 10] if small else [4 << 10, 128 << 10, 4 << 20, 64 << 20]
    rows = []
    for nbytes in sizes:
        t = torch.ones(nbytes // 4, dtype=torch.float32, device=d.device)
        iters = 5 if small else (50 if nbytes <= (4 << 20) else 10)
        s = _seconds_per_call(lambda t=t: dist.all_reduce(t), iters, sync)
        rows.append({"op": "all_reduce", "bytes": nbytes, "us": s * 1e6, "GB_s": nbytes / s / 1e9})

        def ping(t=t):
            if d.rank == 0:
                dist.send(t, 1)
                dist.recv(t, 1)
            else:
                dist.recv(t, 0)
                dist.send(t, 0)

        s = _seconds_per_call(ping, iters, sync) / 2  # one way
        rows.append({"op": "send_recv one way", "bytes": nbytes, "us": s * 1e6,
                     "GB_s": nbytes / s / 1e9})
    peer = {"skipped": "CPU run"} if not cuda else None
    if cuda and d.rank == 0:
        if torch.cuda.device_count() < 2:
            peer = {"skipped": "one CUDA device visible"}
        else:
            peer = {"can_access_peer": torch.cuda.can_device_access_peer(0, 1), "rows": []}
            for nbytes in sizes:
                src = torch.ones(nbytes // 4, device="cuda:0")
                dst = torch.empty(nbytes // 4, device="cuda:1")
                s = _seconds_per_call(lambda s=src, t=dst: t.copy_(s, non_blocking=True), 50,
                                      lambda: (torch.cuda.synchronize(0),
                                               torch.cuda.synchronize(1)))
                peer["rows"].append({"bytes": nbytes, "us": s * 1e6, "GB_s": nbytes / s / 1e9})
    dist.barrier(group=host)
    return {"collectives": rows, "peer_copy": peer}


# --------------------------------------------------------------------------- the worker

def device_record(d: td.Dist) -> dict:
    """The device fields of a record: rnnrt's device_info on CUDA (plus both GPUs' names,
    NCCL's version and `nvidia-smi topo -m`), the CPU otherwise."""
    if d.device.type != "cuda":
        return {"device": "cpu", "detail": td.device_name(d)}
    import cupy as cp

    from rnnrt.session import device_info
    with cp.cuda.Device(d.device.index):
        info = device_info(cp)
    try:
        topo = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True,
                              timeout=20, check=False).stdout
    except (OSError, subprocess.SubprocessError) as e:
        topo = f"unavailable: {type(e).__name__}: {e}"
    return {**info, "gpus_visible": [torch.cuda.get_device_name(i)
                                     for i in range(torch.cuda.device_count())],
            "nccl": str(torch.cuda.nccl.version()),
            "nccl_nvls_enable": os.environ.get("NCCL_NVLS_ENABLE"), "topology": topo}


def _free(d: td.Dist) -> None:
    """Give the two allocators' cached blocks back between phases (CuPy's pool holds
    rnnrt's workspaces, torch's the rest): each phase starts from the same free memory.
    The last phase's modules first: DDP's hooks make reference cycles, and rnnrt.nn drops
    a module's runner (and its workspaces) only when its weights die."""
    gc.collect()
    if d.device.type == "cuda":
        import cupy as cp
        with cp.cuda.Device(d.device.index):
            cp.get_default_memory_pool().free_all_blocks()
        torch.cuda.empty_cache()


def schedules(cfg: td.Config, vocab: int, d: td.Dist) -> dict:
    """The schedules rnnrt's selector cache on disk holds for the phases' training shapes
    (the phases tuned them; both ranks write one file, so for a shape both tuned this is
    the last writer's choice: each rank runs its own, and steps_per_s_by_rank shows when
    they differ)."""
    if d.device.type != "cuda":
        return {}
    import cupy as cp

    import rnnrt
    from rnnrt.gpu import GpuRunner
    out = {}
    with cp.cuda.Device(d.device.index):
        r = GpuRunner(rnnrt.LSTM(vocab, cfg.hidden, cfg.layers, seed=0))
        for b in (cfg.batch, cfg.batch // WORLD):
            out[f"B{b}"] = r.schedule(cfg.seq, b, train=True).schedule.name
        r.close()
    return out


def run_shape(base: td.Config, shape: dict, d2: td.Dist, host, corpus, say,
              device: dict | None) -> dict | None:
    """The three phases of one shape on this rank; -> rank 0's record, None elsewhere."""
    cfg = dataclasses.replace(base, layers=shape["layers"], hidden=shape["hidden"],
                              batch=shape["batch"], steps=shape["steps"])
    td.check_config(cfg, WORLD)
    one = None
    if d2.rank == 0:
        one = td.train(cfg, td.Dist(0, 1, d2.device, None), corpus, snapshot_step=cfg.warmup)
        say(f"  1 GPU : {one['steps_per_s']:8.2f} steps/s")
    _free(d2)
    dist.barrier(group=host)
    two = td.train(cfg, d2, corpus, snapshot_step=cfg.warmup)
    digests = [None] * WORLD
    dist.all_gather_object(digests, digest(two["state"]), group=host)
    rates = [None] * WORLD
    dist.all_gather_object(rates, two["steps_per_s"], group=host)
    _free(d2)
    weak_cfg = dataclasses.replace(cfg, batch=2 * cfg.batch)
    weak = td.train(weak_cfg, d2, corpus)
    weak_rates = [None] * WORLD
    dist.all_gather_object(weak_rates, weak["steps_per_s"], group=host)
    _free(d2)
    if d2.rank != 0:
        return None
    say(f"  2 GPUs: {two['steps_per_s']:8.2f} steps/s (B/2 each), "
        f"{weak['steps_per_s']:.2f} (B each)")
    check = compare_states(two["snapshot"], one["snapshot"], cfg.dtype,
                           f"2 GPUs vs 1 after {cfg.warmup} steps")
    final = compare_states(two["state"], one["state"], cfg.dtype,
                           f"2 GPUs vs 1 after {cfg.steps} steps")
    s1, s2, s2w = one["steps_per_s"], two["steps_per_s"], weak["steps_per_s"]
    loss_diff = max(abs(a - b) for a, b in zip(one["train_loss"], two["train_loss"]))
    warns = one["warnings"] + two["warnings"] + weak["warnings"]
    speedup = s2 / s1
    return {
        "kind": "ddp-scaling", "created": now_iso(),
        "command": "python experiments/scripts/ddp_bench.py " + " ".join(sys.argv[1:]),
        "shape": {"cell": "lstm", "layers": cfg.layers, "hidden": cfg.hidden,
                  "input_size": one["vocab_size"], "batch": cfg.batch, "steps": cfg.seq},
        "config": {k: (list(v) if isinstance(v, tuple) else v)
                   for k, v in dataclasses.asdict(cfg).items()},
        "gpus": [1, WORLD] if d2.device.type == "cuda" else None,
        "processes": [1, WORLD],
        "steps_per_s": [s1, s2],
        "speedup": speedup,
        "goal": {"speedup": GOAL, "met": speedup >= GOAL},
        "throughput_speedup": 2 * s2w / s1,
        "weak": {"global_batch": weak_cfg.batch, "batch_per_gpu": cfg.batch,
                 "steps_per_s": s2w, "steps_per_s_by_rank": weak_rates},
        "steps_per_s_by_rank": rates,
        "timed_steps": cfg.steps - cfg.warmup, "warmup": cfg.warmup,
        "max_param_rel_diff": check["max_param_rel_diff"],
        "check": {**check, "after_steps": cfg.warmup},
        "after_last_step": {**final, "after_steps": cfg.steps},
        "max_train_loss_diff": loss_diff,
        "replicas_identical": digests[0] == digests[1],
        "warnings": warns,
        "ok": check["ok"] and digests[0] == digests[1],
        "schedules_on_disk": schedules(cfg, one["vocab_size"], d2),
        "lstm_params": one["lstm_params"],
        "device": device, "versions": versions(),
        "ddp": {"backend": d2.backend, "gradient_as_bucket_view": True,
                "bucket_cap_mb": 25, "find_unused_parameters": False},
        "loss": {"one_gpu": one["train_loss"], "two_gpus": two["train_loss"]},
    }


def _worker(rank: int, world: int, opts: dict, tmp: str) -> None:
    env = {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank)}
    os.environ.update(env)
    base = td.Config(**opts["config"])
    d2 = td.setup(base, f"file://{tmp}/store", env)
    try:
        host = dist.new_group(backend="gloo",
                              timeout=_dt.timedelta(seconds=opts["config"]["timeout_s"]))
        if d2.device.type == "cuda":  # fp32 everywhere, as the rest of rnnrt's records
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False

        def say(msg):
            if rank == 0:
                print(msg, file=sys.stderr, flush=True)

        corpus = load_corpus(ROOT, base.text, base.val_frac)
        device = device_record(d2) if rank == 0 else None
        written = []
        for shape in opts["shapes"]:
            say(f"L{shape['layers']} H{shape['hidden']} B{shape['batch']} "
                f"({shape['steps']} steps, {base.warmup} warm-up):")
            rec = run_shape(base, shape, d2, host, corpus, say, device)
            if rec is not None:
                stem = (f"ddp-scaling-lstm-L{shape['layers']}-H{shape['hidden']}-"
                        f"B{shape['batch']}-T{base.seq}")
                written.append(str(td.write_record(rec, stem, opts["out"])))
        link = None
        if opts["link"]:
            link = link_probe(d2, host, small=d2.device.type != "cuda")
        if rank == 0:
            if link is not None:
                rec = {"kind": "ddp-link", "created": now_iso(), **link,
                       "device": device, "versions": versions()}
                written.append(str(td.write_record(rec, "ddp-link", opts["out"])))
            Path(tmp, "result.json").write_text(json.dumps(written))
    finally:
        td.teardown(d2)


# --------------------------------------------------------------------------- main

def spawn_with_deadline(fn, args: tuple, nprocs: int, deadline_s: float) -> None:
    """Run fn(rank, *args) in ``nprocs`` spawned processes and wait for them; a worker's
    exception is raised here (torch's ProcessRaisedException), and TimeoutError when they
    are still running after ``deadline_s`` -- they are terminated first, so nothing hangs."""
    ctx = mp.start_processes(fn, args=args, nprocs=nprocs, join=False, start_method="spawn")
    deadline = time.monotonic() + deadline_s
    try:
        while not ctx.join(timeout=0.5):
            if time.monotonic() > deadline:
                raise TimeoutError(f"workers still running after {deadline_s:.0f} s; "
                                   f"terminated")
    finally:
        for p in ctx.processes:  # only the processes this call started
            if p.is_alive():
                p.terminate()
                p.join(5)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    p.add_argument("--shapes", default=DEFAULT_SHAPES,
                   help=f"comma-separated L<layers>-H<hidden>-B<global batch>[-S<steps>] "
                        f"(default {DEFAULT_SHAPES})")
    p.add_argument("--steps", type=int, default=25, help="steps of a shape without -S")
    p.add_argument("--warmup", type=int, default=5,
                   help="untimed first steps; the equality check is after them")
    p.add_argument("--seq", type=int, default=100)
    p.add_argument("--lr", type=float, default=1.0, help="SGD's learning rate")
    p.add_argument("--text", nargs="+", default=None, help="corpus globs (train_ddp's)")
    p.add_argument("--no-link", action="store_true", help="skip the link probe")
    p.add_argument("--deadline", type=float, default=300,
                   help="seconds before the workers are terminated")
    p.add_argument("--out", type=Path, default=ROOT / "experiments" / "results" / "training")
    return p.parse_args(argv)


def main(argv=None) -> tuple[int, list]:
    """-> (exit status, the records written)."""
    args = parse_args(argv)
    shapes = parse_shapes(args.shapes, args.steps)
    config = dict(device=args.device, dtype=args.dtype, seq=args.seq, warmup=args.warmup,
                  optim="sgd", lr=args.lr, clip=5.0, val_chunks=0, log_every=0,
                  sync_debug=True, timeout_s=int(args.deadline))
    if args.text:
        config["text"] = tuple(args.text)
    for s in shapes:  # every argument error before anything starts
        td.check_config(td.Config(**config, **s), WORLD)
    if args.device == "cuda" and torch.cuda.device_count() < WORLD:
        raise SystemExit(f"ddp_bench: needs {WORLD} CUDA devices, torch sees "
                         f"{torch.cuda.device_count()}")
    os.environ["NCCL_NVLS_ENABLE"] = "0"  # NVLink multicast off on the lent machines
    if args.device == "cpu":  # one BLAS / OpenMP thread per worker: they share the cores
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(var, "1")
    opts = {"config": config, "shapes": shapes, "out": str(args.out), "link": not args.no_link}
    with tempfile.TemporaryDirectory(prefix="ddp-bench-") as tmp:
        try:
            spawn_with_deadline(_worker, (WORLD, opts, tmp), WORLD, args.deadline)
        except TimeoutError as e:
            raise SystemExit(f"ddp_bench: {e}") from None
        paths = json.loads(Path(tmp, "result.json").read_text())
    records = [json.loads(Path(p).read_text()) for p in paths]
    status = print_table(records)
    return status, records


def print_table(records: list) -> int:
    """The short table (last on stdout; per-process on the CPU); -> 1 when a check failed."""
    status, unit = 0, "GPU" if any(r.get("gpus") for r in records) else "proc"
    print(f"{'shape':22s} {'1 ' + unit + '/s':>9s} {'2 ' + unit + '/s':>9s} {'speedup':>8s} "
          f"{'thruput':>8s} {'rel diff':>9s} check")
    for r in records:
        if r["kind"] == "ddp-link":
            for row in r["collectives"]:
                print(f"  link {row['op']:18s} {row['bytes']:>10d} B {row['us']:9.1f} us "
                      f"{row['GB_s']:7.2f} GB/s")
            for row in (r["peer_copy"] or {}).get("rows", []):
                print(f"  link {'peer copy 0->1':18s} {row['bytes']:>10d} B {row['us']:9.1f} us "
                      f"{row['GB_s']:7.2f} GB/s")
            continue
        s = r["shape"]
        status |= 0 if r["ok"] else 1
        notes = ["ok" if r["ok"] else "FAILED"]
        if not r["goal"]["met"]:
            notes.append(f"(below {GOAL}x)")
        if r["warnings"]:
            notes.append(f"WARNINGS: {len(r['warnings'])}")
        print(f"L{s['layers']}-H{s['hidden']}-B{s['batch']}-T{s['steps']:<7d} "
              f"{r['steps_per_s'][0]:9.2f} {r['steps_per_s'][1]:9.2f} {r['speedup']:7.2f}x "
              f"{r['throughput_speedup']:7.2f}x {r['max_param_rel_diff']:9.2e} "
              + " ".join(notes))
    return status


if __name__ == "__main__":
    sys.exit(main()[0])
