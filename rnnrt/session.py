"""One way to open the GPU: ``GpuSession`` holds what every GPU user of rnnrt needs — CuPy,
the device's facts and limits, a GpuContext (streams, each with its cuBLAS handle, and the
compiled kernels) — and makes the workspaces and executors that run plans. The runner
(gpu.py), the benchmarks (bench/) and the experiment scripts all open the GPU through it.

Nothing is module-level: a session owns its streams and handles, and ``close()`` frees them.
"""
from __future__ import annotations

import numpy as np

from .device import require_gpu


class GpuSession:
    """The GPU state of one user (a runner, a benchmark run).

    cp: the cupy module; ctx: the exec.cuda_exec.GpuContext (streams + cuBLAS handles +
    the kernel library); limits: the device's kernels.limits.DeviceLimits (what a plan's
    persistent fit reads); info: device facts and versions for records (``device_info``).
    """

    def __init__(self):
        from .exec.cuda_exec import GpuContext
        from .kernels.library import KernelLibrary
        from .kernels.limits import DeviceLimits
        self.cp = require_gpu()
        self.ctx = GpuContext(self.cp, KernelLibrary())
        self.limits = DeviceLimits.from_device(self.cp)
        self._info = None

    @property
    def info(self) -> dict:
        """``device_info()`` of this session's device, read once."""
        if self._info is None:
            self._info = device_info(self.cp)
        return self._info

    def workspace(self, plan, params, grads=None):
        """A Workspace for ``plan``, allocated and poisoned on the plan's first stream (its
        other streams start after that one: exec.cuda_exec's fork): fp32 buffers, and the
        'store' ones in the plan key's storage type (2 bytes an element for bfloat16 and
        float16). ``params``: the model's flat fp32 parameters [layout.size], adopted when it
        is a contiguous CuPy float32 array (shared, not copied), else copied; ``grads``:
        likewise, for backward plans."""
        from .exec.workspace import Workspace
        stream = self.ctx.stream(0, plan.stream_priority[0])[0]
        with stream:
            ws = Workspace(plan, self.cp, np.float32, params, grads=grads)
        # the poison is queued on that stream: a caller's first load on another one (CuPy's
        # current stream; the plan's streams are non-blocking) must not be overwritten by it
        stream.synchronize()
        return ws

    def executor(self, name: str, plan, ws):
        """The executor ``name`` ('eager' or 'graph') of ``plan`` on workspace ``ws``."""
        from .exec.cuda_exec import EXECUTORS
        if name not in EXECUTORS:
            raise ValueError(f"executor: expected one of {sorted(EXECUTORS)}, got {name!r}")
        return EXECUTORS[name](plan, ws, self.ctx)

    def close(self):
        """Free the streams and cuBLAS handles (the session is unusable after)."""
        self.ctx.close()


def time_events(cp, fn, stream, repeats: int, warmup: int) -> list:
    """Milliseconds of each of ``repeats`` calls of ``fn()`` (which issues work on
    ``stream``), from CUDA events recorded on ``stream`` around each call, after ``warmup``
    untimed calls; synchronises after each run so runs do not overlap."""
    for _ in range(warmup):
        fn()
    stream.synchronize()
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    samples = []
    for _ in range(repeats):
        start.record(stream)
        fn()
        stop.record(stream)
        stop.synchronize()
        samples.append(cp.cuda.get_elapsed_time(start, stop))
    return samples


def executor_names() -> tuple[str, ...]:
    """The GPU executors by name (importable without CuPy)."""
    from .exec.cuda_exec import EXECUTORS
    return tuple(sorted(EXECUTORS))


def device_info(cp=None) -> dict:
    """Device name, SM count, clocks, capability, and CuPy / CUDA / cuBLAS versions."""
    cp = require_gpu() if cp is None else cp
    rt = cp.cuda.runtime
    dev = cp.cuda.Device()
    props = rt.getDeviceProperties(dev.id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    info = {
        "device": name,
        "sm_count": props.get("multiProcessorCount"),
        "compute_capability": f"{props.get('major')}.{props.get('minor')}",
        "sm_clock_mhz": (props.get("clockRate") or 0) / 1000 or None,
        "mem_clock_mhz": (props.get("memoryClockRate") or 0) / 1000 or None,
        "shared_mem_per_sm": props.get("sharedMemPerMultiprocessor"),
        "regs_per_sm": props.get("regsPerMultiprocessor"),
        "cupy": cp.__version__,
        "cuda_runtime": rt.runtimeGetVersion(),
        "cuda_driver": rt.driverGetVersion(),
    }
    try:
        from .exec.cublas import cublas_version
        info["cublas"] = cublas_version()
    except Exception as e:  # noqa: BLE001 - informative only
        info["cublas"] = f"unknown ({e})"
    return info
