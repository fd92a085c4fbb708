"""The stack kernel (cuda_src/persistent_stack.cu, ``lstm_persistent_stack_fwd`` and
``gru_persistent_stack_fwd``): every layer of an LSTM or GRU stack in ONE persistent launch,
along the wavefront, with W.x inside the kernel.

Why a second persistent kernel: the per-layer grid kernel needs every SM, so the layers of a
stack run one after another, each behind its own input GEMM (docs/journal.md, fifth session: at the
paper size 4 x (0.25 ms GEMM + 100 x 11.6 us) ~ 5.6 ms). Here the SMs are cut into L groups
of NB = H / U blocks, one group a layer, all resident at once. Block (l, rank) owns units
[rank*U, rank*U + U) of layer l with their G gate rows (M = G*U = PS_M rows) and each step
multiplies [W_l | R_l] rows by [in_t ; h_t] for every batch: W tiles and the input stream
from L2 (cp.async, PS_NS stages), R stays in shared memory. Every operand is k-major (a
k's 64 rows or 64 batches contiguous: one outer product a k from six 16-byte loads); the
kernel writes those copies itself into two scratch outputs, W^T of every layer (``wt``) and
the transposed inputs (``ht``: x_t^T, h0^T in a prologue, each step's h^T beside h). Layer l's step t waits for
layer l-1's step t (its input) before the W half and for its own layer's step t-1 before
the R half, on one progress counter per layer; layer 0 waits on nobody but itself, so the
stack cannot deadlock once all blocks are resident (induction on the layer).

Batch groups: a batch over PS_BMAX runs as ``groups`` = ceil(B / PS_BMAX) stacks side by
side in the one launch (group g: batches [64g, 64g + 64) on its own L x NB blocks, its own
progress counters and k-major inputs; one W^T), where every group's blocks fit on the SMs at
once (L4 H 256: two groups, H 128: four).

GRU runs the same tile of 4 row groups of U units: r, z, n's W.x part and n's R.h part (n =
tanh(W_n x + b_in + r (R_n h + b_hn)) keeps the two apart), W's 4th group and R's 3rd zero,
and not multiplied (the input's tiles skip the 4th group, h's the 3rd: three quarters of
LSTM's FMAs for the same waits, pipeline and registers).

``stack_fit(cell, hidden, batch, layers, input_size, props)`` says whether a shape runs
(and why not); ``lstm_persistent_stack_fwd`` and ``gru_persistent_stack_fwd`` are the
registry's NumPy twins (the same functions, for the CPU plan executors). The kernel's constants are mirrored below; a test
holds them equal.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .budget import DeviceBudget, Launch1D, ceil_div
from .persistent import PK_MAX_THREADS
from .twins import gru_fwd, lstm_fwd

# The kernel's compile-time constants (cuda_src/persistent_stack.cu, PS_*).
PS_M = 64             # rows of a block: G * U
PS_BMAX = 64          # most batches
PS_KT = 64            # k rows of a staged tile
PS_NS = 3             # pipeline stages
PS_RP = 68            # row stride (floats) of a batch's partial sums (they reuse the stages)
# registers a thread at most (nvcc 13.0 -arch=sm_90: 255; the fit and a GPU test hold
# NVRTC's build to it); blocks of PK_MAX_THREADS threads (its __launch_bounds__)
PS_REGS = 255

STACK_KERNEL = "lstm_persistent_stack_fwd"
STACK_KERNELS = {"lstm": STACK_KERNEL, "gru": "gru_persistent_stack_fwd"}
"""The stack kernel of each cell it is built for."""


@dataclass(frozen=True)
class StackFit(Launch1D):
    """How a stack of ``layers`` layers (hidden H, batch B) runs as one stack launch.

    ok / reason: whether it fits (reason says why not, or what was chosen).
    units_per_block U (G*U = PS_M rows a block), blocks_per_layer NB = H / U, groups: batch
    groups of PS_BMAX side by side (``batch_groups``), blocks = groups*L*NB (the grid: one
    block a SM, all resident), smem_bytes: the R slice k-major (H x PS_M floats) + PS_NS
    stages of 2 x PS_KT x 64 floats (the partial sums reuse them) + the bias rows. sms: the
    device's SM count.
    """

    cell: str
    hidden: int
    batch: int
    layers: int
    ok: bool
    reason: str
    units_per_block: int
    blocks_per_layer: int
    smem_bytes: int
    sms: int
    threads: int = PK_MAX_THREADS

    @property
    def groups(self) -> int:
        """Batch groups side by side (``batch_groups_of``)."""
        return batch_groups_of(self.batch, self.batch_groups)

    @property
    def blocks(self) -> int:
        return self.groups * self.layers * self.blocks_per_layer

    @property
    def kernel(self) -> str:
        return STACK_KERNELS.get(self.cell, STACK_KERNEL)

    def scalars(self, steps: int) -> dict:
        """The kernel's int scalars by name (order: the registry's; ``groups`` for a kernel
        of batch groups)."""
        known = {"T": int(steps), "L": self.layers, "units_per_block": self.units_per_block}
        return known | {"groups": self.groups} if self.batch_groups else known

    label = "stack"   # what describe() calls the kernel (not a field)
    # whether a batch over PS_BMAX runs as batch groups side by side (the stack forward
    # kernels; not a field), and whether they must be whole groups (B a multiple of PS_BMAX:
    # the tensor-core kernel's)
    batch_groups = True
    whole_groups = False
    # whether the kernel reads x and the h sequence in the storage type and stores h rounded
    # to it (the tensor-core stack kernel) rather than in fp32 (not a field)
    storage_io = False

    def describe(self) -> str:
        head = (f"{self.label} {self.cell} H {self.hidden} B {self.batch} L {self.layers}: U "
                f"{self.units_per_block}, {batch_groups_phrase(self.groups)}{self.layers} x "
                f"{self.blocks_per_layer} blocks x {self.threads} threads, shared "
                f"{self.smem_bytes} B")
        return head if self.ok else f"{head}: DOES NOT FIT: {self.reason}"


def batch_groups_of(batch: int, grouped: bool) -> int:
    """The batch groups of PS_BMAX a stack kernel runs ``batch`` in: ceil(B / PS_BMAX) for
    one that runs them (``grouped``: StackFit.batch_groups), else 1."""
    return max(1, ceil_div(int(batch), PS_BMAX)) if grouped else 1


def batch_groups_phrase(groups: int) -> str:
    """'N batch groups x ' before a fit's blocks where it runs several, else ''."""
    return f"{groups} batch groups x " if groups > 1 else ""


