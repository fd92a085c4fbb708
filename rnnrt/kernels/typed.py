"""The pointwise kernels' typed twins: which element types a kernel argument may have, and
the NVRTC name expression of one instantiation.

Every non-persistent kernel K of cuda_src/ has, besides its ``extern "C"`` fp32 definition, a
template twin ``K_t<T_1, ..., T_n>``: one element type per pointer argument in call order
(outputs, then inputs, as the registry lists them), each ``float``, ``bf16`` or ``fp16``
(cuda_src/storage.cuh). The executor asks for the combination its views' buffers have; an
all-fp32 combination is the ``extern "C"`` kernel itself (what fp32 plans have always run),
so only a plan with 16-bit buffers compiles a twin. Nothing here needs CuPy.

The per-layer persistent kernels (persistent.cu, persistent_bwd.cu), the register-resident
and the block-persistent forward kernels (persistent_regs.cu, persistent_solo.cu) are
instantiated per precision instead (``persistent_expression``): ``K_t<TS, TF32>``, TS the
storage type of the sequences their product reads (h, dg), TF32 whether it reads its operands
TF32-rounded; a float32 key runs the ``extern "C"`` kernel. The fp32 stack kernels and the register-resident backward are fp32
only; the tensor-core grid kernels (persistent_mma.cu, and the backward's
persistent_mma_bwd.cu), the tensor-core cluster kernels (persistent_mmac.cu, their wide form
persistent_mmacw.cu, their grid form persistent_mmag.cu) and the
tensor-core stack kernels (persistent_stack_mma.cu, its
backward persistent_stack_mma_bwd.cu) are bf16 / fp16 only (``MMA_FILES``).
"""
from __future__ import annotations

from ..precision import get_precision
from .registry import get_kernel

ELEMENT_CTYPES = {"float32": "float", "bfloat16": "bf16", "float16": "fp16"}
"""Element type name (a buffer's storage, precision.Precision.storage) -> its C type in
cuda_src/storage.cuh."""


def has_twin(name: str) -> bool:
    """Whether kernel ``name`` has a typed twin (every non-persistent kernel does)."""
    return not get_kernel(name).persistent


def check_types(name: str, types) -> tuple[str, ...]:
    """``types`` as a tuple, checked: one element type name (a key of ELEMENT_CTYPES) per
    pointer argument of kernel ``name``, outputs then inputs. ValueError naming what is
    wrong."""
    kinfo = get_kernel(name)
    types = tuple(types)
    args = [a for a, _ in kinfo.outs + kinfo.ins]
    if len(types) != len(args):
        raise ValueError(f"{name}: types: expected {len(args)} element types (one per "
                         f"argument {args}), got {len(types)}: {types}")
    for arg, t in zip(args, types):
        if t not in ELEMENT_CTYPES:
            raise ValueError(f"{name}: types: {arg} has element type {t!r}, expected one of "
                             f"{list(ELEMENT_CTYPES)}")
    return types


def is_fp32(types) -> bool:
    """Whether every argument is float32: the ``extern "C"`` kernel, no twin."""
    return all(t == "float32" for t in types)


def name_expression(name: str, types) -> str:
    """The NVRTC name expression of kernel ``name``'s twin for ``types`` (``check_types``),
    e.g. ``ew_copy_t<bf16, float>``."""
    types = check_types(name, types)
    if not has_twin(name):
        raise ValueError(f"{name}: a persistent kernel, fp32 only (no typed twin)")
    return f"{name}_t<{', '.join(ELEMENT_CTYPES[t] for t in types)}>"


TYPED_PERSISTENT_ARGS = ("h", "x", "dgx", "dgh")
"""The persistent kernels' arguments that lie in 'store' buffers (the key's storage type);
the others are fp32 (sync: uint32). x: the tensor-core stack kernel's input sequence (the
fp32 stack kernel's, at float32, is float32 like every argument there)."""


def persistent_expression(name: str, dtype) -> str | None:
    """The NVRTC name expression of persistent kernel ``name``'s instantiation for precision
    ``dtype`` (rnnrt.precision.DTYPES), e.g. ``lstm_persistent_fwd_t<bf16, false>``; None
    for float32 (the ``extern "C"`` kernel). ValueError for a kernel without typed
    instantiations (not persistent, or the stack kernel) at another precision, and for a
    tensor-core kernel (MMA_FILES) at any precision but MMA_DTYPES."""
    p = get_precision(dtype)
    kinfo = get_kernel(name)
    if kinfo.file in MMA_FILES:   # bf16 / fp16 only: no fp32 kernel to fall back on
        if p.name not in MMA_DTYPES:
            raise ValueError(f"{name}: no {p.name} instantiation (the tensor-core kernels "
                             f"of {MMA_FILES} run {list(MMA_DTYPES)})")
        return f"{name}_t<{ELEMENT_CTYPES[p.storage]}, false>"
    if p.name == "float32":
        return None
    if not kinfo.persistent or kinfo.file not in TYPED_PERSISTENT_FILES:
        raise ValueError(f"{name}: no typed persistent instantiation (dtype {p.name!r}: "
                         f"the per-layer persistent kernels of {TYPED_PERSISTENT_FILES} "
                         f"have them)")
    tf32 = "true" if p.gemm == "tf32" else "false"
    return f"{name}_t<{ELEMENT_CTYPES[p.storage]}, {tf32}>"


TYPED_PERSISTENT_FILES = ("persistent.cu", "persistent_bwd.cu", "persistent_regs.cu",
                          "persistent_solo.cu")
"""The files whose persistent kernels have typed instantiations."""
CLUSTER_ONLY_FILES = ("persistent_regs.cu", "persistent_mmac.cu", "persistent_mmacw.cu",
                      "persistent_mmag.cu")
"""Typed files whose every kernel exists on sm_90 and later only (``needs_clusters``): those
that run in thread-block clusters, and the cluster kernels' grid form (persistent_mmag.cu:
its body is theirs, and its fit is the tensor-core cluster kernel's, which asks for 9.0)."""


def needs_clusters(name: str) -> bool:
    """Whether persistent kernel ``name`` runs in thread-block clusters, so exists for sm_90
    and later only (a device without clusters has no instantiation of it): the cluster
    kernels of persistent.cu / persistent_bwd.cu ('_cluster_' in the name) and every kernel
    of CLUSTER_ONLY_FILES."""
    return "_cluster_" in name or get_kernel(name).file in CLUSTER_ONLY_FILES
MMA_FILES = ("persistent_mma.cu", "persistent_mma_bwd.cu", "persistent_mmac.cu",
             "persistent_mmacw.cu", "persistent_mmag.cu", "persistent_stack_mma.cu", "persistent_stack_mma_bwd.cu")
"""The files whose persistent kernels are typed instantiations only, at MMA_DTYPES (the
tensor-core grid kernels and the tensor-core stack kernels, forward and backward: no
``extern "C"`` fp32 kernel)."""
MMA_DTYPES = ("bfloat16", "float16")


def persistent_types(name: str, dtype) -> tuple[str, ...]:
    """The element type of each pointer argument (outputs, then inputs) of persistent kernel
    ``name`` at precision ``dtype``: the storage type for TYPED_PERSISTENT_ARGS, uint32 for
    the barrier counters, float32 for the rest."""
    store = get_precision(dtype).storage
    kinfo = get_kernel(name)
    return tuple(store if a in TYPED_PERSISTENT_ARGS else "uint32" if a == "sync"
                 else "float32" for a, _ in kinfo.outs + kinfo.ins)
