"""GPU availability, detected once per process, and the device facts records carry.

``import rnnrt`` never imports CuPy; only ``require_gpu()`` and the GPU executors do.
"""
from __future__ import annotations

import functools

INSTALL_HINT = ("install the GPU extra that matches your CUDA driver: "
                "pip install 'rnnrt[cuda12]' or pip install 'rnnrt[cuda13]'")


class GpuUnavailable(RuntimeError):
    """Raised when the GPU path is asked for where there is no usable GPU."""


@functools.lru_cache(maxsize=1)
def gpu_status() -> tuple[bool, str]:
    """(available, reason or device name), probed once per process."""
    try:
        import cupy  # noqa: F401
    except Exception as e:  # ImportError, or a broken CUDA install
        return False, f"CuPy is not importable ({type(e).__name__}: {e})"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001 - no driver, no device
        return False, f"CuPy found no CUDA device ({type(e).__name__}: {e})"
    if n < 1:
        return False, "CuPy found no CUDA device"
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    return True, name


def gpu_available() -> bool:
    return gpu_status()[0]


def require_gpu():
    """Return the cupy module, or raise GpuUnavailable saying why and how to install."""
    ok, why = gpu_status()
    if not ok:
        raise GpuUnavailable(f"rnnrt: no usable GPU: {why}; {INSTALL_HINT}")
    import cupy
    return cupy


def device_info() -> dict:
    """Device name, SM count, clocks, capability, and CuPy / CUDA / cuBLAS versions."""
    cp = require_gpu()
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
        from .exec.cublas import load_library
        import ctypes
        v = ctypes.c_int()
        lib = load_library()
        lib.cublasGetProperty.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
        parts = []
        for prop in (0, 1, 2):  # MAJOR, MINOR, PATCH
            lib.cublasGetProperty(prop, ctypes.byref(v))
            parts.append(str(v.value))
        info["cublas"] = ".".join(parts)
    except Exception as e:  # noqa: BLE001 - informative only
        info["cublas"] = f"unknown ({e})"
    return info
