"""The GEMMs of a plan keyed for chosen algorithms (PlanKey.gemm 'lt') on the GPU: for each
eligible Gemm op (fp32, batch 1) its cuBLASLt problem, the heuristic's algorithms, each timed
against cublasSgemm's own choice on scratch buffers of the op's shape (``copies`` of it at
once on as many streams, as the wavefront runs the layers' GEMMs), and the call of the one
kernels/gemm_algos.py chooses. One ``LtGemms`` a GpuContext (its handle, timing streams,
workspaces and chooser are the runner's, nothing module-level).
"""
from __future__ import annotations

import statistics

from ..kernels.gemm_algos import (MAX_COPIES, OPTIONS, AlgoChoice, GemmAlgoChooser,
                                  GemmProblem)
from ..session import time_events
from .cublas import CublasHandle
from .cublaslt import LtHandle, LtProblem, alignment

TIME_REPEATS, TIME_WARMUP = 5, 2


class LtGemms:
    """Chosen-algorithm GEMMs of one GpuContext (module docstring)."""

    def __init__(self, cp, workspace_bytes: int, chooser: GemmAlgoChooser | None = None,
                 timer=None):
        """timer: ``timer(problem, lt_problem, options) -> time_fn`` (options[0] None: the
        default; None: ``time_on_scratch``, the GPU's; tests pass a fake)."""
        self.cp = cp
        self.workspace_bytes = int(workspace_bytes)
        self.handle = LtHandle()
        self.chooser = chooser or GemmAlgoChooser()
        self.timer = timer or self.time_on_scratch
        self._timing = []    # (stream, its workspace, a CublasHandle on it), made on first use

    def _timing_streams(self, n):
        cp = self.cp
        while len(self._timing) < n:
            s = cp.cuda.Stream(non_blocking=True)
            ws = cp.empty(self.workspace_bytes, dtype=cp.uint8)
            self._timing.append((s, ws, CublasHandle(s.ptr, ws.data.ptr, self.workspace_bytes)))
        return self._timing[:n]

    def prepare(self, M, N, K, trans_a, trans_b, out_ptr, out_ld, a_ptr, a_ld, b_ptr, b_ld,
                alpha, beta, stream_ptr, workspace_ptr, copies=1):
        """(the call that runs row-major out[N, M] = alpha op(a) op(b) + beta out with the
        chosen cuBLASLt algorithm on ``stream_ptr``, or None where cublasSgemm's own choice
        is kept; the AlgoChoice)."""
        copies = max(1, min(int(copies), MAX_COPIES))
        problem = GemmProblem(M, N, K, bool(trans_a), bool(trans_b), a_ld, b_ld, out_ld,
                              (alignment(a_ptr), alignment(b_ptr), alignment(out_ptr)),
                              beta != 0.0, copies)
        choice = self.chooser.known(problem)
        if choice is None:
            # the problem's descriptors (shapes, not pointers): one for every op of the problem,
            # kept with the winning algorithm in the choice's payload
            lp = LtProblem(self.handle, M, N, K, trans_a, trans_b, a_ld, b_ld, out_ld,
                           problem.aligns)
            algos = lp.algos(OPTIONS, self.workspace_bytes)
            try:
                choice = self.chooser.choose(
                    problem, ["cublasSgemm"] + [a.describe() for a in algos],
                    self.timer(problem, lp, [None] + algos), [None] + [(lp, a) for a in algos])
            except MemoryError as e:   # CuPy's OutOfMemoryError is one
                # no room for the scratch operands: cublasSgemm's own kernel, said in the
                # choice's label (not remembered: memory may be free next time)
                choice = AlgoChoice(0, f"declined: no memory to time the algorithms "
                                       f"({type(e).__name__}; cublasSgemm)")
        if choice.index == 0:
            return None, choice
        lp, algo = choice.payload
        return lp.prepare(algo, out_ptr, a_ptr, b_ptr, alpha, beta, workspace_ptr,
                          self.workspace_bytes, stream_ptr), choice

    def time_on_scratch(self, p: GemmProblem, lp: LtProblem, options):
        """time_fn(i): the median ms of ``p.copies`` copies of option i at once (None: the
        default cublasSgemm), on scratch operands of the problem's extents (random data)."""
        cp = self.cp
        rows_a = p.K if p.trans_a else p.N
        rows_b = p.M if p.trans_b else p.K
        a = cp.random.uniform(-1, 1, rows_a * p.a_ld, dtype=cp.float32)
        b = cp.random.uniform(-1, 1, rows_b * p.b_ld, dtype=cp.float32)
        outs = [cp.zeros(p.N * p.out_ld, dtype=cp.float32) for _ in range(p.copies)]
        tim = self._timing_streams(p.copies)
        beta = 1.0 if p.accumulate else 0.0
        s0 = tim[0][0]
        fork = cp.cuda.Event(disable_timing=True)
        joins = [cp.cuda.Event(disable_timing=True) for _ in tim[1:]]

        def time_fn(i):
            opt = options[i]
            calls = []
            for (s, ws, h), o in zip(tim, outs):
                if opt is None:
                    pre = h.prepare_gemm(o.data.ptr, p.out_ld, a.data.ptr, p.a_ld, b.data.ptr,
                                         p.b_ld, p.M, p.N, p.K, p.trans_a, p.trans_b, 1.0, beta)
                    calls.append(lambda h=h, pre=pre: h.gemm(pre))
                else:
                    calls.append(lp.prepare(opt, o.data.ptr, a.data.ptr, b.data.ptr, 1.0, beta,
                                            ws.data.ptr, self.workspace_bytes, s.ptr))

            def run():
                fork.record(s0)
                for (s, _, _), c in zip(tim, calls):
                    if s is not s0:
                        s.wait_event(fork)
                    c()
                for (s, _, _), e in zip(tim[1:], joins):
                    e.record(s)
                    s0.wait_event(e)

            return statistics.median(time_events(cp, run, s0, TIME_REPEATS, TIME_WARMUP))
        return time_fn

    def close(self):
        for _, _, h in self._timing:
            h.close()
        self._timing.clear()
        self.handle.close()
