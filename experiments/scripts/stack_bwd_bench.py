"""Time the stack backward (every layer's LSTM backward chain in one launch, dx = dg W inside)
alone, checked first: the kernel its fit takes (cuda_src/persistent_stack_bwd_pair.cu,
lstm_persistent_stack_bwd_pair, in cluster pairs, where the device has clusters), or with
--single the one-block kernel (persistent_stack_bwd.cu, lstm_persistent_stack_bwd).

One launch over T steps on outputs poisoned with NaN, after a float64 forward (rnnrt.reference)
whose act and c it reads: dx, dh0, dc0 and every weight and bias gradient derived from its dg
(float64 GEMMs here, as the plan's after the launch) compared with the reference backward (fp32
tolerance, worst element reported), the progress counters checked back at zero; then timed with
CUDA events (warm-up, median of --repeats). Timing variants (--variants, PK_TIMING masks: 1 no
staging, 2 no FMAs, 4 no waits, 8 no pointwise) compute wrong results on purpose: timed, not
checked. --define NAME=VALUE builds the kernel with another value of an overridable constant
(SB_NS: the stages; SB_KT: k rows a stage, a multiple of 64; the shared memory follows: at H
512, SB_KT=128 fits with SB_NS=2; the pair kernel's: SP_NS, SP_BULK=1 its dg^T by bulk
copies of the TMA engine, SP_WPRE=1 the first tiles' W parts before the wait for dg_t,
SP_DXW=1 the dx count by warp 7); --trace adds one launch with the kernel's PK_TRACE timeline
and prints each layer's median step phases (stack_bench.py's reader). The whole training step against cuDNN: backward_probe.py --backwards.

Usage (GPU): python experiments/scripts/stack_bwd_bench.py [--hidden 512] [--batch 64]
             [--layers 4] [--steps 100] [--variants 0] [--define NAME=VALUE ...] [--trace]
             [--single] [--out PATH]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

from rnnrt import reference  # noqa: E402
from rnnrt.bench.timing import time_gpu  # noqa: E402
from rnnrt.check import FP32_ATOL, FP32_RTOL, compare, reduction_atol  # noqa: E402
from rnnrt.kernels.registry import get_kernel  # noqa: E402
from rnnrt.kernels.sources import source  # noqa: E402
from rnnrt.kernels.stack_bwd import (SB_KT, SB_NS, SP_NS, stack_bwd_fit,  # noqa: E402
                                     stack_bwd_pair_smem_bytes, stack_bwd_smem_bytes)
from rnnrt.session import GpuSession  # noqa: E402
from stack_bench import timeline  # noqa: E402 (this folder: the scripts' sys.path[0])

PHASES = ("above wait", "pointwise+dg count", "own wait", "K loop",
          "reduce+dx+count")
"""The stack backward's phases between its PK_TRACE points 0..5 (persistent_stack_bwd.cu)."""


