"""Train a 2-layer LSTM character model on rnnrt's own source text, with no framework
(``--framework rnnrt``, the default) or through PyTorch (``--framework torch``).

rnnrt: everything outside the LSTM is written here on rnnrt's arrays, in one array module ``xp``
(NumPy on the CPU, CuPy on the GPU): one-hot input, the output projection H -> V, softmax
cross-entropy and its gradient, clipping by global norm, Adam (or SGD) on the model's one
flat parameter buffer plus the head's two arrays, truncated backprop through time over
consecutive chunks (each chunk's final h_n / c_n is the next chunk's hx).

    --device cpu: the model's own forward/backward (the NumPy reference); the parameters
                  are ``model.flat``.
    --device gpu: ``rnnrt.gpu.GpuRunner``; the parameters are ``runner.params`` (updated in
                  place: every plan's workspace shares that buffer). Before training on,
                  the first ``--verify-steps`` steps are recomputed by the NumPy reference
                  and the run stops if loss, h_n or any gradient disagrees.

torch (``--framework torch``): the LSTM is ``rnnrt.nn.LSTM`` (torch.nn.LSTM's drop-in,
autograd through rnnrt's backward), the head ``torch.nn.Linear``, the loss
``torch.nn.functional.cross_entropy``, clipping ``torch.nn.utils.clip_grad_norm_`` and the
optimiser ``torch.optim.Adam`` (or SGD). The LSTM and the head start from the same values as
the rnnrt run of the same seed, so the two paths can be compared step for step. On the CPU
the LSTM runs on the NumPy reference; with ``--device gpu`` every tensor is on CUDA and the
LSTM runs on rnnrt's GPU runner (rnnrt.nn's CUDA backend).

Data: README.md and rnnrt's Python source, read from this checkout at run time (nothing is
downloaded), concatenated in sorted order; the last 10% is the validation text; the
vocabulary is the text's characters. The text changes as the repository does, so every
record carries the text's size and SHA-256.

Outputs: per-step training loss and periodic validation loss (nats/char and bits/char) on
stderr, a generated sample on stdout, a loss-curve PNG in <out>/figures/ and a JSON record in
<out>/results/training/ (``--figures-dir`` / ``--results-dir``); <out> is rnnrt's output
folder, ./rnnrt-out unless RNNRT_OUT names another (bench/records.py).

    python examples/train_charlm.py --device gpu           # the default run (GPU)
    python examples/train_charlm.py --device cpu --tiny    # the CI test's run (seconds)
    python examples/train_charlm.py --device cpu --steps 300 --hidden 128
    python examples/train_charlm.py --framework torch --tiny  # rnnrt.nn + torch.optim

Sections: configuration, backends, training, torch path, sampling, record and figure, main; the corpus, head and optimisers are in
examples/charlm_parts.py.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import math
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT, Path(__file__).resolve().parent):  # a checkout without installing; charlm_parts
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import rnnrt  # noqa: E402
from rnnrt.bench.records import (  # noqa: E402
    device_slug, figures_root, results_root, stamp, write_json)
from rnnrt.plan.switches import ladder, rung_names  # noqa: E402
from charlm_parts import (  # noqa: E402, F401  (the corpus, head, optimisers; tests use all)
    SGD, Adam, Corpus, add_config_flags, chunk, clip_global_norm, config_kwargs, head_loss,
    head_loss_grads, init_head, load_corpus, log_softmax, loss_and_grads, stream_matrix,
    unigram_entropy)

LN2 = math.log(2.0)

# --------------------------------------------------------------------------- configuration

DEFAULT_TEXT = ("README.md", "rnnrt/*.py", "rnnrt/*/*.py")


@dataclass(frozen=True)
class Config:
    """One run. Defaults are the GPU run the README reports (well under 2 minutes on an H100).

    hidden, layers:   the LSTM (input size = vocabulary size, one-hot input)
    batch, seq:       B parallel streams of the text, T steps per truncated-BPTT chunk
    steps:            optimiser steps (one chunk each)
    optim:            'adam' or 'sgd' (plain; it wants a larger lr, ~1); beta1, beta2, eps
                      are Adam's (torch's formula)
    clip:             max global gradient norm (0: no clipping)
    val_frac:         the last fraction of the text held out for validation
    eval_every:       validation every this many steps (and after the last one)
    val_chunks:       at most this many validation chunks per evaluation (0: all)
    verify_steps:     GPU only: steps also computed by the NumPy reference and compared
    rung, executor:   GPU only: the ladder rung whose switches run, 'graph' or 'eager'
    framework:        'rnnrt' (rnnrt's arrays, the head, Adam and clipping written here) or
                      'torch' (rnnrt.nn.LSTM, torch.nn.Linear, torch.optim)
    """

    device: str = "cpu"
    framework: str = "rnnrt"
    hidden: int = 256
    layers: int = 2
    batch: int = 32
    seq: int = 100
    steps: int = 600
    optim: str = "adam"
    lr: float = 5e-3
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    clip: float = 5.0
    seed: int = 0
    val_frac: float = 0.1
    eval_every: int = 50
    val_chunks: int = 0
    log_every: int = 25
    sample_chars: int = 400
    temperature: float = 0.7
    prime: str = "def "
    verify_steps: int = 2
    rung: str = rung_names()[-1]
    executor: str = "graph"
    text: tuple[str, ...] = DEFAULT_TEXT


TINY = dict(hidden=32, layers=2, batch=8, seq=16, steps=150, lr=1e-2, eval_every=50,
            val_chunks=16, log_every=50, sample_chars=80)
"""The CI test's run: a few seconds on two CPU cores."""


# --------------------------------------------------------------------------- backends

class CpuBackend:
    """The model's NumPy reference forward/backward; parameters: ``model.flat``."""

    def __init__(self, model):
        self.xp = np
        self.model = model
        self.params = model.flat

    def forward(self, x, hx, train):
        return self.model.forward(x, hx, train=train)

    def backward(self, tape, dy):
        return self.model.backward(tape, dy)

    @staticmethod
    def host(a):
        return a

    def info(self) -> dict:
        return {"device": f"CPU ({platform.machine()}), NumPy reference",
                "numpy": np.__version__, "python": platform.python_version()}

    def label(self) -> str:
        return "CPU, NumPy reference"


class GpuBackend:
    """``rnnrt.gpu.GpuRunner``; parameters: ``runner.params`` (updated in place)."""

    def __init__(self, model, rung: str, executor: str):
        from rnnrt.device import require_gpu
        from rnnrt.gpu import GpuRunner

        self.xp = require_gpu()
        rungs = {r.name: r for r in ladder()}
        if rung not in rungs:
            raise ValueError(f"rung: expected one of {list(rungs)}, got {rung!r}")
        self.model, self.rung, self.executor = model, rung, executor
        self.runner = GpuRunner(model, switches=rungs[rung].switches, executor=executor)
        self.params = self.runner.params

    def forward(self, x, hx, train):
        if train:
            return self.runner.forward(x, hx, train=True)
        return self.runner.forward(x, hx)

    def backward(self, tape, dy):
        return self.runner.backward(tape, dy)

    def host(self, a):
        return self.xp.asnumpy(a)

    def info(self) -> dict:
        from rnnrt.session import device_info
        return {**device_info(), "rung": self.rung, "executor": self.executor}

    def label(self) -> str:
        from rnnrt.device import gpu_status
        return f"{gpu_status()[1]}, {self.rung} ({self.executor})"


def make_backend(cfg: Config, model):
    if cfg.device == "cpu":
        return CpuBackend(model)
    if cfg.device == "gpu":
        return GpuBackend(model, cfg.rung, cfg.executor)
    raise ValueError(f"device: expected 'cpu' or 'gpu', got {cfg.device!r}")


def _rel(a, b) -> float:
    """||a - b|| / ||b|| in float64 (host arrays)."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


VERIFY_RTOL = 1e-3
"""fp32 against fp32 in a different order: observed errors are ~1e-6; a wrong gradient is O(1)."""


def verify_step(backend, head, x, targets, hx, got, step: int) -> dict:
    """Recompute one step (before any update) with the NumPy reference from host copies of
    the same parameters and inputs; raise if the loss, h_n, c_n or a gradient disagrees."""
    h = backend.host
    m = backend.model
    ref_model = rnnrt.LSTM(m.input_size, m.hidden_size, m.num_layers, seed=0)
    ref_model.flat[...] = h(backend.params)
    ref_head = {k: h(v) for k, v in head.items()}
    ref_hx = None if hx is None else tuple(h(a) for a in hx)
    loss, gflat, dhead, (h_n, c_n) = loss_and_grads(CpuBackend(ref_model), ref_head, h(x),
                                                    h(targets), ref_hx)
    g_loss, g_flat, g_head, (g_h, g_c) = got
    errs = {"loss_abs": abs(float(g_loss) - float(loss)), "h_n": _rel(h(g_h), h_n),
            "c_n": _rel(h(g_c), c_n), "grad_flat": _rel(h(g_flat), gflat),
            "grad_head_weight": _rel(h(g_head["weight"]), dhead["weight"]),
            "grad_head_bias": _rel(h(g_head["bias"]), dhead["bias"])}
    bad = {k: v for k, v in errs.items() if not v <= VERIFY_RTOL}
    if bad:
        raise RuntimeError(f"step {step}: the {backend.label()} result disagrees with the "
                           f"NumPy reference (tolerance {VERIFY_RTOL}): {bad}; all: {errs}")
    return {"step": step, **errs}


# --------------------------------------------------------------------------- training

def evaluate(backend, head, eye, streams, seq: int, max_chunks: int) -> float:
    """Mean validation loss (nats/char) over consecutive chunks, state carried from zeros."""
    xp = backend.xp
    n = (streams.shape[1] - 1) // seq
    if max_chunks:
        n = min(n, max_chunks)
    total = 0.0
    hx = None
    for k in range(n):
        x, targets = chunk(xp, streams, k, seq, eye)
        y, (h_n, c_n) = backend.forward(x, hx, train=False)
        total = total + head_loss(xp, y, head, targets)
        hx = (h_n.copy(), c_n.copy())
    return float(total) / n


def _progress(msg: str):
    print(msg, file=sys.stderr, flush=True)


def _data_summary(corpus: Corpus, per_pass: int) -> dict:
    """The record's 'data' entry: where the text came from, its sizes and the baselines."""
    V = len(corpus.vocab)
    return {"files": list(corpus.files), "chars": corpus.chars, "sha256": corpus.sha256,
            "vocab_size": V, "train_chars": len(corpus.train), "val_chars": len(corpus.val),
            "chunks_per_pass": per_pass, "uniform_nats": math.log(V),
            "unigram_nats": unigram_entropy(corpus.train, V)}


def _announce(cfg: Config, corpus: Corpus, data: dict, label: str, progress):
    progress(f"charlm: {cfg.layers}-layer LSTM H{cfg.hidden} on {label}; "
             f"{corpus.chars} chars from {len(corpus.files)} files, vocab {data['vocab_size']}, "
             f"train {len(corpus.train)} / val {len(corpus.val)}, {data['chunks_per_pass']} "
             f"chunks of B{cfg.batch} x T{cfg.seq} per pass; uniform "
             f"{data['uniform_nats']:.3f} nats, unigram {data['unigram_nats']:.3f} nats")


def _after_step(cfg: Config, step: int, loss_f: float, norm_f: float, log: dict,
                evaluate_fn, progress):
    """Book one finished step into ``log`` (lists train_loss, grad_norm, step_ms -- the
    step's time already appended -- and val), refusing a diverged run; print a line every
    log_every steps; validate (``evaluate_fn() -> nats``) every eval_every and at the end."""
    if not (math.isfinite(loss_f) and math.isfinite(norm_f)):
        raise FloatingPointError(f"step {step}: loss {loss_f}, gradient norm {norm_f}: "
                                 f"the run diverged; lower --lr or --clip")
    log["train_loss"].append(loss_f)
    log["grad_norm"].append(norm_f)
    line = None
    if step % cfg.log_every == 0 or step == 1:
        line = (f"step {step:5d}/{cfg.steps}  loss {loss_f:.3f} nats "
                f"({loss_f / LN2:.3f} bits)  |g| {norm_f:6.2f}  "
                f"{np.median(log['step_ms'][-cfg.log_every:]):6.1f} ms/step")
    if step % cfg.eval_every == 0 or step == cfg.steps:
        v = evaluate_fn()
        log["val"].append({"step": step, "loss": v})
        line = (line or f"step {step:5d}/{cfg.steps}  loss {loss_f:.3f} nats") + \
            f"  | val {v:.3f} nats ({v / LN2:.3f} bits)"
    if line:
        progress(line)


def _record(cfg: Config, log: dict, *, device: dict, device_label: str, data: dict,
            lstm_params: int, checks: list, times: tuple, state: dict, vocab) -> dict:
    """The run's record (see ``train``). times: (t0, t_train, train_wall) from perf_counter."""
    t0, t_train, train_wall = times
    losses, val, V = log["train_loss"], log["val"], data["vocab_size"]
    tail = max(1, min(50, cfg.steps // 10))
    best = min(val, key=lambda r: r["loss"])
    return {
        "kind": "charlm-train",
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "config": dataclasses.asdict(cfg),
        "device": device,
        "device_label": device_label,
        "data": data,
        "model": {"cell": "lstm", "input": "one-hot", "lstm_params": lstm_params,
                  "head_params": V * cfg.hidden + V},
        "train_loss": losses,
        "grad_norm": log["grad_norm"],
        "step_ms": log["step_ms"],
        "val": val,
        "verify": checks,
        "final": {"train_loss_tail": float(np.mean(losses[-tail:])), "tail_steps": tail,
                  "val_loss": val[-1]["loss"], "val_bits": val[-1]["loss"] / LN2,
                  "best_val_loss": best["loss"], "best_val_step": best["step"]},
        "wall_s": {"setup": t_train - t0, "train": train_wall,
                   "total": time.perf_counter() - t0},
        "ms_per_step_median": float(np.median(log["step_ms"])),
        "_state": state,
        "_vocab": vocab,
    }


def train(cfg: Config, progress=_progress) -> dict:
    """Run ``cfg``; -> the record (the dict at the end: config, device, data, per-step
    train_loss / grad_norm / step_ms, val [{step, loss}], verify, final, wall_s), with the
    trained parameters (host arrays) and vocabulary under '_state' / '_vocab' for main."""
    if cfg.framework == "torch":
        return train_torch(cfg, progress)
    if cfg.framework != "rnnrt":
        raise ValueError(f"framework: expected 'rnnrt' or 'torch', got {cfg.framework!r}")
    t0 = time.perf_counter()
    corpus = load_corpus(ROOT, cfg.text, cfg.val_frac)
    V = len(corpus.vocab)
    model, head = start_values(cfg, V)
    backend = make_backend(cfg, model)
    xp = backend.xp
    head = {k: xp.asarray(v) for k, v in head.items()}
    eye = xp.eye(V, dtype=xp.float32)
    train_s = xp.asarray(stream_matrix(corpus.train, cfg.batch, cfg.seq, "training text"))
    val_s = xp.asarray(stream_matrix(corpus.val, cfg.batch, cfg.seq, "validation text"))
    per_pass = (train_s.shape[1] - 1) // cfg.seq
    params = [backend.params, head["weight"], head["bias"]]
    if cfg.optim == "adam":
        opt = Adam(xp, params, cfg.lr, cfg.beta1, cfg.beta2, cfg.eps)
    elif cfg.optim == "sgd":
        opt = SGD(xp, params, cfg.lr)
    else:
        raise ValueError(f"optim: expected 'adam' or 'sgd', got {cfg.optim!r}")
    data = _data_summary(corpus, per_pass)
    _announce(cfg, corpus, data, backend.label(), progress)

    log = {"train_loss": [], "grad_norm": [], "step_ms": [], "val": []}
    checks = []
    hx, k, t_train = None, 0, time.perf_counter()
    for step in range(1, cfg.steps + 1):
        t = time.perf_counter()
        if k == per_pass:  # a new pass over the text: the streams restart, so does the state
            k, hx = 0, None
        x, targets = chunk(xp, train_s, k, cfg.seq, eye)
        k += 1
        loss, gflat, dhead, (h_n, c_n) = loss_and_grads(backend, head, x, targets, hx)
        if cfg.device == "gpu" and step <= cfg.verify_steps:
            checks.append(verify_step(backend, head, x, targets, hx,
                                      (loss, gflat, dhead, (h_n, c_n)), step))
            progress(f"step {step}: matches the NumPy reference: {checks[-1]}")
        grads = [gflat, dhead["weight"], dhead["bias"]]
        norm = clip_global_norm(xp, grads, cfg.clip)
        opt.step(grads)
        hx = (h_n.copy(), c_n.copy())
        loss_f, norm_f = float(loss), float(norm)  # synchronises: the step's time is whole
        log["step_ms"].append((time.perf_counter() - t) * 1e3)
        _after_step(cfg, step, loss_f, norm_f, log,
                    lambda: evaluate(backend, head, eye, val_s, cfg.seq, cfg.val_chunks),
                    progress)
    train_wall = time.perf_counter() - t_train

    state = {"flat": backend.host(backend.params).copy(),
             "head": {k_: backend.host(v).copy() for k_, v in head.items()}}
    return _record(cfg, log, device=backend.info(), device_label=backend.label(), data=data,
                   lstm_params=sum(e.numel for e in model.layout.entries), checks=checks,
                   times=(t0, t_train, train_wall), state=state, vocab=corpus.vocab)


# --------------------------------------------------------------------------- torch path

def start_values(cfg, vocab: int):
    """The start of every path for cfg.seed (this file's, --framework torch's, train_ddp's):
    -> (rnnrt.LSTM(vocab, cfg.hidden, cfg.layers, seed=cfg.seed), the head's float32
    {"weight" [vocab, hidden], "bias" [vocab]} of charlm_parts.init_head with seed + 1)."""
    model = rnnrt.LSTM(vocab, cfg.hidden, cfg.layers, seed=cfg.seed)
    return model, init_head(np.random.default_rng(cfg.seed + 1), cfg.hidden, vocab, np.float32)


def train_torch(cfg: Config, progress=_progress) -> dict:
    """``--framework torch``: the same run through rnnrt.nn.LSTM and torch (module
    docstring); -> the same record as ``train``. The LSTM and head start from the values
    the rnnrt path starts from for this seed; Adam, clipping and the loss are torch's own
    (their formulas are the ones this file writes out for the rnnrt path)."""
    import torch
    import torch.nn.functional as F

    import rnnrt.nn
    from rnnrt.params import to_flat

    if cfg.device not in ("cpu", "gpu"):
        raise ValueError(f"device: expected 'cpu' or 'gpu', got {cfg.device!r}")
    gpu = cfg.device == "gpu"
    if gpu and not torch.cuda.is_available():
        raise RuntimeError("--framework torch --device gpu: this torch has no CUDA device "
                           "(a CUDA build of torch and a GPU are needed; rnnrt.nn then runs "
                           "the LSTM on rnnrt's GPU runner)")
    dev = torch.device("cuda" if gpu else "cpu")
    if not gpu:
        # The LSTM's work is NumPy's (OpenBLAS threads); torch's own here is the head and
        # the optimiser. Two thread pools spinning on the same cores made a tiny step ~7x
        # slower (2 cores: 16 ms vs 2.3 ms), so torch gets one thread.
        torch.set_num_threads(1)
    t0 = time.perf_counter()
    corpus = load_corpus(ROOT, cfg.text, cfg.val_frac)
    V = len(corpus.vocab)
    start, init = start_values(cfg, V)   # the rnnrt path's
    lstm = rnnrt.nn.LSTM(V, cfg.hidden, cfg.layers)
    lstm.load_state_dict({k: torch.from_numpy(v) for k, v in start.state_dict().items()})
    head = torch.nn.Linear(cfg.hidden, V)
    head.load_state_dict({k: torch.from_numpy(v) for k, v in init.items()})
    lstm.to(dev)   # on CUDA this lays the LSTM's weights out as rnnrt's runner reads them
    head.to(dev)
    params = [*lstm.parameters(), *head.parameters()]
    if cfg.optim == "adam":
        opt = torch.optim.Adam(params, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps)
    elif cfg.optim == "sgd":
        opt = torch.optim.SGD(params, lr=cfg.lr)
    else:
        raise ValueError(f"optim: expected 'adam' or 'sgd', got {cfg.optim!r}")
    eye = np.eye(V, dtype=np.float32)
    train_s = stream_matrix(corpus.train, cfg.batch, cfg.seq, "training text")
    val_s = stream_matrix(corpus.val, cfg.batch, cfg.seq, "validation text")
    per_pass = (train_s.shape[1] - 1) // cfg.seq
    data = _data_summary(corpus, per_pass)
    label = ("GPU, rnnrt.nn.LSTM (CUDA) + torch.optim" if gpu
             else "CPU, rnnrt.nn.LSTM + torch.optim")
    _announce(cfg, corpus, data, label, progress)

    def loss_of(streams, k, hx):
        """Chunk k's mean cross-entropy from state hx -> (loss, (h_n, c_n))."""
        x, targets = chunk(np, streams, k, cfg.seq, eye)  # [T, B, V] one-hot, [T*B] ids
        y, hx = lstm(torch.from_numpy(x).to(dev), hx)
        logits = head(y.reshape(-1, cfg.hidden))  # rows in time-major order, as targets
        return F.cross_entropy(logits, torch.from_numpy(targets).long().to(dev)), hx

    def evaluate_fn() -> float:
        n = (val_s.shape[1] - 1) // cfg.seq
        n = min(n, cfg.val_chunks) if cfg.val_chunks else n
        total, hx = 0.0, None
        with torch.no_grad():  # rnnrt.nn's inference path: nothing kept for a backward
            for k in range(n):
                loss, hx = loss_of(val_s, k, hx)
                total += float(loss)
        return total / n

    log = {"train_loss": [], "grad_norm": [], "step_ms": [], "val": []}
    hx, k, t_train = None, 0, time.perf_counter()
    for step in range(1, cfg.steps + 1):
        t = time.perf_counter()
        if k == per_pass:
            k, hx = 0, None
        loss, (h_n, c_n) = loss_of(train_s, k, hx)
        k += 1
        opt.zero_grad()
        loss.backward()
        # max_norm inf: the norm without clipping (this file's clip 0)
        norm = torch.nn.utils.clip_grad_norm_(params, cfg.clip if cfg.clip > 0 else math.inf)
        opt.step()
        hx = (h_n.detach(), c_n.detach())  # truncated BPTT: the next chunk starts here
        loss_f, norm_f = float(loss.detach()), float(norm)
        log["step_ms"].append((time.perf_counter() - t) * 1e3)
        _after_step(cfg, step, loss_f, norm_f, log, evaluate_fn, progress)
    train_wall = time.perf_counter() - t_train

    sd = {k_: v.detach().cpu().numpy() for k_, v in lstm.state_dict().items()}
    state = {"flat": to_flat(sd, start.layout, np.float32),
             "head": {k_: v.detach().cpu().numpy().copy()
                      for k_, v in head.state_dict().items()}}
    info = {"numpy": np.__version__, "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(), "python": platform.python_version()}
    if gpu:
        from rnnrt.session import device_info
        info = {**device_info(), **info, "lstm": "rnnrt.nn.LSTM (CUDA: rnnrt's GPU runner)"}
    else:
        info["device"] = (f"CPU ({platform.machine()}), rnnrt.nn.LSTM (NumPy reference) + "
                          f"torch.optim")
    return _record(cfg, log, device=info, device_label=label, data=data,
                   lstm_params=sum(p.numel() for p in lstm.parameters()), checks=[],
                   times=(t0, t_train, train_wall), state=state, vocab=corpus.vocab)


# --------------------------------------------------------------------------- sampling

def sample(flat, head, vocab, cfg: Config, n: int, temperature: float, seed: int,
           prime: str) -> str:
    """``n`` characters after ``prime``, one step at a time through the NumPy reference
    (host parameters ``flat`` / ``head``). temperature 0: greedy."""
    V = len(vocab)
    index = {c: i for i, c in enumerate(vocab)}
    prime = "".join(c for c in prime if c in index) or vocab[0]
    model = rnnrt.LSTM(V, cfg.hidden, cfg.layers, seed=0)
    model.flat[...] = flat
    eye = np.eye(V, dtype=np.float32)
    rng = np.random.default_rng(seed)
    ids = [index[c] for c in prime]
    y, hx = model.forward(eye[np.array(ids)][:, None, :], None)
    out = []
    for _ in range(n):
        logits = (y[-1, 0] @ head["weight"].T + head["bias"]).astype(np.float64)
        if temperature > 0:
            p = np.exp((logits - logits.max()) / temperature)
            nxt = int(rng.choice(V, p=p / p.sum()))
        else:
            nxt = int(np.argmax(logits))
        out.append(vocab[nxt])
        y, hx = model.forward(eye[[nxt]][:, None, :], hx)
    return prime + "".join(out)


# --------------------------------------------------------------------------- record, figure

def stem(record: dict) -> str:
    """The record's and the figure's name (rnnrt.bench.records' scheme: what, device, stamp)."""
    c = record["config"]
    slug = device_slug(record["device"].get("device", c["device"]))   # 'cpu' for any CPU
    if c.get("framework", "rnnrt") != "rnnrt":
        slug += "-" + c["framework"]
    return (f"charlm-lstm-L{c['layers']}-H{c['hidden']}-B{c['batch']}-T{c['seq']}-"
            f"S{c['steps']}-{slug}-{stamp(record['created'])}")


def plot_record(record: dict, path: Path) -> Path:
    """The loss curve of a record: per-step training loss (and its running mean), the
    validation losses, the uniform and unigram baselines; nats/char left, bits/char right."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c, d = record["config"], record["data"]
    tr = np.asarray(record["train_loss"])
    steps = np.arange(1, len(tr) + 1)
    fig, ax = plt.subplots(figsize=(8, 4.8), dpi=120)
    ax.plot(steps, tr, color="tab:blue", alpha=0.3, lw=0.8, label="train (per step)")
    w = max(1, min(25, len(tr) // 10))
    if w > 1:
        run = np.convolve(tr, np.ones(w) / w, mode="valid")
        ax.plot(steps[w - 1:], run, color="tab:blue", lw=1.6, label=f"train ({w}-step mean)")
    vs = [r["step"] for r in record["val"]]
    vl = [r["loss"] for r in record["val"]]
    ax.plot(vs, vl, "o-", color="tab:orange", lw=1.6, ms=4, label="validation")
    ax.axhline(d["uniform_nats"], color="gray", ls=":", lw=1,
               label=f"uniform guess ln V = {d['uniform_nats']:.2f}")
    ax.axhline(d["unigram_nats"], color="gray", ls="--", lw=1,
               label=f"unigram entropy {d['unigram_nats']:.2f}")
    ax.set_xlabel("training step (one chunk of B x T characters)")
    ax.set_ylabel("cross-entropy (nats/char)")
    sec = ax.secondary_yaxis("right", functions=(lambda n: n / LN2, lambda b: b * LN2))
    sec.set_ylabel("bits/char")
    ax.set_ylim(0, d["uniform_nats"] * 1.35)  # room for the legend above ln V
    ax.set_xlim(0, len(tr))
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", fontsize=8, ncol=2)
    f = record["final"]
    ax.set_title(f"{c['layers']}-layer LSTM char model on rnnrt's source: H{c['hidden']} "
                 f"B{c['batch']} T{c['seq']}, {c['optim']} lr {c['lr']:g}, clip {c['clip']:g}\n"
                 f"{record['device_label']}: val {f['val_loss']:.3f} nats "
                 f"({f['val_bits']:.2f} bits)/char after {len(tr)} steps, "
                 f"{record['wall_s']['train']:.0f} s", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------- main

def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    p.add_argument("--tiny", action="store_true", help="the CI test's small preset")
    p.add_argument("--framework", choices=("rnnrt", "torch"), default=None,
                   help="rnnrt (default): rnnrt's arrays, no framework; torch: rnnrt.nn.LSTM "
                        "with torch.optim (CPU)")
    add_config_flags(p, Config, skip=("device", "text", "framework"))
    p.add_argument("--text", nargs="+", default=None,
                   help=f"globs under the repo root (default {' '.join(DEFAULT_TEXT)})")
    p.add_argument("--figures-dir", type=Path, default=None,
                   help="default <out>/figures (<out>: ./rnnrt-out, or $RNNRT_OUT)")
    p.add_argument("--results-dir", type=Path, default=None,
                   help="default <out>/results/training")
    return p.parse_args(argv)


def config_from_args(args: argparse.Namespace) -> Config:
    return Config(**config_kwargs(args, Config, TINY if args.tiny else None))


def main(argv=None, progress=_progress) -> dict:
    """Train, sample, write the figure and the record. -> the record (with 'figure' and
    'record' paths)."""
    args = parse_args(argv)
    cfg = config_from_args(args)
    record = train(cfg, progress)
    state, vocab = record.pop("_state"), record.pop("_vocab")
    text = sample(state["flat"], state["head"], vocab, cfg, cfg.sample_chars,
                  cfg.temperature, cfg.seed, cfg.prime)
    record["sample"] = {"prime": cfg.prime, "temperature": cfg.temperature, "text": text}
    name = stem(record)
    figures = args.figures_dir if args.figures_dir is not None else figures_root()
    results = args.results_dir if args.results_dir is not None else results_root() / "training"
    record["figure"] = str(plot_record(record, Path(figures) / f"{name}.png"))
    rec_path = Path(results) / f"{name}.json"
    record["record"] = str(rec_path)
    write_json(record, rec_path)
    f = record["final"]
    progress(f"done: train {f['train_loss_tail']:.3f} nats (mean of the last "
             f"{f['tail_steps']} steps), val {f['val_loss']:.3f} nats = {f['val_bits']:.3f} "
             f"bits/char (best {f['best_val_loss']:.3f} at step {f['best_val_step']}); "
             f"{record['wall_s']['train']:.1f} s training, "
             f"{record['ms_per_step_median']:.1f} ms/step median\n"
             f"figure: {record['figure']}\nrecord: {record['record']}")
    print(f"--- sample (temperature {cfg.temperature}) ---\n{text}\n---")
    return record


if __name__ == "__main__":
    main()
