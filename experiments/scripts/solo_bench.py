"""Time the block-persistent kernel (cuda_src/persistent_solo.cu) against the register-resident
cluster kernel (persistent_regs.cu) and the cluster kernel (persistent.cu) on one layer, the
kernels alone (gx given, no input GEMM), over cells, hidden sizes and batches: us per step of
each, in one process on one device.

Each (cell, H, batch, kernel): one launch over T steps on outputs poisoned with NaN, h, c and act
compared with the float64 NumPy reference (fp32 tolerance, worst element reported), then timed
with CUDA events (warm-up, median of --repeats). Kernels: 'solo' (the one-unit solo fit: one
wave of independent blocks), 'solo-rr' (the two-unit fit, part of R in registers: the
default where it fits), 'solo-half' (half the fit's blocks, twice the batches a block, where that
fits: does a second batch cost less than a second wave's worth of SMs?), 'regs', 'cluster'
(their fits). Prints a table last and writes the record (JSON, kind 'solo_bench', the device and
the versions) into the folder --out.

Usage (GPU): python experiments/scripts/solo_bench.py [--cells gru,lstm,rnn_tanh]
             [--hidden 128,64] [--batches 8,32,64,128,256] [--steps 100] [--out DIR]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from regs_bench import layer_data, run_one  # noqa: E402 - this folder: buffers, check + time

from rnnrt.bench import records  # noqa: E402
from rnnrt.kernels import persistent as P  # noqa: E402
from rnnrt.kernels import regs as RG  # noqa: E402
from rnnrt.kernels import solo as SO  # noqa: E402
from rnnrt.kernels.library import KernelLibrary  # noqa: E402
from rnnrt.session import GpuSession  # noqa: E402

KERNELS = ("solo", "solo-rr", "solo-half", "regs", "cluster")


def fits(cell, H, B, props):
    """(label, fit) of each kernel timed."""
    solo = SO.solo_fit(cell, H, B, props, upt=1)   # the one-unit kernel (the default is _rr)
    out = [("solo", solo), ("solo-rr", SO.solo_fit(cell, H, B, props, upt=2))]
    if solo.ok and solo.blocks > 1:
        half = SO.solo_fit(cell, H, B, props, blocks=-(-solo.blocks // 2), upt=1)
        if half.ok and half.blocks != solo.blocks:
            out.append(("solo-half", half))
    return out + [("regs", RG.regs_fit(cell, H, B, props)),
                  ("cluster", P.persistent_fit(cell, H, B, props, kind="cluster"))]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", default="gru,lstm,rnn_tanh")
    ap.add_argument("--hidden", default="128,64")
    ap.add_argument("--batches", default="8,32,64,128,256")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", default=None, help="folder for the JSON record")
    a = ap.parse_args(argv)
    session = GpuSession()
    cp = session.cp
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    lib = KernelLibrary()
    T = a.steps
    rows = []
    stream = cp.cuda.Stream(non_blocking=True)
    for H in [int(h) for h in a.hidden.split(",") if h]:
        for cell in [c for c in a.cells.split(",") if c]:
            for B in [int(b) for b in a.batches.split(",") if b]:
                d, outs, ins = layer_data(cp, cell, H, B, T)
                cp.cuda.Device().synchronize()
                for label, fit in fits(cell, H, B, props):
                    row = {"cell": cell, "hidden": H, "batch": B, "steps": T, "kernel": label,
                           "name": fit.kernel, "ok": fit.ok, "fit": fit.describe(),
                           "threads": fit.threads, "blocks": fit.blocks}
                    rows.append(row)
                    if not fit.ok:
                        print(f"skip: {fit.describe()}", file=sys.stderr)
                        continue
                    row.update(run_one(cp, lib, stream, d, outs, ins, fit, B, T, a.repeats))
                    print(f"{cell} H {H} B {B} {label}: {row['us_per_step']:.2f} us/step "
                          f"{'ok' if row['correct'] else 'WRONG'} {row['checks']}",
                          file=sys.stderr, flush=True)
    created = records.now_iso()
    rec = {"kind": "solo_bench", "created": created, "device": session.info,
           "versions": records.versions(cp), "command": " ".join(sys.argv),
           "config": {"hidden": a.hidden, "steps": T, "repeats": a.repeats}, "rows": rows}
    if a.out:
        slug = records.device_slug(session.info["device"])
        path = Path(a.out) / f"persistent-solo-bench-T{T}-{slug}-{records.stamp(created)}.json"
        records.write_json(rec, path)
        print(f"record: {path}", file=sys.stderr)
    print("| cell | H | B | " + " | ".join(f"{k} us/step" for k in KERNELS)
          + " | best other / solo | all correct |")
    print("|---|---|---|" + "---|" * (len(KERNELS) + 2))
    by = {}
    for r in rows:
        by.setdefault((r["cell"], r["hidden"], r["batch"]), {})[r["kernel"]] = r
    fmt = lambda v: "-" if v is None else f"{v:.2f}"   # noqa: E731
    for (cell, H, B), k in by.items():
        us = {n: k[n].get("us_per_step") for n in KERNELS if n in k}
        others = [us[n] for n in ("regs", "cluster") if us.get(n)]
        ratio = f"{min(others) / us['solo']:.2f}x" if others and us.get("solo") else "-"
        ok = all(r.get("correct", False) for r in k.values() if r["ok"])
        print(f"| {cell} | {H} | {B} | " + " | ".join(fmt(us.get(n)) for n in KERNELS)
              + f" | {ratio} | {'yes' if ok else 'NO'} |")


if __name__ == "__main__":
    main()
