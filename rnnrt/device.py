"""GPU availability, detected once per process.

``import rnnrt`` never imports CuPy; only ``require_gpu()`` and the GPU executors do. The
device's facts for records are ``session.device_info()``.
"""
from __future__ import annotations

import functools

INSTALL_HINT = ("install CuPy for your CUDA driver through rnnrt's extra, from the clone: "
                "pip install -e '.[cuda13]' (CUDA 13) or pip install -e '.[cuda12]' (CUDA 12)")


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