def check_twin_groups(name: str, batch: int, groups, whole: bool) -> None:
    """A stack kernel twin's refusal of a ``groups`` argument its kernel would trap on: not
    ceil(B / PS_BMAX), or (``whole``: the kernels of whole groups) several for a batch that
    is not a multiple of PS_BMAX."""
    B, g = int(batch), int(groups)
    if g != batch_groups_of(B, True) or (whole and g > 1 and B % PS_BMAX):
        kind = "whole groups" if whole else "groups"
        raise ValueError(f"{name}: groups {groups} for batch {B} (one group of at most "
                         f"{PS_BMAX}, or {kind} of {PS_BMAX})")


def stack_smem_bytes(hidden: int) -> int:
    """Dynamic shared memory of one block (bytes): the R slice k-major + pipeline stages
    (A^T and X^T tiles; the partial sums reuse them) + the block's two bias rows."""
    assert 4 * PS_BMAX * PS_RP <= PS_NS * 2 * PS_KT * PS_M   # as the kernel's static_assert
    return 4 * (int(hidden) * PS_M + PS_NS * 2 * PS_KT * PS_M + 2 * PS_M)


def stack_fit(cell: str, hidden: int, batch: int, layers: int, input_size: int,
              props: dict, steps: int = 1) -> StackFit:
    """Fit a whole stack onto the device described by ``props`` (CuPy's
    getDeviceProperties, the keys persistent_fit reads; budget.DeviceBudget reads them):
    ``stack_rules`` with this kernel's registers and shared memory (the R slice k-major +
    the stages + the biases: ``stack_smem_bytes``)."""
    return stack_rules(StackFit, PS_REGS, stack_smem_bytes(hidden), 4 * int(hidden) * PS_M,
                       "R slice", cell, hidden, batch, layers, input_size, props, steps,
                       cells=tuple(STACK_KERNELS))


