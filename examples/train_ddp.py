"""Train the character LSTM of examples/train_charlm.py -- rnnrt.nn.LSTM, a torch.nn.Linear
head, torch.optim -- under torch DistributedDataParallel: NCCL on CUDA, gloo on the CPU.

    NCCL_NVLS_ENABLE=0 torchrun --nproc_per_node 2 examples/train_ddp.py --device cuda
    torchrun --nproc_per_node 2 examples/train_ddp.py --device cpu --tiny      # gloo
    python examples/train_ddp.py --device cuda          # one process: the 1-GPU baseline

Data parallelism over streams. As in train_charlm, the text is cut into ``--batch`` (the
GLOBAL batch) contiguous streams and trained by truncated backprop through time, chunk k of
every stream at step k, each chunk starting from the previous chunk's final state. A
``DistributedSampler`` over the stream indices gives each of the W processes batch/W of them
(reshuffled each pass over the text, ``set_epoch``); a process keeps the LSTM state of its
own streams. Its loss is the mean cross-entropy over its T x batch/W characters, and DDP
averages the gradients over the W equal shares: the mean over the whole global batch. So a
W-process run computes the 1-process run on the same global batch, up to rounding -- the CI
test (tests/examples/test_examples_ddp.py, gloo, float64) and the scaling benchmark
(experiments/scripts/ddp_bench.py, NCCL) check exactly that.

The step: one-hot input built on the device from the id streams (nothing is copied from the
host after the start), forward, cross-entropy, backward (DDP all-reduces the gradients in its
buckets), clipping by global norm, the optimiser step. No host synchronisation beyond DDP's
own: the loss is read (``.item()``) only every ``--log-every`` steps and, for the record,
once at the end. Timing: steps per second over the steps after ``--warmup`` (the first ones
tune rnnrt's schedules and capture its CUDA graphs), between two synchronised points.

Launcher: torchrun's RANK / WORLD_SIZE / LOCAL_RANK (absent: one process, no DDP);
``--init-method`` (default env://, torchrun's MASTER_ADDR / MASTER_PORT) may be a file://
rendezvous instead. NCCL_NVLS_ENABLE defaults to 0 here (NVLink multicast off) unless the
environment sets it. Rank 0 prints steps/s and writes a JSON record to ``--results-dir``
(experiments/results/training/ddp-charlm-...); ``--save-params`` saves its final parameters.
Warnings raised while training (torch.nn's cuDNN LSTM would warn about weight re-compaction
under DDP; rnnrt.nn must not) are printed and kept in the record.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as _dt
import math
import os
import platform
import sys
import time
import types
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT, Path(__file__).resolve().parent):  # a checkout without installing; charlm_parts
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import rnnrt  # noqa: E402
import rnnrt.nn  # noqa: E402
from rnnrt.bench.records import now_iso, record_path, versions, write_json  # noqa: E402
from charlm_parts import (  # noqa: E402
    add_config_flags, chunk, config_kwargs, load_corpus, stream_matrix)
from train_charlm import DEFAULT_TEXT  # noqa: E402
from train_charlm import Config as CharlmConfig  # noqa: E402
from train_charlm import start_values  # noqa: E402

CHARLM = CharlmConfig()
"""train_charlm's defaults: this run's model, data and optimiser defaults are the same."""
TORCH_XP = types.SimpleNamespace(ascontiguousarray=lambda t: t.contiguous())
"""charlm_parts.chunk's array module for torch tensors (the one function it needs)."""


