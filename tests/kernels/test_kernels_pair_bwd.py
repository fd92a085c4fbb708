"""The backward grid kernel in cluster pairs (cuda_src/persistent_bwd_pair.cu;
persistent_bwd.PairBwdFit, pair_fit, pair_decline; emulate_bwd.pair_products; choice_backward's
wiring), without a GPU: the fit's layout and the .cu's agree; the fit declines with the reason
(float32 only, no clusters before sm_90, an empty half, more pairs than the device holds at
once, shared memory); the cost model's pick between the grid kernel and the pair; the twin
equals the float64 reference whatever order the blocks run in; PlanKey.backward 'pair' and the
selector's alternatives ('+ppbwd', '+gbwd') name it where it fits and say why not where not.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from testkit import CELLS, bwd_layer_case, check_bwd_against_reference, emulated

from rnnrt.kernels import choice as C
from rnnrt.kernels import selector as SEL
from rnnrt.kernels import persistent_bwd as PB
from rnnrt.kernels import sources as S
from rnnrt.kernels.emulate_bwd import pair_products
from rnnrt.kernels.limits import H100_SXM
from rnnrt.kernels.persistent import partial_stride, stride_r, tile_stride
from rnnrt.kernels.registry import get_kernel
from rnnrt.plan.backward import backward_plan
from rnnrt.plan.ops import Kernel
from rnnrt.plan.switches import PAPER_RUNGS, ladder
from testkit import cpu_plan_key as PlanKey

SRC = S.source("persistent_bwd_pair.cu")
P = H100_SXM.props()


def test_the_kernel_computes_the_fits_layout():
    """PairBwdFit's layout is the kernel's: 2U rows of R^T over KH = 4 ceil(K / 8) columns
    (SR(KH)), the dg tile [B][SH(KT)], the partial sums [NKG][2U][BP], the other half's sums
    [U][B]; block 1's half K - KH starting at column KH; whole pairs."""
    for line in ("KD = 4 * ((K + 7) / 8);", "kb = pc * KD;", "KC = pc ? K - KD : KD;",
                 "if (KC < 1 || (ranks & 1) || pc != (rank & 1)) __trap();",
                 "const PkGeom g = pk_geom<MMA>(1, PAIR ? 2 * U : U, BG, KD, KT, nt);",
                 "+ (long long)g.NKG * g.M * g.BP + (PAIR ? (long long)U * BG : 0));",
                 "const TS* const src = dgs + (long long)(t + 1) * S * lds + kb;",
                 "__cluster_dims__(2, 1, 1)"):
        assert line in SRC, line
    assert SRC.count(", 0, float, false, false, true>(") == 4   # the four kernels: PAIR
    f = PB.pair_geometry("gru", 37, 5, 4, 64, k_tile=20)
    kh, kc = f.halves
    assert (kh, kc) == (56, 55) and f.depth == 56 and f.rows == 8 and f.blocks == 10
    lr, lb, _ = f.lanes
    assert f.smem_r == 4 * 8 * stride_r(56) and f.smem_tile == 4 * 5 * tile_stride(20)
    assert f.smem_partials == 4 * f.k_groups * 8 * partial_stride(5, lb)
    assert f.smem_bytes == f.smem_r + f.smem_tile + f.smem_partials + 4 * 4 * 5
    assert f.kernel == "gru_persistent_pair_bwd" and f.barrier_arrivals(3) == 30
    assert PB.pair_geometry("lstm", 20, 3, 7).blocks == 4   # 2 pairs, block 3 without units


