"""The character model's parts that are not the LSTM, for examples/train_charlm.py: the corpus
(rnnrt's own text, split into training and validation streams), the output head (H -> V
projection, softmax cross-entropy and its gradient), global-norm clipping, Adam and SGD --
all on one array module ``xp`` (NumPy or CuPy). Array shapes are in each docstring. And the
command line both scripts build from their Config dataclass (``add_config_flags``,
``config_kwargs``)."""
from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np


# --------------------------------------------------------------------------- data

@dataclass(frozen=True)
class Corpus:
    """The text as integer ids. files: repo-relative paths in reading order; vocab: the
    characters, sorted (id = index); train / val: int32 ids; sha256 of the UTF-8 text."""

    files: tuple[str, ...]
    chars: int
    sha256: str
    vocab: tuple[str, ...]
    train: np.ndarray
    val: np.ndarray


def load_corpus(root: Path, patterns, val_frac: float) -> Corpus:
    """Concatenate the files matching ``patterns`` (globs under ``root``, each sorted,
    duplicates dropped) with a newline between files; split off the last ``val_frac``."""
    paths = []
    for pat in patterns:
        for p in sorted(root.glob(pat)):
            if p.is_file() and p not in paths:
                paths.append(p)
    if not paths:
        raise FileNotFoundError(f"text: no file under {root} matches {list(patterns)}")
    text = "\n".join(p.read_text(encoding="utf-8") for p in paths)
    vocab = tuple(sorted(set(text)))
    index = {c: i for i, c in enumerate(vocab)}
    ids = np.fromiter((index[c] for c in text), dtype=np.int32, count=len(text))
    if not 0 < val_frac < 1:
        raise ValueError(f"val_frac: expected a fraction in (0, 1), got {val_frac}")
    n_val = int(len(ids) * val_frac)
    return Corpus(tuple(str(p.relative_to(root)) for p in paths), len(text),
                  hashlib.sha256(text.encode("utf-8")).hexdigest(), vocab,
                  ids[:len(ids) - n_val], ids[len(ids) - n_val:])


def stream_matrix(ids: np.ndarray, batch: int, seq: int, what: str) -> np.ndarray:
    """[B, N] int32: ``ids`` cut into B contiguous streams (the remainder dropped). Chunk k
    of a pass is columns [k*T, k*T + T + 1): inputs the first T, targets the last T."""
    n = len(ids) // batch
    if n < seq + 1:
        raise ValueError(f"{what}: {len(ids)} characters make streams of {n} for batch "
                         f"{batch}, fewer than one chunk of seq + 1 = {seq + 1}; lower "
                         f"--batch or --seq, or use more text")
    return np.ascontiguousarray(ids[:batch * n].reshape(batch, n))


def unigram_entropy(ids: np.ndarray, vocab_size: int) -> float:
    """Entropy (nats/char) of the characters' frequencies: the loss of a model that has
    learnt the frequencies and nothing about order."""
    p = np.bincount(ids, minlength=vocab_size) / len(ids)
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


def chunk(xp, streams, k: int, seq: int, eye):
    """Chunk k: x [T, B, V] one-hot (eye's dtype), targets [T*B] ids in y's time-major order."""
    c = streams[:, k * seq:k * seq + seq + 1]
    return eye[c[:, :seq].T], xp.ascontiguousarray(c[:, 1:].T).reshape(-1)


# --------------------------------------------------------------------------- head

def init_head(rng, hidden: int, vocab: int, dtype) -> dict:
    """The output projection, torch.nn.Linear's initialisation: weight [V, H] and bias [V]
    uniform in [-1/sqrt(H), 1/sqrt(H)] (NumPy arrays)."""
    bound = 1.0 / math.sqrt(hidden)
    return {"weight": rng.uniform(-bound, bound, (vocab, hidden)).astype(dtype),
            "bias": rng.uniform(-bound, bound, (vocab,)).astype(dtype)}


def log_softmax(xp, y, head):
    """y [T, B, H] -> log-probabilities [T*B, V] (rows in y's time-major order)."""
    T, B, H = y.shape
    logits = y.reshape(T * B, H) @ head["weight"].T + head["bias"]
    logits -= logits.max(axis=1, keepdims=True)
    return logits - xp.log(xp.exp(logits).sum(axis=1, keepdims=True))


def head_loss(xp, y, head, targets):
    """Mean cross-entropy (nats/char, a 0-d array) of the head on y [T, B, H]."""
    logp = log_softmax(xp, y, head)
    return -logp[xp.arange(logp.shape[0]), targets].mean()


