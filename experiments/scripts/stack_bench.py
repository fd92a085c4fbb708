"""Time the stack kernel (cuda_src/persistent_stack.cu, lstm_persistent_stack_fwd: every layer of
an LSTM stack in one launch, W.x inside) against cuDNN in the same process.

Each configuration: one launch over T steps on outputs poisoned with NaN, the last layer's
h, every layer's c and the gates compared with a float64 NumPy reference (fp32 tolerance,
worst element reported), the progress counters checked back at zero; then timed with CUDA
events (warm-up, median of --repeats), beside torch.nn.LSTM (cuDNN, TF32 off) on the same
shapes. Timing variants (--variants, PK_TIMING masks: 1 no staging, 2 no FMAs, 4 no waits,
8 no pointwise) compute wrong results on purpose: timed, not checked. --define NAME=VALUE
builds the kernel with another value of an overridable constant (PS_KT, PS_NS, PK_SLACK,
PS_FAST_CELL); --trace adds one launch with the kernel's PK_TRACE timeline and prints each
layer's median step phases.

Usage (GPU): python experiments/scripts/stack_bench.py [--hidden 512] [--batch 64] [--layers 4]
             [--steps 100] [--variants 0] [--define NAME=VALUE ...] [--out PATH]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

from rnnrt import reference  # noqa: E402
from rnnrt.bench.timing import time_gpu, time_torch  # noqa: E402
from rnnrt.check import FP32_ATOL, FP32_RTOL, compare  # noqa: E402
from rnnrt.kernels.registry import get_kernel  # noqa: E402
from rnnrt.kernels.sources import source  # noqa: E402
from rnnrt.kernels.stack import stack_fit  # noqa: E402
from rnnrt.session import GpuSession  # noqa: E402


def expected(x, wih, whh, bih, bhh, h0, c0):
    """float64 reference (rnnrt.reference) of the stack: x [T, B, H]; wih, whh [L, 4H, H];
    bih, bhh [L, 4H]; h0, c0 [L, B, H] -> h, c [L, T, B, H], act [L, T, B, 4H]."""
    f64 = np.float64
    params = [{"weight_ih": w.astype(f64), "weight_hh": r.astype(f64),
               "bias_ih": bi.astype(f64), "bias_hh": bh.astype(f64)}
              for w, r, bi, bh in zip(wih, whh, bih, bhh)]
    _, _, _, cache = reference.forward("lstm", params, x.astype(f64), h0.astype(f64),
                                       c0.astype(f64))
    return cache.sequences()


FORWARD_PHASES = ("top wait", "W tiles to own wait", "own wait", "rest of K loop",
                  "reduce+pointwise+count")
"""The stack kernel's phases between its PK_TRACE points 0..5 (persistent_stack.cu)."""


