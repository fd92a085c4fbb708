"""GPU tests of the persistent kernels (marker gpu; skipped without a GPU). Written before
any GPU run (v1, 2026-11-22; v2: the k_tile argument, 16-byte staging loads,
prefetched pointwise inputs; not yet run on a GPU).

Each persistent kernel runs one layer's T steps in one launch, with gx = W x from a cuBLAS
matmul (CuPy), and is compared with the float64 NumPy reference in fp32 tolerance, outputs
poisoned with NaN first; it runs twice in a row on one sync buffer (the counters must come
back to zero); it is captured into a CUDA graph (capture runs nothing, the replay is right);
the fit agrees with the occupancy API; a grid that cannot be co-resident is refused by
``persistent_fit`` before anything is launched.

Run on the device: pytest -m gpu tests/gpu/test_gpu_persistent.py
"""
from __future__ import annotations

import numpy as np
import pytest

from rnnrt.device import gpu_available

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU with CuPy")]

from rnnrt import reference  # noqa: E402
from rnnrt.cells import get_cell  # noqa: E402
from rnnrt.check import FP32_ATOL, FP32_RTOL, assert_close  # noqa: E402
from rnnrt.kernels import persistent as P  # noqa: E402
from rnnrt.kernels.registry import KERNELS, kernel_args  # noqa: E402

CELL_NAMES = ("lstm", "gru", "rnn_tanh", "rnn_relu")


@pytest.fixture(scope="module")
def props(cp):
    return cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)


@pytest.fixture(scope="module")
def lib():
    from rnnrt.kernels.library import KernelLibrary
    return KernelLibrary()


class Layer:
    """One layer on the device: fp32 weights and input, gx = x W^T by cuBLAS (no bias),
    outputs h, c, act poisoned, a zeroed sync buffer; and the float64 reference."""

    def __init__(self, cp, cell, T, B, H, I=24, bias=True, seed=0):
        spec = get_cell(cell)
        G = spec.gates
        rng = np.random.default_rng(seed)
        bound = 1 / np.sqrt(H)
        u = lambda *s: rng.uniform(-bound, bound, s).astype(np.float32)   # noqa: E731
        self.cp, self.cell, self.spec, self.T, self.B, self.H, self.G = cp, cell, spec, T, B, H, G
        w, r = u(G * H, I), u(G * H, H)
        b_ih, b_hh = (u(G * H), u(G * H)) if bias else (None, None)
        x = rng.standard_normal((T, B, I)).astype(np.float32)
        h0 = (0.5 * rng.standard_normal((B, H))).astype(np.float32)
        c0 = (0.5 * rng.standard_normal((B, H))).astype(np.float32) if spec.has_cell_state \
            else None
        f64 = lambda a: None if a is None else a.astype(np.float64)   # noqa: E731
        params = [{"weight_ih": f64(w), "weight_hh": f64(r), "bias_ih": f64(b_ih),
                   "bias_hh": f64(b_hh)}]
        _, _, _, cache = reference.forward(cell, params, f64(x), f64(h0)[None],
                                           None if c0 is None else f64(c0)[None])
        lc = cache.layers[0]
        self.ref = {"h": lc.h, "c": lc.c, "act": lc.gates}

        self.gx = cp.asarray(x).reshape(T * B, I) @ cp.asarray(w).T      # cuBLAS, [T*B, G*H]
        self.w_hh = cp.asarray(r)
        zeros = cp.zeros(G * H, cp.float32)
        self.bw = zeros if b_ih is None else cp.asarray(b_ih)
        self.br = zeros if b_hh is None else cp.asarray(b_hh)
        self.h0, self.c0 = h0, c0
        self.h = cp.empty(((T + 1) * B, H), cp.float32)
        self.c = cp.empty(((T + 1) * B, H), cp.float32) if spec.has_cell_state else None
        self.act = cp.empty((T * B, 4 * H), cp.float32) if spec.saved_gates else None
        self.sync = cp.zeros(P.SYNC_WORDS, cp.uint32)
        self.poison()

    def poison(self):
        """NaN everywhere the kernel must write; h[0] = h0 and c[0] = c0."""
        cp, B = self.cp, self.B
        self.h.fill(np.nan)
        self.h[:B] = cp.asarray(self.h0)
        if self.c is not None:
            self.c.fill(np.nan)
            self.c[:B] = cp.asarray(self.c0)
        if self.act is not None:
            self.act.fill(np.nan)

    def pairs(self):
        """(outs, ins) as (pointer, ld) pairs in the registry's order."""
        outs = [(self.h.data.ptr, self.H)]
        if self.c is not None:
            outs.append((self.c.data.ptr, self.H))
        if self.act is not None:
            outs.append((self.act.data.ptr, 4 * self.H))
        outs.append((self.sync.data.ptr, P.SYNC_WORDS))
        ins = [(self.gx.data.ptr, self.G * self.H), (self.w_hh.data.ptr, self.H),
               (self.bw.data.ptr, 0), (self.br.data.ptr, 0)]
        return outs, ins

    def check(self, what=""):
        T, B, H = self.T, self.B, self.H
        name = f"{self.cell} T{T} B{B} H{H} {what}"
        assert_close(self.h.reshape(T + 1, B, H), self.ref["h"], FP32_ATOL, FP32_RTOL,
                     name=f"{name} h")
        if self.c is not None:
            assert_close(self.c.reshape(T + 1, B, H), self.ref["c"], FP32_ATOL, FP32_RTOL,
                         name=f"{name} c")
        if self.act is not None:
            assert_close(self.act.reshape(T, B, 4 * H), self.ref["act"], FP32_ATOL,
                         FP32_RTOL, name=f"{name} act")
        assert int(self.sync[0]) == 0 and int(self.sync[1]) == 0, \
            f"{name}: sync counters {self.sync.get().tolist()} not reset"