def head_loss_grads(xp, y, head, targets):
    """Mean cross-entropy of the head and its gradients.

    y: [T, B, H] the LSTM's output; head: {'weight' [V, H], 'bias' [V]}; targets: [T*B] ids
    -> (loss 0-d, dy [T, B, H], {'weight': dW [V, H], 'bias': db [V]}), all in y's dtype.
    d loss / d logits = (softmax - onehot(target)) / (T*B).
    """
    T, B, H = y.shape
    n = T * B
    yf = y.reshape(n, H)
    logp = log_softmax(xp, y, head)
    rows = xp.arange(n)
    loss = -logp[rows, targets].mean()
    dlogits = xp.exp(logp)
    dlogits[rows, targets] -= 1
    dlogits *= 1.0 / n
    grads = {"weight": dlogits.T @ yf, "bias": dlogits.sum(axis=0)}
    dy = (dlogits @ head["weight"]).reshape(T, B, H)
    return loss, dy, grads


def loss_and_grads(backend, head, x, targets, hx):
    """One chunk of truncated BPTT: training forward from hx, head, backward with no
    gradient into the final state (the next chunk's hx is a constant to it).

    -> (loss 0-d, flat gradient [layout.size], head gradients, (h_n, c_n))
    """
    y, (h_n, c_n), tape = backend.forward(x, hx, train=True)
    loss, dy, dhead = head_loss_grads(backend.xp, y, head, targets)
    g = backend.backward(tape, dy)
    return loss, g.flat, dhead, (h_n, c_n)


# --------------------------------------------------------------------------- optimiser

def clip_global_norm(xp, grads, max_norm: float):
    """Scale ``grads`` in place so their joint L2 norm is at most ``max_norm`` (0: leave
    them). -> the norm before clipping (0-d; no host synchronisation)."""
    norm = xp.sqrt(sum(xp.sum(g * g) for g in grads))
    if max_norm > 0:
        scale = xp.minimum(1.0, max_norm / (norm + 1e-6))
        for g in grads:
            g *= scale.astype(g.dtype)
    return norm


class Adam:
    """Adam (torch.optim.Adam's formula, no weight decay) on a list of arrays, in place.

    Zero-gradient elements never move (m = v = 0 there), so the flat buffer's padding stays
    zero."""

    def __init__(self, xp, params, lr, beta1, beta2, eps):
        self.xp, self.params, self.lr = xp, params, lr
        self.b1, self.b2, self.eps = beta1, beta2, eps
        self.m = [xp.zeros_like(p) for p in params]
        self.v = [xp.zeros_like(p) for p in params]
        self.t = 0

    def step(self, grads):
        self.t += 1
        bc1 = 1.0 - self.b1 ** self.t
        bc2 = 1.0 - self.b2 ** self.t
        for p, g, m, v in zip(self.params, grads, self.m, self.v):
            m *= self.b1
            m += (1.0 - self.b1) * g
            v *= self.b2
            v += (1.0 - self.b2) * (g * g)
            p -= (self.lr / bc1) * m / (self.xp.sqrt(v) * (1.0 / math.sqrt(bc2)) + self.eps)


class SGD:
    """Plain SGD, in place."""

    def __init__(self, xp, params, lr):
        self.params, self.lr = params, lr

    def step(self, grads):
        for p, g in zip(self.params, grads):
            p -= self.lr * g


# --------------------------------------------------------------------------- command line

def add_config_flags(parser, config_cls, skip=(), choices=None) -> None:
    """A --flag for each field of the dataclass ``config_cls`` but those in ``skip`` (its
    name, underscores as dashes), typed as the field's default is, default None (so the
    Config's own default, named in the help, applies); ``choices``: {field: its values}."""
    for f in dataclasses.fields(config_cls):
        if f.name in skip:
            continue
        extra = {"choices": choices[f.name]} if choices and f.name in choices else {}
        parser.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=None,
                            help=f"default {f.default!r}", **extra)


def config_kwargs(args, config_cls, base=None, skip=()) -> dict:
    """``base`` (a preset's fields) updated with every field of ``config_cls`` but ``skip``
    that ``args`` (argparse's namespace) gives, not None; 'text' (globs) as a tuple."""
    kw = dict(base or {})
    for f in dataclasses.fields(config_cls):
        v = getattr(args, f.name, None)
        if v is not None and f.name not in skip:
            kw[f.name] = tuple(v) if f.name == "text" else v
    return kw