def case(T, B, H, L, seed=0):
    """Random fp32 weights, inputs, output gradients; the float64 forward's act and c
    (rounded to fp32, and the reference's cache holding the rounded values) and the
    reference gradients. -> (arrays dict, reference dict)."""
    rng = np.random.default_rng(seed)
    f32, f64 = np.float32, np.float64
    W = (rng.standard_normal((L, 4 * H, H)) / np.sqrt(H)).astype(f32)
    R = (rng.standard_normal((L, 4 * H, H)) / np.sqrt(H)).astype(f32)
    bi = (0.1 * rng.standard_normal((L, 4 * H))).astype(f32)
    bh = (0.1 * rng.standard_normal((L, 4 * H))).astype(f32)
    x = rng.standard_normal((T, B, H)).astype(f32)
    h0, c0 = (rng.standard_normal((2, L, B, H)) * 0.5).astype(f32)
    dy = rng.standard_normal((T, B, H)).astype(f32)
    dhn, dcn = rng.standard_normal((2, L, B, H)).astype(f32)
    p = [{"weight_ih": W[n].astype(f64), "weight_hh": R[n].astype(f64),
          "bias_ih": bi[n].astype(f64), "bias_hh": bh[n].astype(f64)} for n in range(L)]
    _, _, _, cache = reference.forward("lstm", p, x.astype(f64), h0.astype(f64), c0.astype(f64))
    act = np.stack([lc.gates for lc in cache.layers]).astype(f32)
    c = np.stack([lc.c for lc in cache.layers]).astype(f32)
    for n, lc in enumerate(cache.layers):   # the kernel reads them as stored
        lc.gates[...], lc.c[...] = act[n], c[n]
    g = reference.backward("lstm", p, cache, dy.astype(f64), dhn.astype(f64), dcn.astype(f64))
    xs = [lc.x.reshape(T * B, -1) for lc in cache.layers]
    hs = [lc.h[:-1].reshape(T * B, -1) for lc in cache.layers]
    return (dict(W=W, R=R, dy=dy, dhn=dhn, dcn=dcn, act=act, c=c),
            dict(g=g, xs=xs, hs=hs))