def _fit(props, cell, H, B, **kw):
    fit = P.persistent_fit(cell, H, B, props, **kw)
    assert fit.ok, fit.describe()
    return fit


SHAPES = [  # (T, B, H): odd H, B 1 and 3, one step; the paper's LSTM (shorter); H 1024 > 48 KB.
    # The default fit: all of h_t in one tile (H 1024: LSTM 4 tiles, GRU 3, RNN 2); 16-byte
    # staging loads where H is a multiple of 4 (200, 512, 1024), 4-byte ones elsewhere
    (1, 1, 33), (7, 3, 37), (9, 3, 150), (5, 1, 200), (20, 64, 512), (6, 64, 1024)]


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("cell", CELL_NAMES)
@pytest.mark.parametrize("shape", SHAPES, ids=[f"T{t}B{b}H{h}" for t, b, h in SHAPES])
def test_matches_reference_twice(cp, props, lib, shape, cell, bias):
    T, B, H = shape
    fit = _fit(props, cell, H, B)
    layer = Layer(cp, cell, T, B, H, bias=bias)
    outs, ins = layer.pairs()
    lib.launch_persistent(fit, outs, ins, T)
    cp.cuda.Device().synchronize()
    layer.check("first launch")
    layer.poison()   # the second launch on the same sync buffer must redo everything
    lib.launch_persistent(fit, outs, ins, T)
    cp.cuda.Device().synchronize()
    layer.check("second launch")


@pytest.mark.parametrize("H", [150, 200], ids=["H150-4byte", "H200-16byte"])
@pytest.mark.parametrize("cell", CELL_NAMES)
@pytest.mark.parametrize("kw", [{"units_per_block": 7}, {"threads": 32}, {"threads": 128},
                                {"k_tile": 8}, {"k_tile": 64},
                                {"k_tile": 12, "threads": 128}],
                         ids=["U7", "thr32", "thr128", "kt8", "kt64", "kt12-thr128"])