def test_the_fit_at_the_goal_shapes():
    """LSTM L1 H 512 B 32 / 64 on the H100: the pair fits (every pair resident: <= 64 of
    (132 - 4) / 2), and the cost model takes it over the grid kernel ('persistent');
    its fit string says how the gate rows are split."""
    wide = PB.persistent_bwd_fit("lstm", 1024, 64, P, kind="pair")   # U 8 is the first fit
    assert (wide.units_per_block, wide.blocks) == (8, 128), wide.describe()
    for B in (32, 64):
        pair = PB.persistent_bwd_fit("lstm", 512, B, P, kind="pair")
        grid = PB.persistent_bwd_fit("lstm", 512, B, P, kind="grid")
        assert pair.ok and grid.ok, (pair.reason, grid.reason)
        assert pair.pairs <= (132 - 4) // 2 and pair.halves == (1024, 1024)
        # the most blocks that fit (U 4: 128 blocks, 64 pairs; the H100 ran it 11-12% faster
        # than U 8), where the cost model would take U 8 (64 blocks)
        assert (pair.units_per_block, pair.blocks) == (4, 128), pair.describe()
        assert "U 4: the most blocks that fit" in pair.reason
        assert pair.step_us() < grid.step_us()
        pick = PB.persistent_bwd_fit("lstm", 512, B, P)
        assert pick.kernel == "lstm_persistent_pair_bwd", pick.describe()
        assert "cluster pairs" in pick.describe() and "the grid kernel ~" in pick.reason
    # where the halving saves less than the exchange costs, the grid kernel (RNN H 512 B 64)
    pick = PB.persistent_bwd_fit("rnn_tanh", 512, 64, P)
    assert pick.kernel == "rnn_tanh_persistent_bwd" and "the pair kernel ~" in pick.reason


@pytest.mark.parametrize("props, dtype, cell, H, B, why", [
    (P, "bfloat16", "lstm", 512, 32, "float32 only"),
    (dict(P, major=8), "float32", "lstm", 512, 32, "no thread-block clusters"),
    (P, "float32", "rnn_relu", 1, 2, "too few to halve"),
    # U 4: 64 blocks on 66 SMs, but 32 pairs > (66 - 4) / 2
    (dict(P, multiProcessorCount=66), "float32", "lstm", 256, 8, "32 pairs > 31 resident"),
    (dict(P, sharedMemPerBlockOptin=8192, sharedMemPerMultiprocessor=9216), "float32", "lstm",
     512, 32, "shared memory")])
def test_the_pair_declines_with_the_reason(props, dtype, cell, H, B, why):
    f = PB.persistent_bwd_fit(cell, H, B, props, kind="pair", dtype=dtype, units_per_block=4
                              if "resident" in why else None)
    assert not f.ok and why in f.reason, f.reason
    assert "DOES NOT FIT" in f.describe()
    pick = PB.persistent_bwd_fit(cell, H, B, props, dtype=dtype)   # never the pair
    assert not isinstance(pick, PB.PairBwdFit), pick.describe()


@pytest.mark.parametrize("cell", CELLS)
def test_the_twin_gives_the_reference_in_any_block_order(cell):
    """emulate_bwd with the pair's sums (each block its half, then half 0 + half 1) is the
    float64 reference's backward, the same bits whatever order the blocks run in; the
    registry's twin of the kernel runs it."""
    fit = PB.pair_geometry(cell, 37, 3, 5, 64, k_tile=12)
    data, ref = bwd_layer_case(cell, 3, 3, 37)
    out = emulated(cell, fit, data, products=pair_products(fit))
    check_bwd_against_reference(out, data, ref, f"pair twin {cell}")
    rev = emulated(cell, fit, data, products=pair_products(fit),
                   block_order=list(reversed(range(fit.blocks))))
    for name in ("dgx", "dh0"):
        assert np.array_equal(out[name], rev[name]), name
    k = get_kernel(PB.pair_kernel_name(cell))
    assert k.file == "persistent_bwd_pair.cu" and k.persistent
    assert k.numpy_fn.__name__ == PB.pair_kernel_name(cell)


def launched(plan) -> set:
    """The persistent kernels ``plan`` launches."""
    return {op.name for op in plan.ops if isinstance(op, Kernel) and op.kind == "persistent"}


def _key(backward, dtype="float32", device=H100_SXM, H=512, B=32):
    sw = ladder(input_batch=2)[PAPER_RUNGS - 1].switches
    return PlanKey("lstm", 10, B, H, H, 1, True, sw, train=True, backward=backward,
                   dtype=dtype, device=device)