@dataclass(frozen=True)
class Config:
    """One run. Defaults: train_charlm's (its README run: 2 x 256, batch 32, T 100, Adam).

    device:      'cpu' (gloo; float32 or float64) or 'cuda' (NCCL; float32)
    batch:       the GLOBAL batch: streams over all processes (a multiple of the world size)
    steps:       optimiser steps; warmup: the first of them, left out of steps/s
    optim:       'adam' or 'sgd' (plain; wants lr ~1); clip: max global norm (0: none)
    val_chunks:  rank 0's validation chunks after training (0: none)
    log_every:   print the loss every this many steps (a host sync; 0: never)
    shuffle:     the sampler reshuffles the streams each pass (set_epoch)
    skip_allreduce: train every process on its own shard WITHOUT DDP's all-reduce
                 (``no_sync``): a planted fault the equality checks must catch
    sync_debug:  CUDA: torch.cuda.set_sync_debug_mode('warn') over the timed steps, so any
                 torch operation there that synchronises with the host is recorded as a
                 warning (rnnrt's own CuPy calls are not seen by it)
    """

    device: str = "cpu"
    dtype: str = "float32"
    hidden: int = CHARLM.hidden
    layers: int = CHARLM.layers
    batch: int = CHARLM.batch
    seq: int = CHARLM.seq
    steps: int = CHARLM.steps
    warmup: int = 5
    optim: str = CHARLM.optim
    lr: float = CHARLM.lr
    clip: float = CHARLM.clip
    seed: int = CHARLM.seed
    val_frac: float = CHARLM.val_frac
    val_chunks: int = 16
    log_every: int = 50
    shuffle: bool = True
    skip_allreduce: bool = False
    sync_debug: bool = False
    timeout_s: int = 600
    text: tuple[str, ...] = CHARLM.text


TINY = dict(hidden=32, layers=2, batch=8, seq=16, steps=40, warmup=2, lr=1e-2, val_chunks=4,
            log_every=10)
"""A CPU run of a few seconds."""


@dataclass(frozen=True)
class Dist:
    """Where this process runs: rank of world, its device, the backend of the process group
    (None for one process: no DDP)."""

    rank: int
    world: int
    device: torch.device
    backend: str | None

    @property
    def ddp(self) -> bool:
        return self.world > 1


def check_config(cfg: Config, world: int) -> None:
    """Raise ValueError naming the argument, before any work, for a run that cannot go."""
    if cfg.device not in ("cpu", "cuda"):
        raise ValueError(f"--device: expected 'cpu' or 'cuda', got {cfg.device!r}")
    if cfg.dtype not in ("float32", "float64"):
        raise ValueError(f"--dtype: expected 'float32' or 'float64', got {cfg.dtype!r}")
    if cfg.device == "cuda" and cfg.dtype != "float32":
        raise ValueError(f"--dtype: rnnrt.nn computes in float32 on CUDA, got {cfg.dtype}; "
                         f"use float64 on --device cpu")
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: torch sees no CUDA device; use --device cpu")
    for name in ("hidden", "layers", "batch", "seq", "steps"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"--{name}: expected >= 1, got {getattr(cfg, name)}")
    if not 0 <= cfg.warmup < cfg.steps:
        raise ValueError(f"--warmup: expected 0 <= warmup < steps ({cfg.steps}), got "
                         f"{cfg.warmup}")
    if cfg.batch % world:
        raise ValueError(f"--batch: the global batch ({cfg.batch}) must split evenly over "
                         f"the {world} processes (a DistributedSampler would pad it with "
                         f"repeated streams); use a multiple of {world}")
    if cfg.optim not in ("adam", "sgd"):
        raise ValueError(f"--optim: expected 'adam' or 'sgd', got {cfg.optim!r}")


# --------------------------------------------------------------------------- model

class CharLM(torch.nn.Module):
    """rnnrt.nn.LSTM (one-hot input of the vocabulary V, H hidden, L layers) + the head
    torch.nn.Linear(H, V). forward(x [T, B, V], hx ((h0, c0) [L, B, H]) | None) ->
    (logits [T*B, V], rows in x's time-major order as chunk's targets; (h_n, c_n))."""

    def __init__(self, vocab: int, hidden: int, layers: int):
        super().__init__()
        self.lstm = rnnrt.nn.LSTM(vocab, hidden, layers)
        self.head = torch.nn.Linear(hidden, vocab)

    def forward(self, x, hx=None):
        y, hx = self.lstm(x, hx)
        return self.head(y.reshape(-1, y.shape[-1])), hx


