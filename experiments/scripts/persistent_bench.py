"""Time one layer of the persistent kernel (cuda_src/persistent.cu) over its two knobs, units
per block U and threads per block: the kernel alone (gx given, no input GEMM), to choose the
fit's defaults and to compare with the per-step estimate in docs/journal.md.

Each configuration: one launch over T steps on outputs poisoned with NaN, h and c of every
step compared with the float64 NumPy reference (fp32 tolerance, worst element reported), the
barrier counters checked back at zero, then timed with CUDA events (warm-up, median of
--repeats). Prints a table (us per step, us per launch, effective
TFLOPS of the recurrent GEMMs) and writes JSON with --out.

Usage (GPU): python experiments/scripts/persistent_bench.py [--cell lstm] [--hidden 512] [--batch 64]
             [--steps 100] [--out PATH]
The cluster kernel's count: ``--kinds cluster --clusters sweep`` prints the device's
co-resident cap for the cluster fit (kernels/occupancy.py: cuOccupancyMaxActiveClusters for
the compiled kernel) and times every count from the rule's to one past the cap (the first
that runs in two waves) and the counts the schedule selector would time.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

from rnnrt.kernels import occupancy as O  # noqa: E402
from rnnrt.kernels import persistent as P  # noqa: E402
from rnnrt.kernels.counts import extra_cluster_counts  # noqa: E402
from rnnrt import reference  # noqa: E402
from rnnrt.bench.timing import time_gpu  # noqa: E402
from rnnrt.cells import get_cell  # noqa: E402
from rnnrt.check import FP32_ATOL, FP32_RTOL, compare  # noqa: E402
from rnnrt.kernels.library import KernelLibrary  # noqa: E402
from rnnrt.session import GpuSession  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cell", default="lstm")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--units", default="4,5,6,8", help="comma list; '' for the fit's only")
    ap.add_argument("--threads", default="128,256,512")
    ap.add_argument("--variants", default="0",
                    help="comma list of PK_TIMING masks (cuda_src/persistent.cu): 0 the real "
                         "kernel; 1 no h staging, 2 no FMAs, 4 no grid barrier (sums combine)."
                         " Variants other than 0 compute wrong results on purpose: timed, "
                         "not checked")
    ap.add_argument("--kinds", default="auto",
                    help="comma list of fits for the default configuration: auto (the fit's "
                         "choice), grid (the grid-barrier kernel), cluster (the cluster "
                         "kernel); --units / --threads configurations are grid kernels")
    ap.add_argument("--clusters", default="",
                    help="comma list of cluster counts to try with the cluster kernel "
                         "(its knob; default: the fit's), or 'sweep': the rule's to one "
                         "past the device's co-resident cap, and the selector's counts")
    ap.add_argument("--cluster-threads", default="",
                    help="comma list of block sizes to try with the cluster kernel (its "
                         "default: the fit's)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    session = GpuSession()   # CuPy and the device's facts; kernels from the variants' libraries
    cp = session.cp
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    variants = [int(v) for v in a.variants.split(",")]
    libs = {v: KernelLibrary(options=("-std=c++17",) + ((f"-DPK_TIMING={v}",) if v else ()))
            for v in variants}
    spec = get_cell(a.cell)
    G, H, B, T = spec.gates, a.hidden, a.batch, a.steps
    rng = np.random.default_rng(0)
    bound = 1 / np.sqrt(H)
    x_np = rng.standard_normal((T, B, H)).astype(np.float32)      # input size = H
    w_np = rng.uniform(-bound, bound, (G * H, H)).astype(np.float32)
    r_np = rng.uniform(-bound, bound, (G * H, H)).astype(np.float32)
    b_np = [rng.uniform(-bound, bound, G * H).astype(np.float32) for _ in range(2)]
    h0_np = (0.5 * rng.standard_normal((B, H))).astype(np.float32)
    c0_np = (0.5 * rng.standard_normal((B, H))).astype(np.float32) \
        if spec.has_cell_state else None
    f64 = lambda v: None if v is None else v.astype(np.float64)   # noqa: E731
    _, _, _, cache = reference.forward(
        a.cell, [{"weight_ih": f64(w_np), "weight_hh": f64(r_np), "bias_ih": f64(b_np[0]),
                  "bias_hh": f64(b_np[1])}], f64(x_np), f64(h0_np)[None],
        None if c0_np is None else f64(c0_np)[None])
    ref_h, ref_c = cache.layers[0].h, cache.layers[0].c          # [T+1, B, H]

    gx = cp.asarray(x_np).reshape(T * B, H) @ cp.asarray(w_np).T   # [T*B, G*H]
    w_hh = cp.asarray(r_np)
    bw, br = cp.asarray(b_np[0]), cp.asarray(b_np[1])
    h = cp.empty(((T + 1) * B, H), cp.float32)
    c = cp.empty_like(h) if spec.has_cell_state else None
    act = cp.empty((T * B, 4 * H), cp.float32) if spec.saved_gates else None
    sync = cp.zeros(P.SYNC_WORDS, cp.uint32)
    outs = [(h.data.ptr, H)] + ([(c.data.ptr, H)] if c is not None else []) \
        + ([(act.data.ptr, 4 * H)] if act is not None else []) + [(sync.data.ptr, 2)]
    ins = [(gx.data.ptr, G * H), (w_hh.data.ptr, H), (bw.data.ptr, 0), (br.data.ptr, 0)]
    # every array above was written on the legacy stream: finish that before the
    # non-blocking stream below reads them (the first version of this script did not, and
    # its first launch read an unzeroed barrier buffer)
    cp.cuda.Device().synchronize()
    stream = cp.cuda.Stream(non_blocking=True)
    flops = 2 * G * H * H * B * T

    # (variant, label, persistent_fit's keyword arguments)
    split = lambda s: [x for x in s.split(",") if x]   # noqa: E731
    cap = None
    base = P.persistent_fit(a.cell, H, B, props, kind="cluster")
    if base.ok:
        cap = O.cluster_cap(base, props, libs[variants[0]].with_shared(base.kernel,
                                                                         base.smem_bytes))
        print(f"cluster fit {base.clusters} clusters ({base.threads} threads, "
              f"{base.smem_bytes} B shared): {cap.describe()}", flush=True)
    if a.clusters == "sweep":
        if cap is None:
            raise SystemExit(f"--clusters sweep: the cluster kernel does not fit: {base.reason}")
        counts = set(range(base.clusters, cap.clusters + 2)) | set(
            extra_cluster_counts(B, base.clusters, cap.clusters))
        a.clusters = ",".join(str(n) for n in sorted(counts))
    configs = [(v, k, {"kind": None if k == "auto" else k}) for v in variants
               for k in split(a.kinds)] + [
        (v, "grid", {"units_per_block": int(u), "threads": int(t)}) for v in variants
        for u in split(a.units) for t in split(a.threads)] + [
        (v, "cluster", {"clusters": int(n)}) for v in variants for n in split(a.clusters)] + [
        (v, "cluster", {"kind": "cluster", "threads": int(t)}) for v in variants
        for t in split(a.cluster_threads)]
    rows = []
    for variant, kind, knobs in configs:
        lib = libs[variant]
        fit = P.persistent_fit(a.cell, H, B, props, **knobs)
        row = {"variant": variant, "kind": kind, "knobs": knobs, "kernel": fit.kernel,
               "clusters": fit.clusters if fit.cluster else None,
               "units_per_block": fit.units_per_block, "threads": fit.threads,
               "k_tile": getattr(fit, "k_tile", None),
               "blocks": fit.blocks, "k_split": fit.k_split, "smem_bytes": fit.smem_bytes,
               "default": set(knobs) == {"kind"}, "ok": fit.ok, "fit": fit.describe()}
        if not fit.ok:
            rows.append(row)
            print(f"skip: {fit.describe()}", file=sys.stderr)
            continue
        with stream:
            h.fill(np.nan)
            h[:B] = cp.asarray(h0_np)
            if c is not None:
                c.fill(np.nan)
                c[:B] = cp.asarray(c0_np)
            lib.launch_persistent(fit, outs, ins, T)
            stream.synchronize()
            checks = [compare(h.get().reshape(T + 1, B, H), ref_h, FP32_ATOL, FP32_RTOL,
                              name="h")]
            if c is not None:
                checks.append(compare(c.get().reshape(T + 1, B, H), ref_c, FP32_ATOL,
                                      FP32_RTOL, name="c"))
            counters = sync.get().tolist()
            t = time_gpu(cp, lambda: lib.launch_persistent(fit, outs, ins, T), stream,
                         repeats=a.repeats, warmup=3)
        ok = (all(ch.ok for ch in checks) or variant != 0) and counters == [0, 0]
        row.update(ms_median=t.ms_median, ms_min=t.ms_min, ms_max=t.ms_max,
                   us_per_step=t.ms_median * 1e3 / T,
                   tflops=flops / (t.ms_median * 1e-3) / 1e12, correct=ok,
                   checks=[str(ch) for ch in checks], sync_after=counters,
                   max_abs_err=max(ch.max_abs_err for ch in checks))
        rows.append(row)
        print(f"variant {variant} {fit.kernel} U {fit.units_per_block} thr {fit.threads}: "
              f"{row['us_per_step']:.2f} us/step "
              f"{'ok' if ok else 'WRONG'} {[str(ch) for ch in checks]}", file=sys.stderr,
              flush=True)

    rec = {"device": session.info, "command": " ".join(sys.argv),
           "config": {"cell": a.cell, "hidden": H, "batch": B, "steps": T}, "rows": rows,
           "cluster_cap": None if cap is None else cap.as_dict()}
    print("variant: PK_TIMING mask, phases left out (1 staging, 2 FMAs, 4 barrier); "
          "0 is the real kernel, the only one checked")
    if cap is not None:
        print(f"cluster kernel: {cap.describe()}")
    print("| variant | kernel | U | threads | blocks | KS | shared B | us/step | ms/launch | "
          "TFLOPS | max err |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "ms_median" not in r:
            print(f"| {r['variant']} | {r['kernel']} | {r['units_per_block']} | {r['threads']} "
                  f"| - | - | - | does not fit | | | |")
            continue
        tag = " (default)" if r["default"] else ""
        print(f"| {r['variant']} | {r['kernel']} | {r['units_per_block']}{tag} | {r['threads']} "
              f"| {r['blocks']} | {r['k_split']} "
              f"| {r['smem_bytes']} | {r['us_per_step']:.2f} | {r['ms_median']:.3f} | "
              f"{r['tflops']:.1f} | "
              f"{r['max_abs_err'] if r['variant'] == 0 else float('nan'):.1e}"
              f"{'' if r['correct'] else ' WRONG'} |")
    if a.out:
        Path(a.out).write_text(json.dumps(rec, indent=1) + "\n")


if __name__ == "__main__":
    main()