def test_other_decompositions(cp, props, lib, cell, kw, H):
    """Knobs: more units a block (fewer blocks, other lane grids), other block sizes (1 or 4
    warps: 32 or 128 k-groups at B 3), h_t in several tiles (k_tile 8: 19 or 25 tiles, most
    warps owning no chunk; 64; 12 with 4 warps: one chunk a warp), with 4-byte (H 150) and
    16-byte (H 200) staging loads."""
    T, B = 5, 3
    fit = _fit(props, cell, H, B, **kw)
    if "k_tile" in kw:
        assert fit.k_tile == kw["k_tile"] and fit.tiles > 1, fit.describe()
    layer = Layer(cp, cell, T, B, H, seed=3)
    outs, ins = layer.pairs()
    lib.launch_persistent(fit, outs, ins, T)
    cp.cuda.Device().synchronize()
    layer.check(fit.describe())


@pytest.mark.parametrize("offset", [1, 2], ids=["4-byte", "8-byte"])
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_misaligned_h_falls_back_to_4_byte_loads(cp, props, lib, cell, offset):
    """H a multiple of 4 but h not 16-byte aligned (a view one or two floats into a
    buffer): a 16-byte load would fault, the kernel must stage with 4-byte loads and give
    the same results."""
    T, B, H = 6, 5, 200
    fit = _fit(props, cell, H, B)
    layer = Layer(cp, cell, T, B, H, seed=4)
    buf = cp.empty((T + 1) * B * H + offset, cp.float32)
    layer.h = buf[offset:].reshape((T + 1) * B, H)
    assert layer.h.data.ptr % 16 != 0
    layer.poison()
    outs, ins = layer.pairs()
    lib.launch_persistent(fit, outs, ins, T)
    cp.cuda.Device().synchronize()
    layer.check(f"h at +{4 * offset} bytes")


@pytest.mark.parametrize("kind", ["grid", "cluster"])
@pytest.mark.parametrize("cell", CELL_NAMES)
def test_cuda_graph(cp, props, lib, cell, kind):
    """As cuda_exec launches kernels (Function(grid, block, args, shared_mem, stream)) on a
    non-blocking stream, captured: the capture runs nothing, each replay is right and
    leaves the counters zero; the grid kernel (H 512) and the cluster kernel (H 128)."""
    T, B, H = 8, 16, (512 if kind == "grid" else 128)
    fit = _fit(props, cell, H, B, kind=kind)
    layer = Layer(cp, cell, T, B, H, seed=1)
    outs, ins = layer.pairs()
    kinfo = KERNELS[fit.kernel]
    grid, block, smem = kinfo.launch_persistent(fit)
    args = kernel_args(kinfo, B, H, outs, ins, fit.scalars(T))
    fn = lib.with_shared(fit.kernel, smem).kernel   # opted in before capture, as a plan is
    stream = cp.cuda.Stream(non_blocking=True)
    cp.cuda.Device().synchronize()
    mode = getattr(cp.cuda.runtime, "streamCaptureModeRelaxed", None)   # as GraphExecutor
    if mode is None:
        stream.begin_capture()
    else:
        stream.begin_capture(mode=mode)
    try:
        fn(grid, block, args, smem, stream)
    finally:
        graph = stream.end_capture()
    stream.synchronize()
    assert bool(cp.isnan(layer.h[B:]).all()), "the capture ran the kernel"
    if layer.act is not None:
        assert bool(cp.isnan(layer.act).all())
    for replay in range(3):
        layer.poison()
        graph.launch(stream)
        stream.synchronize()
        layer.check(f"graph replay {replay}")


CLUSTER_SHAPES = [(6, 21, 100), (5, 64, 128), (4, 1, 8), (3, 9, 61)]   # (T, B, H)


@pytest.mark.parametrize("cell", CELL_NAMES)
@pytest.mark.parametrize("shape", CLUSTER_SHAPES, ids=[f"T{t}B{b}H{h}" for t, b, h in
                                                       CLUSTER_SHAPES])
