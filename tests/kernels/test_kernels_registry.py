"""The kernel registry (rnnrt/kernels/registry.py), without a GPU: the arguments it builds
(types, order, counts, lds and sizes refused), every kernel's launch geometry, the views a
plan hands a kernel, the argument shapes."""
from __future__ import annotations

import re

import numpy as np
import pytest

from rnnrt.kernels import registry as K
from rnnrt.kernels.sources import source
from rnnrt.plan.ops import View


def test_kernel_args_types_and_order():
    kinfo = K.KERNELS["lstm_fwd"]
    outs = [(1000, 8), (2000, 8), (3000, 32)]
    ins = [(4000, 32), (5000, 32), (6000, 0), (7000, 0), (2**40, 8)]
    args = K.kernel_args(kinfo, 4, 8, outs, ins)
    assert len(args) == 2 + 2 * 8
    assert type(args[0]) is np.int32 and type(args[1]) is np.int32 and args[:2] == (4, 8)
    assert all(type(p) is np.uint64 for p in args[2::2])
    assert all(type(ld) is np.int32 for ld in args[3::2])
    assert [int(p) for p in args[2::2]] == [p for p, _ in outs + ins]
    assert [int(ld) for ld in args[3::2]] == [ld for _, ld in outs + ins]


@pytest.mark.parametrize("name", list(K.KERNELS))
def test_kernel_args_every_kernel(name):
    kinfo = K.KERNELS[name]
    scalars = {s: 2 for s in kinfo.scalars} or None
    out_shapes, in_shapes = kinfo.arg_shapes(3, 5, **(scalars or {}))
    pairs = [(4096 * (i + 1), c) for i, (_, c) in enumerate(out_shapes + in_shapes)]
    args = K.kernel_args(kinfo, 3, 5, pairs[:kinfo.n_outs], pairs[kinfo.n_outs:], scalars)
    assert len(args) == 2 + 2 * (kinfo.n_outs + kinfo.n_ins) + len(kinfo.scalars)
    assert all(type(a) is np.int32 for a in args[len(args) - len(kinfo.scalars):])
    with pytest.raises(ValueError, match=f"takes {kinfo.n_outs} outputs"):
        K.kernel_args(kinfo, 3, 5, pairs[:kinfo.n_outs] + [(1, 5)], pairs[kinfo.n_outs:],
                      scalars)
    with pytest.raises(ValueError, match=f"and {kinfo.n_ins} inputs"):
        K.kernel_args(kinfo, 3, 5, pairs[:kinfo.n_outs], pairs[kinfo.n_outs + 1:], scalars)
    with pytest.raises(ValueError, match="takes scalars"):
        K.kernel_args(kinfo, 3, 5, pairs[:kinfo.n_outs], pairs[kinfo.n_outs:],
                      {**(scalars or {}), "extra": 1})


def test_kernel_args_rejects_bad_lds_and_sizes():
    kinfo = K.KERNELS["ew_add"]
    with pytest.raises(ValueError, match="output out with ld 0"):
        K.kernel_args(kinfo, 3, 5, [(64, 0)], [(128, 5), (256, 5)])
    K.kernel_args(kinfo, 1, 5, [(64, 0)], [(128, 0), (256, 5)])   # one row: ld 0 is harmless
    with pytest.raises(ValueError, match="ld 4 < its 5 columns"):
        K.kernel_args(kinfo, 3, 5, [(64, 5)], [(128, 4), (256, 5)])
    with pytest.raises(ValueError, match="rows = 0"):
        K.kernel_args(kinfo, 0, 5, [(64, 5)], [(128, 5), (256, 5)])
    with pytest.raises(ValueError, match="ld -1"):
        K.kernel_args(kinfo, 3, 5, [(64, 5)], [(128, -1), (256, 5)])
    with pytest.raises(ValueError, match="not a device address"):
        K.kernel_args(kinfo, 3, 5, [(0, 5)], [(128, 5), (256, 5)])
    with pytest.raises(ValueError, match="ld 4 < its 5 columns"):   # transpose out is [cols, rows]
        K.kernel_args(K.KERNELS["transpose"], 5, 4, [(64, 4)], [(128, 4)])


def test_launch_geometry():
    for kinfo in K.REGISTRY:
        if kinfo.persistent:   # its geometry is a persistent.Fit: test_kernels_persistent_twins.py
            with pytest.raises(ValueError, match="launch_persistent"):
                kinfo.launch(3, 5)
            continue
        if kinfo.tiled:
            continue
        assert kinfo.launch(3, 5) == ((1, 1, 1), (256, 1, 1))
        assert kinfo.launch(64, 1024) == ((256, 1, 1), (256, 1, 1))
        grid, _ = kinfo.launch(100 * 64, 4 * 2048)   # a time-batched [T*B, 4H] problem
        assert grid == (K.MAX_POINTWISE_BLOCKS, 1, 1)
    tr = K.KERNELS["transpose"]
    assert tr.launch(4096, 1000) == ((32, 128, 1), (32, 8, 1))   # x: column tiles, y: row tiles
    assert tr.launch(1, 1) == ((1, 1, 1), (32, 8, 1))
    assert tr.launch(2**23, 33) == ((2, 65535, 1), (32, 8, 1))   # y capped; the kernel loops
    assert K.TILE == int(re.search(r"#define TILE (\d+)", source("transpose.cu"))[1])
    assert K.TILE_ROWS == int(re.search(r"#define TILE_ROWS (\d+)", source("transpose.cu"))[1])


def test_check_views():
    B, H = 4, 3
    kinfo = K.KERNELS["gru_fwd"]
    outs = (View("h", 0, B, H, H), View("act", 0, B, 4 * H, 4 * H))
    ins = (View("gx", 0, B, 3 * H, 3 * H), View("gh", 0, B, 3 * H, 5 * H),
           View("params", 7, B, 3 * H, 0), View("params", 9, 1, 3 * H, 0), View("h", 0, B, H, H))
    K.check_views(kinfo, B, H, outs, ins)
    with pytest.raises(ValueError, match=r"gx is \[4, 12\], expected \[4, 9\]"):
        K.check_views(kinfo, B, H, outs, (View("gx", 0, B, 4 * H, 4 * H),) + ins[1:])
    with pytest.raises(ValueError, match="output h with ld 0"):
        K.check_views(kinfo, B, H, (View("h", 0, B, H, 0),) + outs[1:], ins)
    with pytest.raises(ValueError, match="takes 2 outputs"):
        K.check_views(kinfo, B, H, outs[:1], ins)
    tr = K.KERNELS["transpose"]
    K.check_views(tr, 6, 2, (View("w", 0, 2, 6, 6),), (View("p", 0, 6, 2, 2),))


def test_arg_shapes():
    assert K.KERNELS["lstm_fwd"].arg_shapes(2, 3) == (
        [(2, 3), (2, 3), (2, 12)], [(2, 12), (2, 12), (2, 12), (2, 12), (2, 3)])
    assert K.KERNELS["transpose"].arg_shapes(2, 3) == ([(3, 2)], [(2, 3)])
    with pytest.raises(ValueError, match="unknown"):
        K.get_kernel("unknown")