def stack_rules(fit_class: type[StackFit], regs: int, smem: int, weight_bytes: int,
                weights: str, cell: str, hidden: int, batch: int, layers: int,
                input_size: int, props: dict, steps: int = 1, where: str = "stack",
                cells: tuple = ("lstm",)):
    """A stack kernel's fit of class ``fit_class`` (StackFit, or the tensor-core stack's
    stack_mma.StackMmaFit): ``regs`` registers a thread, ``smem`` bytes of dynamic shared
    memory a block (``weight_bytes`` of them the resident ``weights``, named in a refusal);
    ``where`` opens every refusal. Rules in order (the first that fails is the reason):
      1. a cell of ``cells`` (those the kernel is built for; U = PS_M / 4 = 16 units a
         block, of 4 row groups) and at least 2 layers (the fp32 kernel's prologue counter is layer 1's spare sync word;
         one layer runs the per-layer kernels);
      2. input_size == hidden (every layer's W has the same shape, so the kernel reads
         layer l's matrices at row l of one view);
      3. hidden a multiple of PS_KT (whole tiles) and batch <= PS_BMAX, or for a kernel of
         ``batch_groups``, any batch (ceil(B / PS_BMAX) groups; a multiple of PS_BMAX for
         one of ``whole_groups``);
      4. groups * layers * hidden / U blocks <= SMs (one a SM, all resident at once: the waits
         spin);
      5. shared memory <= what a block can have; registers of 256 threads <= one SM's;
      6. steps * blocks_per_layer < 2^32 (the 32-bit progress counters).
    """
    H, B, L = int(hidden), int(batch), int(layers)
    dev = DeviceBudget(props, regs, PK_MAX_THREADS, threads=PK_MAX_THREADS)
    sms = dev.sms
    U = PS_M // 4
    nb = ceil_div(H, U)
    groups = batch_groups_of(B, fit_class.batch_groups)
    where = f"{where} {cell} hidden {H}, batch {B}, {L} layers on {sms} SMs"

    def no(reason):
        return fit_class(cell, H, B, L, False, f"{where}: {reason}", U, nb, smem, sms)

    if cell not in cells:
        return no(f"the stack kernel is built for {' and '.join(c.upper() for c in cells)} "
                  f"only")
    if L < 2:
        return no("one layer (the stack kernel is for 2 or more; one layer runs the per-layer "
                  "kernels)")
    if int(input_size) != H:
        return no(f"input size {input_size} != hidden {H} (the kernel reads every layer's "
                  f"W as one [4H, H] matrix)")
    if H % PS_KT:
        return no(f"hidden not a multiple of {PS_KT} (the kernel's tile width)")
    if B < 1:
        return no(f"batch {B} < 1")
    if B > PS_BMAX and not fit_class.batch_groups:
        return no(f"batch outside [1, {PS_BMAX}] (the kernel's tile covers {PS_BMAX} batches)")
    if groups > 1 and fit_class.whole_groups and B % PS_BMAX:
        return no(f"batch over {PS_BMAX} and not a multiple of it (the kernel's batch groups "
                  f"are whole groups of {PS_BMAX})")
    if groups * L * nb > sms:
        return no(f"{batch_groups_phrase(groups)}{L} layers x {nb} blocks of {U} units = {groups * L * nb} > {sms} "
                  f"SMs (one block a SM, all resident at once)")
    if smem > dev.limit:
        return no(f"{smem} bytes of shared memory ({weights} {weight_bytes} + stages) > "
                  f"{dev.limit} a block can have")
    if not dev.regs_ok(PK_MAX_THREADS):
        return no(f"{PK_MAX_THREADS} threads x {regs} registers > {dev.regs_sm} a SM")
    if int(steps) * nb >= 2**32:
        return no(f"{steps} steps x {nb} blocks overflow the 32-bit progress counters")
    return fit_class(cell, H, B, L, True,
                     f"fits: {groups * L * nb} of {sms} SMs ({batch_groups_phrase(groups)}{L} "
                     f"layers x {nb} blocks), all layers in one launch", U, nb, smem, sms)


