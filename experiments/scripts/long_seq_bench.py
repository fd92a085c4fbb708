"""Long sequences on GpuRunner (rnnrt/chunked.py): plan and capture time, time per step and
peak GPU memory at T = 1,000 to 100,000, checked against the float64 reference, beside cuDNN.

Each run (one row of the ``kind: "long-sequence"`` record): a fresh GpuRunner
(``switches='auto'``, graph executor, schedules tuned in memory); x (and dy) random on the
device. Its steps:
  tune        the selector's choice for every chunk length the pass runs (not timed here;
              the first use of the kernels compiles them, announced)
  plan_s      the forward (and backward, accumulate off and on) plans of every distinct chunk
              key, built from empty plan caches
  capture_s   the first call (workspaces allocated, one CUDA graph per chunk state captured,
              then run) less a steady call
  ms_per_step the median of ``repeats`` steady calls (perf_counter around the call and a
              device synchronize: host work included) over the steps
  peak_bytes  the CuPy pool's bytes held after the first call and the steady ones, the pool
              emptied of free blocks before the first call: the high-water of what the pass
              held at once (x, y, dy, dx, the weights, workspaces, kept activations and cuBLAS
              workspaces included; freed blocks are reused, so it bounds the peak from above).
              ``device_used_bytes``: cudaMemGetInfo's used bytes at the same moment less those
              before x was made (adds the graphs' and the driver's memory)
  check       rows ``--check-rows`` of the batch (sequences are independent) over the first
              ``--check-steps`` steps (all of T where shorter) against the float64 reference,
              fp32 tolerance, worst element: y (and h_n over all of T). A prefix is a full
              check of the forward (the chunks before it carried their state into it) and,
              in a pass of its own with dy zero past the prefix, of the backward: every
              chunk past it carries dh = 0 back, dx there is exactly zero, dx and dh0 over
              the prefix are the prefix's reference (every weight gradient too where all
              rows are checked). The float64 reference is slow (a Python loop over steps):
              a check over all 100,000 steps would take minutes.
  cudnn       torch.nn.LSTM on CUDA with the same weights, fp32, TF32 off, same process:
              ms_per_step, its peak (torch's allocator peak + x, shared through DLPack), and
              rnnrt's y (and dx) against it on the device; 'did not fit' where it runs out of
              memory
Then the plan-build time of the unchunked forward plan at ``--plan-steps`` (the paper's best
rung, +wavefront: ops for every layer and step), which a chunked run no longer builds.
--recompute: each fwd+bwd run again on a runner with recompute=True (plan/recompute.py: the
chunks keep no gates, the backward remakes them), a row of its own (``recompute`` true; its
cuDNN field points at the row before): the memory and the time both ways.

Usage (GPU): python experiments/scripts/long_seq_bench.py [--recompute] [--out FOLDER]
On the CPU (a test runs it with rnnrt.session.GpuSession replaced by a NumPy stand-in):
  --small  (tiny shapes, chunks of 8 steps)
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

import rnnrt  # noqa: E402
from rnnrt import chunked  # noqa: E402
from rnnrt.bench.cudnn import torch_module  # noqa: E402
from rnnrt.bench.ladder import reference_outputs  # noqa: E402
from rnnrt.bench.records import now_iso, record_path, versions, write_json  # noqa: E402
from rnnrt.check import FP32_ATOL, FP32_RTOL, compare, reduction_atol  # noqa: E402

GPU_RUNS = [("lstm", 4, 512, 512, 64, T, "fwd") for T in (1_000, 10_000, 100_000)] + \
           [("lstm", 2, 512, 512, 16, T, "fwd+bwd") for T in (1_000, 100_000)]
SMALL_RUNS = [("lstm", 2, 3, 5, 2, T, p) for p in ("fwd", "fwd+bwd") for T in (20, 37)]


def _repeats(steps: int, given: int | None) -> int:
    return given if given is not None else 5 if steps <= 1_000 else 3 if steps <= 10_000 else 2


def _sync(cp):
    cp.cuda.Device().synchronize()


def _used(cp) -> int | None:
    try:
        free, total = cp.cuda.runtime.memGetInfo()
        return int(total) - int(free)
    except AttributeError:
        return None


def _pool_total(cp) -> int | None:
    pool = cp.get_default_memory_pool()
    return int(pool.total_bytes()) if hasattr(pool, "total_bytes") else None


def _host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


def device_compare(cp, got, ref, name, atol=FP32_ATOL, rtol=FP32_RTOL) -> dict:
    """got vs ref (arrays of one module, same shape) without a host copy: the worst element
    by excess over atol + rtol*|ref| (a NaN in got is infinitely bad)."""
    err = cp.abs(got - ref)
    excess = err - (atol + rtol * cp.abs(ref))
    excess = cp.where(cp.isnan(excess), cp.inf, excess)
    i = int(cp.argmax(excess))
    worst = float(excess.ravel()[i])
    return {"name": name, "ok": worst <= 0, "max_abs_err": float(cp.nanmax(err)),
            "worst_excess": worst, "n_bad": int((excess > 0).sum()),
            "worst_index": [int(v) for v in np.unravel_index(i, got.shape)]}


def _check(r, x, out, rows, steps, dy=None, grads=None) -> list:
    """Rows [0, rows) of the batch over the first ``steps`` steps against the float64
    reference (the module doc says why a prefix is a full check): y; h_n where steps is all
    of T; with dy (zero from ``steps`` on, or T = steps) dx, dh0, dx past the prefix exactly
    zero, and the weight gradients where every row is checked."""
    m = r.model   # its weights are the runner's (r.params, uploaded from m.flat)
    T = x.shape[0]
    xs = _host(x[:steps, :rows])
    g = reference_outputs(m.cell_name, m, (xs, None, None,
                                           None if dy is None else _host(dy[:steps, :rows])),
                          backward=dy is not None)
    res = [compare(out["y"][:steps, :rows], g["y"], name="y")]
    if steps == T:
        res.append(compare(out["h_n"][:, :rows], g["h_n"], name="h_n"))
    if dy is not None:
        res += [compare(out["dx"][:steps, :rows], g["dx"], name="dx"),
                compare(out["dh0"][:, :rows], g["dh0"], name="dh0")]
        if steps < T:
            tail = _host(out["dx"][steps:, :rows])
            res.append(compare(tail, np.zeros_like(tail), 0.0, 0.0, name="dx past the prefix"))
        if grads is not None and rows == x.shape[1]:
            res.append(compare(grads, g["grads"], reduction_atol(steps * rows), FP32_RTOL,
                               name="grads"))
    return [{"name": c.name, **c.as_dict(), "worst_excess": c.max_excess} for c in res]


def _pass(r, x, dy, train):
    """One call: forward (inference), or forward + backward. -> dict of its results."""
    if not train:
        y, (h_n, _) = r.forward(x)
        return {"y": y, "h_n": h_n}
    y, (h_n, _), tape = r.forward(x, train=True)
    g = r.backward(tape, dy)
    return {"y": y, "h_n": h_n, "dx": g.dx, "dh0": g.dh0}


def run_rnnrt(cp, spec, repeats, check_rows, check_steps, schedules, recompute=False):
    from rnnrt.gpu import GpuRunner
    from rnnrt.plan.backward import backward_plan
    from rnnrt.plan.forward import forward_plan
    cell, L, I, H, B, T, which = spec
    train = which == "fwd+bwd"
    used0 = _used(cp)
    model = rnnrt.LSTM(I, H, num_layers=L, seed=0)
    rng = cp.random.default_rng(1)
    x = rng.standard_normal((T, B, I), dtype=cp.float32)
    dy = rng.standard_normal((T, B, H), dtype=cp.float32) if train else None
    # tuned by a runner of its own, closed before the measured one opens (its timing
    # workspaces would count in the peak); the measured runner reads the choices back
    tuner = GpuRunner(model, schedule_cache=schedules)
    parts = tuner.long.pieces(T, B, train)
    lengths = sorted({n for _, n in parts} if parts else {T})
    t0 = time.perf_counter()
    for n in lengths:
        tuner.schedule(n, B, train)
    tune_s = time.perf_counter() - t0
    tuner.close()
    del tuner
    gc.collect()
    r = GpuRunner(model, schedule_cache=schedules, recompute=recompute)
    scheds = {n: r.schedule(n, B, train).schedule.name for n in lengths}
    keys = [r.plan_key(n, B, train) for n in lengths]
    forward_plan.cache_clear()
    backward_plan.cache_clear()
    gc.collect()
    t0 = time.perf_counter()
    ops = 0
    for k in keys:
        ops += len(forward_plan(k).ops)
        if train:
            ops += sum(len(backward_plan(k, acc, True).ops) for acc in (False, True))
    plan_s = time.perf_counter() - t0
    cp.get_default_memory_pool().free_all_blocks()
    _sync(cp)
    t0 = time.perf_counter()
    out = _pass(r, x, dy, train)
    _sync(cp)
    first_s = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        out = None
        t0 = time.perf_counter()
        out = _pass(r, x, dy, train)
        _sync(cp)
        times.append(time.perf_counter() - t0)
    peak, used = _pool_total(cp), _used(cp)
    steady = float(np.median(times))
    row = {"cell": cell, "layers": L, "input_size": I, "hidden": H, "batch": B, "steps": T,
           "pass": which, "recompute": recompute, "chunk_steps": r.long.length(B, train),
           "pieces": len(parts) if parts else 1, "chunk_lengths": lengths,
           "schedules": {str(n): s for n, s in scheds.items()}, "tune_s": tune_s,
           "plan_s": plan_s, "plan_ops": ops, "first_call_s": first_s,
           "capture_s": max(0.0, first_s - steady), "ms_per_step": 1e3 * steady / T,
           "ms_samples": [1e3 * t for t in times], "repeats": repeats,
           "peak_bytes": peak,
           "device_used_bytes": None if used is None or used0 is None else used - used0,
           # x, y and the weights (training: dy, dx and the gradient buffer too)
           "io_weights_bytes": 4 * (x.size + T * B * H + model.layout.size
                                    + (x.size + T * B * H + model.layout.size if train
                                       else 0))}
    if row["peak_bytes"] is not None:
        row["peak_vs_io_weights"] = row["peak_bytes"] / row["io_weights_bytes"]
    rows, steps = min(check_rows, B), min(check_steps, T)
    row.update(check_rows=rows, check_steps=steps)
    dy_check = dy
    if train and steps < T:   # a pass of its own, untimed: dy zero past the prefix
        out = None
        dy_check = dy.copy()
        dy_check[steps:] = 0
        out = _pass(r, x, dy_check, train)
    row["check"] = _check(r, x, out, rows, steps, None if dy is None else dy_check[:steps],
                          _host(r.grads) if train else None)
    row["check_ok"] = all(c["ok"] for c in row["check"])
    r.close()
    del dy   # cuDNN runs on the dy that made ``out``
    return row, model, x, dy_check, out


def run_cudnn(cp, model, x, dy, out, repeats, train):
    """torch.nn.LSTM (cuDNN) with the model's weights on the same x (DLPack, not copied)."""
    try:
        import torch
    except ImportError:
        return {"status": "not run: torch is not installed"}
    if not torch.cuda.is_available():
        return {"status": "not run: no CUDA device for torch"}
    gc.collect()   # rnnrt's runner is closed: its memory goes back to the device first
    cp.get_default_memory_pool().free_all_blocks()
    T = x.shape[0]
    res = {}
    try:
        mod = torch_module(torch, model)   # fp32, TF32 off
        tx = torch.from_dlpack(x)
        tdy = torch.from_dlpack(dy) if train else None
        params = list(mod.parameters())
        if train:
            tx.requires_grad_(True)

        def call():
            if not train:
                with torch.no_grad():
                    return mod(tx)[0], None
            y, _ = mod(tx)
            return y, torch.autograd.grad(y, [tx] + params, tdy)[0]

        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        y, dx = call()
        torch.cuda.synchronize()
        res["check"] = [device_compare(cp, out["y"], cp.from_dlpack(y.detach()),
                                       "y vs cuDNN")]
        if train:
            res["check"].append(device_compare(cp, out["dx"], cp.from_dlpack(dx), "dx vs cuDNN"))
        del y, dx
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            call()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        res.update(status="ran", ms_per_step=1e3 * float(np.median(times)) / T,
                   peak_bytes=int(torch.cuda.max_memory_allocated()) + 4 * x.size
                   * (2 if train else 1))
    except (torch.cuda.OutOfMemoryError, RuntimeError) as e:   # cuDNN's own alloc errors too
        msg = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
        oom = isinstance(e, torch.cuda.OutOfMemoryError) or "memory" in msg.lower() \
            or "ALLOC" in msg
        res = {"status": "did not fit" if oom else "failed", "error": msg}
    finally:
        torch.cuda.empty_cache()
    return res


