"""Timing with CUDA events (GPU) or perf_counter (CPU): warm-up, then the median of many runs.

The GPU ceiling (a large fp32 GEMM) is measured through rnnrt's own cuBLAS binding, math mode
plain fp32 (no TF32), in the same process as the figures it is compared with.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Timing:
    """Median, min and max of ``runs`` timed runs (ms); ``samples`` the runs themselves."""

    ms_median: float
    ms_min: float
    ms_max: float
    runs: int
    samples: tuple = field(default=(), repr=False, compare=False)

    def as_dict(self):
        """What a record keeps (not the samples)."""
        return {"ms_median": self.ms_median, "ms_min": self.ms_min, "ms_max": self.ms_max,
                "runs": self.runs}


def _summary(samples) -> Timing:
    return Timing(statistics.median(samples), min(samples), max(samples), len(samples),
                  tuple(samples))


def time_gpu(cp, fn, stream, repeats: int = 20, warmup: int = 3) -> Timing:
    """Time ``fn()`` (which issues work on ``stream``) with events recorded on ``stream``
    around each call (session.time_events); the median and spread of the runs."""
    from ..session import time_events
    return _summary(time_events(cp, fn, stream, repeats, warmup))


def time_torch(torch, fn, repeats: int = 20, warmup: int = 3) -> Timing:
    """The same protocol for a torch callable, with torch's events on its current stream."""
    return time_in_turn({"fn": fn}, repeats, warmup, torch=torch)["fn"]


def time_in_turn(fns: dict, repeats: int = 20, warmup: int = 3, *, cp=None,
                 torch=None) -> dict:
    """{name: Timing} of each of ``fns`` timed in turn: each warmed up ``warmup`` times,
    then ``repeats`` rounds that run every fn once, each run between two CUDA events and
    waited for before the next (runs never overlap; fns compared this way share the clocks
    and the thermal state of the same moments). ``fns``: {name: (fn, stream)} for work
    issued on a CuPy ``stream`` (events of ``cp`` recorded on it), or {name: fn} for torch
    work (events of ``torch`` on its current stream). Each fn's two events are made once,
    before the rounds."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats: expected an int >= 1, got {repeats!r}")
    runs = {}
    for name, f in fns.items():
        if isinstance(f, tuple):
            if cp is None:
                raise ValueError(f"fns[{name!r}]: a (fn, stream) pair is timed with CuPy's "
                                 f"events: pass cp")
            runs[name] = (f[0], f[1], cp.cuda.Event(), cp.cuda.Event())
        else:
            if torch is None:
                raise ValueError(f"fns[{name!r}]: a callable is timed with torch's events: "
                                 f"pass torch (or give (fn, stream) and cp)")
            runs[name] = (f, None, torch.cuda.Event(enable_timing=True),
                          torch.cuda.Event(enable_timing=True))
    for fn, *_ in runs.values():
        for _ in range(warmup):
            fn()
    if cp is not None:
        cp.cuda.Device().synchronize()
    if torch is not None:
        torch.cuda.synchronize()
    samples = {name: [] for name in runs}
    for _ in range(repeats):
        for name, (fn, stream, start, stop) in runs.items():
            if stream is None:   # torch: its current stream
                start.record()
                fn()
                stop.record()
                stop.synchronize()
                samples[name].append(start.elapsed_time(stop))
            else:
                start.record(stream)
                fn()
                stop.record(stream)
                stop.synchronize()
                samples[name].append(cp.cuda.get_elapsed_time(start, stop))
    return {name: _summary(s) for name, s in samples.items()}


def time_cpu(fn, repeats: int = 5, warmup: int = 1) -> Timing:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    return _summary(samples)


def gemm_ceiling(cp, ctx, n: int = 8192, repeats: int = 10) -> dict:
    """TFLOPS of an fp32 n^3 GEMM (tensor cores off) through rnnrt's cuBLAS binding."""
    stream, handle = ctx.stream(0, 0)
    rng = cp.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=cp.float32)
    b = rng.standard_normal((n, n), dtype=cp.float32)
    c = cp.empty((n, n), dtype=cp.float32)
    prepared = handle.prepare_gemm(c.data.ptr, n, a.data.ptr, n, b.data.ptr, n, n, n, n)
    t = time_gpu(cp, lambda: handle.gemm(prepared), stream, repeats=repeats, warmup=2)
    # spot-check the product so the ceiling is a real GEMM, not a no-op
    ref = a[:4].get().astype("float64") @ b[:, :4].get().astype("float64")
    got = c[:4, :4].get()
    err = float(abs(got - ref).max() / abs(ref).max())
    del a, b, c
    return {"what": f"fp32 SGEMM {n}^3, tensor cores off (CUBLAS_DEFAULT_MATH)",
            "tflops": 2 * n**3 / (t.ms_median * 1e-3) / 1e12, "ms_median": t.ms_median,
            "rel_err_spot_check": err}
