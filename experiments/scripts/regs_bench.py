"""Time the register-resident cluster kernel (cuda_src/persistent_regs.cu) against the cluster
kernel (persistent.cu) on one layer, the kernels alone (gx given, no input GEMM), over cells
and batches: us per step of each, in one process on one device.

Each (cell, batch, kernel): one launch over T steps on outputs poisoned with NaN, h, c and act
compared with the float64 NumPy reference (fp32 tolerance, worst element reported), then timed
with CUDA events (warm-up, median of --repeats). Kernels: 'cluster' (the cluster kernel's
fit), 'regs' (the regs fit), 'regs512' (the regs kernel with 512 threads a block, where it
fits). Prints a table last and writes the record (JSON, kind 'regs_bench', the device and the
versions) into the folder --out.

Usage (GPU): python experiments/scripts/regs_bench.py [--cells gru,lstm] [--hidden 128]
             [--batches 8,32,64,128,256] [--steps 100] [--out DIR]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

from rnnrt import reference  # noqa: E402
from rnnrt.bench import records  # noqa: E402
from rnnrt.bench.timing import time_gpu  # noqa: E402
from rnnrt.cells import get_cell  # noqa: E402
from rnnrt.check import FP32_ATOL, FP32_RTOL, compare  # noqa: E402
from rnnrt.kernels import persistent as P  # noqa: E402
from rnnrt.kernels import regs as RG  # noqa: E402
from rnnrt.kernels.library import KernelLibrary  # noqa: E402
from rnnrt.session import GpuSession  # noqa: E402


def layer_data(cp, cell, H, B, T, seed=0):
    """Device buffers of one layer (input size H) and its float64 reference."""
    spec = get_cell(cell)
    G = spec.gates
    rng = np.random.default_rng(seed)
    bound = 1 / np.sqrt(H)
    u = lambda *s: rng.uniform(-bound, bound, s).astype(np.float32)   # noqa: E731
    x, w, r, b = rng.standard_normal((T, B, H)).astype(np.float32), u(G * H, H), \
        u(G * H, H), [u(G * H), u(G * H)]
    h0 = (0.5 * rng.standard_normal((B, H))).astype(np.float32)
    c0 = (0.5 * rng.standard_normal((B, H))).astype(np.float32) if spec.has_cell_state \
        else None
    f64 = lambda v: None if v is None else v.astype(np.float64)   # noqa: E731
    _, _, _, cache = reference.forward(
        cell, [{"weight_ih": f64(w), "weight_hh": f64(r), "bias_ih": f64(b[0]),
                "bias_hh": f64(b[1])}], f64(x), f64(h0)[None],
        None if c0 is None else f64(c0)[None])
    lc = cache.layers[0]
    d = {"ref": {"h": lc.h, "c": lc.c, "act": lc.gates}, "h0": h0, "c0": c0,
         "gx": cp.asarray(x).reshape(T * B, H) @ cp.asarray(w).T, "w": cp.asarray(r),
         "bw": cp.asarray(b[0]), "br": cp.asarray(b[1]),
         "h": cp.empty(((T + 1) * B, H), cp.float32),
         "c": cp.empty(((T + 1) * B, H), cp.float32) if spec.has_cell_state else None,
         "act": cp.empty((T * B, 4 * H), cp.float32) if spec.saved_gates else None,
         "sync": cp.zeros(P.SYNC_WORDS, cp.uint32)}
    outs = [(d["h"].data.ptr, H)] + ([(d["c"].data.ptr, H)] if d["c"] is not None else []) \
        + ([(d["act"].data.ptr, 4 * H)] if d["act"] is not None else []) \
        + [(d["sync"].data.ptr, 2)]
    ins = [(d["gx"].data.ptr, G * H), (d["w"].data.ptr, H), (d["bw"].data.ptr, 0),
           (d["br"].data.ptr, 0)]
    return d, outs, ins


def fits(cell, H, B, props):
    """(label, fit) of each kernel timed."""
    out = [("cluster", P.persistent_fit(cell, H, B, props, kind="cluster")),
           ("regs", RG.regs_fit(cell, H, B, props))]
    f512 = RG.regs_fit(cell, H, B, props, threads=512)
    if f512.ok and f512.threads != out[1][1].threads:
        out.append(("regs512", f512))
    return out


def run_one(cp, lib, stream, d, outs, ins, fit, B, T, repeats):
    """Check ``fit``'s launch against the reference, then time it: the row's results."""
    with stream:
        for name in ("h", "c", "act"):
            if d[name] is not None:
                d[name].fill(np.nan)
        d["h"][:B] = cp.asarray(d["h0"])
        if d["c"] is not None:
            d["c"][:B] = cp.asarray(d["c0"])
        lib.launch_persistent(fit, outs, ins, T)
        stream.synchronize()
        checks = [compare(d[n].get().reshape(d["ref"][n].shape), d["ref"][n], FP32_ATOL,
                          FP32_RTOL, name=n) for n in ("h", "c", "act") if d[n] is not None]
        t = time_gpu(cp, lambda: lib.launch_persistent(fit, outs, ins, T), stream,
                     repeats=repeats, warmup=3)
    return dict(us_per_step=t.ms_median * 1e3 / T, ms_median=t.ms_median, ms_min=t.ms_min,
                ms_max=t.ms_max, correct=all(ch.ok for ch in checks),
                checks=[str(ch) for ch in checks],
                max_abs_err=max(ch.max_abs_err for ch in checks))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", default="gru,lstm")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--batches", default="8,32,64,128,256")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", default=None, help="folder for the JSON record")
    a = ap.parse_args(argv)
    session = GpuSession()
    cp = session.cp
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    lib = KernelLibrary()
    H, T = a.hidden, a.steps
    rows = []
    for cell in [c for c in a.cells.split(",") if c]:
        for B in [int(b) for b in a.batches.split(",") if b]:
            d, outs, ins = layer_data(cp, cell, H, B, T)
            cp.cuda.Device().synchronize()
            stream = cp.cuda.Stream(non_blocking=True)
            for label, fit in fits(cell, H, B, props):
                row = {"cell": cell, "hidden": H, "batch": B, "steps": T, "kernel": label,
                       "name": fit.kernel, "ok": fit.ok, "fit": fit.describe(),
                       "threads": fit.threads, "clusters": fit.clusters}
                rows.append(row)
                if not fit.ok:
                    print(f"skip: {fit.describe()}", file=sys.stderr)
                    continue
                row.update(run_one(cp, lib, stream, d, outs, ins, fit, B, T, a.repeats))
                print(f"{cell} B {B} {label}: {row['us_per_step']:.2f} us/step "
                      f"{'ok' if row['correct'] else 'WRONG'} {row['checks']}",
                      file=sys.stderr, flush=True)
    created = records.now_iso()
    rec = {"kind": "regs_bench", "created": created, "device": session.info,
           "versions": records.versions(cp), "command": " ".join(sys.argv),
           "config": {"hidden": H, "steps": T, "repeats": a.repeats}, "rows": rows}
    if a.out:
        slug = records.device_slug(session.info["device"])
        path = Path(a.out) / f"persistent-regs-bench-H{H}-T{T}-{slug}-{records.stamp(created)}.json"
        records.write_json(rec, path)
        print(f"record: {path}", file=sys.stderr)
    print("| cell | B | cluster us/step | regs us/step | regs512 us/step | regs / cluster | "
          "all correct |")
    print("|---|---|---|---|---|---|---|")
    by = {}
    for r in rows:
        by.setdefault((r["cell"], r["batch"]), {})[r["kernel"]] = r
    for (cell, B), k in by.items():
        us = {n: k[n].get("us_per_step") for n in ("cluster", "regs", "regs512") if n in k}
        fmt = lambda v: "-" if v is None else f"{v:.2f}"   # noqa: E731
        ratio = (f"{us['cluster'] / us['regs']:.2f}x faster" if us.get("cluster") and
                 us.get("regs") else "-")
        ok = all(r.get("correct", False) for r in k.values() if r["ok"])
        print(f"| {cell} | {B} | {fmt(us.get('cluster'))} | {fmt(us.get('regs'))} | "
              f"{fmt(us.get('regs512'))} | {ratio} | {'yes' if ok else 'NO'} |")


if __name__ == "__main__":
    main()
