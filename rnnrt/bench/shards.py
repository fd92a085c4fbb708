"""`rnnrt sweep --gpus 0,1,...`: one sweep on several GPUs of one host at once.

Why: a wide grid is ~2,000 s of sweeping on one H200 (its largest points dominate), and a
host's GPUs sit idle meanwhile. The grid, cheapest point first, is dealt out like cards: GPU
k of N runs points k, k + N, k + 2N, ... (``--shard k/N``, 1-based; sweep.grid), so every
share holds small and large points alike and the shares take about as long. Each share is a
sweep of its own: a fresh ``python -m rnnrt sweep ... --shard k/N`` process that sees only
its GPU (CUDA_VISIBLE_DEVICES), times rnnrt and cuDNN in that one process as always, and
writes its own file (the default name with '-shardKofN'; ``--resume`` finds it again with
the same --gpus list). Their lines come through here as they are written, each prefixed with
its GPU. ``rnnrt summary`` and ``rnnrt plot`` read the shard files together (a folder, or the
files).

The shares run side by side on one host: their ladders' CPU parts (plan building, the float64
reference of the check) share its cores, so a share can take longer than the same points on a
host of its own (on an H200 pair, two bfloat16 shares' largest points took 2-3x); the GPU
timings, each in its own process on its own GPU, do not share anything. Each child's BLAS
(NumPy's, for the reference) gets its share of the cores (``blas_threads``), not all of them:
N pools of every core's threads on one host oversubscribe it N times. An environment that
sets a BLAS thread count already keeps its own.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading

from .processes import without_flags

# the flags the parent takes for itself (with their values): each child gets its --shard
_PARENT_FLAGS = {"--gpus": 1}


def shard_argv(argv: list[str], k: int, n: int) -> list[str]:
    """``argv`` (the parent's arguments after the program name, 'sweep' first) without
    --gpus (and its value), with ``--shard k/n``."""
    return without_flags(argv, _PARENT_FLAGS) + ["--shard", f"{k}/{n}"]


def visible_device(gpu: int, env=None) -> str:
    """What CUDA_VISIBLE_DEVICES a child gets for ``gpu`` (an index among the GPUs this
    process sees): the parent's own CUDA_VISIBLE_DEVICES entry at that index where it has
    one (indices are relative to it), else the index itself. ValueError naming --gpus where
    the parent's list has no such entry."""
    env = os.environ if env is None else env
    seen = env.get("CUDA_VISIBLE_DEVICES")
    if seen is None or not seen.strip():
        return str(gpu)
    ids = [s.strip() for s in seen.split(",") if s.strip()]
    if gpu >= len(ids):
        raise ValueError(f"--gpus: GPU {gpu} is not among the {len(ids)} that "
                         f"CUDA_VISIBLE_DEVICES={seen!r} leaves this process")
    return ids[gpu]


BLAS_THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def blas_threads(n: int, env=None, cores: int | None = None) -> dict[str, str]:
    """The BLAS thread variables for each of ``n`` children on one host: the host's cores
    (those this process may run on) split evenly, at least 1 each; {} where ``env`` sets
    any of them (the caller's choice stands)."""
    env = os.environ if env is None else env
    if any(env.get(v) for v in BLAS_THREAD_VARIABLES):
        return {}
    if cores is None:
        cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                 else os.cpu_count() or 1)
    each = str(max(1, cores // max(1, n)))
    return {v: each for v in BLAS_THREAD_VARIABLES}


def run_shards(argv: list[str], gpus: list[int], popen=subprocess.Popen, out=None,
               env=None) -> list[int]:
    """The sweep of ``argv`` (``shard_argv``'s input) on ``gpus``: one child a GPU, all at
    once (``python -m rnnrt``), the k-th (1-based) running ``--shard k/len(gpus)`` with only
    its GPU visible and its share of the host's cores for BLAS (``blas_threads``); each
    child's lines (stdout and stderr) written to ``out`` (default
    stdout) as they come, prefixed '[gpu G] '. -> the children's exit statuses, in order.
    Ctrl-C reaches the children too (one process group): each stops cleanly, its file
    resumable, and this waits for them."""
    out = sys.stdout if out is None else out
    base = dict(os.environ if env is None else env)
    n = len(gpus)
    base.update(blas_threads(n, base))
    lock = threading.Lock()
    children, readers = [], []

    def pump(gpu, stream):
        for line in stream:
            with lock:
                out.write(f"[gpu {gpu}] {line}" if line.endswith("\n") else
                          f"[gpu {gpu}] {line}\n")
                out.flush()

    try:
        for k, gpu in enumerate(gpus, 1):
            cmd = [sys.executable, "-m", "rnnrt", *shard_argv(argv, k, n)]
            # unbuffered: a child's stdout is a pipe, and its lines should come as written
            child_env = dict(base, CUDA_VISIBLE_DEVICES=visible_device(gpu, base),
                             PYTHONUNBUFFERED="1")
            with lock:
                out.write(f"[gpu {gpu}] {' '.join(cmd[2:])}\n")
                out.flush()
            p = popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                      env=child_env, bufsize=1)
            children.append(p)
            t = threading.Thread(target=pump, args=(gpu, p.stdout), daemon=True)
            t.start()
            readers.append(t)
        codes = []
        for p in children:
            while True:
                try:
                    codes.append(p.wait())
                    break
                except KeyboardInterrupt:   # the children got it too: wait for them to stop
                    continue
    finally:
        for t in readers:
            t.join(timeout=5)
    return codes
