"""What a model, a pass and a plan need, computed before anything is allocated or looped over:
the one place that sizes things, and refuses what cannot fit.

Everything here is arithmetic on the sizes a caller gave (closed forms: nothing loops over a
user-given count), so a model of 10**9 layers or a batch of 10**9 is refused at once rather
than after minutes of work or a NumPy ``Unable to allocate 447 GiB`` traceback:

  model        the flat parameter buffer (``params.py``'s layout: every entry starts on a
               64-element boundary) plus the layout's Python objects, per layer
  reference    the NumPy reference's forward (every layer's h, c and saved gates for every
               step: it keeps them even for inference) and backward (their gradients)
  plan         a plan's ops, held in host memory as Python objects (``PLAN_OP_BYTES`` each):
               an upper bound on their number from the switches (``plan_ops_bound``)
  workspace    a plan's buffers (``workspace_elements``: the builders' own buffer lists,
               the forward's, plus the backward's for a training key)
  index range  what a kernel or cuBLAS receives as a 32-bit int (rows, columns, leading
               dimensions, T) must be below 2**31

A refusal is a ``SizeError`` (a ValueError) naming the sizes asked for, the need in GiB and
the limit: the host's available memory (``/proc/meminfo``'s MemAvailable, or
``RNNRT_HOST_BYTES`` to set a cap), the GPU's free memory, or the int32 range.
"""
from __future__ import annotations

import os

from .cells import get_cell
from .params import ALIGN, align  # noqa: F401  (ALIGN: the layout's, named here too)

INT32_MAX = 2**31 - 1
"""Largest row count, column count, leading dimension or step count a kernel or cuBLAS takes."""
LAYOUT_BYTES_PER_LAYER = 2048
"""Host bytes of one layer's layout entries and parameter views (measured ~1.2 KB, peak
~1.7 KB; tests/core/test_core_sizes.py keeps the bound honest)."""
PLAN_OP_BYTES = 768
"""Host bytes per op of ``plan_ops_bound`` that building a plan takes at its peak, views,
tasks and events included (measured up to ~560 B; tests/core/test_core_sizes.py keeps the
bound honest)."""
NAIVE_POINTWISE = {"lstm": 16, "gru": 16, "rnn_tanh": 4, "rnn_relu": 4}
"""Pointwise kernels one step of one layer issues without the fused switch, at most
(LSTM 12 forward and 14 backward, GRU 12, RNN 4 and 2)."""


class SizeError(ValueError):
    """A model, pass or plan that does not fit this machine or a kernel's index range. The
    message names the sizes, the need in GiB and the limit; nothing was allocated."""


def gib(nbytes: float) -> str:
    """``nbytes`` in GiB for messages: '447.0 GiB' (small ones with more digits)."""
    g = nbytes / 2**30
    return f"{g:.1f} GiB" if g >= 10 else f"{g:.2f} GiB" if g >= 0.1 else f"{g:.2g} GiB"


def host_available() -> int | None:
    """Bytes of host memory a new allocation can take: ``RNNRT_HOST_BYTES`` if set (a cap
    the user chooses), else the kernel's MemAvailable, else free pages; None if unknown (then
    nothing is refused for host memory)."""
    cap = os.environ.get("RNNRT_HOST_BYTES")
    if cap:
        try:
            return int(float(cap))
        except ValueError:
            raise SizeError(f"RNNRT_HOST_BYTES: expected a number of bytes, got {cap!r}") \
                from None
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def param_elements(cell: str, input_size: int, hidden: int, layers: int, bias: bool) -> int:
    """Elements of the flat parameter buffer (``params.make_layout(...).size``), in closed
    form: every entry starts aligned, so the buffer is the sum of its entries rounded up, and
    layers above the first are alike."""
    gh = get_cell(cell).gates * hidden
    biases = 2 * align(gh) if bias else 0
    first = align(gh * input_size) + align(gh * hidden) + biases
    return first + (layers - 1) * (2 * align(gh * hidden) + biases)


def describe_shape(cell, input_size, hidden, layers, batch=None, steps=None) -> str:
    """'LSTM input_size=8 hidden_size=16 num_layers=2, batch=4 steps=10' (for messages)."""
    return _shape_words(cell, input_size, hidden, layers, batch, steps)


def _shape_words(cell, input_size, hidden, layers, batch=None, steps=None) -> str:
    s = (f"{get_cell(cell).mode.split('_')[0]} input_size={input_size} hidden_size={hidden} "
         f"num_layers={layers}")
    if batch is not None:
        s += f", batch={batch} steps={steps}"
    return s


