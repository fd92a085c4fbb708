"""How many clusters of the cluster kernel (persistent.py, PK_CLUSTER blocks each) the device
holds at once: the cap on the cluster counts the schedule selector times.

A cluster waits only for its own blocks, so a launch of more clusters than the device holds
is still correct; it runs in waves, and a second wave doubles the launch's steps (measured on
the H100: 16 clusters of 8 at GRU H 128 B 256 were slower than 14). The cap is therefore a
performance bound, never a correctness one, and it depends on the compiled kernel (its
registers), the block size and the dynamic shared memory, and on how the device groups its
SMs (a cluster lives on one GPC, whose size the device properties do not give).

``cluster_cap(fit, props, kernel)``: with a loaded kernel (a cupy.RawKernel, opted in to the
fit's shared memory), the driver's answer (``cuOccupancyMaxActiveClusters``, through ctypes on
the libcuda CuPy already loaded: CuPy 14 wraps only the per-SM occupancy queries); without
one (CPU runs, tests), an upper bound derived from the properties (blocks an SM holds x SMs /
PK_CLUSTER); where the driver cannot answer, the rule's cap (``persistent.rule_cluster_cap``),
with the reason. ``ClusterCap.describe`` says which it is.
"""
from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass

from .budget import REG_ALLOC_UNIT, ceil_div
from .persistent import PK_CLUSTER, rule_cluster_cap

CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4   # cuda.h, CUlaunchAttributeID


class OccupancyUnavailable(RuntimeError):
    """The driver's cluster occupancy query cannot be made or failed."""


@dataclass(frozen=True)
class ClusterCap:
    """The most clusters of PK_CLUSTER blocks of one launch that are resident together.

    clusters: the count (>= 1). source: 'driver' (cuOccupancyMaxActiveClusters for the
    compiled kernel), 'derived' (from the device properties: an upper bound) or 'rule' (the
    query was unavailable: ``rule_cluster_cap``). note: how it was found, or why not."""

    clusters: int
    source: str
    note: str

    def describe(self) -> str:
        return f"co-resident cap {self.clusters} clusters of {PK_CLUSTER} ({self.note})"

    def as_dict(self) -> dict:
        return {"clusters": self.clusters, "source": self.source, "note": self.note}


def blocks_per_sm(props: dict, threads: int, smem_bytes: int, regs_per_thread: int) -> int:
    """Blocks of ``threads`` threads, ``smem_bytes`` of dynamic shared memory and
    ``regs_per_thread`` registers one SM holds at once, by threads, shared memory (with the
    per-block reservation) and registers (allocated per warp in units of REG_ALLOC_UNIT)."""
    warps = ceil_div(int(threads), 32)
    per_warp = ceil_div(int(regs_per_thread) * 32, REG_ALLOC_UNIT) * REG_ALLOC_UNIT
    by_threads = int(props["maxThreadsPerMultiProcessor"]) // max(1, int(threads))
    by_smem = int(props["sharedMemPerMultiprocessor"]) // (
        int(smem_bytes) + int(props.get("reservedSharedMemPerBlock", 0)))
    by_regs = int(props["regsPerMultiprocessor"]) // max(1, warps * per_warp)
    return max(0, min(by_threads, by_smem, by_regs))


def derived_cap(fit, props: dict) -> ClusterCap:
    """The cap from the device properties alone: SMs x ``blocks_per_sm`` / the fit's blocks a
    cluster (PK_CLUSTER, or the tensor-core cluster kernel's 16). An upper bound: a
    cluster must sit in one GPC, and the properties do not give the GPCs' sizes (the
    driver's count is at most this)."""
    bps = blocks_per_sm(props, fit.threads, fit.smem_bytes, fit.regs_per_thread or 255)
    cn = fit.cluster or PK_CLUSTER
    n = max(1, int(props["multiProcessorCount"]) * bps // cn)
    return ClusterCap(n, "derived", f"derived from the device properties: "
                                    f"{props['multiProcessorCount']} SMs x {bps} block"
                                    f"{'' if bps == 1 else 's'} an SM / {cn}, an upper "
                                    f"bound (the GPCs' sizes are not in them)")


class _Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


class _AttrValue(ctypes.Union):   # CUlaunchAttributeValue: 64 bytes
    _fields_ = [("pad", ctypes.c_char * 64), ("clusterDim", _Dim3)]


class _LaunchAttr(ctypes.Structure):   # CUlaunchAttribute: id, 4 bytes of padding, value
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", _AttrValue)]


class _LaunchConfig(ctypes.Structure):   # CUlaunchConfig
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint),
                ("gridDimZ", ctypes.c_uint), ("blockDimX", ctypes.c_uint),
                ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttr)), ("numAttrs", ctypes.c_uint)]


