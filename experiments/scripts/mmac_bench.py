"""Time one layer of the tensor-core cluster kernel (cuda_src/persistent_mmac.cu) alone (gx
given, no input GEMM) over its knob, the parts of the k16 steps (threads = 32 x m16 tiles x
parts), and its PK_TIMING variants, to choose the fit's default and to say where a step's
time goes; ``--clusters`` over cluster counts too (past one n8 tile a cluster, the wide
form, persistent_mmacw.cu). ``--family mma`` times the tensor-core grid kernel (persistent_mma.cu, the fit's
own geometry; no parts knob) the same way: its variant 4 leaves out the grid barrier.

Each configuration: one launch over T steps on outputs poisoned with NaN; variant 0's h and c
compared with the float64 rounding-aware reference (gx, R and h0 drawn representable in the
storage type, the input GEMM an identity, so the reference reads gx exactly; the precision's
tolerance, worst element reported); then timed with CUDA events (warm-up, median of
--repeats). Variants 1-8 leave phases out (1 no pushes, 2 no mma.sync, 4 no cluster
barrier a step, 8 no pointwise update) and compute wrong results on purpose: timed, not
checked; variant 16 (right results, checked as 0 is) branches out of the held-register loop
in every form, as the wide form does: an A/B of that choice in one process; variant 32
(right results, checked) leaves the partial sums' rows unpadded (8 NT floats): the pad's A/B;
variant 64 (the grid form, right results, checked): its grid barrier's wait as ps_wait, not
a spin on acquire loads (that A/B).

Usage (GPU, repo root): python experiments/scripts/mmac_bench.py --out DIR [--cells lstm,gru]
  [--hidden 128,256] [--batches 8,32] [--dtype float16] [--parts auto,1,2,4]
  [--variants 0,1,2,4,8] [--clusters auto,8,16] [--cluster 4|8|16] [--steps 100] [--repeats 30]
  [--family mmac|mma]
Prints a table last; writes DIR/persistent-<family>-bench-T<T>-<device>-<stamp>.json.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

from rnnrt import reference  # noqa: E402
from rnnrt.bench.records import device_slug, now_iso, stamp, versions, write_json  # noqa: E402
from rnnrt.bench.timing import time_gpu  # noqa: E402
from rnnrt.cells import get_cell  # noqa: E402
from rnnrt.check import compare  # noqa: E402
from rnnrt.kernels import mma as MA  # noqa: E402
from rnnrt.kernels import mmac as MC  # noqa: E402
from rnnrt.kernels.library import KernelLibrary  # noqa: E402
from rnnrt.precision import get_precision, round_to_storage  # noqa: E402
from rnnrt.session import GpuSession  # noqa: E402

WRONG = 1 | 2 | 4 | 8   # the PK_TIMING bits that leave a phase out (wrong results on purpose)


def layer(cp, cell, T, B, H, dtype, seed=0):
    """Device arrays of one layer (h in the storage type) and its rounding-aware reference."""
    G = get_cell(cell).gates
    rng = np.random.default_rng(seed)
    r = lambda *s: round_to_storage(rng.uniform(-0.5, 0.5, s), dtype)   # noqa: E731
    gx, R = r(T, B, G * H), r(G * H, H) / np.sqrt(H / 16)
    R = round_to_storage(R, dtype)
    bw, br = rng.uniform(-0.3, 0.3, G * H), rng.uniform(-0.3, 0.3, G * H)
    h0 = round_to_storage(0.5 * rng.standard_normal((B, H)), dtype)
    c0 = 0.5 * rng.standard_normal((B, H)) if cell == "lstm" else None
    p = {"weight_ih": np.eye(G * H), "weight_hh": R, "bias_ih": bw, "bias_hh": br}
    _, _, _, cache = reference.forward(cell, [p], gx, h0[None],
                                       None if c0 is None else c0[None], dtype=dtype)
    lc = cache.layers[0]
    st = cp.uint16 if get_precision(dtype).storage == "bfloat16" else cp.float16
    d = {"gx": cp.asarray(gx.reshape(T * B, G * H), cp.float32),
         "w": cp.asarray(R, cp.float32), "bw": cp.asarray(bw, cp.float32),
         "br": cp.asarray(br, cp.float32), "h0": h0, "c0": c0, "st": st,
         "h": cp.empty(((T + 1) * B, H), st),
         "c": cp.empty(((T + 1) * B, H), cp.float32) if c0 is not None else None,
         "act": cp.empty((T * B, 4 * H), cp.float32) if G > 1 else None,
         "sync": cp.zeros(2, cp.uint32)}
    return d, {"h": lc.h, "c": lc.c}


def as_storage(cp, a, dtype):
    """float array -> the storage type's bits (bfloat16 as uint16: the top half of fp32)."""
    if get_precision(dtype).storage == "bfloat16":
        return cp.asarray((np.asarray(a, np.float32).view(np.uint32) >> 16).astype(np.uint16))
    return cp.asarray(np.asarray(a, np.float16))


