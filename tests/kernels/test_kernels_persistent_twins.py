"""The per-layer persistent kernels through the registry (rnnrt/kernels/registry.py,
emulate.py's twins), checked without a GPU.

- the registry's twins, on padded views of one NaN-poisoned buffer with ld-0 biases, write
  exactly their outputs (slots 1..T), leave h0, c0 and the zero sync counters alone; they
  refuse dirty sync counters and a k_tile the kernel traps on;
- the registry's shapes, arguments and launch of persistent kernels (a stand-in for CuPy).
"""
from __future__ import annotations

import sys

import numpy as np
import pytest

from rnnrt.cells import get_cell
from rnnrt.check import FP32_ATOL, FP32_RTOL, assert_close
from rnnrt.kernels import library as L
from rnnrt.kernels import persistent as P
from rnnrt.kernels import registry as K
from rnnrt.kernels import twins as knp
from rnnrt.kernels.stack import STACK_KERNEL
from rnnrt.plan.ops import View
from testkit import H100, PERSISTENT, FakeCupy, layer_case


# --- the twins through the registry's views -----------------------------------------------

def _lay_out(kinfo, T, B, H, data, dtype, ld_pad=3, gap=5):
    """Every argument of one launch in one NaN-filled flat buffer: padded rows (ld > cols),
    gaps between views, biases with ld 0 (or the zeros buffer without bias), h[0] = h0 and
    c[0] = c0, sync zeros. -> (buf, {arg: (offset, rows, cols, ld)})"""
    scal = {"T": T, "units_per_block": 1, "k_tile": 4}
    out_shapes, in_shapes = kinfo.arg_shapes(B, H, **scal)
    place, off = {}, gap
    for (arg, _), (r, c) in zip(kinfo.outs + kinfo.ins, out_shapes + in_shapes):
        ld = 0 if arg in ("bw", "br") else c + ld_pad
        place[arg] = (off, r, c, ld)
        off += (r - 1) * ld + c + gap
    buf = np.full(off, np.nan, dtype)
    G = get_cell(kinfo.name.split("_persistent")[0]).gates
    fill = {"gx": data["gx"].reshape(T * B, G * H), "w_hh": data["R"]}
    for arg in ("bw", "br"):
        b = data["bw" if arg == "bw" else "br"]
        fill[arg] = (np.zeros(G * H) if b is None else b)[None]
    for arg, a in fill.items():
        o, r, c, ld = place[arg]
        knp.view(buf, o, a.shape[0], c, ld or c)[...] = a
    o, _, c, ld = place["h"]
    knp.view(buf, o, B, c, ld)[...] = data["h0"]
    if "c" in place:
        o, _, c, ld = place["c"]
        knp.view(buf, o, B, c, ld)[...] = data["c0"]
    o, _, c, ld = place["sync"]
    knp.view(buf, o, 1, c, ld)[...] = 0
    return buf, place