def plan_build_times(steps_list, L, H, B):
    """Seconds to build the unchunked forward plan of LSTM L x H batch B on the +wavefront
    rung at each of ``steps_list`` (the plan caches emptied before each; host only)."""
    from rnnrt.kernels.limits import H100_SXM
    from rnnrt.plan.forward import forward_plan
    from rnnrt.plan.model import PlanKey
    from rnnrt.plan.switches import ladder
    sw = {g.name: g.switches for g in ladder()}["+wavefront"]
    out = []
    for T in steps_list:
        forward_plan.cache_clear()
        gc.collect()
        key = PlanKey("lstm", T, B, H, H, L, True, sw, device=H100_SXM)
        t0 = time.perf_counter()
        n = len(forward_plan(key).ops)
        out.append({"steps": T, "layers": L, "hidden": H, "batch": B, "rung": "+wavefront",
                    "plan_s": time.perf_counter() - t0, "ops": n})
        forward_plan.cache_clear()
        print(f"plan build  T={T:>7}: {out[-1]['plan_s']:7.3f} s, {n:,} ops", flush=True)
    gc.collect()
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true",
                    help="tiny shapes, chunks of 8 steps (the CPU test; any device)")
    ap.add_argument("--repeats", type=int, default=None,
                    help="steady calls a run (default 5 at T <= 1,000, 3 to 10,000, else 2)")
    ap.add_argument("--check-rows", type=int, default=1,
                    help="batch rows checked against the float64 reference over all T")
    ap.add_argument("--plan-steps", default=None,
                    help="comma-separated T of the unchunked plan builds "
                         "(default 1000,10000,100000; --small 100,200)")
    ap.add_argument("--check-steps", type=int, default=1000,
                    help="steps checked against the reference (a prefix of longer runs)")
    ap.add_argument("--no-cudnn", action="store_true")
    ap.add_argument("--recompute", action="store_true",
                    help="each fwd+bwd run again with recompute=True (a row of its own)")
    ap.add_argument("--out", default=None, help="folder (default <RNNRT_OUT>/results/"
                                                "long-sequence)")
    a = ap.parse_args(argv)
    if a.repeats is not None and a.repeats < 1:
        ap.error(f"--repeats: expected an int >= 1, got {a.repeats}")
    if a.check_steps < 1:
        ap.error(f"--check-steps: expected an int >= 1, got {a.check_steps}")
    if a.check_rows < 1:
        ap.error(f"--check-rows: expected an int >= 1, got {a.check_rows}")
    try:
        plan_steps = [int(s) for s in (a.plan_steps or ("100,200" if a.small else
                                                         "1000,10000,100000")).split(",")]
    except ValueError:
        ap.error(f"--plan-steps: expected comma-separated ints, got {a.plan_steps!r}")
    created = now_iso()
    out_dir = Path(a.out) if a.out else None
    if out_dir is not None and out_dir.exists() and not out_dir.is_dir():
        ap.error(f"--out: {out_dir} is a file, expected a folder")
    if a.small:
        os.environ["RNNRT_CHUNK_STEPS"] = "8"
    from rnnrt.session import GpuSession
    session = GpuSession()   # the device's facts, and the first CuPy handle
    cp = session.cp
    info = session.info
    from rnnrt.kernels.tuning import ScheduleCache
    tmp = tempfile.TemporaryDirectory()   # the tuned choices, for this run only
    schedules = ScheduleCache("long_seq_bench", path=Path(tmp.name) / "schedules.json")
    rows = []
    for spec in (SMALL_RUNS if a.small else GPU_RUNS):
        T, which = spec[5], spec[6]
        reps = _repeats(T, a.repeats)
        print(f"run {spec[0]} L{spec[1]} H{spec[3]} B{spec[4]} T={T} {which} ...", flush=True)
        row, model, x, dy, out = run_rnnrt(cp, spec, reps, a.check_rows, a.check_steps, schedules)
        row["cudnn"] = ({"status": "not run: --no-cudnn"} if a.no_cudnn or a.small else
                        run_cudnn(cp, model, x, dy, out, reps, which == "fwd+bwd"))
        rows.append(row)
        del x, dy, out
        gc.collect()
        cp.get_default_memory_pool().free_all_blocks()
        if a.recompute and which == "fwd+bwd":
            print("    ... again with recompute=True", flush=True)
            row, *_ = run_rnnrt(cp, spec, reps, a.check_rows, a.check_steps, schedules, True)
            row["cudnn"] = {"status": "see the row without recompute"}
            rows.append(row)
            gc.collect()
            cp.get_default_memory_pool().free_all_blocks()
    builds = plan_build_times(plan_steps, 4 if not a.small else 2, 512 if not a.small else 5,
                              64 if not a.small else 2)
    def kind(r):
        return r["pass"], r["recompute"]
    base = {kind(r): r["ms_per_step"] for r in rows if r["steps"] == min(
        q["steps"] for q in rows if kind(q) == kind(r))}
    for r in rows:
        r["ms_per_step_vs_shortest"] = r["ms_per_step"] / base[kind(r)]
    rec = {"kind": "long-sequence", "created": created, "command": " ".join(sys.argv),
           "device": info, "versions": versions(cp if hasattr(cp, "__version__") else None),
           "chunk_rule": {"max_steps": chunked.MAX_CHUNK_STEPS,
                          "min_steps": chunked.MIN_CHUNK_STEPS,
                          "bytes": chunked.DEFAULT_CHUNK_BYTES,
                          "RNNRT_CHUNK_STEPS": os.environ.get("RNNRT_CHUNK_STEPS"),
                          "RNNRT_CHUNK_BYTES": os.environ.get("RNNRT_CHUNK_BYTES")},
           "rows": rows, "plan_build": builds,
           "notes": "peak_bytes: CuPy pool high-water (module doc); capture_s: first call "
                    "less a steady one; ms_per_step: wall clock with a device sync"}
    path = record_path("long-sequence", "long-sequence", info.get("device", "device"),
                       created, root=None if out_dir is None else out_dir.parent)
    if out_dir is not None:
        path = out_dir / path.name
    print(f"record: {write_json(rec, path, overwrite=False)}")
    print(f"{'pass':>8} {'rc':>2} {'L':>2} {'B':>3} {'T':>7} {'chunk':>5} {'plan s':>7} {'capt s':>7} "
          f"{'ms/step':>8} {'vs 1st':>6} {'peak GiB':>8} {'pk/io':>5} {'check':>5} "
          f"{'cuDNN ms/step':>14}")
    for r in rows:
        c = r["cudnn"]
        cud = f"{c['ms_per_step']:.4f}" if "ms_per_step" in c else c["status"][:14]
        pk = "-" if r["peak_bytes"] is None else f"{r['peak_bytes'] / 2**30:.2f}"
        ratio = "-" if r.get("peak_vs_io_weights") is None else f"{r['peak_vs_io_weights']:.2f}"
        ok = "ok" if r["check_ok"] and all(x["ok"] for x in c.get("check", [])) else "FAIL"
        print(f"{r['pass']:>8} {'y' if r['recompute'] else '-':>2} {r['layers']:>2} {r['batch']:>3} {r['steps']:>7} "
              f"{r['chunk_steps']:>5} {r['plan_s']:7.3f} {r['capture_s']:7.3f} "
              f"{r['ms_per_step']:8.4f} {r['ms_per_step_vs_shortest']:6.3f} {pk:>8} "
              f"{ratio:>5} {ok:>5} {cud:>14}")
    bad = [r for r in rows if not r["check_ok"]
           or not all(x["ok"] for x in r["cudnn"].get("check", []))]
    if bad:
        print(f"FAILED checks in {len(bad)} run(s): see the record")
    return 1 if bad else 0, rec, path


if __name__ == "__main__":
    sys.exit(main()[0])
