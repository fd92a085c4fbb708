"""rnnrt.nn against torch.nn on the GPU: one training step, and memory over varied lengths.

Usage (GPU, from the repo root):
    python experiments/scripts/nn_bench.py train-step [--repeats 30] [--fold on,off] [--out DIR]
    python experiments/scripts/nn_bench.py memory-varlen [--steps 1000] [--out DIR]

train-step: one training step (forward, a loss, backward, SGD step, zero_grad) of an LSTM
(2 layers, hidden 512, input 512, batch 64), through rnnrt.nn and through torch.nn (cuDNN,
fp32 with TF32 off), on (a) a fixed batch of 100 steps and (b) a packed batch of lengths
uniform in 20-200 (rnnrt.nn: a variable-length plan, a per-step active batch); CUDA events
around each step, median of --repeats after warm-up, the two modules timed in turn. Both
start from the same weights; the first step's parameters after the update are compared (fp32
tolerance). Beside them, each case's forward + backward through GpuRunner alone (CuPy arrays,
no torch): what a step costs beyond it is the module's own; with --fold on,off that twice, the
per-step backward as planned and with the split GEMM's sum a launch of its own every step
(plan/backward.py ``split_sums_unfolded``; the row's 'fold'). Record: kind 'train-step',
rows {case, impl, ms_median, ms_min, ms_max, runs}.

memory-varlen: --steps training steps of rnnrt.nn's LSTM (2 x 256, batch 32) on packed
batches whose every sequence has a random length in 1-500 (--lengths per-batch: one random
length a batch), recording GPU memory in use after each step (CuPy's pool plus torch's
allocator) and its peak; fields distinct_lengths (sequence lengths seen), patterns (distinct
bucketed plans), peak_bytes_first_100, peak_bytes_last_100, ms per step (the step alone:
the input is drawn and packed before its clock starts).
Record: kind 'memory-varlen'.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import rnnrt.nn  # noqa: E402
from rnnrt.bench.records import now_iso, record_path, versions, write_json  # noqa: E402
from rnnrt.bench.timing import time_in_turn  # noqa: E402
from rnnrt.check import compare_all, reduction_atol  # noqa: E402
from rnnrt.plan.packing import batch_sizes  # noqa: E402
from rnnrt.session import device_info  # noqa: E402


def _no_tf32():
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False


def _pair(inp, hidden, layers, seed=0):
    """(torch.nn.LSTM, rnnrt.nn.LSTM) on the GPU with the same weights."""
    torch.manual_seed(seed)
    ref = torch.nn.LSTM(inp, hidden, num_layers=layers).cuda()
    ours = rnnrt.nn.LSTM(inp, hidden, num_layers=layers).cuda()
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def _step_fn(module, inp, lr=1e-3):
    """One training step of ``module`` on ``inp`` (a tensor or a PackedSequence, made once
    by the caller: the step times the module, not making its input)."""
    opt = torch.optim.SGD(module.parameters(), lr=lr)

    def step():
        out, _ = module(inp)
        data = out.data if isinstance(out, torch.nn.utils.rnn.PackedSequence) else out
        loss = (data * data).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def train_step(repeats: int, folds=("on",)) -> dict:
    _no_tf32()
    T, B, H, L = 100, 64, 512, 2
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(T, B, H, device="cuda", generator=g)
    lengths = torch.randint(20, 201, (B,), generator=torch.Generator().manual_seed(2))
    xp = torch.randn(int(lengths.max()), B, H, device="cuda", generator=g)
    cases = {   # packed once: each timed step reuses it, as the fixed case reuses x
        "fixed-T100": x,
        "packed-lengths-20-200": torch.nn.utils.rnn.pack_padded_sequence(
            xp, lengths, enforce_sorted=False),
    }
    rows, checks = [], {}
    for case, inp in cases.items():
        ref, ours = _pair(H, H, L)
        # one step first: rnnrt.nn updates the weights as torch.nn does
        r2, o2 = _pair(H, H, L)
        _step_fn(r2, inp)()
        _step_fn(o2, inp)()
        got, want = ({n: p.detach().cpu().numpy() for n, p in m.named_parameters()}
                     for m in (o2, r2))
        checks[case] = compare_all(got, want, f"torch.nn after a step ({case})",
                                   atol=reduction_atol(T * B)).as_dict()
        fns = {"torch.nn": _step_fn(ref, inp), "rnnrt.nn": _step_fn(ours, inp)}
        times = time_in_turn(fns, repeats, torch=torch)
        for impl, t in times.items():
            rows.append({"case": case, "impl": impl, **t.as_dict(),
                         **({"check": checks[case]} if impl == "rnnrt.nn" else {})})
        for r in rows[-len(times):]:
            print(f"{case:24s} {r['impl']:9s} {r['ms_median']:8.3f} ms", flush=True)
    for case, bs in (("fixed-T100", None), ("packed-lengths-20-200", batch_sizes(lengths))):
        for fold in folds:
            rows.append(_runner_only(case, T, B, H, L, repeats, bs, fold))
            print(f"{case:24s} GpuRunner {rows[-1]['ms_median']:8.3f} ms (fwd+bwd alone, "
                  f"fold {fold})")
    return {"kind": "train-step", "shape": dict(cell="lstm", layers=L, input_size=H,
                                                hidden=H, batch=B, steps=T),
            "rows": rows, "note": "SGD step; loss mean(y^2); torch.nn fp32 with TF32 off; "
                                  "timed in turn with CUDA events"}


def _runner_only(case, T, B, H, L, repeats, batch_sizes=None, fold="on") -> dict:
    """The case's forward + backward through GpuRunner alone (CuPy arrays, no torch; a
    packed case through forward_packed): what rnnrt.nn's step costs beyond it is the
    module's own overhead. ``fold`` 'off': inside plan.backward.split_sums_unfolded (the
    split sum a launch of its own every step)."""
    import contextlib

    import cupy as cp

    import rnnrt
    from rnnrt.gpu import GpuRunner
    from rnnrt.plan.backward import split_sums_unfolded
    with split_sums_unfolded() if fold == "off" else contextlib.nullcontext():
        r = GpuRunner(rnnrt.LSTM(H, H, num_layers=L, seed=0), schedule_cache=False)
        rng = cp.random.default_rng(0)
        n = T * B if batch_sizes is None else sum(batch_sizes)
        x = rng.standard_normal((n, H), dtype=cp.float32)
        dy = cp.ones((n, H), cp.float32)

        def run():   # no dx: the modules' input needs no gradient either
            if batch_sizes is None:
                _, _, tape = r.forward(x.reshape(T, B, H), train=True)
                r.backward(tape, dy.reshape(T, B, H), need_dx=False)
            else:
                _, _, tape = r.forward_packed(x, batch_sizes, train=True)
                r.backward(tape, dy, need_dx=False)

        t = time_in_turn({"runner": run}, repeats, torch=torch)["runner"]
        steps, varlen = (T, False) if batch_sizes is None else (len(batch_sizes), True)
        return {"case": case, "impl": "GpuRunner (fwd+bwd alone)", **t.as_dict(),
                "fold": fold, "schedule": r.schedule(steps, B, True, varlen).schedule.name}


def memory_varlen(steps: int, per_batch: bool = False) -> dict:
    import time

    import cupy as cp

    from rnnrt.plan.packing import bucket
    _no_tf32()
    B, H, L = 32, 256, 2
    torch.manual_seed(0)
    m = rnnrt.nn.LSTM(H, H, num_layers=L).cuda()
    rng = np.random.default_rng(0)
    pool = cp.get_default_memory_pool()
    used, seen, patterns, ms = [], set(), set(), []
    for i in range(steps):
        lengths = (np.full(B, rng.integers(1, 501)) if per_batch
                   else rng.integers(1, 501, B))
        seen.update(lengths.tolist())
        patterns.add(bucket(batch_sizes(lengths)))
        x = torch.randn(int(lengths.max()), B, H, device="cuda")
        p = torch.nn.utils.rnn.pack_padded_sequence(x, torch.from_numpy(lengths),
                                                    enforce_sorted=False)
        torch.cuda.synchronize()   # making the input is not the step: outside the window
        t = time.perf_counter()
        out, _ = m(p)
        (out.data * out.data).mean().backward()
        for q in m.parameters():
            q.grad = None
        torch.cuda.synchronize()
        ms.append((time.perf_counter() - t) * 1e3)
        used.append(pool.used_bytes() + torch.cuda.memory_allocated())
        if (i + 1) % 100 == 0:
            print(f"step {i + 1}: {used[-1] / 2**20:.0f} MiB in use, {len(seen)} lengths, "
                  f"{len(patterns)} patterns so far, {np.median(ms[-100:]):.1f} ms a step",
                  flush=True)
    first, last = max(used[:100]), max(used[-100:])
    print(f"peak first 100 steps {first / 2**20:.0f} MiB, last 100 {last / 2**20:.0f} MiB "
          f"({last / first:.3f}x; goal <= 1.1x)")
    return {"kind": "memory-varlen", "shape": dict(cell="lstm", layers=L, input_size=H,
                                                   hidden=H, batch=B),
            "steps": steps, "lengths": "one per batch" if per_batch else "one per sequence",
            "distinct_lengths": len(seen), "patterns": len(patterns),
            "peak_bytes_first_100": first, "peak_bytes_last_100": last,
            "ratio_last_to_first": last / first, "ms_median": float(np.median(ms)),
            "ms_median_last_100": float(np.median(ms[-100:])),
            "bytes_in_use_every_10": used[::10],
            "note": "packed batches (pack_padded_sequence, enforce_sorted=False) of lengths "
                    "uniform in 1-500; GPU memory in use after each training step: CuPy's "
                    "pool (used) plus torch's allocator (allocated)"}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["train-step", "memory-varlen"])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--lengths", choices=["per-sequence", "per-batch"], default="per-sequence",
                    help="memory-varlen: a random length for each sequence, or one a batch")
    ap.add_argument("--fold", default="on",
                    help="train-step: time GpuRunner's fwd+bwd with the split sum folded into "
                         "the pointwise kernels (on) and without (off), e.g. on,off")
    ap.add_argument("--out", default=None, help="folder (default experiments/results/training)")
    a = ap.parse_args(argv)
    rec = (train_step(a.repeats, tuple(f for f in a.fold.split(",") if f))
           if a.what == "train-step"
           else memory_varlen(a.steps, a.lengths == "per-batch"))
    rec.update(created=now_iso(), command=" ".join(sys.argv), device=device_info(),
               versions=versions())
    sh = rec["shape"]   # the stem names the shape, as every record's does
    stem = f"{a.what}-{sh['cell']}-L{sh['layers']}-H{sh['hidden']}-B{sh['batch']}" + (
        f"-T{sh['steps']}" if "steps" in sh else "")
    path = record_path("training", stem, rec["device"]["device"], rec["created"],
                       root=None if a.out is None else Path(a.out).parent)
    if a.out is not None:
        path = Path(a.out) / path.name
    print(f"record: {write_json(rec, path)}")


if __name__ == "__main__":
    main()