@pytest.mark.parametrize("k_tile", [40, 12], ids=["one-tile", "kt12"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("name", PERSISTENT)
def test_twin_on_poisoned_padded_views(name, bias, dtype, k_tile):
    kinfo = K.KERNELS[name]
    cell, cluster = name.split("_persistent")[0], "_cluster" in name
    # the cluster twin: 3 clusters of 7, 7 and 5 batches
    T, B, H, U = 7, (19 if cluster else 3), 37, 5
    data, ref = layer_case(cell, T, B, H, bias=bias)
    buf, place = _lay_out(kinfo, T, B, H, data, dtype)
    if cluster and k_tile < H:   # the cluster kernel keeps all of h_t: it traps on this
        before = buf.copy()
        outs = [knp.view(buf, *place[a]) for a, _ in kinfo.outs]
        ins = [knp.view(buf, *place[a]) for a, _ in kinfo.ins]
        with pytest.raises(ValueError, match=f"k_tile {k_tile} < hidden {H}"):
            kinfo.numpy_fn(B, H, outs, ins, T, U, k_tile)
        np.testing.assert_array_equal(buf, before, err_msg="wrote before refusing")
        return
    written = np.zeros(buf.size, bool)
    for arg, _ in kinfo.outs:
        o, r, c, ld = place[arg]
        first = B if arg in ("h", "c") else 0          # slot 0 is read, not written
        for i in range(first, r):
            written[o + i * ld:o + i * ld + c] = True
    before = buf.copy()
    outs = [knp.view(buf, *place[a]) for a, _ in kinfo.outs]
    ins = [knp.view(buf, *place[a]) for a, _ in kinfo.ins]
    K.check_views(kinfo, B, H, [View("w", *place[a]) for a, _ in kinfo.outs],
                  [View("w", *place[a]) for a, _ in kinfo.ins],
                  {"T": T, "units_per_block": U, "k_tile": k_tile})
    with np.errstate(over="raise", divide="raise", invalid="raise"):
        kinfo.numpy_fn(B, H, outs, ins, T, U, k_tile)
    tol = (1e-12, 1e-12) if dtype is np.float64 else (FP32_ATOL, FP32_RTOL)
    got = dict(zip((a for a, _ in kinfo.outs), outs))
    assert_close(got["h"], ref["h"].reshape((T + 1) * B, H), *tol, name=f"{name} h")
    if "c" in got:
        assert_close(got["c"], ref["c"].reshape((T + 1) * B, H), *tol, name=f"{name} c")
    if "act" in got:
        assert_close(got["act"], ref["act"].reshape(T * B, 4 * H), *tol, name=f"{name} act")
    assert (got["sync"] == 0).all(), "the sync counters must be left zero"
    np.testing.assert_array_equal(buf[~written], before[~written],
                                  err_msg=f"{name} wrote outside its outputs (or slot 0)")


def test_twin_refuses_dirty_sync_counters():
    kinfo = K.KERNELS["gru_persistent_fwd"]
    data, _ = layer_case("gru", 2, 3, 37)
    buf, place = _lay_out(kinfo, 2, 3, 37, data, np.float64)
    o = place["sync"][0]
    buf[o + 1] = 4
    outs = [knp.view(buf, *place[a]) for a, _ in kinfo.outs]
    ins = [knp.view(buf, *place[a]) for a, _ in kinfo.ins]
    with pytest.raises(ValueError, match="sync counters must be zero"):
        kinfo.numpy_fn(3, 37, outs, ins, 2, 5, 40)


def test_twin_refuses_a_k_tile_the_kernel_traps_on():
    kinfo = K.KERNELS["rnn_tanh_persistent_fwd"]
    data, _ = layer_case("rnn_tanh", 2, 3, 37)
    buf, place = _lay_out(kinfo, 2, 3, 37, data, np.float64)
    before = buf.copy()
    outs = [knp.view(buf, *place[a]) for a, _ in kinfo.outs]
    ins = [knp.view(buf, *place[a]) for a, _ in kinfo.ins]
    with pytest.raises(ValueError, match="k_tile 6 is not a multiple of 4"):
        kinfo.numpy_fn(3, 37, outs, ins, 2, 5, 6)
    np.testing.assert_array_equal(buf, before, err_msg="wrote before refusing")


# --- registry: shapes, arguments, launch --------------------------------------------------

def test_registry_shapes_use_the_scalars():
    kinfo = K.KERNELS["lstm_persistent_fwd"]
    assert kinfo.scalars == ("T", "units_per_block", "k_tile") and kinfo.uint_args == ("sync",)
    outs, ins = kinfo.arg_shapes(64, 512, T=100, units_per_block=4, k_tile=512)
    assert outs == [(101 * 64, 512), (101 * 64, 512), (100 * 64, 2048), (1, 2)]
    assert ins == [(100 * 64, 2048), (2048, 512), (64, 2048), (64, 2048)]
    outs, ins = K.KERNELS["rnn_relu_persistent_fwd"].arg_shapes(3, 5, T=2)
    assert outs == [(9, 5), (1, 2)] and ins == [(6, 5), (5, 5), (3, 5), (3, 5)]
    with pytest.raises(ValueError, match="need the scalar T"):
        kinfo.arg_shapes(3, 5)
    with pytest.raises(ValueError, match="names 'S'"):
        K.KernelInfo("x", "persistent.cu", outs=(("h", "S*R,C"),), ins=(), numpy_fn=None)
    with pytest.raises(ValueError, match="shape term"):
        K.KernelInfo("x", "persistent.cu", outs=(("h", "T+1*R,C"),), ins=(), numpy_fn=None)
    # several factors: the stack kernel's views of every layer at once
    stack = K.KERNELS[STACK_KERNEL]
    outs, ins = stack.arg_shapes(64, 512, T=100, L=4, units_per_block=16, groups=1)
    assert outs == [(4 * 101 * 64, 512), (4 * 101 * 64, 512), (4 * 100 * 64, 2048), (1, 8),
                    (4 * 512, 2048), (5 * 101 * 512, 64)]   # + the scratch wt, ht
    # batch groups: a row of counters and a block of k-major inputs each
    outs, _ = stack.arg_shapes(128, 256, T=100, L=4, units_per_block=16, groups=2)
    assert outs[3:] == [(2, 8), (4 * 256, 1024), (2 * 5 * 101 * 256, 64)]
    assert ins == [(100 * 64, 512), (4, 4 * 512 * 512), (4, 4 * 512 * 512), (4, 2048),
                   (4, 2048)]


def test_kernel_args_persistent():
    kinfo = K.KERNELS["lstm_persistent_fwd"]
    B, H, T = 4, 8, 3
    outs = [(1000, H), (2000, H + 2), (3000, 4 * H), (4000, 2)]
    ins = [(5000, 4 * H), (6000, H), (7000, 0), (8000, 0)]
    scal = {"T": T, "units_per_block": 2, "k_tile": 8}
    args = K.kernel_args(kinfo, B, H, outs, ins, scal)
    assert len(args) == 2 + 2 * 8 + 3
    assert [type(a) for a in args[:2]] == [np.int32, np.int32]
    pairs = args[2:-3]
    assert all(type(p) is np.uint64 for p in pairs[::2])
    assert all(type(ld) is np.int32 for ld in pairs[1::2])
    assert [int(p) for p in pairs[::2]] == [p for p, _ in outs + ins]
    assert args[-3:] == (T, 2, 8) and all(type(a) is np.int32 for a in args[-3:])
    with pytest.raises(ValueError, match="takes scalars"):
        K.kernel_args(kinfo, B, H, outs, ins)
    with pytest.raises(ValueError, match="takes scalars"):
        K.kernel_args(kinfo, B, H, outs, ins, {"T": T, "units_per_block": 2})   # no k_tile
    with pytest.raises(ValueError, match="T = 0"):
        K.kernel_args(kinfo, B, H, outs, ins, dict(scal, T=0))
    with pytest.raises(ValueError, match="output h with ld 0"):
        K.kernel_args(kinfo, B, H, [(1000, 0)] + outs[1:], ins, scal)


def test_check_views_persistent():
    kinfo = K.KERNELS["rnn_tanh_persistent_fwd"]
    B, H, T = 3, 5, 4
    outs = [View("h", 0, (T + 1) * B, H, H), View("sync", 0, 1, 2, 2)]
    ins = [View("gx", 0, T * B, H, H), View("params", 0, H, H, H),
           View("params", 64, B, H, 0), View("zeros", 0, 1, H, 0)]
    scal = {"T": T, "units_per_block": 2, "k_tile": 8}
    K.check_views(kinfo, B, H, outs, ins, scal)
    with pytest.raises(ValueError, match=r"h is \[12, 5\], expected \[15, 5\].*T=4"):
        K.check_views(kinfo, B, H, [View("h", 0, T * B, H, H)] + outs[1:], ins, scal)


def test_launch_persistent(monkeypatch):
    fake = FakeCupy()
    monkeypatch.setitem(sys.modules, "cupy", fake)
    L.compile_module.cache_clear()
    try:
        lib = L.KernelLibrary()
        T = 100
        fit = P.persistent_fit("lstm", 1024, 64, H100)
        kinfo = K.KERNELS[fit.kernel]
        scal = {"T": T, "units_per_block": fit.units_per_block, "k_tile": fit.k_tile}
        out_shapes, in_shapes = kinfo.arg_shapes(64, 1024, **scal)
        pairs = [(4096 * (i + 1), c) for i, (_, c) in enumerate(out_shapes + in_shapes)]
        outs, ins = pairs[:kinfo.n_outs], pairs[kinfo.n_outs:]
        lib.launch_persistent(fit, outs, ins, T)
        name, grid, block, args = fake.launches[-1]
        assert (name, grid, block) == ("lstm_persistent_fwd", (128, 1, 1), (256, 1, 1))
        assert args[-3:] == (T, 8, 116) and args[:2] == (64, 1024), "T, U, k_tile last"
        assert fake.shared_mem[-1] == (name, 230912, 230912), "opt in past 48 KB, then launch"
        small = P.persistent_fit("rnn_tanh", 64, 8, H100)   # U 1: one warp (32 k-groups)
        assert small.ok and small.block == (32, 1, 1)
        assert small.smem_bytes <= P.DEFAULT_SHARED_BYTES
        sk = K.KERNELS[small.kernel]
        o, i = sk.arg_shapes(8, 64, T=T)
        pairs = [(4096 * (n + 1), c) for n, (_, c) in enumerate(o + i)]
        lib.launch_persistent(small, pairs[:2], pairs[2:], T)
        assert fake.launches[-1][3][-3:] == (T, 1, 64)
        assert fake.launches[-1][2] == (32, 1, 1)
        assert fake.shared_mem[-1] == ("rnn_tanh_persistent_fwd", small.smem_bytes, 0)

        n = len(fake.launches)
        with pytest.raises(ValueError, match="refused, does not fit: .*512 KiB"):
            lib.launch_persistent(P.persistent_fit("lstm", 2048, 64, H100), outs, ins, T)
        with pytest.raises(ValueError, match="overflow"):
            lib.launch_persistent(fit, outs, ins, 2**31 - 1)
        assert len(fake.launches) == n, "nothing launched after a refusal"
        with pytest.raises(ValueError, match="the fit is for gru_persistent_fwd"):
            kinfo.launch_persistent(P.persistent_fit("gru", 1024, 64, H100))
        with pytest.raises(ValueError, match="not a persistent kernel"):
            K.KERNELS["lstm_fwd"].launch_persistent(fit)
    finally:
        L.compile_module.cache_clear()