def libcuda_function(symbol: str, argtypes: list):
    """The driver's function ``symbol`` (ctypes, returning a CUresult int, taking
    ``argtypes``), from the libcuda already in the process (CuPy links it); raises
    OccupancyUnavailable where there is none."""
    name = "nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1"
    try:
        fn = getattr(ctypes.CDLL(name), symbol)
    except (OSError, AttributeError) as e:
        raise OccupancyUnavailable(f"no {symbol} in {name} ({e})") from e
    fn.restype = ctypes.c_int
    fn.argtypes = argtypes
    return fn


def libcuda_query():
    """The driver's ``cuOccupancyMaxActiveClusters`` (``libcuda_function``)."""
    return libcuda_function("cuOccupancyMaxActiveClusters",
                            [ctypes.POINTER(ctypes.c_int), ctypes.c_void_p,
                             ctypes.POINTER(_LaunchConfig)])


CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14   # cuda.h, CUfunction_attribute


def libcuda_set_attribute():
    """The driver's ``cuFuncSetAttribute`` (``libcuda_function``)."""
    return libcuda_function("cuFuncSetAttribute", [ctypes.c_void_p, ctypes.c_int, ctypes.c_int])


def allow_non_portable_clusters(kernel, setter=None) -> None:
    """Let ``kernel`` (a loaded cupy.RawKernel) launch in clusters past the portable 8 blocks
    (cuFuncSetAttribute NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 1: the tensor-core cluster
    kernels of 16 blocks). ``setter``: the ctypes function (default
    ``libcuda_set_attribute()``; tests pass a fake). RuntimeError saying what the driver
    returned where it refuses: the launch would fail without it."""
    fn = libcuda_set_attribute() if setter is None else setter
    func = int(kernel.kernel.ptr)   # the CUfunction of the loaded kernel
    status = fn(ctypes.c_void_p(func), CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
    if status != 0:
        raise RuntimeError(f"cuFuncSetAttribute(NON_PORTABLE_CLUSTER_SIZE_ALLOWED) returned "
                           f"CUresult {status}: clusters past 8 blocks cannot launch")


def driver_max_active_clusters(kernel, threads: int, smem_bytes: int, query=None,
                               cluster: int = PK_CLUSTER) -> int:
    """The driver's count of co-resident clusters of ``cluster`` blocks (the kernel's
    __cluster_dims__: PK_CLUSTER for the cluster kernels, 2 for the stack backward's pairs)
    for ``kernel`` (a cupy.RawKernel whose dynamic shared memory limit already allows
    ``smem_bytes``) in blocks of ``threads`` threads. ``query``: the ctypes function
    (default ``libcuda_query()``; tests pass a fake). Raises OccupancyUnavailable when the
    driver cannot answer."""
    fn = libcuda_query() if query is None else query
    try:
        func = int(kernel.kernel.ptr)   # the CUfunction of the loaded kernel
    except AttributeError as e:
        raise OccupancyUnavailable(f"not a loaded CuPy kernel ({e})") from e
    attr = _LaunchAttr(id=CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)
    attr.value.clusterDim = _Dim3(int(cluster), 1, 1)   # the kernel's __cluster_dims__
    cfg = _LaunchConfig(gridDimX=int(cluster), gridDimY=1, gridDimZ=1, blockDimX=int(threads),
                        blockDimY=1, blockDimZ=1, sharedMemBytes=int(smem_bytes),
                        hStream=None, attrs=ctypes.pointer(attr), numAttrs=1)
    out = ctypes.c_int(0)
    status = fn(ctypes.byref(out), ctypes.c_void_p(func), ctypes.byref(cfg))
    if status != 0:
        raise OccupancyUnavailable(f"cuOccupancyMaxActiveClusters returned CUresult {status}")
    if out.value < 1:
        raise OccupancyUnavailable(f"cuOccupancyMaxActiveClusters gave {out.value} clusters")
    return int(out.value)


def cluster_cap(fit, props: dict, kernel=None, query=None) -> ClusterCap:
    """The co-resident cap for the cluster kernel's ``fit`` (persistent.Fit, cluster > 0) on
    the device of ``props``: the driver's count for the loaded ``kernel`` (cupy.RawKernel,
    opted in to ``fit.smem_bytes``), else (no kernel: CPU) ``derived_cap``; where the driver
    cannot answer, the rule's cap for one layer, saying why."""
    if not fit.cluster:
        raise ValueError(f"cluster_cap: {fit.kernel} is not a cluster kernel")
    if kernel is None:
        return derived_cap(fit, props)
    try:
        n = driver_max_active_clusters(kernel, fit.threads, fit.smem_bytes, query,
                                       cluster=fit.cluster)
    except OccupancyUnavailable as e:
        rule = rule_cluster_cap(int(props["multiProcessorCount"]))
        return ClusterCap(rule, "rule", f"occupancy query unavailable ({e}): the rule's cap, "
                                        f"half the SMs / {PK_CLUSTER}")
    return ClusterCap(n, "driver", f"cuOccupancyMaxActiveClusters, {fit.threads} threads, "
                                   f"{fit.smem_bytes} B shared")
