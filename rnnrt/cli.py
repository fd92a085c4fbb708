"""Command line: `rnnrt ladder` (the paper's Table 1 on this GPU) and `rnnrt demo`."""
from __future__ import annotations

import argparse
import sys

import numpy as np


def _input_batch(s: str):
    if s == "all":
        return "all"
    try:
        k = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive int or 'all', got {s!r}") from None
    if k < 1:
        raise argparse.ArgumentTypeError(f"expected a positive int or 'all', got {s!r}")
    return k


def _positive(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {s!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {s!r}")
    return v


def _ladder_parser(sub):
    from .bench.ladder import CPU_SIZE
    from .switches import DEFAULT_INPUT_BATCH
    p = sub.add_parser("ladder", help="verify and time every rung of the paper's ladder "
                       "beside cuDNN and the fp32 GEMM ceiling (the paper's Table 1)")
    p.add_argument("--cell", default="lstm", choices=["lstm", "gru", "rnn_tanh", "rnn_relu"])
    p.add_argument("--layers", type=_positive, default=None, help="default 4")
    p.add_argument("--hidden", type=_positive, default=None, help="default 512")
    p.add_argument("--input-size", type=_positive, default=None, help="default = hidden")
    p.add_argument("--batch", type=_positive, default=None, help="minibatch, default 64")
    p.add_argument("--steps", type=_positive, default=None, help="timesteps, default 100")
    p.add_argument("--repeats", type=_positive, default=20, help="timed runs (median taken)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--input-batch", type=_input_batch, default=DEFAULT_INPUT_BATCH,
                   help=f"steps per W.x GEMM on the input-batching rung: k or 'all' "
                        f"(default {DEFAULT_INPUT_BATCH})")
    p.add_argument("--executor", choices=["eager", "graph", "both"], default="both")
    p.add_argument("--out", default=None, help="JSON record path (default: "
                   "experiments/results/ladder-...json)")
    p.add_argument("--no-cudnn", action="store_true", help="skip the cuDNN row")
    p.add_argument("--backward", action="store_true",
                   help="time forward+backward (a training step's RNN work; FLOPs = 3x the "
                        "forward's); cuDNN through torch autograd")
    p.add_argument("--cpu", action="store_true",
                   help=f"no GPU: run the ladder on the NumPy executor at a small size "
                        f"({CPU_SIZE}); figures are labelled CPU figures")
    return p


def _cmd_ladder(a) -> int:
    from .bench.ladder import CPU_SIZE, LadderConfig, markdown_table, run_ladder, write_record
    from .device import gpu_status
    if not a.cpu:
        ok, why = gpu_status()
        if not ok:
            from .device import INSTALL_HINT
            print(f"rnnrt ladder: no usable GPU ({why}).\n  Either {INSTALL_HINT},\n  or run "
                  f"`rnnrt ladder --cpu` for the same ladder on the NumPy executor at a small "
                  f"size (CPU figures).", file=sys.stderr)
            return 2
    size = dict(CPU_SIZE) if a.cpu else dict(layers=4, hidden=512, batch=64, steps=100)
    for name in ("layers", "hidden", "batch", "steps"):
        if getattr(a, name) is not None:
            size[name] = getattr(a, name)
    if a.input_size is not None:
        size["input_size"] = a.input_size
    executors = ("eager", "graph") if a.executor == "both" else (a.executor,)
    cfg = LadderConfig(cell=a.cell, repeats=a.repeats, warmup=a.warmup,
                       input_batch=a.input_batch, executors=executors, cpu=a.cpu,
                       cudnn=not a.no_cudnn, backward=a.backward, **size)
    record = run_ladder(cfg)
    path = write_record(record, a.out)
    print(markdown_table(record))
    print(f"\nrecord: {path}")
    refused = [r for r in record["rows"] if "refused" in r]
    return 1 if refused else 0


def _cmd_demo(a) -> int:
    """A small forward + backward through the NumPy reference: output and gradient norms."""
    import rnnrt
    m = rnnrt.LSTM(a.input_size, a.hidden, num_layers=a.layers, seed=0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((a.steps, a.batch, a.input_size)).astype(np.float32)
    y, (h_n, c_n), tape = m.forward(x, train=True)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    g = m.backward(tape, dy)
    print(f"{m!r}\n  x {x.shape} -> y {y.shape}, h_n {h_n.shape}, c_n {c_n.shape}")
    print(f"  |y| = {np.linalg.norm(y):.4f}  |h_n| = {np.linalg.norm(h_n):.4f}  "
          f"|c_n| = {np.linalg.norm(c_n):.4f}")
    print(f"  |dx| = {np.linalg.norm(g.dx):.4f}  |dh0| = {np.linalg.norm(g.dh0):.4f}  "
          f"|dc0| = {np.linalg.norm(g.dc0):.4f}")
    for name, grad in g.params.items():
        print(f"  |d {name}| = {np.linalg.norm(grad):.4f}")
    print(f"  forward GEMM FLOPs (paper's convention): {m.flops(a.batch, a.steps):,}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="rnnrt", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    _ladder_parser(sub)
    d = sub.add_parser("demo", help="a small CPU forward/backward; prints output and "
                       "gradient norms")
    d.add_argument("--layers", type=_positive, default=2)
    d.add_argument("--hidden", type=_positive, default=16)
    d.add_argument("--input-size", type=_positive, default=8)
    d.add_argument("--batch", type=_positive, default=4)
    d.add_argument("--steps", type=_positive, default=10)
    a = parser.parse_args(argv)
    return {"ladder": _cmd_ladder, "demo": _cmd_demo}[a.cmd](a)


if __name__ == "__main__":
    raise SystemExit(main())
