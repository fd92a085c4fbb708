"""The stack kernels (lstm_ and gru_persistent_stack_fwd: every layer of an LSTM or GRU stack in
one launch) without a GPU: the .cu on CPU threads (tests/kernels/persistent_host_sim.cpp,
PK_SIM_STACK) against a float64 reference on random data with poisoned outputs, twice on one
sync buffer; the same source with its waits removed must be caught; the fit's rules; the
plan that uses it (one launch, race-free, the NumPy executor's forward and the backward
after it equal to the reference), LSTM's and GRU's."""
from __future__ import annotations

import dataclasses
import re
import subprocess

import numpy as np
import pytest

from rnnrt import reference
from rnnrt.check import FP32_ATOL, FP32_RTOL, assert_close, compare
from rnnrt.exec import numpy_exec
from rnnrt.exec.racecheck import find_races
from rnnrt.exec.workspace import Workspace
from rnnrt.kernels import stack, stack_bwd
from rnnrt.kernels.limits import H100_SXM
from rnnrt.kernels.sources import cuda_src_dir, source
from rnnrt.params import per_layer, to_flat
from rnnrt.plan import PlanKey, forward_plan
from rnnrt.plan.backward import backward_plan
from rnnrt.plan.ops import Kernel
from rnnrt.plan.switches import ladder
from testkit import (build_host_sim, bwd_plan_case, check_bwd_key, check_outputs,
                     random_layer_stack, run_bwd_plan)

# a device without clusters: the per-layer fit is the grid kernel, so the stack is considered
SM80 = dataclasses.replace(H100_SXM, name="no clusters", cc_major=8)


def _build(tmp_path_factory, src_text, name):
    d = tmp_path_factory.mktemp(name)
    src = d / "persistent_stack.cu"
    src.write_text(src_text)
    return build_host_sim(d / "sim", src, define="PK_SIM_STACK")


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    return _build(tmp_path_factory, source("persistent_stack.cu"), "stack_sim")


@pytest.fixture(scope="module")
def sim_no_waits(tmp_path_factory):
    text = source("persistent_stack.cu")
    # the stack kernel's three waits gone (the grid kernel's barrier is a different
    # function): calls of a wait that returns at once
    cut = re.sub(r"ps_wait\((lower|mine), ", r"ps_nowait(\1, ", text)
    assert cut.count("ps_nowait(") == 3
    cut = "static void ps_nowait(const unsigned int*, unsigned int) {}\n" + cut
    return _build(tmp_path_factory, cut, "stack_sim_no_waits")


