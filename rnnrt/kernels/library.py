"""Compiled kernels (CuPy): each cuda_src file compiled once per process, kernels loaded by
name, launched on CuPy's current stream. Importing this module needs no CuPy; the first
compile imports it.

A file's first compile on a machine takes seconds (NVRTC; all seven files about 19 s on the
H100 host); CuPy keeps the result on disk (keyed by the source text, the options, the GPU
architecture and the CUDA version), so later processes load it in milliseconds. A compile
that is still running after ANNOUNCE_AFTER_S says so, once, on stderr: which file, and about
how long it takes (an estimate from the source's size); a fast load from CuPy's cache says
nothing.

A plan with 16-bit buffers runs the pointwise kernels' typed twins (``typed.py``): the
library instantiates the (kernel, element types) its views have, through NVRTC name
expressions, all a plan's missing ones of a file in one compile (``instantiate``), each
combination once a process (the function cache and the module cache are bounded, least
recently used out; a launch or graph built on an evicted function keeps its module alive,
CuPy's functions hold their module). fp32 plans run the ``extern "C"`` kernels as before.
"""
from __future__ import annotations

import functools
import sys
import threading
import time

from collections import OrderedDict

from . import mmac
from . import persistent as pk
from . import typed
from .occupancy import allow_non_portable_clusters
from .registry import REGISTRY, get_kernel, kernel_args
from .sources import source

COMPILE_BYTES_PER_S = 5000
"""Rough NVRTC rate on these sources (the estimate a first compile announces; calibrated so
that all seven files come to about the 19 s measured on the H100 host)."""
ANNOUNCE_AFTER_S = 1.0
"""A compile running this long is a real one (not a load from CuPy's disk cache): say so."""


class _CompileClock:
    """Seconds this process has spent in kernel compiles (``announced``: NVRTC, or a load
    from CuPy's disk cache), all threads together."""

    def __init__(self):
        self._lock = threading.Lock()
        self._s = 0.0

    def add(self, seconds: float) -> None:
        with self._lock:
            self._s += seconds

    def total(self) -> float:
        with self._lock:
            return self._s


# one a process, as the compiled modules are (the lru caches below): a counter, not a handle
_COMPILE_CLOCK = _CompileClock()


def compile_seconds() -> float:
    """Seconds this process has spent compiling kernels so far. The sweep takes a point's
    share out of the time its cost model learns from: a file's first compile is paid once a
    process, not by every point (on a fresh machine the first point took 108 s, 100 of them
    compiles, and a time budget stopped the sweep there, expecting every point to)."""
    return _COMPILE_CLOCK.total()


def compile_estimate_s(text: str) -> float:
    """Rough seconds NVRTC takes for ``text`` (at least one)."""
    return max(1.0, len(text) / COMPILE_BYTES_PER_S)


def _announce(msg: str) -> None:
    print(f"[rnnrt] {msg}", file=sys.stderr, flush=True)


def announced(file: str, text: str, compile_fn, say=None, after_s: float | None = None):
    """Run ``compile_fn()``; if it is still running after ``after_s`` seconds (default
    ANNOUNCE_AFTER_S), one line through ``say`` names ``file`` and the estimated time (from a
    timer thread; where the compile holds the interpreter, the line comes when it ends,
    with the time it took). -> what compile_fn returned."""
    after_s = ANNOUNCE_AFTER_S if after_s is None else after_s
    say = _announce if say is None else say
    # Who says it, the timer thread or the finally below, is whoever takes this lock first
    # (never released): taking it is atomic, a check of a flag then a set is not, and both
    # may run at once (a timer already running is not stopped by cancel).
    once = threading.Lock()
    line = (f"compiling {file} ({len(text) // 1000} kB of CUDA, NVRTC): first use on this "
            f"machine, about {compile_estimate_s(text):.0f} s; cached on disk for later runs")

    def tell():
        if once.acquire(blocking=False):
            say(line)

    timer = threading.Timer(after_s, tell)
    timer.daemon = True
    t0 = time.perf_counter()
    timer.start()
    try:
        return compile_fn()
    finally:
        timer.cancel()
        dt = time.perf_counter() - t0
        _COMPILE_CLOCK.add(dt)
        if dt >= after_s and once.acquire(blocking=False):   # the timer could not run
            say(line.replace("compiling", "compiled", 1).replace(
                f"about {compile_estimate_s(text):.0f} s", f"took {dt:.1f} s"))


@functools.lru_cache(maxsize=None)
def compile_module(file: str, text: str, options: tuple[str, ...]):
    """One cupy.RawModule per (file, source text, options), compiled here: each file once a
    process, a slow (first-use) compile announced (``announced``)."""
    import cupy  # here, not at the top: importing rnnrt.kernels must work without CuPy

    def build():
        module = cupy.RawModule(code=text, options=options)
        # CuPy compiles lazily, on the first get_function: compile now, under the announcer
        compile_now = getattr(module, "compile", None)
        if compile_now is not None:
            compile_now()
        return module

    return announced(file, text, build)