def refuse_if(need: int, limit: int | None, what: str, where: str) -> None:
    """SizeError '``what`` needs <GiB> of ``where``; <GiB> available' when need > limit."""
    if limit is not None and need > limit:
        raise SizeError(f"{what} needs {gib(need)} of {where}; {gib(limit)} available")


def model_bytes(cell: str, input_size: int, hidden: int, layers: int, bias: bool,
                itemsize: int) -> int:
    """Host bytes of a model: its flat buffer plus its layout's objects."""
    return (param_elements(cell, input_size, hidden, layers, bias) * itemsize
            + layers * LAYOUT_BYTES_PER_LAYER)


def check_model(cell: str, input_size: int, hidden: int, layers: int, bias: bool,
                itemsize: int, available: int | None = None) -> None:
    """SizeError unless the model fits the host (``available`` bytes, default
    ``host_available()``). The sizes are positive ints (checked before)."""
    need = model_bytes(cell, input_size, hidden, layers, bias, itemsize)
    refuse_if(need, host_available() if available is None else available,
              f"the model ({_shape_words(cell, input_size, hidden, layers)}, "
              f"{param_elements(cell, input_size, hidden, layers, bias):,} parameters)",
              "host memory")


REFERENCE_PASSES = ("forward", "train", "backward")


def reference_bytes(cell: str, input_size: int, hidden: int, layers: int, batch: int,
                    steps: int, itemsize: int, pass_: str = "forward") -> int:
    """Host bytes the NumPy reference allocates in one pass: 'forward' (every layer's h, c
    and saved gates for every step, y, the states, one layer's W x of every step and its
    operand), 'train' (that plus the snapshots of x and the parameters a tape keeps) or
    'backward' (the backward's own: dx, the gate gradients of one layer, the x and h its
    weight-gradient GEMMs read, the parameter gradients and their flat copy)."""
    if pass_ not in REFERENCE_PASSES:
        raise ValueError(f"pass_: expected one of {REFERENCE_PASSES}, got {pass_!r}")
    c = get_cell(cell)
    bh = batch * hidden
    params = param_elements(cell, input_size, hidden, layers, True)
    if pass_ == "backward":
        elems = (steps * batch * (2 * input_size + hidden + 2 * c.gates * hidden)
                 + 2 * params + 4 * layers * bh)
        return elems * itemsize
    per_layer = (steps + 1) * bh * (2 if c.has_cell_state else 1) + steps * bh * c.saved_gates
    # + y, the states, one layer's W x of every step and its operand (a rounded copy at
    # tf32), and one step's temporaries (gi, gh, their sum, the gates' halves)
    elems = (layers * per_layer + steps * bh + 4 * layers * bh + 8 * c.gates * bh
             + steps * batch * (c.gates * hidden + max(input_size, hidden)))
    if pass_ == "train":
        elems += steps * batch * input_size + params
    return elems * itemsize


def check_reference(cell, input_size, hidden, layers, batch, steps, itemsize,
                    pass_="forward", available=None) -> None:
    """SizeError unless the NumPy reference's pass (``reference_bytes``) fits the host."""
    need = reference_bytes(cell, input_size, hidden, layers, batch, steps, itemsize, pass_)
    refuse_if(need, host_available() if available is None else available,
              f"the NumPy reference's {'training forward' if pass_ == 'train' else pass_} "
              f"({_shape_words(cell, input_size, hidden, layers, batch, steps)})",
              "host memory")


# --------------------------------------------------------------------------------------------
# Plans and workspaces (PlanKey: plan/model.py)

def _key_words(key) -> str:
    return _shape_words(key.cell, key.input_size, key.hidden_size, key.num_layers, key.batch,
                        key.steps)


def _persistent_runs(key):
    """The persistent choice of ``key`` when its kernel runs (kernels/choice.py), else None."""
    if not key.switches.persistent:
        return None
    # kernels/choice.py's choice, or its decline (e.g. the stack kernel at 16-bit storage)
    from .kernels.choice import choose_persistent
    choice = choose_persistent(key)
    return choice if choice.runs else None