def lstm_persistent_stack_fwd(rows, cols, outs, ins, T, L, units_per_block, groups=1,
                              dtype="float32"):
    """NumPy twin of the LSTM stack kernel (the registry's numpy_fn): rows = B, cols = H;
    outs h [L*(T+1)*B, H], c [L*(T+1)*B, H], act [L*T*B, 4H], sync [groups, 2L], wt [L*H, 4H]
    (each layer's W^T), ht [groups*(L+1)*(T+1)*H, 64] (k-major inputs: of group g, block m,
    slot s holds x_{s-1}^T for m = 0, layer m-1's h_s^T else, of the group's batches
    [64g, 64g + 64) in its first columns); ins x [T*B, H], w_ih
    [L, 4*H*H], w_hh [L, 4*H*H], bw [L, 4H] (or one broadcast row), br. Slot 0 of each
    layer's h and c is read, slots 1..T written. Each step is the fused kernel's twin
    (kernels_np.lstm_fwd) on W.in and R.h, in the arrays' dtype: the same function as the
    kernel, whose sums run in another order (checked against the reference, not this)."""
    h, c, act, sync, wt, ht = outs
    _stack_twin("lstm", rows, cols, (h, c, act), sync, wt, ht, ins, T, L, units_per_block,
                groups, dtype)


def gru_persistent_stack_fwd(rows, cols, outs, ins, T, L, units_per_block, groups=1,
                             dtype="float32"):
    """NumPy twin of the GRU stack kernel: as lstm_persistent_stack_fwd's without c (outs h,
    act [L*T*B, 4H]: r, z, n, hn, sync, wt [L*H, 4H]: W^T in the first 3H columns, zeros in
    the last H, ht), w_ih / w_hh [L, 3*H*H], bw / br [L, 3H]; each step kernels_np.gru_fwd."""
    h, act, sync, wt, ht = outs
    _stack_twin("gru", rows, cols, (h, None, act), sync, wt, ht, ins, T, L, units_per_block,
                groups, dtype)


def _stack_twin(cell, rows, cols, states, sync, wt, ht, ins, T, L, units_per_block, groups,
                dtype):
    """The stack kernels' twins: (h, c or None, act) of every layer from x, the weights and
    the biases (see lstm_persistent_stack_fwd), the scratch wt and ht as the kernel leaves
    them."""
    name = STACK_KERNELS[cell]
    if dtype != "float32":   # kernels/choice.py declines it (STACK_TYPED_REASON)
        raise ValueError(f"{name}: fp32 only, got dtype {dtype!r}")
    B, H = int(rows), int(cols)
    h, c, act = states
    x, w_ih, w_hh, bw, br = ins
    if np.any(np.asarray(sync) != 0):
        raise ValueError(f"{name}: the sync counters must be zero on entry, got "
                         f"{np.asarray(sync).ravel().tolist()}")
    if int(units_per_block) * 4 != PS_M:
        raise ValueError(f"{name}: units_per_block {units_per_block} != {PS_M // 4}")
    check_twin_groups(name, rows, groups, whole=False)
    GW = 4 if cell == "lstm" else 3    # gate rows (of H) of W and R
    S1 = (T + 1) * B
    bw = np.broadcast_to(bw, (L, GW * H))
    br = np.broadcast_to(br, (L, GW * H))
    inp = np.asarray(x).reshape(T, B, H)
    hts = ht.reshape(int(groups), L + 1, T + 1, H, ht.shape[-1])

    def k_major(m, seq):   # seq [S, B, H] into slots of block m of every group's ht
        for g in range(int(groups)):
            part = seq[:, g * PS_BMAX:(g + 1) * PS_BMAX]
            hts[g, m, T + 1 - len(seq):, :, :part.shape[1]] = part.transpose(0, 2, 1)

    k_major(0, inp)
    for layer in range(L):
        W = np.asarray(w_ih[layer]).reshape(GW * H, H)
        R = np.asarray(w_hh[layer]).reshape(GW * H, H)
        wt[layer * H:(layer + 1) * H, :GW * H] = W.T
        wt[layer * H:(layer + 1) * H, GW * H:4 * H] = 0
        hs = h[layer * S1:(layer + 1) * S1].reshape(T + 1, B, H)
        acts = act[layer * T * B:(layer + 1) * T * B].reshape(T, B, 4 * H)
        biases = (bw[layer:layer + 1], br[layer:layer + 1])
        if c is not None:
            cs = c[layer * S1:(layer + 1) * S1].reshape(T + 1, B, H)
        for t in range(T):
            gx, gh = inp[t] @ W.T, hs[t] @ R.T
            if c is not None:
                lstm_fwd(B, H, (hs[t + 1], cs[t + 1], acts[t]), (gx, gh, *biases, cs[t]))
            else:
                gru_fwd(B, H, (hs[t + 1], acts[t]), (gx, gh, *biases, hs[t]))
        k_major(layer + 1, hs)
        inp = hs[1:]