TWIN_MODULES_MAX = 32
"""Compiled modules of typed twins kept per process (each a file's source with the name
expressions one ``instantiate`` call needed)."""
TWIN_FUNCTIONS_MAX = 256
"""Loaded twin functions a KernelLibrary keeps (by (kernel, element types))."""


@functools.lru_cache(maxsize=TWIN_MODULES_MAX)
def compile_twins(file: str, text: str, options: tuple[str, ...], exprs: tuple[str, ...]):
    """One cupy.RawModule of ``file`` with the typed twins ``exprs`` instantiated (NVRTC name
    expressions), compiled here, announced when slow (``announced``). Cached per
    (file, text, options, exprs), at most TWIN_MODULES_MAX modules.

    The compiled text ends with a comment naming the expressions: CuPy's disk cache is keyed
    on the source text, and CuPy releases before 2026-03 left the name expressions out of
    the key, so two instantiation sets of one file would share (and mis-load) one entry."""
    import cupy

    code = text + "\n// typed twins instantiated (rnnrt): " + "; ".join(exprs) + "\n"

    def build():
        module = cupy.RawModule(code=code, options=options, name_expressions=list(exprs))
        compile_now = getattr(module, "compile", None)
        if compile_now is not None:
            compile_now()
        return module

    return announced(f"{file} ({len(exprs)} typed twins)", text, build)


TYPED_ONLY = "-DRNNRT_TYPED_ONLY"
"""The option that leaves a persistent file's fp32 (``extern "C"``) kernels out of a module
compiled for its typed instantiations (``KernelLibrary.get_persistent``)."""


def typed_persistent_kernels(file: str, cluster: bool) -> tuple[str, ...]:
    """The registered persistent kernels of ``file`` that have typed instantiations, those
    that run in clusters (``typed.needs_clusters``: sm_90 and later only) only where
    ``cluster``."""
    return tuple(k.name for k in REGISTRY
                 if k.persistent and k.file == file
                 and file in typed.TYPED_PERSISTENT_FILES + typed.MMA_FILES
                 and (cluster or not typed.needs_clusters(k.name)))


def precompile(lib, dtype="float32", cluster: bool = True) -> None:
    """Compile every kernel file ``lib`` (a KernelLibrary) runs at precision ``dtype`` once,
    before anything is timed: the schedule selector's budget (a few seconds a shape) is for
    timing kernels, and a file's first use compiles it (~15 s; CuPy caches the result on
    disk, but a fresh machine has none). The ``extern "C"`` kernels of every file but the
    typed-only ones (``lib.get``); at a precision other than float32 also the module of typed
    instantiations of each persistent file that has one (``lib.get_persistent``: one module
    a (file, precision) holds them all), the tensor-core kernels at their precisions only.
    cluster: whether the device runs thread-block clusters (its typed cluster kernels exist:
    ``typed_persistent_kernels``). The pointwise kernels' typed twins compile when a plan's
    executor is made (exec/cuda_exec.py), not here."""
    from ..precision import get_precision
    name = get_precision(dtype).name
    for k in REGISTRY:
        if k.file not in typed.MMA_FILES:
            lib.get(k.name)
    if name == "float32":
        return
    files = typed.TYPED_PERSISTENT_FILES + (typed.MMA_FILES if name in typed.MMA_DTYPES
                                            else ())
    for file in files:
        names = typed_persistent_kernels(file, cluster)
        if names:
            lib.get_persistent(names[0], name)


def device_has_clusters() -> bool:
    """Whether the current CUDA device runs thread-block clusters (compute capability 9.0+)."""
    import cupy

    return int(cupy.cuda.Device().compute_capability) >= 90