def test_cluster_and_grid_kernels_match_reference(cp, props, lib, shape, cell):
    """The cluster kernel (clusters of PK_CLUSTER blocks, each cluster its own batch slice:
    B 21 in 3 clusters of 8, 8, 5; B 64 in 8; B 1; B 9 in 2 of 5 and 4) and the grid kernel
    on the same layer: both equal the reference, the cluster kernel twice in a row."""
    T, B, H = shape
    layer = Layer(cp, cell, T, B, H, seed=5)
    outs, ins = layer.pairs()
    for kind in ("cluster", "grid", "cluster"):
        fit = _fit(props, cell, H, B, kind=kind)
        assert (fit.cluster > 0) == (kind == "cluster"), fit.describe()
        layer.poison()
        lib.launch_persistent(fit, outs, ins, T)
        cp.cuda.Device().synchronize()
        layer.check(fit.describe())


def test_auto_fit_takes_the_cluster_kernel_where_it_fits(props):
    """On a device with clusters (compute capability 9.0+) the default fit runs small layers
    in clusters and the paper's size with the grid kernel, saying why."""
    assert props["major"] >= 9, "these GPU tests expect an sm_90 or later device"
    small = P.persistent_fit("lstm", 128, 64, props)
    assert small.ok and small.kernel == "lstm_persistent_cluster_fwd", small.describe()
    paper = P.persistent_fit("lstm", 512, 64, props)
    assert paper.ok and paper.kernel == "lstm_persistent_fwd", paper.describe()
    assert "the cluster kernel does not fit" in paper.reason


def test_fit_agrees_with_the_occupancy_api(cp, props, lib):
    """Every fit that says ok is co-resident by the driver's own count, and the compiled
    kernels (NVRTC, as CuPy builds them) use no more registers than the fit assumed and
    no local memory (no spills)."""
    driver = cp.cuda.driver
    sms = props["multiProcessorCount"]
    checked = 0
    for cell in CELL_NAMES:
        for H in (64, 150, 512, 1024, 2048):
            for B in (1, 3, 64, 256):
                fit = P.persistent_fit(cell, H, B, props)
                if not fit.ok:
                    continue
                raw = lib.with_shared(fit.kernel, fit.smem_bytes)
                attrs = raw.attributes
                assert attrs["num_regs"] <= fit.regs_per_thread, (fit.kernel, attrs)
                assert attrs["local_size_bytes"] == 0, f"{fit.kernel} spills: {attrs}"
                per_sm = driver.occupancyMaxActiveBlocksPerMultiprocessor(
                    raw.kernel.ptr, fit.threads, fit.smem_bytes)
                assert per_sm >= 1 and fit.blocks <= sms * per_sm, \
                    f"{fit.describe()}: occupancy {per_sm} a SM x {sms} SMs"
                checked += 1
    assert checked >= 20


def test_refuses_a_grid_that_cannot_be_co_resident(cp, props, lib):
    """More blocks than SMs (units_per_block too small), or more shared memory than a block
    can have: persistent_fit says no, and launching refuses before anything runs."""
    sms = props["multiProcessorCount"]
    T, B, H = 4, 3, 2 * sms + 5
    layer = Layer(cp, "gru", T, B, H)
    outs, ins = layer.pairs()
    too_many = P.persistent_fit("gru", H, B, props, units_per_block=1)
    assert not too_many.ok and f"> {sms} SMs" in too_many.reason
    with pytest.raises(ValueError, match="does not fit"):
        lib.launch_persistent(too_many, outs, ins, T)
    big = P.persistent_fit("lstm", 2048, 64, props)
    assert not big.ok and "R slice" in big.reason
    with pytest.raises(ValueError, match="does not fit"):
        KERNELS["lstm_persistent_fwd"].launch_persistent(big)
    cp.cuda.Device().synchronize()
    assert bool(cp.isnan(layer.h[B:]).all()), "something ran"
    assert int(layer.sync.sum()) == 0