def to_float(a, dtype):
    """The storage type's array (host) as float32."""
    if get_precision(dtype).storage == "bfloat16":
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cells", default="lstm,gru")
    ap.add_argument("--hidden", default="128,256")
    ap.add_argument("--batches", default="8,32")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--parts", default="auto,1,2,4")
    ap.add_argument("--variants", default="0,1,2,4,8")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--clusters", default="auto")
    ap.add_argument("--cluster", default="auto", help="blocks a cluster (4, 8, 16; auto: the fit's)")
    ap.add_argument("--family", default="mmac", choices=("mmac", "mma"))
    a = ap.parse_args(argv)
    if a.family == "mma":
        a.parts = a.clusters = "auto"   # the grid kernel's geometry is the fit's
    session = GpuSession()
    cp = session.cp
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    variants = [int(v) for v in a.variants.split(",")]
    libs = {v: KernelLibrary(options=("-std=c++17",) + ((f"-DPK_TIMING={v}",) if v else ()))
            for v in variants}
    T, dtype, prec = a.steps, a.dtype, get_precision(a.dtype)
    stream = cp.cuda.Stream(non_blocking=True)
    rows = []
    for cell in a.cells.split(","):
        for H in map(int, a.hidden.split(",")):
            for B in map(int, a.batches.split(",")):
                d, ref = layer(cp, cell, T, B, H, dtype)
                outs = [(d["h"].data.ptr, H)]
                if d["c"] is not None:
                    outs.append((d["c"].data.ptr, H))
                if d["act"] is not None:
                    outs.append((d["act"].data.ptr, 4 * H))
                outs.append((d["sync"].data.ptr, 2))
                G = get_cell(cell).gates
                ins = [(d["gx"].data.ptr, G * H), (d["w"].data.ptr, H), (d["bw"].data.ptr, 0),
                       (d["br"].data.ptr, 0)]
                for parts, ncl in [(p, n) for n in a.clusters.split(",")
                                   for p in a.parts.split(",")]:
                    kp = None if parts == "auto" else int(parts)
                    n = None if ncl == "auto" else int(ncl)
                    cs = None if a.cluster == "auto" else int(a.cluster)
                    fit = (MC.mmac_fit(cell, H, B, props, dtype, k_parts=kp, clusters=n,
                                       cluster=cs)
                           if a.family == "mmac" else MA.mma_fit(cell, H, B, props, dtype))
                    if not fit.ok:
                        rows.append({"cell": cell, "hidden": H, "batch": B, "parts": parts,
                                     "ok": False, "fit": fit.describe()})
                        continue
                    for v in variants:
                        lib = libs[v]
                        with stream:
                            d["h"].fill(0xFFFF if prec.storage == "bfloat16" else np.nan)
                            d["h"][:B] = as_storage(cp, d["h0"], dtype)
                            if d["c"] is not None:
                                d["c"].fill(np.nan)
                                d["c"][:B] = cp.asarray(d["c0"], cp.float32)
                            lib.launch_persistent(fit, outs, ins, T, dtype)
                            stream.synchronize()
                            checks = []
                            if not v & WRONG:   # the right-results variants: checked
                                h = to_float(cp.asnumpy(d["h"]), dtype).reshape(T + 1, B, H)
                                checks.append(compare(h, ref["h"], prec.atol, prec.rtol,
                                                      name="h"))
                                if d["c"] is not None:
                                    checks.append(compare(
                                        cp.asnumpy(d["c"]).reshape(T + 1, B, H), ref["c"],
                                        prec.atol, prec.rtol, name="c"))
                            t = time_gpu(cp, lambda: lib.launch_persistent(fit, outs, ins, T,
                                                                           dtype),
                                         stream, repeats=a.repeats, warmup=3)
                        row = {"cell": cell, "hidden": H, "batch": B,
                               "parts": getattr(fit, "k_parts", None),
                               "default": parts == "auto" and ncl == "auto", "variant": v,
                               "threads": fit.threads, "clusters": getattr(fit, "clusters", None),
                               "cluster": getattr(fit, "cluster", None),
                               "smem_bytes": fit.smem_bytes, "fit": fit.describe(),
                               "us_per_step": 1e3 * t.ms_median / T, "ms_min": t.ms_min,
                               "ok": all(c.ok for c in checks),
                               "checks": [str(c) for c in checks]}
                        rows.append(row)
                        print(f"{cell} H{H} B{B} parts {row['parts']} variant {v}: "
                              f"{row['us_per_step']:.2f} us/step {row['checks']}", flush=True)
    rec = {"schema": "rnnrt.mmac_bench/1", "kind": "mmac_bench", "created": now_iso(),
           "command": " ".join(sys.argv), "device": session.info, "versions": versions(cp),
           "family": a.family, "dtype": dtype, "steps": T, "rows": rows}
    path = Path(a.out) / (f"persistent-{a.family}-bench-T{T}-{device_slug(session.info['device'])}"
                          f"-{stamp(rec['created'])}.json")
    write_json(rec, path)
    print(f"\nrecord: {path}")
    print("variant: PK_TIMING mask, phases left out (1 pushes / the grid kernel's staging, "
          "2 mma.sync, 4 cluster / grid barrier, 8 pointwise update; 16: the held-register "
          "loop branching out in every form; 32: the partial sums unpadded); us a step of the "
          "kernel alone")
    print(f"{'cell':<6}{'H':>5}{'B':>4}{'parts':>6}{'thr':>5}{'cl':>4}" + "".join(
        f"{'v' + str(v):>8}" for v in variants) + "  ok")
    seen = {}
    for r in rows:
        if "variant" in r:
            seen.setdefault((r["cell"], r["hidden"], r["batch"], r["parts"], r["threads"],
                             r["clusters"], r["default"]), {})[r["variant"]] = r
    for (cell, H, B, parts, thr, ncl, dflt), vs in seen.items():
        ok = all(x["ok"] for x in vs.values())
        print(f"{cell:<6}{H:>5}{B:>4}{str(parts):>5}{'*' if dflt else ' '}{thr:>5}"
              f"{str(ncl):>4}" + "".join(
            f"{vs[v]['us_per_step']:>8.2f}" if v in vs else f"{'-':>8}" for v in variants)
            + f"  {'ok' if ok else 'WRONG'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