class KernelLibrary:
    """Compiled kernels, loaded lazily by name: ``KernelLibrary().get('lstm_fwd')``.

    Each file is compiled once per process (per options) however many libraries ask.
    ``launch`` runs a kernel on CuPy's current stream.
    """

    def __init__(self, options=("-std=c++17",)):
        self.options = tuple(options)
        self._kernels = {}
        self._twins = OrderedDict()   # (name, types) -> function, least recently used first

    def get(self, name: str):
        """The cupy.RawKernel ``name``."""
        if name not in self._kernels:
            kinfo = get_kernel(name)
            if kinfo.file in typed.MMA_FILES:
                raise ValueError(f"{name}: no fp32 kernel (the tensor-core kernels of "
                                 f"{kinfo.file} are bf16 / fp16 instantiations: "
                                 f"get_persistent(name, dtype))")
            module = compile_module(kinfo.file, source(kinfo.file), self.options)
            self._kernels[name] = module.get_function(name)
        return self._kernels[name]

    def instantiate(self, requests) -> None:
        """Load the typed twins of ``requests``, an iterable of (kernel name, element types:
        one precision storage name per pointer argument, ``typed.check_types``), that are not
        loaded yet: the missing ones of each file compiled together, in one module. All-fp32
        requests need nothing (the ``extern "C"`` kernel)."""
        missing: dict[str, dict[str, tuple]] = {}
        for name, types in requests:
            types = typed.check_types(name, types)
            if typed.is_fp32(types) or (name, types) in self._twins:
                continue
            expr = typed.name_expression(name, types)
            missing.setdefault(get_kernel(name).file, {})[expr] = (name, types)
        for file, by_expr in missing.items():
            exprs = tuple(sorted(by_expr))
            module = compile_twins(file, source(file), self.options, exprs)
            for expr, key in by_expr.items():
                self._remember(key, module.get_function(expr))

    @property
    def loaded_twins(self) -> tuple:
        """The (kernel, element types) of the twins loaded, least recently used first."""
        return tuple(self._twins)

    def _remember(self, key, fn) -> None:
        self._twins[key] = fn
        self._twins.move_to_end(key)
        while len(self._twins) > TWIN_FUNCTIONS_MAX:
            self._twins.popitem(last=False)

    def get_typed(self, name: str, types):
        """The kernel ``name`` for element types ``types`` (one per pointer argument,
        outputs then inputs; ``typed.check_types``): the ``extern "C"`` kernel when all are
        float32, else its typed twin, instantiated on first use."""
        types = typed.check_types(name, types)
        if typed.is_fp32(types):
            return self.get(name)
        if (name, types) not in self._twins:
            self.instantiate([(name, types)])
        self._twins.move_to_end((name, types))
        return self._twins[name, types]

    def get_persistent(self, name: str, dtype="float32"):
        """Persistent kernel ``name`` at precision ``dtype``: the ``extern "C"`` kernel for
        float32, else its typed instantiation (``typed.persistent_expression``). The first
        typed request of a (file, precision) compiles ONE module with the instantiations of
        every persistent kernel of the file at that precision and without the file's fp32
        kernels (``-DRNNRT_TYPED_ONLY``): a module an instantiation recompiled the whole file
        each time (~6 s on the device's host), and the GPU test matrix spent ten minutes
        compiling."""
        expr = typed.persistent_expression(name, dtype)
        if expr is None:
            return self.get(name)
        key = (name, ("persistent", expr))
        if key not in self._twins:
            file = get_kernel(name).file
            names = typed_persistent_kernels(file, cluster=device_has_clusters())
            if name not in names:
                names = names + (name,)
            exprs = {typed.persistent_expression(n, dtype): n for n in names}
            module = compile_twins(file, source(file), self.options + (TYPED_ONLY,),
                                   tuple(sorted(exprs)))
            for e, n in exprs.items():
                self._remember((n, ("persistent", e)), module.get_function(e))
        self._twins.move_to_end(key)
        return self._twins[key]

    def with_shared(self, name: str, smem_bytes: int, dtype="float32"):
        """The cupy.RawKernel ``name`` (at precision ``dtype``: ``get_persistent``), opted in
        (cudaFuncSetAttribute) to ``smem_bytes`` of dynamic shared memory where that is past
        the default 48 KB and past what it already allows, and for a kernel of clusters past
        8 blocks (mmac.non_portable) allowed to launch them. Call it before a launch or a
        graph capture, not inside one."""
        fn = self.get_persistent(name, dtype)
        if smem_bytes > pk.DEFAULT_SHARED_BYTES and fn.max_dynamic_shared_size_bytes < smem_bytes:
            fn.max_dynamic_shared_size_bytes = smem_bytes
        if mmac.non_portable(name):   # clusters of 16 blocks: the launch must opt in (a
            allow_non_portable_clusters(fn)   # driver call; the kernel may be a new load)
        return fn

    def launch(self, name: str, rows: int, cols: int, out_ptrs_lds, in_ptrs_lds) -> None:
        """Launch ``name`` over a [rows, cols] problem with (pointer, ld) pairs."""
        kinfo = get_kernel(name)
        grid, block = kinfo.launch(rows, cols)
        self.get(name)(grid, block, kernel_args(kinfo, rows, cols, out_ptrs_lds, in_ptrs_lds))

    def launch_persistent(self, fit, out_ptrs_lds, in_ptrs_lds, steps: int,
                          dtype="float32") -> None:
        """Launch ``fit``'s persistent kernel over ``steps`` steps of one layer (rows = B,
        cols = H from the fit) on CuPy's current stream. Sets the kernel's dynamic shared
        memory limit first when the fit needs more than the default 48 KB. For a grid
        kernel the caller guarantees that no other grid kernel runs at the same time (see
        docs/kernels.md, the barrier contract); cluster kernels may run side by side."""
        kinfo = get_kernel(fit.kernel)
        grid, block, smem = kinfo.launch_persistent(fit)
        fit.check_steps(steps)
        args = kernel_args(kinfo, fit.batch, fit.hidden, out_ptrs_lds, in_ptrs_lds,
                           fit.scalars(steps))
        self.with_shared(fit.kernel, smem, dtype)(grid, block, args, shared_mem=smem)
