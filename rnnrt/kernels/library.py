"""Compiled kernels (CuPy): each cuda_src file compiled once per process, kernels loaded by
name, launched on CuPy's current stream. Importing this module needs no CuPy; the first
compile imports it.
"""
from __future__ import annotations

import functools

from . import persistent as pk
from .registry import get_kernel, kernel_args
from .sources import source

@functools.lru_cache(maxsize=None)
def compile_module(file: str, text: str, options: tuple[str, ...]):
    """One cupy.RawModule per (file, source text, options): each file compiles once a process."""
    import cupy  # here, not at the top: importing rnnrt.kernels must work without CuPy

    return cupy.RawModule(code=text, options=options)


class KernelLibrary:
    """Compiled kernels, loaded lazily by name: ``KernelLibrary().get('lstm_fwd')``.

    Each file is compiled once per process (per options) however many libraries ask.
    ``launch`` runs a kernel on CuPy's current stream.
    """

    def __init__(self, options=("-std=c++17",)):
        self.options = tuple(options)
        self._kernels = {}

    def get(self, name: str):
        """The cupy.RawKernel ``name``."""
        if name not in self._kernels:
            kinfo = get_kernel(name)
            module = compile_module(kinfo.file, source(kinfo.file), self.options)
            self._kernels[name] = module.get_function(name)
        return self._kernels[name]

    def with_shared(self, name: str, smem_bytes: int):
        """The cupy.RawKernel ``name``, opted in (cudaFuncSetAttribute) to ``smem_bytes`` of
        dynamic shared memory where that is past the default 48 KB and past what it already
        allows. Call it before a launch or a graph capture, not inside one."""
        fn = self.get(name)
        if smem_bytes > pk.DEFAULT_SHARED_BYTES and fn.max_dynamic_shared_size_bytes < smem_bytes:
            fn.max_dynamic_shared_size_bytes = smem_bytes
        return fn

    def launch(self, name: str, rows: int, cols: int, out_ptrs_lds, in_ptrs_lds) -> None:
        """Launch ``name`` over a [rows, cols] problem with (pointer, ld) pairs."""
        kinfo = get_kernel(name)
        grid, block = kinfo.launch(rows, cols)
        self.get(name)(grid, block, kernel_args(kinfo, rows, cols, out_ptrs_lds, in_ptrs_lds))

    def launch_persistent(self, fit, out_ptrs_lds, in_ptrs_lds, steps: int) -> None:
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
        self.with_shared(fit.kernel, smem)(grid, block, args, shared_mem=smem)