def timeline(cp, mod, run, stream, L, blocks, T, phases=FORWARD_PHASES):
    """One more launch with the kernel's PK_TRACE notes (persistent_common.cuh, PS_NOTE):
    per layer, the medians over its blocks and steps 5..min(T, 128)-5 of the step period
    and of each phase between its points (us; ``phases``: their names, the kernel's), printed
    and returned."""
    nblk, steps, points = 160, 128, 6   # PS_TRACE_BLOCKS, _STEPS, _POINTS
    if blocks > nblk:
        raise SystemExit(f"--trace: {blocks} blocks > the trace's {nblk}")
    ptr = mod.get_global("pk_trace")
    buf = cp.ndarray((nblk, steps, points), cp.uint64, ptr)
    buf.fill(0)
    cp.cuda.Device().synchronize()   # (CuPy's current stream; run() launches on another)
    run()
    stream.synchronize()
    tr = cp.asnumpy(buf)[:blocks].astype(np.int64)
    n = min(T, steps)
    nb = blocks // L
    out = {}
    names = ("period",) + tuple(phases)
    print("layer " + "".join(f"{k:>24}" for k in names))
    for layer in range(L):
        x = tr[layer * nb:(layer + 1) * nb, 5:n - 5] / 1e3
        v = [np.median(np.diff(x[:, :, 0], axis=1))] + [
            np.median(x[..., p + 1] - x[..., p]) for p in range(points - 1)]
        out[layer] = dict(zip(names, map(float, v)))
        print(f"{layer:>5} " + "".join(f"{e:24.2f}" for e in v))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--variants", default="0")
    ap.add_argument("--define", action="append", default=[],
                    help="NAME=VALUE for the kernel's build (e.g. PK_SLACK=2); repeatable")
    ap.add_argument("--trace", action="store_true",
                    help="build with PK_TRACE and print each layer's median step timeline")
    ap.add_argument("--no-cudnn", action="store_true")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    session = GpuSession()   # CuPy and the device's facts; the kernel built here with -D
    cp = session.cp
    H, B, L, T = a.hidden, a.batch, a.layers, a.steps
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    fit = stack_fit("lstm", H, B, L, H, props, steps=T)
    print(fit.describe())
    if not fit.ok:
        raise SystemExit(f"the stack kernel declines this shape: {fit.reason}")
    rng = np.random.default_rng(0)
    f32 = np.float32
    x = rng.standard_normal((T, B, H)).astype(f32)
    wih = (rng.standard_normal((L, 4 * H, H)) / np.sqrt(H)).astype(f32)
    whh = (rng.standard_normal((L, 4 * H, H)) / np.sqrt(H)).astype(f32)
    bih = (0.1 * rng.standard_normal((L, 4 * H))).astype(f32)
    bhh = (0.1 * rng.standard_normal((L, 4 * H))).astype(f32)
    h0 = rng.standard_normal((L, B, H)).astype(f32)
    c0 = rng.standard_normal((L, B, H)).astype(f32)
    ref_h, ref_c, ref_act = expected(x, wih, whh, bih, bhh, h0, c0)

    stream = cp.cuda.Stream(non_blocking=True)
    d_x, d_wih, d_whh = cp.asarray(x), cp.asarray(wih), cp.asarray(whh)
    d_bih, d_bhh = cp.asarray(bih), cp.asarray(bhh)
    d_h = cp.full((L, T + 1, B, H), np.nan, f32)
    d_c = cp.full((L, T + 1, B, H), np.nan, f32)
    d_act = cp.full((L, T, B, 4 * H), np.nan, f32)
    d_sync = cp.zeros(2 * L, cp.uint32)
    # the kernel's scratch (W^T, the k-major inputs), shaped by its registry entry
    outs, _ = get_kernel(fit.kernel).arg_shapes(B, H, **fit.scalars(T))
    wt_shape, ht_shape = outs[-2:]
    d_wt, d_ht = cp.full(wt_shape, np.nan, f32), cp.full(ht_shape, np.nan, f32)
    grid, block, smem = fit.grid, fit.block, fit.smem_bytes
    rows = []
    for variant in [int(v) for v in a.variants.split(",")]:
        mod = cp.RawModule(code=source("persistent_stack.cu"),
                           options=("-std=c++17", f"-DPK_TIMING={variant}",
                                    *(("-DPK_TRACE",) if a.trace else ()),
                                    *(f"-D{d}" for d in a.define)))
        k = mod.get_function("lstm_persistent_stack_fwd")
        k.max_dynamic_shared_size_bytes = smem
        args = (np.int32(B), np.int32(H), d_h, np.int32(H), d_c, np.int32(H), d_act,
                np.int32(4 * H), d_sync, np.int32(2 * L), d_wt, np.int32(wt_shape[1]),
                d_ht, np.int32(ht_shape[1]), d_x, np.int32(H), d_wih,
                np.int32(4 * H * H), d_whh, np.int32(4 * H * H), d_bih, np.int32(4 * H),
                d_bhh, np.int32(4 * H), np.int32(T), np.int32(L), np.int32(fit.units_per_block))

        def run():
            k(grid, block, args, shared_mem=smem, stream=stream)

        d_h[:, 1:] = np.nan
        d_c[:, 1:] = np.nan
        d_act[:] = np.nan
        d_h[:, 0] = cp.asarray(h0)
        d_c[:, 0] = cp.asarray(c0)
        # the fills ran on CuPy's current stream: the non-blocking launch stream does not wait
        cp.cuda.Device().synchronize()
        run()
        stream.synchronize()
        row = dict(variant=variant, defines=a.define, hidden=H, batch=B, layers=L, steps=T,
                   units_per_block=fit.units_per_block, grid=grid[0], smem=smem)
        if variant == 0:
            worst = 0.0
            for name, got, ref in (("h", d_h[:, 1:], ref_h), ("c", d_c[:, 1:], ref_c),
                                   ("act", d_act, ref_act)):
                r = compare(cp.asnumpy(got), ref, FP32_ATOL, FP32_RTOL, name=name)
                print(f"  {name}: {r}")
                if not r.ok:
                    raise SystemExit(f"stack kernel wrong in {name}: {r}")
                worst = max(worst, r.max_abs_err)
            if int(cp.asnumpy(d_sync).max()) != 0:
                raise SystemExit(f"counters not reset: {cp.asnumpy(d_sync)}")
            row["max_abs_err"] = worst
        tm = time_gpu(cp, run, stream, repeats=a.repeats)
        if a.trace:
            row["trace"] = timeline(cp, mod, run, stream, L, grid[0], T)
        row["ms"] = tm.ms_median
        row["us_per_wavefront_step"] = 1e3 * tm.ms_median / (T + L - 1)
        row["tflops"] = 2 * 4 * H * 2 * H * B * T * L / (tm.ms_median * 1e-3) / 1e12
        rows.append(row)
    cudnn = None
    if not a.no_cudnn:
        import torch
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
        m = torch.nn.LSTM(H, H, L).cuda()
        tx = torch.randn(T, B, H, device="cuda")
        with torch.no_grad():
            cudnn = time_torch(torch, lambda: m(tx), repeats=a.repeats).ms_median
    print(f"{'variant':>7} {'ms':>8} {'us/wstep':>9} {'TFLOPS':>7} {'vs cuDNN':>8}")
    for r in rows:
        ratio = f"{cudnn / r['ms']:.2f}x" if cudnn else "-"
        r["cudnn_ms"] = cudnn
        print(f"{r['variant']:>7} {r['ms']:8.3f} {r['us_per_wavefront_step']:9.2f} "
              f"{r['tflops']:7.2f} {ratio:>8}")
    if cudnn:
        print(f"cuDNN {cudnn:.3f} ms")
    if a.out:
        Path(a.out).write_text(json.dumps(dict(device=session.info, rows=rows), indent=1))


if __name__ == "__main__":
    main()