def test_plan_key_pair_names_it_or_says_why_not():
    """PlanKey.backward 'pair' runs the pair kernel where it fits (its plan's fit string
    says so), else the per-step backward with the reason; 'grid' stays the grid kernel;
    'persistent' takes the pair where the cost model does; no cluster count with it."""
    plan = backward_plan(_key("pair"))
    assert launched(plan) == {"lstm_persistent_pair_bwd"} and plan.fallback is None
    assert "cluster pairs" in plan.fit
    grid = backward_plan(_key("grid"))
    assert launched(grid) == {"lstm_persistent_bwd"} and "cluster pairs" not in grid.fit
    assert launched(backward_plan(_key("persistent"))) == {"lstm_persistent_pair_bwd"}
    ampere = dataclasses.replace(H100_SXM, name="sm80 GPU", cc_major=8)
    plan = backward_plan(_key("pair", device=ampere))
    assert plan.fallback and "declined on sm80 GPU" in plan.fallback
    assert "no thread-block clusters" in plan.fallback and "per-step backward" in plan.fallback
    plan = backward_plan(_key("pair", dtype="bfloat16"))
    assert "float32 only" in plan.fallback
    with pytest.raises(ValueError, match="cluster backward kernel's count"):
        dataclasses.replace(_key("pair"), bwd_clusters=4)


def test_plan_key_bwd_units_runs_that_u():
    """PlanKey.bwd_units (the experiments' knob) runs the grid or pair kernel at exactly
    that U; a U that does not fit falls back to the per-step backward saying why; with
    another backward it is refused."""
    for backward, u, blocks in (("pair", 4, 128), ("grid", 4, 128), ("pair", 16, 32)):
        key = dataclasses.replace(_key(backward), bwd_units=u)
        fit = C.choose_persistent_backward(key).fit
        assert (fit.units_per_block, fit.blocks) == (u, blocks), fit.describe()
        want = "lstm_persistent_pair_bwd" if backward == "pair" else "lstm_persistent_bwd"
        assert launched(backward_plan(key)) == {want}
    plan = backward_plan(dataclasses.replace(_key("pair"), bwd_units=1))   # 512 blocks
    assert "per-step backward" in plan.fallback and "> 132 SMs" in plan.fallback
    for backward in ("cluster", "persistent"):
        with pytest.raises(ValueError, match="bwd_units 4: the grid backward kernel's"):
            dataclasses.replace(_key(backward), bwd_units=4)


def test_the_selector_times_grid_and_pair():
    """Training shapes where the cost model's backward is a grid kernel get the other one as
    a candidate too: '+gbwd' where it takes the pair, '+ppbwd' where it takes the grid
    kernel; the cluster kernel's shapes (small H) and forward-only shapes get neither; each
    candidate's plan runs what it names."""
    shape = SEL.Shape("lstm", 1, 512, 512, 32, 100, train=True)
    got = [s.name for s in C.candidates(shape, H100_SXM)]
    assert "grid+pbwd" in got and "grid+gbwd" in got and "+ppbwd" not in " ".join(got), got
    rnn = SEL.Shape("rnn_tanh", 1, 512, 512, 64, 100, train=True)   # the model takes the grid
    assert "grid+ppbwd" in [s.name for s in C.candidates(rnn, H100_SXM)]
    for s in (dataclasses.replace(shape, train=False),
              SEL.Shape("lstm", 1, 128, 128, 8, 100, train=True)):
        assert not any(n.endswith(("+gbwd", "+ppbwd")) for n in
                       (c.name for c in C.candidates(s, H100_SXM)))
    runs = {"grid+pbwd": "lstm_persistent_pair_bwd", "grid+gbwd": "lstm_persistent_bwd"}
    for s in C.candidates(shape, H100_SXM):
        if s.name in runs:
            key = C.with_family(PlanKey("lstm", 12, 32, 512, 512, 1, True, s.switches,
                                        train=True, device=H100_SXM), s)
            plan = backward_plan(key)
            assert plan.fallback is None and launched(plan) == {runs[s.name]}
