"""Does cuBLAS's default choice of fp32 GEMM kernel leave time on the table at the GEMM-bound
points of the wide grid? The wide grid's LSTM L4 forward at B 256 (H 512-2048) runs at
0.96-0.99x cuDNN fp32 on the H200 (and on the H100): there our per-step GEMMs (cublasSgemm,
the heuristic's kernel) already add up to no more GPU time than cuDNN's, whose R.h at H 2048 is
a CUTLASS SIMT 256x128 tile where ours is a 128x128 one.

For each GEMM of the forward (R.h of one step: out [B, 4H] = h [B, H] R^T, as stored ('tn') and
pre-transposed ('nn'); W.x of a 2- and a 10-step chunk), this times cublasSgemm (the default)
and every algorithm cublasLt's heuristic offers for the same fp32 problem (compute
CUBLAS_COMPUTE_32F: FMA kernels, no TF32), each alone and as four copies on four streams at
once (the wavefront's layers), CUDA events, warm-up, median. Each algorithm's result is checked
against the default's (same math: fp32 FMAs; the order of the sum may differ, so within 1e-5
of the terms' magnitude).

Usage (GPU): python experiments/scripts/gemm_algos_bench.py [--out DIR] [--repeats 20]
Prints a table last; writes `kernels/gemm-algos-bench-<device>-<stamp>.json` under --out.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rnnrt.bench.records import now_iso, record_path, versions, write_json  # noqa: E402
from rnnrt.bench.timing import time_gpu  # noqa: E402

WORKSPACE = 32 << 20
HEURISTIC_RESULTS = 32


def problems():
    """(label, M, N, K, pretransposed): row-major out[N, M] = in[N, K] @ W^T (W [M, K]) or,
    pre-transposed, @ Wt (Wt [K, M])."""
    out = []
    for H, B in ((2048, 256), (1024, 256), (512, 256), (2048, 128), (1024, 128)):
        out.append((f"R.h H{H} B{B} tn", 4 * H, B, H, False))
        out.append((f"R.h H{H} B{B} nn", 4 * H, B, H, True))
        out.append((f"W.x 2 steps H{H} B{B} tn", 4 * H, 2 * B, H, False))
        out.append((f"W.x 10 steps H{H} B{B} nn", 4 * H, 10 * B, H, True))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--max-algos", type=int, default=12)
    a = ap.parse_args(argv)
    import cupy as cp
    from rnnrt.exec.cublas import CublasHandle, cublas_version
    props = cp.cuda.runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    from rnnrt.exec.cublaslt import TILES, LtHandle, LtProblem
    lth = LtHandle()
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(4)]
    wss = [cp.empty(WORKSPACE, dtype=cp.uint8) for _ in range(4)]
    handles = [CublasHandle(s.ptr, w.data.ptr, WORKSPACE) for s, w in zip(streams, wss)]
    main_s = streams[0]
    ev_start = cp.cuda.Event(disable_timing=True)
    ev_joins = [cp.cuda.Event(disable_timing=True) for _ in streams[1:]]

    def four(calls):
        """calls[i]() on stream i, the four at once; joined on stream 0."""
        ev_start.record(main_s)
        for s, c in zip(streams, calls):
            s.wait_event(ev_start)
            c()
        for s, e in zip(streams[1:], ev_joins):
            e.record(s)
            main_s.wait_event(e)

    rng = np.random.default_rng(0)
    rows = []
    for label, M, N, K, pre in problems():
        X = [cp.asarray(rng.uniform(-1, 1, (N, K)).astype(np.float32)) for _ in range(4)]
        W = cp.asarray(rng.uniform(-1, 1, (K, M) if pre else (M, K)).astype(np.float32))
        outs = [cp.empty((N, M), dtype=cp.float32) for _ in range(4)]
        mag = (cp.abs(X[0]) @ (cp.abs(W) if pre else cp.abs(W).T)).astype(cp.float32)
        # row-major out[N, M] = X @ op(W): op(W) = W^T as stored, Wt pre-transposed
        w_ld = M if pre else K
        prep = [h.prepare_gemm(o.data.ptr, M, x.data.ptr, K, W.data.ptr, w_ld, M, N, K,
                               trans_b=not pre) for h, o, x in zip(handles, outs, X)]
        default = [lambda h=h, p=q: h.gemm(p) for h, q in zip(handles, prep)]
        lp = LtProblem(lth, M, N, K, False, not pre, K, w_ld, M)
        flops = 2.0 * M * N * K

        default[0]()
        main_s.synchronize()
        ref = outs[0].copy()
        t1 = time_gpu(cp, default[0], main_s, a.repeats, 3)
        t4 = time_gpu(cp, lambda: four(default), main_s, a.repeats, 3)
        base = {"shape": label, "M": M, "N": N, "K": K, "variant": "cublasSgemm",
                "ms_alone": t1.ms_median, "ms_four_streams": t4.ms_median,
                "tflops_alone": flops / t1.ms_median / 1e9,
                "tflops_four_streams": 4 * flops / t4.ms_median / 1e9}
        rows.append(base)
        for j, algo in enumerate(lp.algos(HEURISTIC_RESULTS, WORKSPACE)[:a.max_algos]):
            calls = [lp.prepare(algo, o.data.ptr, x.data.ptr, W.data.ptr, 1.0, 0.0,
                                w.data.ptr, WORKSPACE, s.ptr)
                     for o, x, w, s in zip(outs, X, wss, streams)]
            outs[0].fill(cp.nan)
            calls[0]()
            main_s.synchronize()
            err = float(cp.max(cp.abs(outs[0] - ref) / mag))
            t1 = time_gpu(cp, calls[0], main_s, a.repeats, 3)
            t4 = time_gpu(cp, lambda: four(calls), main_s, a.repeats, 3)
            rows.append({"shape": label, "M": M, "N": N, "K": K, "variant": f"lt#{j}",
                         **algo.config, "tile_name": TILES.get(algo.config["tile"],
                                                               str(algo.config["tile"])),
                         "waves": algo.waves, "workspace": algo.workspace,
                         "ms_alone": t1.ms_median, "ms_four_streams": t4.ms_median,
                         "tflops_alone": flops / t1.ms_median / 1e9,
                         "tflops_four_streams": 4 * flops / t4.ms_median / 1e9,
                         "x_default_alone": base["ms_alone"] / t1.ms_median,
                         "x_default_four": base["ms_four_streams"] / t4.ms_median,
                         "worst_err_vs_default": err, "check_ok": bool(err <= 1e-5)})
        lp.close()
        cp.get_default_memory_pool().free_all_blocks()
    for h in handles:
        h.close()
    lth.close()
    created = now_iso()
    rec = {"schema": "rnnrt.gemm_algos_bench/1", "kind": "gemm_algos_bench", "created": created,
           "command": "experiments/scripts/gemm_algos_bench.py " + " ".join(argv or sys.argv[1:]),
           "device": {"device": name, "sm_count": int(props["multiProcessorCount"])},
           "versions": {**versions(cp), "cublas": cublas_version()}, "rows": rows}
    if a.out:
        p = write_json(rec, record_path("kernels", "gemm-algos-bench", name, created,
                                        root=a.out))
        print("wrote", p)
    print(f"{'shape':28s} {'variant':12s} {'tile':8s} {'sk':>3s} {'alone ms':>9s} {'TF':>5s} "
          f"{'x def':>6s} {'4 str ms':>9s} {'TF':>5s} {'x def':>6s} ok")
    for r in rows:
        if r["variant"] == "cublasSgemm":
            print(f"{r['shape']:28s} {'default':12s} {'':8s} {'':>3s} {r['ms_alone']:9.4f} "
                  f"{r['tflops_alone']:5.1f} {'':6s} {r['ms_four_streams']:9.4f} "
                  f"{r['tflops_four_streams']:5.1f}")
        else:
            print(f"{'':28s} {r['variant']:12s} {r['tile_name']:8s} {r['splitk'] or 0:3d} "
                  f"{r['ms_alone']:9.4f} {r['tflops_alone']:5.1f} {r['x_default_alone']:6.3f} "
                  f"{r['ms_four_streams']:9.4f} {r['tflops_four_streams']:5.1f} "
                  f"{r['x_default_four']:6.3f} {'ok' if r['check_ok'] else 'BAD'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