def build_model(cfg: Config, vocab: int, device, dtype) -> CharLM:
    """The model at train_charlm's initial values for cfg.seed (train_charlm.start_values),
    on ``device`` in ``dtype``."""
    m = CharLM(vocab, cfg.hidden, cfg.layers)
    start, head = start_values(cfg, vocab)
    m.lstm.load_state_dict({k: torch.from_numpy(v) for k, v in start.state_dict().items()})
    m.head.load_state_dict({k: torch.from_numpy(v) for k, v in head.items()})
    return m.to(device=device, dtype=dtype)


def make_optimizer(cfg: Config, params):
    if cfg.optim == "adam":
        return torch.optim.Adam(params, lr=cfg.lr)
    return torch.optim.SGD(params, lr=cfg.lr)


# --------------------------------------------------------------------------- distributed

def barrier(d: Dist) -> None:
    """All processes here, their device work done (no-op for one process)."""
    if d.device.type == "cuda":
        torch.cuda.synchronize(d.device)
    if d.ddp:
        if d.backend == "nccl":
            dist.barrier(device_ids=[d.device.index])
        else:
            dist.barrier()


def setup(cfg: Config, init_method: str = "env://", env=None) -> Dist:
    """The process group of a launched run (torchrun's RANK, WORLD_SIZE, LOCAL_RANK in
    ``env``); none for one process. Checks ``cfg`` first."""
    env = os.environ if env is None else env
    world, rank = int(env.get("WORLD_SIZE", 1)), int(env.get("RANK", 0))
    local = int(env.get("LOCAL_RANK", rank))
    check_config(cfg, world)
    device = torch.device("cpu")
    if cfg.device == "cuda":
        if local >= torch.cuda.device_count():
            raise ValueError(f"LOCAL_RANK {local}: only {torch.cuda.device_count()} CUDA "
                             f"device(s) here; launch at most that many processes")
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    if world == 1:
        return Dist(0, 1, device, None)
    backend = "nccl" if cfg.device == "cuda" else "gloo"
    if backend == "nccl":
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off (read at init)
    # device_id binds NCCL's communicator to this GPU (no guessing it from the rank)
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                            timeout=_dt.timedelta(seconds=cfg.timeout_s),
                            **({"device_id": device} if backend == "nccl" else {}))
    return Dist(rank, world, device, backend)


def teardown(d: Dist) -> None:
    if d.ddp and dist.is_initialized():
        dist.destroy_process_group()


# --------------------------------------------------------------------------- training

def _dtype(cfg: Config):
    return {"float32": torch.float32, "float64": torch.float64}[cfg.dtype]


# torch's own notice on turning its sync-debug mode on (it says the mode is a prototype), not a
# synchronisation it found: not counted (seen on the H100 with torch 2.11)
SYNC_DEBUG_NOTICE = "Synchronization debug mode is a prototype feature"


def _distinct(caught) -> list[str]:
    """The warnings caught, each distinct one once, with how often it came (less torch's
    notice that sync-debug mode is on)."""
    counts: dict[str, int] = {}
    for w in caught:
        if str(w.message).startswith(SYNC_DEBUG_NOTICE):
            continue
        text = f"{w.category.__name__}: {w.message}"
        counts[text] = counts.get(text, 0) + 1
    return [t if n == 1 else f"{t} (x{n})" for t, n in counts.items()]