def check(dgx, dx, dh0, dc0, ref, T, B):
    """The kernel's outputs against the reference: dx, dh0, dc0, and dW, dR, the biases
    from its dg [L, T*B, 4H]. -> the worst absolute error."""
    worst = 0.0
    g = ref["g"]
    pairs = [("dx", dx, g["dx"]), ("dh0", dh0, g["dh0"]), ("dc0", dc0, g["dc0"])]
    for n, d in enumerate(dgx.astype(np.float64)):
        got = {"weight_ih": d.T @ ref["xs"][n], "weight_hh": d.T @ ref["hs"][n],
               "bias_ih": d.sum(0), "bias_hh": d.sum(0)}
        pairs += [(f"layer {n} {k}", v, g["params"][n][k]) for k, v in got.items()]
    for name, got, want in pairs:
        atol = reduction_atol(T * B) if name.startswith("layer") else FP32_ATOL
        r = compare(got, want, atol, FP32_RTOL, name=name)
        if not r.ok:
            raise SystemExit(f"stack backward wrong in {name}: {r}")
        worst = max(worst, r.max_abs_err)
    print(f"  every gradient within fp32 tolerance; worst |err| {worst:.3g}")
    return worst


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--variants", default="0")
    ap.add_argument("--define", action="append", default=[],
                    help="NAME=VALUE for the kernel's build (e.g. SB_NS=4); repeatable")
    ap.add_argument("--trace", action="store_true",
                    help="build with PK_TRACE and print each layer's median step timeline")
    ap.add_argument("--single", action="store_true",
                    help="the one-block kernel even where the cluster pairs fit")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    session = GpuSession()   # CuPy and the device's facts; the kernel built here with -D
    cp = session.cp
    H, B, L, T = a.hidden, a.batch, a.layers, a.steps
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    fit = stack_bwd_fit("lstm", H, B, L, H, props, steps=T, pairs=not a.single)
    print(fit.describe())
    if not fit.ok:
        raise SystemExit(f"the stack backward declines this shape: {fit.reason}")
    arrays, ref = case(T, B, H, L)
    f32 = np.float32
    stream = cp.cuda.Stream(non_blocking=True)
    d = {k: cp.asarray(v) for k, v in arrays.items()}
    outs, _ = get_kernel(fit.kernel).arg_shapes(B, H, **fit.scalars(T))
    d_dgx, d_dhin, d_dx, d_dh0, d_dc0 = (cp.full(s, np.nan, f32) for s in outs[:5])
    d_sync = cp.zeros(outs[5], cp.uint32)
    d_dgt = cp.full(outs[6], np.nan, f32)
    grid, block, smem = fit.grid, fit.block, fit.smem_bytes
    defined = dict(x.split("=", 1) for x in a.define)
    if "SB_NS" in defined or "SB_KT" in defined:   # the stages the build will have
        kt, ns = int(defined.get("SB_KT", SB_KT)), int(defined.get("SB_NS", SB_NS))
        smem = stack_bwd_smem_bytes(H, kt, ns)
        print(f"  shared memory for SB_KT {kt}, SB_NS {ns}: {smem} bytes")
    if fit.pair and ("SP_NS" in defined or "SP_BULK" in defined):
        smem = stack_bwd_pair_smem_bytes(H, int(defined.get("SP_NS", SP_NS)),
                                         bulk=defined.get("SP_BULK", "0") != "0")
        print(f"  shared memory for {' '.join(a.define)}: {smem} bytes")
    ld = np.int32
    rows = []
    for variant in [int(v) for v in a.variants.split(",")]:
        mod = cp.RawModule(code=source(get_kernel(fit.kernel).file),
                           options=("-std=c++17", f"-DPK_TIMING={variant}",
                                    *(("-DPK_TRACE",) if a.trace else ()),
                                    *(f"-D{x}" for x in a.define)))
        k = mod.get_function(fit.kernel)
        k.max_dynamic_shared_size_bytes = smem
        args = (ld(B), ld(H), d_dgx, ld(4 * H), d_dhin, ld(H), d_dx, ld(H), d_dh0, ld(H),
                d_dc0, ld(H), d_sync, ld(2 * L), d_dgt, ld(outs[6][1]), d["dhn"], ld(H),
                d["dcn"], ld(H), d["act"], ld(4 * H), d["c"], ld(H), d["W"], ld(4 * H * H),
                d["R"], ld(4 * H * H), ld(T), ld(L), ld(fit.units_per_block))

        def run():
            k(grid, block, args, shared_mem=smem, stream=stream)

        for buf in (d_dgx, d_dhin, d_dx, d_dh0, d_dc0, d_dgt):
            buf.fill(np.nan)
        d_dhin.reshape(L, T * B, H)[L - 1] = d["dy"].reshape(T * B, H)   # the top's: dy
        # the fills ran on CuPy's current stream, which the non-blocking launch stream does not
        # wait for: the whole device, or a late fill overwrites the kernel's outputs (its
        # first run read NaN dx that way)
        cp.cuda.Device().synchronize()
        run()
        stream.synchronize()
        row = dict(variant=variant, kernel=fit.kernel, defines=a.define, hidden=H, batch=B,
                   layers=L, steps=T, grid=grid[0], smem=smem)
        if variant == 0:
            row["max_abs_err"] = check(cp.asnumpy(d_dgx).reshape(L, T * B, 4 * H),
                                       cp.asnumpy(d_dx).reshape(T, B, H),
                                       cp.asnumpy(d_dh0).reshape(L, B, H),
                                       cp.asnumpy(d_dc0).reshape(L, B, H), ref, T, B)
            if int(cp.asnumpy(d_sync).max()) != 0:
                raise SystemExit(f"counters not reset: {cp.asnumpy(d_sync)}")
        tm = time_gpu(cp, run, stream, repeats=a.repeats)
        if a.trace:
            row["trace"] = timeline(cp, mod, run, stream, L, grid[0], T, PHASES)
        row["ms"] = tm.ms_median
        row["us_per_wavefront_step"] = 1e3 * tm.ms_median / (T + L - 1)
        # dh = dg R and dx = dg W a layer a step
        row["tflops"] = 2 * 2 * 4 * H * H * B * T * L / (tm.ms_median * 1e-3) / 1e12
        rows.append(row)
    print(f"{'variant':>7} {'ms':>8} {'us/wstep':>9} {'TFLOPS':>7}")
    for r in rows:
        print(f"{r['variant']:>7} {r['ms']:8.3f} {r['us_per_wavefront_step']:9.2f} "
              f"{r['tflops']:7.2f}")
    if a.out:
        Path(a.out).write_text(json.dumps(dict(device=session.info, rows=rows), indent=1))


if __name__ == "__main__":
    main()
