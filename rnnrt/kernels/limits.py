"""The device limits a plan depends on: what ``persistent.persistent_fit`` reads (SM count,
shared memory, threads, registers), as a small hashable record that can sit in a PlanKey.

A GPU run takes them from the device (``DeviceLimits.from_device(cp)``); CPU runs (tests, the
NumPy executor, ``--cpu``) name a device explicitly. ``H100_SXM`` is the lent H100's
properties as CuPy reported them, kept for CPU runs only: a GPU run never uses it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

_PROPS = {  # DeviceLimits field -> cudaDeviceProp field (CuPy's getDeviceProperties keys)
    "sms": "multiProcessorCount",
    "smem_per_block_optin": "sharedMemPerBlockOptin",
    "smem_per_sm": "sharedMemPerMultiprocessor",
    "reserved_smem_per_block": "reservedSharedMemPerBlock",
    "max_threads_per_block": "maxThreadsPerBlock",
    "max_threads_per_sm": "maxThreadsPerMultiProcessor",
    "regs_per_sm": "regsPerMultiprocessor",
    "regs_per_block": "regsPerBlock",
    "cc_major": "major",
}
_OPTIONAL = ("reservedSharedMemPerBlock", "major")   # 0 when absent (major 0: no clusters)


@dataclass(frozen=True)
class DeviceLimits:
    """Per-device resource limits (bytes, threads, registers) and the device's name."""

    name: str
    sms: int
    smem_per_block_optin: int
    smem_per_sm: int
    reserved_smem_per_block: int
    max_threads_per_block: int
    max_threads_per_sm: int
    regs_per_sm: int
    regs_per_block: int
    cc_major: int = 0   # compute capability, major: 9 and later have thread-block clusters

    def __post_init__(self):
        for f, _ in _PROPS.items():
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"DeviceLimits.{f}: expected an int >= 0, got {v!r}")
        if self.sms < 1:
            raise ValueError(f"DeviceLimits.sms: expected >= 1, got {self.sms}")

    @classmethod
    def from_props(cls, props: dict, name: str | None = None) -> "DeviceLimits":
        """From CuPy's ``cupy.cuda.runtime.getDeviceProperties(dev)`` dict."""
        missing = [p for p in _PROPS.values() if p not in props and p not in _OPTIONAL]
        if missing:
            raise ValueError(f"props: missing {missing}")
        raw = props.get("name", b"?")
        dev = name or (raw.decode() if isinstance(raw, bytes) else str(raw))
        return cls(dev, **{f: int(props.get(p, 0)) for f, p in _PROPS.items()})

    @classmethod
    def from_device(cls, cp, device: int | None = None) -> "DeviceLimits":
        """The limits of CUDA device ``device`` (default: CuPy's current device)."""
        dev = cp.cuda.Device().id if device is None else int(device)
        return cls.from_props(cp.cuda.runtime.getDeviceProperties(dev))

    def props(self) -> dict:
        """The CuPy-style properties dict ``persistent_fit`` reads."""
        d = asdict(self)
        return {p: d[f] for f, p in _PROPS.items()}


H100_SXM = DeviceLimits("NVIDIA H100 80GB HBM3 (example, for CPU runs)", sms=132,
                        smem_per_block_optin=232448, smem_per_sm=233472,
                        reserved_smem_per_block=1024, max_threads_per_block=1024,
                        max_threads_per_sm=2048, regs_per_sm=65536, regs_per_block=65536,
                        cc_major=9)
"""The lent H100's limits (CuPy 14.2, 2026-11-21), for plans built on a CPU."""