def run_sim(exe, tmp_path, B, H, T, L, seed=0, launches=2, cell="lstm"):
    """Random weights and inputs, h and c poisoned past slot 0; returns (h, c, act) of the
    sim and of the float64 reference, each [L, T, B, *] (GRU: c None). The kernel's scratch
    (W^T in wt, the k-major inputs in ht, poisoned before each launch) is checked exactly
    here: W^T (GRU: then zeros), x_t^T, and every layer's h_s^T equal to its own h output,
    in each batch group's block of ht (B > 64: ceil(B / 64) groups side by side)."""
    rng = np.random.default_rng(seed)
    f32 = np.float32
    G = 4 if cell == "lstm" else 3     # gate rows (of H) of W and R
    ldw = G * H * H + 64          # a layer's stride in the flat parameters (as the plan's)
    ldb = G * H + 4
    x = rng.standard_normal((T, B, H)).astype(f32)
    W = (rng.standard_normal((L, G * H, H)) / np.sqrt(H)).astype(f32)
    R = (rng.standard_normal((L, G * H, H)) / np.sqrt(H)).astype(f32)
    wih, whh = np.zeros((L, ldw), f32), np.zeros((L, ldw), f32)
    wih[:, :G * H * H], whh[:, :G * H * H] = W.reshape(L, -1), R.reshape(L, -1)
    bw = (0.1 * rng.standard_normal((L, ldb))).astype(f32)
    br = (0.1 * rng.standard_normal((L, ldb))).astype(f32)
    h = np.full((L, T + 1, B, H), np.nan, f32)
    c = np.full((L, T + 1, B, H), np.nan, f32)
    h[:, 0] = 0.5 * rng.standard_normal((L, B, H))
    c[:, 0] = 0.5 * rng.standard_normal((L, B, H))
    for n, a in dict(x=x, h=h, c=c, wih=wih, whh=whh, bw=bw, br=br).items():
        a.tofile(tmp_path / f"{n}.f32")
    smem = stack.stack_smem_bytes(H)
    r = subprocess.run([str(exe), str(B), str(H), str(T), str(L), str(stack.PS_M // 4),
                        str(smem), str(launches), str(tmp_path), str(ldw), str(ldw), str(ldb),
                        str(ldb), cell], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    got_h = np.fromfile(tmp_path / "h.out", f32).reshape(L, T + 1, B, H)[:, 1:]
    got_c = np.fromfile(tmp_path / "c.out", f32).reshape(L, T + 1, B, H)[:, 1:]
    got_a = np.fromfile(tmp_path / "act.out", f32).reshape(L, T, B, 4 * H)
    wt = np.fromfile(tmp_path / "wt.out", f32).reshape(L, H, 4 * H)
    groups = -(-B // 64)
    hts = np.fromfile(tmp_path / "ht.out", f32).reshape(groups, L + 1, T + 1, H, 64)
    got_hall = np.fromfile(tmp_path / "h.out", f32).reshape(L, T + 1, B, H)
    assert np.array_equal(wt[..., :G * H], W.transpose(0, 2, 1)), "wt is not W^T"
    assert not wt[..., G * H:].any(), "wt's padding (GRU: n's R part) is not zero"
    for g in range(groups):
        bs = slice(64 * g, min(B, 64 * g + 64))
        ht = hts[g, ..., :bs.stop - bs.start]
        assert np.array_equal(ht[0, 1:], x[:, bs].transpose(0, 2, 1)), \
            f"ht block 0 of group {g} is not x^T"
        assert np.array_equal(ht[1:], got_hall[:, :, bs].transpose(0, 1, 3, 2),
                              equal_nan=True), f"ht of group {g} is not h^T"
    # the float64 reference (rnnrt.reference): each layer's c and saved gates from its cache
    f64 = np.float64
    p = [{"weight_ih": W[n].astype(f64), "weight_hh": R[n].astype(f64),
          "bias_ih": bw[n, :G * H].astype(f64), "bias_hh": br[n, :G * H].astype(f64)}
         for n in range(L)]
    lstm = cell == "lstm"
    _, _, _, cache = reference.forward(cell, p, x.astype(f64), h[:, 0].astype(f64),
                                       c[:, 0].astype(f64) if lstm else None)
    return (got_h, got_c if lstm else None, got_a), cache.sequences()


# (B, H, T, L): tile edges, B < 8; B 70: two batch groups, the second on the 32-batch path
SHAPES = [(64, 64, 3, 2), (5, 64, 4, 3), (37, 192, 3, 2), (70, 64, 3, 2)]


# GRU at the shapes with tile edges and groups (CI time: every simulation is seconds of two
# cores)
CASES = [(s, "lstm") for s in SHAPES] + [(s, "gru") for s in SHAPES[1:]]


@pytest.mark.parametrize("shape, cell", CASES,
                         ids=[f"{c}-B{b}H{h}T{t}L{ll}" for (b, h, t, ll), c in CASES])
def test_stack_kernel_on_cpu_threads_matches_reference(sim, tmp_path, shape, cell):
    got, want = run_sim(sim, tmp_path, *shape, cell=cell)
    for name, g, w in zip(("h", "c", "act"), got, want):
        if w is None:   # GRU: no c
            assert g is None
            continue
        assert_close(g, w, FP32_ATOL, FP32_RTOL, name=f"{cell} stack {shape} {name}")


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_stack_kernel_without_its_waits_is_caught(sim_no_waits, tmp_path, cell):
    """Layers 1 and 2 then read layer 0's h before it is written (NaN poison) and every
    layer its own h_t before the other blocks wrote it: the comparison must fail."""
    got, want = run_sim(sim_no_waits, tmp_path, 16, 64, 4, 3, launches=1, cell=cell)
    assert not compare(got[0], want[0], FP32_ATOL, FP32_RTOL).ok


def test_a_gru_stack_that_skips_the_wrong_group_is_caught(tmp_path_factory, tmp_path):
    """The GRU kernel multiplies only the row groups a tile has: the input's tiles skip n's R
    group (no W there), h's tiles n's W group (no R). A kernel that skips n's W group in the
    input's tiles instead (and so adds n's R part's zeros and drops W_n x) must fail the
    comparison."""
    text = source("persistent_stack.cu")
    old = "ps_tile_fma<NH, 3>(acc, a + a_lane, s + x_lane);"
    assert text.count(old) == 1
    exe = _build(tmp_path_factory, text.replace(old, old.replace("<NH, 3>", "<NH, 2>")),
                 "stack_sim_gru_wrong_skip")
    got, want = run_sim(exe, tmp_path, 8, 64, 3, 2, launches=1, cell="gru")
    assert not compare(got[0], want[0], FP32_ATOL, FP32_RTOL).ok


def test_batch_groups_sharing_one_row_of_counters_are_caught(tmp_path_factory, tmp_path):
    """Each batch group waits on its own row of progress counters. A kernel whose groups all
    count on row 0 lets a block pass its waits on the other group's progress, before the
    h^T of its own group is written (NaN poison): the comparison must fail. To show it
    whatever the host's scheduling (a loaded 2-core host once ran the groups in step and the
    race did not show), group 1's layer 0 starts its step 0 only after both groups' layer 1
    finished theirs (row 0's word 2 at 2 NB): group 1's layer 1 has then run its step 0 on
    group 0's progress alone. (In the right kernel that wait would never end: there group 1's
    layer 1 waits for group 1's layer 0.)"""
    text = source("persistent_stack.cu")
    old = "sync + grp * ldsync + 2 * l;"
    assert text.count(old) == 1
    top = "PS_NOTE(t, 0);"
    assert text.count(top) == 1
    lag = "if (grp == 1 && l == 0 && t == 0 && tid == 0) ps_wait(sync + 2, 2u * NB);"
    text = text.replace(old, "sync + 2 * l;").replace(top, top + lag)
    exe = _build(tmp_path_factory, text, "stack_sim_one_row")
    got, want = run_sim(exe, tmp_path, 100, 64, 4, 2, launches=1)
    assert not compare(got[0], want[0], FP32_ATOL, FP32_RTOL).ok


def test_constants_match_the_kernel():
    text = source("persistent_stack.cu")
    for name in ("PS_M", "PS_BMAX", "PS_KT", "PS_NS", "PS_RP"):
        m = re.search(rf"#define {name} (\d+)", text)
        assert m and int(m[1]) == getattr(stack, name), name
    assert (cuda_src_dir() / "persistent_stack.cu").exists()


def test_fit_rules_name_what_is_wrong():
    p = H100_SXM.props()
    ok = stack.stack_fit("lstm", 512, 64, 4, 512, p)
    assert ok.ok and ok.blocks == 128 and ok.smem_bytes == stack.stack_smem_bytes(512)
    assert ok.grid == (128, 1, 1) and ok.block == (256, 1, 1)
    assert stack.stack_fit("gru", 512, 64, 4, 512, p).kernel == "gru_persistent_stack_fwd"
    # batch groups side by side: L4 H 256 B 128 two of 64 blocks, H 128 B 256 four of 32;
    # the group count is a kernel scalar
    two = stack.stack_fit("lstm", 256, 128, 4, 256, p)
    assert two.ok and two.groups == 2 and two.grid == (128, 1, 1) and "2 batch groups" in two.reason
    assert two.scalars(7)["groups"] == 2
    four = stack.stack_fit("gru", 128, 256, 4, 128, p)
    assert four.ok and four.groups == 4 and four.blocks == 128
    assert not stack.stack_fit("lstm", 256, 129, 4, 256, p).ok   # 3 x 64 blocks
    assert stack.stack_fit("lstm", 256, 64, 4, 256, p).groups == 1
    cases = [(("rnn_tanh", 512, 64, 4, 512), "LSTM and GRU only"),
             (("lstm", 512, 64, 4, 256), "input size 256 != hidden 512"),
             (("lstm", 528, 64, 2, 528), "multiple of 64"),
             (("lstm", 512, 65, 4, 512), r"2 batch groups x 4 layers x 32 blocks .* = 256 "
                                         r"> 132 SMs"),
             (("lstm", 256, 0, 4, 256), r"batch 0 < 1"),
             (("lstm", 512, 64, 5, 512), "160 > 132 SMs"),
             (("lstm", 1024, 64, 2, 1024), "shared memory"),
             (("lstm", 512, 64, 1, 512), "one layer")]
    for args, why in cases:
        f = stack.stack_fit(*args, p)
        assert not f.ok and re.search(why, f.reason), (args, f.reason)


# --- the plan ---------------------------------------------------------------------------------

T, B, H, L = 5, 40, 64, 3


def make_case(bias, seed=0):
    """(layout, flat, x, h0, c0) in float64 (the fp32 random stack, widened exactly)."""
    layout, *arrays, _ = random_layer_stack("lstm", L, T, B, H, H, bias, seed)
    return (layout, *(a.astype(np.float64) for a in arrays))


def key(train=False, bias=True, batch=B, device=SM80):
    sw = ladder()[-1].switches
    return PlanKey("lstm", T, batch, H, H, L, bias, sw, train=train, device=device)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_plan_runs_every_layer_in_one_stack_launch(bias):
    layout, flat, x, h0, c0 = make_case(bias)
    plan = forward_plan(key(bias=bias))
    ks = [op for op in plan.ops if isinstance(op, Kernel)]
    assert [op.name for op in ks] == [stack.STACK_KERNEL] and plan.counts().get("gemm:wx", 0) == 0
    assert plan.fit.startswith("stack lstm") and plan.fallback is None
    assert not find_races(plan)
    ws = Workspace(plan, np, np.float64, flat)
    ws.poison(roles=("io", "scratch"))
    ws.load_inputs(x, h0, c0)
    numpy_exec.run(plan, ws)
    y, hn, cn, _ = reference.forward("lstm", per_layer(flat, layout), x, h0, c0)
    out = ws.outputs()
    for name, want in (("y", y), ("h_n", hn), ("c_n", cn)):
        assert_close(out[name], want, 1e-12, 1e-10, name=f"stack plan {name}")


def test_backward_after_a_stack_forward_gives_reference_gradients():
    layout, flat, x, h0, c0 = make_case(True, seed=2)
    rng = np.random.default_rng(3)
    dy, dhn, dcn = (rng.standard_normal((T, B, H)), rng.standard_normal((L, B, H)),
                    rng.standard_normal((L, B, H)))
    k = key(train=True)
    fwd, bwd = forward_plan(k), backward_plan(k)
    assert any(isinstance(op, Kernel) and op.name == stack.STACK_KERNEL for op in fwd.ops)
    assert not find_races(bwd)
    ws = Workspace(bwd, np, np.float64, flat)
    ws.poison(roles=("io", "scratch"))
    ws.load_inputs(x, h0, c0)
    numpy_exec.run(fwd, ws)
    ws.load(dy=dy, dh_n=dhn, dc_n=dcn)
    numpy_exec.run(bwd, ws)
    p = per_layer(flat, layout)
    _, _, _, cache = reference.forward("lstm", p, x, h0, c0)
    g = reference.backward("lstm", p, cache, dy, dhn, dcn)
    for name in ("dx", "dh0", "dc0"):
        assert_close(ws.read(name), g[name], 1e-12, 1e-10, name=name)
    grads = to_flat(g["params"], layout)
    got = ws.read("grads")
    for e in layout.entries:
        n = int(np.prod(e.shape))
        assert_close(got[e.offset:e.offset + n], grads[e.offset:e.offset + n], 1e-12, 1e-10,
                     name=e.name)


def test_plan_says_why_the_stack_is_not_used():
    small = forward_plan(key(batch=16))
    assert stack.STACK_KERNEL not in {op.name for op in small.ops if isinstance(op, Kernel)}
    assert "stack kernel not used: batch 16 <= 16" in small.fit
    above = forward_plan(key(batch=17))
    assert stack.STACK_KERNEL in {op.name for op in above.ops if isinstance(op, Kernel)}
    # the H100 has clusters: at H 64 the per-layer fit is the cluster kernel, which already
    # overlaps layers; the stack is not considered
    cl = forward_plan(key(device=H100_SXM))
    assert "cluster" in cl.fit and stack.STACK_KERNEL not in cl.fit


# --- the GRU stack ---------------------------------------------------------------------------

def gru_key(train=False, bias=True, family="stack", backward=None, device=SM80):
    sw = ladder()[-1].switches
    return PlanKey("gru", T, B, H, H, L, bias, sw, train=train, device=device, family=family,
                   backward=backward)


@pytest.mark.parametrize("backward", [None, "stack", "persistent", "stack on H100"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_a_gru_stack_plan_forward_and_training_equal_the_reference(bias, backward):
    """family 'stack' names the GRU stack kernel: one launch; the backward after it is the
    per-step one, or with 'stack' (and 'persistent', which takes it after a stack forward)
    the GRU stack backward, one launch, no fallback: the one-block kernel without clusters,
    the cluster-pair one on the H100. Both plans race-free; on the NumPy executor (the
    twins), in program order and a random interleaving, every gradient and the forward's y
    and h_n equal the float64 reference (testkit.check_bwd_key)."""
    on_h100 = backward == "stack on H100"
    backward = "stack" if on_h100 else backward
    k = gru_key(train=True, bias=bias, backward=backward,
                device=H100_SXM if on_h100 else SM80)
    fwd, bwd = forward_plan(k), backward_plan(k)
    ks = [op.name for op in fwd.ops if isinstance(op, Kernel)]
    # one stack launch (the transposes of W and R are the per-step backward's, training)
    assert [n for n in ks if n != "transpose"] == ["gru_persistent_stack_fwd"]
    assert fwd.counts().get("gemm:wx", 0) == 0
    assert fwd.fit.startswith("stack gru") and not find_races(fwd)
    launches = [op.name for op in bwd.ops if isinstance(op, Kernel) and op.kind == "persistent"]
    if backward:   # the GRU stack backward
        want = stack_bwd.STACK_BWD_GRU_PAIR_KERNEL if on_h100 else stack_bwd.STACK_BWD_GRU_KERNEL
        assert launches == [want], bwd.fit
        assert bwd.fit.startswith("stack backward gru") and bwd.fallback is None
    else:
        assert launches == [] and bwd.fit is None
    case = bwd_plan_case("gru", L, bias, seed=4, shape=(T, B, H, H))
    check_bwd_key(k, case, f"gru stack {backward}", always_random=True)   # races, gradients
    _, flat, fwd_in, bwd_in, ref = case
    check_outputs(run_bwd_plan(k, flat, fwd_in, bwd_in).outputs(), ref, "gru stack forward")


def test_the_rules_choose_the_gru_stack_as_lstms():
    """Checked on a GPU (tests/gpu/test_gpu_stack.py): where a key names no family the rules
    choose GRU's stack kernel past the batch rule, as LSTM's, and the fit says why not at B
    16; the selector lists it. After it the rule's backward is the stack backward only in
    cluster pairs (the one-block form measured slower: prefers_stack_backward)."""
    from rnnrt.kernels import choice as C
    from rnnrt.kernels.selector import Shape

    def fwd_kernels(plan):
        return {op.name for op in plan.ops if isinstance(op, Kernel)}

    assert "gru_persistent_stack_fwd" in fwd_kernels(forward_plan(gru_key(family=None)))
    small = forward_plan(dataclasses.replace(gru_key(family=None), batch=16))
    assert "gru_persistent_stack_fwd" not in fwd_kernels(small)
    assert "stack kernel not used: batch 16 <= 16" in small.fit
    shape = Shape("gru", 4, 512, 512, 64, 100, train=True)
    assert "stack" in C.fitting_families(shape, H100_SXM)
    assert C.prefers_stack_backward(shape, H100_SXM)   # in pairs
    assert not C.prefers_stack_backward(shape, SM80)   # the one-block kernel
    assert C.prefers_stack_backward(dataclasses.replace(shape, cell="lstm"), SM80)


@pytest.mark.parametrize("b", [100, 128])
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_a_stack_plan_in_batch_groups_trains_to_the_reference(cell, b):
    """B 100 and 128 run as two batch groups of the stack kernel (64 + 36, 64 + 64) in one
    launch: one sync row a group, one k-major block of ht a group; race-free. The backward
    asked for the stack backward: at B 128 its pair kernel in two whole groups, one launch;
    at B 100 it declines (its groups are whole) and the plan says so, the per-step backward
    running. Forward outputs and every gradient equal the
    float64 reference on the NumPy executor, in program order and a random interleaving."""
    sw = ladder()[-1].switches
    k = PlanKey(cell, T, b, H, H, L, True, sw, train=True, device=H100_SXM, family="stack",
                backward="stack")
    fwd, bwd = forward_plan(k), backward_plan(k)
    (op,) = [o for o in fwd.ops if isinstance(o, Kernel) and o.kind == "persistent"]
    assert op.name == stack.STACK_KERNELS[cell] and dict(op.scalars)["groups"] == 2
    assert op.launch[0] == (2 * L * H // 16, 1, 1) and "2 batch groups" in fwd.fit
    sync = next(v for v in op.outs if v.buf == "sync")
    assert sync.rows == 2 and fwd.buffer("sync").size >= 2 * sync.cols
    assert not find_races(fwd) and not find_races(bwd)
    launches = [o for o in bwd.ops if isinstance(o, Kernel) and o.kind == "persistent"]
    if b == 128:   # (H 64: two groups of 6 pairs fit)
        want = (stack_bwd.STACK_BWD_PAIR_KERNEL if cell == "lstm"
                else stack_bwd.STACK_BWD_GRU_PAIR_KERNEL)
        assert [o.name for o in launches] == [want] and bwd.fallback is None, bwd.fallback
        assert dict(launches[0].scalars)["groups"] == 2 and "2 batch groups" in bwd.fit
    else:
        assert launches == [] and "not a multiple of it" in bwd.fallback, bwd.fallback
    case = bwd_plan_case(cell, L, True, seed=6, shape=(T, b, H, H))
    check_bwd_key(k, case, f"{cell} stack in batch groups B {b}", always_random=True)
    _, flat, fwd_in, bwd_in, ref = case
    check_outputs(run_bwd_plan(k, flat, fwd_in, bwd_in).outputs(), ref,
                  f"{cell} stack forward in batch groups B {b}")


def test_plans_take_the_grouped_stack_backward_where_it_paid():
    """backward 'persistent' after a stack forward in batch groups: the stack backward in
    cluster pairs where its groups fill three quarters of the SMs (H 256 B 128, H 128 B 256:
    128 of 132), LSTM's one-block kernel there too (no pairs asked); the per-layer backward,
    with the reason, at H 128 B 128 (64 SMs) and for GRU's one-block kernel (measured slower:
    choice_backward.grouped_stack_backward_pays); 'stack' names it anyway."""
    from rnnrt.kernels.choice_backward import choose_persistent_backward
    sw = ladder()[-1].switches

    def bwd(cell, h, b, backward="persistent"):
        return choose_persistent_backward(PlanKey(cell, T, b, h, h, 4, True, sw, train=True,
                                                  device=H100_SXM, family="stack",
                                                  backward=backward))
    for cell, h, b in (("lstm", 256, 128), ("gru", 256, 128), ("lstm", 128, 256),
                       ("gru", 128, 256)):
        taken = bwd(cell, h, b).stack
        assert taken is not None and taken.pair and taken.groups == b // 64, (cell, h, b)
    for cell, h, b in (("lstm", 128, 128), ("gru", 128, 128)):
        c = bwd(cell, h, b)
        assert c.stack is None and "grouped_stack_backward_pays" in c.describe(), (cell, h, b)
        assert bwd(cell, h, b, "stack").stack is not None
    from rnnrt.kernels.choice_backward import grouped_stack_backward_pays
    one_block = stack_bwd.stack_bwd_fit("gru", 256, 128, 4, 256, H100_SXM.props(), pairs=False)
    lstm_one = stack_bwd.stack_bwd_fit("lstm", 256, 128, 4, 256, H100_SXM.props(), pairs=False)
    assert not grouped_stack_backward_pays(one_block) and grouped_stack_backward_pays(lstm_one)


def test_the_untimed_rule_takes_the_stack_in_batch_groups():
    """RNNRT_AUTOTUNE=0 (choice.heuristic): past 64 batches at H >= 256 the stack forward in
    batch groups (as below 64), with the stack backward in groups where they fill the SMs
    (L4 H 256 B 128: 128 of 132); at H 128 the forward heuristic keeps its per-layer kernels;
    where the groups do not fit (H 256 B 256: 256 blocks) the paper rung."""
    from rnnrt.kernels import choice as C
    from rnnrt.kernels.selector import Shape
    for cell in ("lstm", "gru"):
        taken = C.heuristic(Shape(cell, 4, 256, 256, 128, 100, train=True), H100_SXM)
        assert taken.family == "stack" and taken.backward == "persistent", (cell, taken)
        assert C.heuristic(Shape(cell, 4, 256, 256, 256, 100), H100_SXM).family != "stack"
        assert C.heuristic(Shape(cell, 4, 128, 128, 256, 100), H100_SXM).family != "stack"