def plan_ops_bound(key, backward: bool = False) -> int:
    """An upper bound on the ops of ``key``'s forward plan (or its backward plan): per layer
    and step its GEMMs and pointwise kernels plus three events per task, per layer a few
    more. A persistent kernel that runs replaces a layer's steps by one launch per chunk."""
    sw, T, L = key.switches, key.steps, key.num_layers
    g = 1 if sw.grouped else get_cell(key.cell).gates
    pointwise = 1 if sw.fused else NAIVE_POINTWISE[key.cell]
    k = sw.steps_per_input_gemm(T)
    chunks = -(-T // k)
    per_layer = 32                         # transposes, weight gradients, bias reductions
    choice = None if backward else _persistent_runs(key)
    if choice is not None:
        chunks = -(-T // choice.steps_per_launch)
        return L * (chunks * (g + 1 + 6) + per_layer) + 16
    # per step: the R.h (or dh) GEMMs, the pointwise kernels (a backward's split dh GEMM:
    # one more, its sum), events of the cell's task; per chunk: the W.x (or dx) GEMMs and
    # their task's events
    return L * (T * (g + pointwise + 3 + backward) + chunks * (g + 3) + per_layer) + 16


def check_index_range(key) -> None:
    """SizeError unless every count a kernel or cuBLAS receives fits an int32: the rows of
    a GEMM over all steps (T*B: the W.x of input_batch 'all' or of a persistent layer, and
    the weight gradients of a training key), G*H columns, the input size."""
    sw, T, B = key.switches, key.steps, key.batch
    gh = get_cell(key.cell).gates * key.hidden_size
    all_steps = key.train or sw.persistent or sw.steps_per_input_gemm(T) == T
    rows = T * B if all_steps else sw.steps_per_input_gemm(T) * B
    for what, v in ((f"steps x batch = {T} x {B} (rows of a GEMM over all steps)" if
                     all_steps else f"input chunk x batch = {rows // B} x {B}", rows),
                    (f"gates x hidden_size = {gh}", gh), (f"input_size = {key.input_size}",
                                                          key.input_size),
                    (f"steps = {T}", T), (f"batch = {B}", B)):
        if v > INT32_MAX:
            raise SizeError(f"{what} is past the 32-bit index range of the kernels and "
                            f"cuBLAS (2**31 - 1 = {INT32_MAX:,}); split the sequence or the "
                            f"batch")


def check_plan(key, backward: bool = False, available: int | None = None) -> None:
    """SizeError unless ``key``'s plan can be built: its counts fit the index range and its
    ops (``plan_ops_bound`` x ``PLAN_OP_BYTES``) fit the host."""
    check_index_range(key)
    ops = plan_ops_bound(key, backward)
    refuse_if(ops * PLAN_OP_BYTES, host_available() if available is None else available,
              f"the {'backward' if backward else 'forward'} plan of {_key_words(key)} with "
              f"{key.switches.label()} (up to {ops:,} ops)", "host memory")


def workspace_elements(key) -> int:
    """Elements of the workspace of ``key``'s plans: the sum of the buffers its builders list
    (plan/backward.py ``workspace_buffers``: the forward's, and for a training key the
    backward's too). No op is built: the builders' geometry is O(steps), the list O(layers)
    — so callers with a user-given step count check the plan (``check_plan``) first."""
    from .plan.backward import workspace_buffers
    return sum(b.size for b in workspace_buffers(key))


def workspace_bytes(key) -> int:
    """Bytes of the workspace of ``key``'s plans on the GPU: each buffer's elements times
    its element size (plan/model.py ``Buffer.itemsize``: 2 for a 'store' buffer of 16-bit
    storage, else 4). As ``workspace_elements``, no op is built."""
    from .plan.backward import workspace_buffers
    return sum(b.size * b.itemsize(key.dtype) for b in workspace_buffers(key))


def check_workspace(key, available: int | None, where: str = "GPU memory",
                    itemsize: int | None = None) -> int:
    """SizeError unless ``key``'s workspace fits ``available`` bytes of ``where``; -> its
    bytes: ``workspace_bytes`` (each buffer at its own element size), or with ``itemsize``
    every element at that size."""
    need = workspace_bytes(key) if itemsize is None else workspace_elements(key) * itemsize
    refuse_if(need, available,
              f"the workspace of {_key_words(key)}{' (training)' if key.train else ''}", where)
    return need


def gpu_available(cp) -> int:
    """Bytes a new GPU allocation can take: the device's free memory plus what CuPy's pool
    holds unused."""
    free, _ = cp.cuda.runtime.memGetInfo()
    return int(free) + int(cp.get_default_memory_pool().free_bytes())
