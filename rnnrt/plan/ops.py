"""The vocabulary of a plan: views into named buffers, and the four kinds of op.

A plan (``model.py``) is a tuple of these ops in *host issue order*, each tagged with the
stream it runs on. Executors (``exec/``) run them: NumPy (in program order or in random
interleavings, to check the schedule for races), CuPy eagerly, or captured in a CUDA graph.
Nothing here knows about CuPy or NumPy.

Views are row-major 2-D windows of a flat buffer: element (r, c) of a view lives at
``offset + r*ld + c`` of its buffer. ``ld = 0`` broadcasts one row to all rows, which is how
a bias vector [G*H] is handed to a kernel that works on [B, G*H] tiles.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class View:
    """A [rows, cols] row-major window of buffer ``buf``: element (r, c) at offset + r*ld + c."""

    buf: str
    offset: int
    rows: int
    cols: int
    ld: int

    def __post_init__(self):
        if self.rows < 1 or self.cols < 1:
            raise ValueError(f"View {self.buf}: empty shape [{self.rows}, {self.cols}]")
        if self.ld != 0 and self.ld < self.cols:
            raise ValueError(f"View {self.buf}: ld {self.ld} < cols {self.cols}")
        if self.offset < 0:
            raise ValueError(f"View {self.buf}: negative offset {self.offset}")

    @property
    def end(self) -> int:
        """One past the last element touched (for bounds checks)."""
        return self.offset + (self.rows - 1) * self.ld + self.cols

    def row_intervals(self):
        """The exact footprint as half-open [start, stop) element intervals, one per row
        (a broadcast view, ld = 0, touches one row)."""
        if self.ld == 0:
            return [(self.offset, self.offset + self.cols)]
        if self.ld == self.cols:
            return [(self.offset, self.offset + self.rows * self.cols)]
        return [(self.offset + r * self.ld, self.offset + r * self.ld + self.cols)
                for r in range(self.rows)]


@dataclass(frozen=True, slots=True)
class Gemm:
    """out[N, M] = alpha * op(a) @ op(b) + beta * out, all row-major views.

    op(a) is a.T when trans_a, op(b) is b.T when trans_b; op(a) is [N, K], op(b) is [K, M].
    kind tags what it is for tracing and counting ('wx', 'rh', ...); layer and steps say
    which cells of the (layer, step) grid it serves (steps = (first, last+1)).

    batch > 1: ``batch`` such products in one call (cuBLAS strided-batched), product i on
    the views moved by i * strides = (a, b, out) elements; ``entries()`` lists them. The
    split-K recurrent backward GEMM uses it: product i takes the i-th K slice of a and b
    and writes its own partial sum (plan/backward.py).
    """

    stream: int
    out: View
    a: View
    b: View
    trans_a: bool = False
    trans_b: bool = False
    alpha: float = 1.0
    beta: float = 0.0
    kind: str = "gemm"
    layer: int = -1
    steps: tuple[int, int] = (-1, -1)
    batch: int = 1
    strides: tuple[int, int, int] = (0, 0, 0)

    def __post_init__(self):
        b = self.batch
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise ValueError(f"Gemm.batch: expected an int >= 1, got {b!r}")
        if (len(self.strides) != 3 or any(not isinstance(s, int) or s < 0 for s in self.strides)
                or (b > 1 and self.strides[2] == 0)):
            raise ValueError(f"Gemm.strides: expected 3 ints >= 0 (a, b, out), out's > 0 "
                             f"when batch > 1, got {self.strides!r}")

    def entries(self) -> tuple[tuple[View, View, View], ...]:
        """(a, b, out) of each of the batch's products."""
        if self.batch == 1:
            return ((self.a, self.b, self.out),)
        sa, sb, so = self.strides

        def moved(v, i, s):
            return View(v.buf, v.offset + i * s, v.rows, v.cols, v.ld)

        return tuple((moved(self.a, i, sa), moved(self.b, i, sb), moved(self.out, i, so))
                     for i in range(self.batch))

    @property
    def reads(self):
        if self.batch == 1:
            return (self.a, self.b) + ((self.out,) if self.beta != 0.0 else ())
        return tuple(v for a, b, o in self.entries()
                     for v in ((a, b, o) if self.beta != 0.0 else (a, b)))

    @property
    def writes(self):
        return tuple(o for _, _, o in self.entries())

    def mnk(self):
        """(M, N, K) of one product of the batch, for FLOP counts."""
        k = self.a.rows if self.trans_a else self.a.cols
        return self.out.cols, self.out.rows, k

    def flops(self) -> int:
        """2 M N K for each product of the batch."""
        m, n, k = self.mnk()
        return 2 * m * n * k * self.batch


@dataclass(frozen=True, slots=True)
class Kernel:
    """A launch of one pointwise (or transpose) kernel over a [rows, cols] problem.

    ``name`` keys both the CUDA kernel (cuda_src/) and its NumPy twin (kernels/twins.py);
    ``outs`` and ``ins`` are views, passed to the kernel as (pointer, ld) pairs after
    (rows, cols), outs first. What rows and cols mean is each kernel's own (see its header).

    Persistent kernels (kind 'persistent') also carry ``scalars`` (((name, int), ...) in
    the kernel's order, e.g. T and units_per_block), their ``launch`` geometry ((grid xyz),
    (block xyz), dynamic shared memory bytes) from the device fit, and the GEMM ``flops``
    they do inside (R.h of every step), which the plan's FLOP count includes.

    ``footprint`` ((reads, writes), views) replaces ins / outs as what the launch touches,
    where an out is partly read: a persistent launch starts from slot 0 of the h and c it
    is handed (read) and writes the slots after it. None: reads = ins, writes = outs.
    """

    stream: int
    name: str
    rows: int
    cols: int
    outs: tuple[View, ...]
    ins: tuple[View, ...]
    kind: str = "pointwise"
    layer: int = -1
    steps: tuple[int, int] = (-1, -1)
    scalars: tuple[tuple[str, int], ...] = ()
    launch: tuple | None = None
    flops: int = 0
    footprint: tuple | None = None

    @property
    def reads(self):
        return self.ins if self.footprint is None else self.footprint[0]

    @property
    def writes(self):
        return self.outs if self.footprint is None else self.footprint[1]


@dataclass(frozen=True, slots=True)
class Record:
    """Record event ``event`` on ``stream``. Every event of a plan is recorded exactly once."""

    stream: int
    event: int
    kind: str = "record"
    reads: tuple = field(default=(), repr=False)
    writes: tuple = field(default=(), repr=False)


@dataclass(frozen=True, slots=True)
class Wait:
    """Make ``stream`` wait for event ``event`` (whose Record is issued earlier)."""

    stream: int
    event: int
    kind: str = "wait"
    reads: tuple = field(default=(), repr=False)
    writes: tuple = field(default=(), repr=False)


Op = Gemm | Kernel | Record | Wait