def evaluate(model: CharLM, streams, cfg: Config, eye) -> float:
    """Mean cross-entropy (nats/char) of ``model`` over the first cfg.val_chunks chunks of
    ``streams`` [B, N] (ids on the device), state carried across chunks."""
    n = min((streams.shape[1] - 1) // cfg.seq, cfg.val_chunks)
    total, hx = 0.0, None
    with torch.no_grad():  # rnnrt.nn's inference path: nothing kept for a backward
        for k in range(n):
            x, targets = chunk(TORCH_XP, streams, k, cfg.seq, eye)
            logits, hx = model(x, hx)
            total += float(F.cross_entropy(logits, targets))
    return total / n


def train_step(net, opt, params, x, targets, hx, clip: float, skip_allreduce: bool):
    """One optimiser step on chunk x [T, b, V] (targets [T*b] ids) from state hx: forward,
    cross-entropy, backward (DDP all-reduces the gradients unless ``skip_allreduce``),
    clipping to ``clip`` (0: none), the update. Nothing is read back to the host.
    -> (loss, (h_n, c_n)), detached: the step's graph dies on return, and with it rnnrt's
    tape (its saved activations), so the next forward reuses the same workspace."""
    sync = net.no_sync() if skip_allreduce else contextlib.nullcontext()
    with sync:
        logits, (h_n, c_n) = net(x, hx)
        loss = F.cross_entropy(logits, targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
    if clip > 0:
        torch.nn.utils.clip_grad_norm_(params, clip)
    opt.step()
    return loss.detach(), (h_n.detach(), c_n.detach())  # truncated BPTT: hx for the next


def train(cfg: Config, d: Dist, corpus=None, progress=None, snapshot_step: int = 0) -> dict:
    """Train on this process's shard; -> {steps_per_s, train_loss [steps] (the global
    batch's), val_loss, warnings, state (the final parameters, CPU copies), snapshot (the
    parameters after step ``snapshot_step`` <= warmup, taken before the timed steps; None
    for 0), ...}. Every process of ``d`` calls it; with d.world == 1 it is the plain (no
    DDP) run on the whole global batch."""
    check_config(cfg, d.world)
    if not 0 <= snapshot_step <= cfg.warmup:
        raise ValueError(f"snapshot_step: expected 0..warmup ({cfg.warmup}), got "
                         f"{snapshot_step}")
    threads = torch.get_num_threads()
    if cfg.device == "cpu":
        torch.set_num_threads(1)  # the LSTM is NumPy's; two thread pools on few cores thrash
    try:
        return _train(cfg, d, corpus, progress, snapshot_step)
    finally:
        torch.set_num_threads(threads)


def _train(cfg: Config, d: Dist, corpus, progress, snapshot_step: int) -> dict:
    say = progress if progress is not None else (lambda m: None)
    dtype = _dtype(cfg)
    torch.manual_seed(cfg.seed)
    if corpus is None:
        corpus = load_corpus(ROOT, cfg.text, cfg.val_frac)
    V = len(corpus.vocab)
    streams = torch.from_numpy(stream_matrix(corpus.train, cfg.batch, cfg.seq,
                                             "training text")).long().to(d.device)
    per_pass = (streams.shape[1] - 1) // cfg.seq
    eye = torch.eye(V, dtype=dtype, device=d.device)
    sampler = torch.utils.data.DistributedSampler(range(cfg.batch), num_replicas=d.world,
                                                  rank=d.rank, shuffle=cfg.shuffle,
                                                  seed=cfg.seed, drop_last=True)
    order = []  # [passes, batch/world]: this process's streams in each pass over the text
    for epoch in range(math.ceil(cfg.steps / per_pass)):
        sampler.set_epoch(epoch)
        order.append(list(sampler))
    # One copy to the device before the steps (a copy from pageable host memory in the loop
    # would wait for the device's queue: a host synchronisation every pass).
    order = torch.tensor(order, dtype=torch.long).to(d.device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = build_model(cfg, V, d.device, dtype)
        net = model
        if d.ddp:
            ids = [d.device.index] if d.device.type == "cuda" else None
            net = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids,
                                                            gradient_as_bucket_view=True)
        params = list(model.parameters())
        opt = make_optimizer(cfg, params)
        losses, hx, k, epoch, t0, snapshot = [], None, per_pass, -1, None, None
        debug_syncs = cfg.sync_debug and d.device.type == "cuda"
        barrier(d)
        t_start = time.perf_counter()
        try:
            for step in range(1, cfg.steps + 1):
                if step == cfg.warmup + 1:
                    barrier(d)
                    t0 = time.perf_counter()
                    if debug_syncs:  # from here, a torch op that waits for the device warns
                        torch.cuda.set_sync_debug_mode("warn")
                if k == per_pass:  # a new pass: the sampler's next order, the state restarts
                    epoch += 1
                    local, k, hx = streams.index_select(0, order[epoch]), 0, None
                x, targets = chunk(TORCH_XP, local, k, cfg.seq, eye)  # [T, b, V], [T*b]
                k += 1
                loss, hx = train_step(net, opt, params, x, targets, hx, cfg.clip,
                                      d.ddp and cfg.skip_allreduce)
                losses.append(loss)
                if step == snapshot_step:  # device copies, before the timed steps
                    snapshot = {n: t.detach().clone() for n, t in model.state_dict().items()}
                if progress is not None and cfg.log_every and step % cfg.log_every == 0:
                    say(f"step {step}: loss {loss.item():.4f} nats/char (this process's "
                        f"streams)")  # the one host sync
        finally:
            if debug_syncs:
                torch.cuda.set_sync_debug_mode(0)
        barrier(d)
        t_end = time.perf_counter()
        # The global batch's loss of each step: the mean of the processes' (equal shares).
        loss_curve = torch.stack(losses).double()
        if d.ddp:  # one collective, after the timed steps
            loss_curve = loss_curve.to(d.device)
            dist.all_reduce(loss_curve)
            loss_curve /= d.world
        val = None
        if cfg.val_chunks and d.rank == 0:
            val_s = torch.from_numpy(stream_matrix(corpus.val, cfg.batch, cfg.seq,
                                                   "validation text")).long().to(d.device)
            val = evaluate(model, val_s, cfg, eye)
        barrier(d)
    timed = cfg.steps - cfg.warmup
    return {
        "rank": d.rank, "world": d.world, "backend": d.backend,
        "batch_per_process": cfg.batch // d.world, "vocab_size": V,
        "chunks_per_pass": per_pass, "timed_steps": timed,
        "steps_per_s": timed / (t_end - t0), "wall_s": t_end - t_start,
        "train_loss": loss_curve.cpu().tolist(),  # one copy, at the end
        "val_loss": val,
        "warnings": _distinct(caught),
        "lstm_params": sum(p.numel() for p in model.lstm.parameters()),
        "state": {n: t.detach().cpu().clone() for n, t in model.state_dict().items()},
        "snapshot": None if snapshot is None else {n: t.cpu() for n, t in snapshot.items()},
    }


# --------------------------------------------------------------------------- record, main

def device_name(d: Dist) -> str:
    if d.device.type == "cuda":
        return torch.cuda.get_device_name(d.device)
    return f"CPU ({platform.machine()})"


def record_stem(cfg: Config, world: int) -> str:
    """ddp-charlm-lstm-L..-H..-B..-T..-S<steps>-W<world> (the device slug and the stamp
    follow: rnnrt.bench.records.record_path)."""
    return (f"ddp-charlm-lstm-L{cfg.layers}-H{cfg.hidden}-B{cfg.batch}-T{cfg.seq}-"
            f"S{cfg.steps}-W{world}")


def write_record(rec: dict, stem: str, folder) -> Path:
    """Write ``rec`` into ``folder`` under the records scheme's name (rnnrt.bench.records
    .record_path: ``stem``, the device slug, the stamp), its path kept as rec['record'];
    -> that path (ddp_bench writes its records through this too)."""
    name = record_path("training", stem, rec["device"]["device"], rec["created"]).name
    path = Path(folder) / name
    rec["record"] = str(path)
    write_json(rec, path)
    return path


def make_record(cfg: Config, d: Dist, res: dict, command: str) -> dict:
    tail = res["train_loss"][-min(25, len(res["train_loss"])):]
    return {
        "kind": "ddp-charlm", "created": now_iso(), "command": command,
        "config": {k: (list(v) if isinstance(v, tuple) else v)
                   for k, v in dataclasses.asdict(cfg).items()},
        "world": d.world, "backend": d.backend, "batch_per_process": res["batch_per_process"],
        "device": {"device": device_name(d), "type": d.device.type,
                   "nccl": str(torch.cuda.nccl.version()) if d.backend == "nccl" else None,
                   "nccl_nvls_enable": os.environ.get("NCCL_NVLS_ENABLE")},
        "versions": versions(),
        "ddp": ({"gradient_as_bucket_view": True, "find_unused_parameters": False}
                if d.ddp else None),
        "steps_per_s": res["steps_per_s"], "timed_steps": res["timed_steps"],
        "warmup": cfg.warmup, "wall_s": res["wall_s"],
        "train_loss": res["train_loss"], "val_loss": res["val_loss"],
        "final": {"train_loss_tail": float(np.mean(tail)), "tail_steps": len(tail),
                  "val_loss": res["val_loss"],
                  "val_bits": None if res["val_loss"] is None else res["val_loss"] / math.log(2),
                  "uniform_nats": math.log(res["vocab_size"])},
        "warnings": res["warnings"], "lstm_params": res["lstm_params"],
        "chunks_per_pass": res["chunks_per_pass"],
    }


FLAGS = ("shuffle", "skip_allreduce", "sync_debug")
"""The Config fields set by switches of their own (--no-shuffle, --skip-allreduce,
--sync-debug), not by a --<field> VALUE flag."""


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tiny", action="store_true", help=f"a few CPU seconds: {TINY}")
    add_config_flags(p, Config, skip=("text", *FLAGS),
                     choices={"device": ("cpu", "cuda"), "dtype": ("float32", "float64"),
                              "optim": ("adam", "sgd")})
    p.add_argument("--no-shuffle", action="store_true", help="same streams every pass")
    p.add_argument("--skip-allreduce", action="store_true",
                   help="planted fault: no gradient all-reduce (the equality checks fail)")
    p.add_argument("--sync-debug", action="store_true",
                   help="CUDA: report torch ops that synchronise with the host in timed steps")
    p.add_argument("--text", nargs="+", default=None,
                   help=f"globs under the repo root (default {' '.join(DEFAULT_TEXT)})")
    p.add_argument("--init-method", default="env://",
                   help="process-group rendezvous: env:// (torchrun) or file:///path")
    p.add_argument("--results-dir", type=Path,
                   default=ROOT / "experiments" / "results" / "training")
    p.add_argument("--save-params", type=Path, default=None,
                   help="rank 0 saves its final parameters here (torch.save, a state_dict)")
    return p.parse_args(argv)


def config_from_args(args: argparse.Namespace) -> Config:
    kw = config_kwargs(args, Config, TINY if args.tiny else None, skip=FLAGS)
    if args.device is None:
        kw["device"] = "cuda" if torch.cuda.is_available() else "cpu"
    return Config(**kw, shuffle=not args.no_shuffle, skip_allreduce=args.skip_allreduce,
                  sync_debug=args.sync_debug)


def main(argv=None, env=None) -> dict | None:
    """Run (every process of a launch calls it); -> rank 0's record, None on other ranks."""
    args = parse_args(argv)
    cfg = config_from_args(args)
    d = setup(cfg, args.init_method, env)
    try:
        say = (lambda m: print(f"[rank 0] {m}", file=sys.stderr, flush=True)) \
            if d.rank == 0 else None
        if say:
            say(f"{d.world} process(es), {d.backend or 'no process group'}, {device_name(d)}"
                f" x{d.world}; LSTM {cfg.layers} x {cfg.hidden}, global batch {cfg.batch} "
                f"({cfg.batch // d.world} a process), T {cfg.seq}, {cfg.steps} steps, "
                f"{cfg.optim} lr {cfg.lr:g}, {cfg.dtype}")
        res = train(cfg, d, progress=say)
        for w in res["warnings"]:
            print(f"[rank {d.rank}] warning while training: {w}", file=sys.stderr)
        if d.rank != 0:
            return None
        if args.save_params is not None:
            args.save_params.parent.mkdir(parents=True, exist_ok=True)
            torch.save(res["state"], args.save_params)
        command = ["examples/train_ddp.py", *(sys.argv[1:] if argv is None else argv)]
        rec = make_record(cfg, d, res, " ".join(command))
        path = write_record(rec, record_stem(cfg, d.world), args.results_dir)
        val = rec["val_loss"]
        say(f"{res['steps_per_s']:.2f} steps/s ({res['timed_steps']} steps after "
            f"{cfg.warmup} warm-up, {d.world} process(es)); train loss "
            f"{rec['final']['train_loss_tail']:.3f}"
            + ("" if val is None else f", val {val:.3f}") + f" nats/char\nrecord: {path}")
        return rec
    finally:
        teardown(d)


if __name__ == "__main__":
    main()
