"""What a persistent launch may use on one device, shared by every persistent family's fit
(persistent.py: the grid and cluster kernels; stack.py: the stack kernel).

Persistent kernels spin-wait on each other, so a fit must know the device's SMs, shared
memory and registers exactly; these come from CuPy-style device properties
(``cupy.cuda.runtime.getDeviceProperties``, or ``limits.DeviceLimits.props()`` for plans
built on a CPU).
"""
from __future__ import annotations

REG_ALLOC_UNIT = 256
"""Registers are allocated to a warp in units of 256 (sm_70 .. sm_90)."""


def ceil_div(a: int, b: int) -> int:
    """ceil(a / b) for positive ints, exactly."""
    return -(-a // b)


class Launch1D:
    """A persistent launch's grid and block from its ``blocks`` and ``threads``: a 1-D grid
    of 1-D blocks (the per-layer fits and the stack fit alike)."""

    @property
    def grid(self) -> tuple[int, int, int]:
        return (self.blocks, 1, 1)

    @property
    def block(self) -> tuple[int, int, int]:
        return (self.threads, 1, 1)


class DeviceBudget:
    """What one block may use on the device, and the block sizes a fit may try.

    props: CuPy-style device properties (multiProcessorCount, sharedMemPerBlockOptin,
    sharedMemPerMultiprocessor, reservedSharedMemPerBlock, maxThreadsPerBlock,
    maxThreadsPerMultiProcessor, regsPerMultiprocessor, regsPerBlock, major).
    regs_per_thread: what the kernel's compiled build uses (or the fit assumes).
    max_threads: the kernel's own cap on threads a block (its __launch_bounds__).
    block_sizes: the sizes to try, largest first; ``threads``: one given size instead.
    """

    def __init__(self, props: dict, regs_per_thread: int, max_threads: int,
                 block_sizes: tuple = (), threads: int | None = None):
        self.sms = int(props["multiProcessorCount"])
        self.cc_major = int(props.get("major", 0))
        self.max_threads = min(int(max_threads), int(props["maxThreadsPerBlock"]),
                               int(props.get("maxThreadsPerMultiProcessor", max_threads)))
        self.regs = int(regs_per_thread)
        self.regs_sm = int(props["regsPerMultiprocessor"])
        self.regs_block = int(props.get("regsPerBlock", self.regs_sm))
        self.per_warp = ceil_div(self.regs * 32, REG_ALLOC_UNIT) * REG_ALLOC_UNIT
        self.optin = int(props["sharedMemPerBlockOptin"])
        self.per_sm = int(props["sharedMemPerMultiprocessor"])
        self.reserved = int(props.get("reservedSharedMemPerBlock", 0))
        self.limit = min(self.optin, self.per_sm - self.reserved)
        if threads is not None:
            self.candidates = [int(threads)]
        else:
            self.candidates = ([t for t in block_sizes if t <= self.max_threads
                                and self.regs_ok(t)] or [min(block_sizes)])

    def cluster_problem(self, blocks: int) -> str | None:
        """Why clusters of ``blocks`` blocks cannot run on this device (thread-block clusters
        need compute capability 9.0; a cluster needs its blocks' SMs), or None."""
        if self.cc_major < 9:
            return (f"thread-block clusters need compute capability 9.0 or later (device: "
                    f"{self.cc_major}.x)")
        if self.sms < blocks:
            return f"{self.sms} SMs < one cluster of {blocks}"
        return None

    def regs_ok(self, threads: int) -> bool:
        """Whether a block of ``threads`` threads gets its registers (per block and per SM)."""
        return (self.regs * threads <= self.regs_block
                and ceil_div(threads, 32) * self.per_warp <= self.regs_sm)
