"""The GRU stack backward (gru_persistent_stack_bwd and its cluster-pair form
gru_persistent_stack_bwd_pair: every layer's backward chain of a GRU stack in one launch, the
LSTM kernels' tiles with K = 4H product rows dr, dz, dn, dhn) without a GPU: the .cu on CPU
threads (tests/kernels/persistent_host_sim.cpp, PK_SIM_STACK_BWD with 'gru'; the pair source
in clusters of 2) and the NumPy twins, each against the float64 reference on random data with
poisoned outputs: dx, dh0 and every weight and bias gradient from the kernel's dgx and dgh
(the GEMMs the plan runs after the launch, here in float64); twice on one sync buffer; the
same sources with their waits removed, or with dhn's W rows not skipped (one-block) or not
zeroed (pair), caught; the fit. The plans that run them: test_kernels_stack.py."""
from __future__ import annotations

import subprocess

import numpy as np
import pytest

from rnnrt import reference
from rnnrt.check import FP32_ATOL, FP32_RTOL, assert_close, compare
from rnnrt.kernels import stack_bwd as SB
from rnnrt.kernels.limits import H100_SXM
from rnnrt.kernels.sources import source
from testkit import SIM_ENV, build_host_sim

f32, f64 = np.float32, np.float64
KERNEL = "persistent_stack_bwd.cu"
PAIR_KERNEL = "persistent_stack_bwd_pair.cu"


def _build(tmp_path_factory, text, name, file=KERNEL):
    d = tmp_path_factory.mktemp(name)
    src = d / file
    src.write_text(text)
    return build_host_sim(d / "sim", src, define="PK_SIM_STACK_BWD")


@pytest.fixture(scope="module", params=[False, True], ids=["single", "pair"])
def sim(request, tmp_path_factory):
    """(the host simulation of the one-block kernel or of the cluster-pair kernel, pair)."""
    file = PAIR_KERNEL if request.param else KERNEL
    return _build(tmp_path_factory, source(file), f"gru_stack_bwd_sim_{request.param}",
                  file), request.param


def make_case(B, H, T, L, seed=0):
    """Random fp32 weights, inputs and output gradients; the forward's act (r, z, n, hn) and
    h from the float64 reference, rounded to fp32 as the stack kernel would have stored them
    (the reference's backward runs on the stored values). -> (case, params, cache)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T, B, H)).astype(f32)
    W = (rng.standard_normal((L, 3 * H, H)) / np.sqrt(H)).astype(f32)
    R = (rng.standard_normal((L, 3 * H, H)) / np.sqrt(H)).astype(f32)
    bw = (0.1 * rng.standard_normal((L, 3 * H))).astype(f32)
    br = (0.1 * rng.standard_normal((L, 3 * H))).astype(f32)
    h0 = (0.5 * rng.standard_normal((L, B, H))).astype(f32)
    dy = rng.standard_normal((T, B, H)).astype(f32)
    dhn = rng.standard_normal((L, B, H)).astype(f32)
    p = [{"weight_ih": W[n].astype(f64), "weight_hh": R[n].astype(f64),
          "bias_ih": bw[n].astype(f64), "bias_hh": br[n].astype(f64)} for n in range(L)]
    _, _, _, cache = reference.forward("gru", p, x.astype(f64), h0.astype(f64), None)
    act = np.stack([lc.gates for lc in cache.layers]).astype(f32)     # [L, T, B, 4H]
    h = np.stack([lc.h for lc in cache.layers]).astype(f32)           # [L, T+1, B, H]
    for n, lc in enumerate(cache.layers):
        lc.gates[...] = act[n]
        lc.h[...] = h[n]
    return dict(W=W, R=R, dy=dy, dhn=dhn, act=act, h=h), p, cache


def check_against_reference(got, case, p, cache, what):
    """dx, dh0 against reference.backward; dW = dgx^T x_l, dR = dgh^T h_prev, the biases their
    sums (float64, the operands as stored) against the reference's parameter gradients."""
    g = reference.backward("gru", p, cache, case["dy"].astype(f64), case["dhn"].astype(f64))
    for name in ("dx", "dh0"):
        assert_close(got[name], g[name], FP32_ATOL, FP32_RTOL, name=f"{what} {name}")
    L, T, B, G = got["dgx"].shape
    for n, lc in enumerate(cache.layers):
        dx_side = got["dgx"][n].astype(f64).reshape(T * B, G)
        dh_side = got["dgh"][n].astype(f64).reshape(T * B, G)
        derived = {"weight_ih": dx_side.T @ lc.x.reshape(T * B, -1),
                   "weight_hh": dh_side.T @ lc.h[:-1].reshape(T * B, -1),
                   "bias_ih": dx_side.sum(0), "bias_hh": dh_side.sum(0)}
        for name, v in derived.items():
            assert_close(v, g["params"][n][name], FP32_ATOL, FP32_RTOL,
                         name=f"{what} layer {n} {name}")


def run_sim(exe, tmp_path, case, launches=2, pair=False):
    """The sim on ``case`` (``pair``: built from the cluster-pair source) -> {dgx, dgh [L, T,
    B, 3H], dx [T, B, H], dh0 [L, B, H]}."""
    L, T, B, K = case["act"].shape
    H = K // 4
    ldw = 3 * H * H + 64   # a layer's stride in the flat parameters (as the plan's)
    wih, whh = np.zeros((L, ldw), f32), np.zeros((L, ldw), f32)
    wih[:, :3 * H * H], whh[:, :3 * H * H] = case["W"].reshape(L, -1), case["R"].reshape(L, -1)
    dhin = np.full((L, T, B, H), np.nan, f32)
    dhin[L - 1] = case["dy"]
    files = dict(dhin=dhin, dhn=case["dhn"], dcn=np.full((L, B, H), np.nan, f32),
                 act=case["act"], c=case["h"], wih=wih, whh=whh)
    for n, a in files.items():
        np.ascontiguousarray(a).tofile(tmp_path / f"{n}.f32")
    smem = SB.stack_bwd_pair_smem_bytes(H) if pair else SB.stack_bwd_smem_bytes(H)
    r = subprocess.run([str(a) for a in (exe, B, H, T, L, SB.SB_U, smem, launches, tmp_path,
                                         ldw, "gru")],
                       capture_output=True, text=True, timeout=600, env=SIM_ENV)
    assert r.returncode == 0, r.stderr[-2000:]

    def out(name, shape):
        return np.fromfile(tmp_path / f"{name}.out", f32).reshape(shape)
    return {"dgx": out("dgx", (L, T, B, 3 * H)), "dgh": out("dgh", (L, T, B, 3 * H)),
            "dx": out("dx", (T, B, H)), "dh0": out("dh0", (L, B, H))}


def run_twin(case, pair=False):
    """The registry's NumPy twin (``pair``: the cluster-pair kernel's) on ``case`` (fp32,
    poisoned outputs); run_sim's dict."""
    L, T, B, K = case["act"].shape
    H = K // 4
    outs = [np.full(s, np.nan, f32) for s in ((L * T * B, 3 * H), (L * T * B, 3 * H),
                                              (L * T * B, H), (T * B, H), (L * B, H))]
    outs[2].reshape(L, T, B, H)[L - 1] = case["dy"]
    groups = 1 if B <= SB.SB_BMAX else B // SB.SB_BMAX   # (whole batch groups past 64)
    sync = np.zeros((groups, 2 * L), np.uint32)
    dgt = np.full((groups * 8 * L * H, SB.SB_BMAX), np.nan, f32)
    dgx, dgh, dhin, dx, dh0 = outs
    args = (B, H, (dgx, dgh, dhin, dx, dh0, sync, dgt),
            (case["dhn"].reshape(L * B, H), case["act"].reshape(-1, K),
             case["h"].reshape(-1, H), case["W"].reshape(L, -1), case["R"].reshape(L, -1)),
            T, L, SB.SB_U)
    twin = SB.gru_persistent_stack_bwd_pair if pair else SB.gru_persistent_stack_bwd
    twin(*args, groups)
    return {"dgx": dgx.reshape(L, T, B, 3 * H), "dgh": dgh.reshape(L, T, B, 3 * H),
            "dx": dx.reshape(T, B, H), "dh0": dh0.reshape(L, B, H)}


# (B, H, T, L): tile edges, B < 8 (the pair kernel's 32-batch path), B > 32 (its 64-batch
# path); H 64 and 192: whole pairs, dhn's rows a tile apart; B 128: two whole batch groups
SHAPES = [(5, 64, 4, 3), (37, 192, 3, 2), (128, 64, 3, 2)]


@pytest.mark.parametrize("shape", SHAPES, ids=[f"B{b}H{h}T{t}L{ll}" for b, h, t, ll in SHAPES])
def test_gru_stack_backward_on_cpu_threads_matches_reference(sim, tmp_path, shape):
    exe, pair = sim
    case, p, cache = make_case(*shape, seed=sum(shape))
    got = run_sim(exe, tmp_path, case, pair=pair)
    check_against_reference(got, case, p, cache, f"sim {shape} pair {pair}")
    twin = run_twin(case, pair)   # the twin sums as the kernel does: close to it
    for name in ("dx", "dh0", "dgx", "dgh"):
        assert_close(got[name], twin[name], 1e-6, 1e-5, name=f"sim vs twin {name}")


@pytest.mark.parametrize("pair", [False, True], ids=["single", "pair"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"B{b}H{h}T{t}L{ll}" for b, h, t, ll in SHAPES])
def test_gru_stack_backward_twin_matches_reference(shape, pair):
    case, p, cache = make_case(*shape, seed=1)
    check_against_reference(run_twin(case, pair), case, p, cache, f"twin {shape} pair {pair}")


@pytest.mark.parametrize("pair", [False, True], ids=["single", "pair"])
def test_gru_stack_backward_without_its_waits_is_caught(tmp_path_factory, tmp_path, pair):
    """The waits on the layer above's dg W and on the layer's own dg gone: a layer reads
    dh_above before it is written (NaN poison), its product dg before it is published."""
    import re
    file = PAIR_KERNEL if pair else KERNEL
    cut = re.sub(r"ps_wait\((above|dg_done), done\);", "(void)done;", source(file))
    assert cut.count("(void)done;") == 3   # the two pointwise forms' and the product's
    exe = _build(tmp_path_factory, cut, f"gru_stack_bwd_no_waits_{pair}", file)
    case, p, cache = make_case(16, 64, 4, 3, seed=2)
    got = run_sim(exe, tmp_path, case, launches=1, pair=pair)
    g = reference.backward("gru", p, cache, case["dy"].astype(f64), case["dhn"].astype(f64))
    assert not compare(got["dx"], g["dx"], FP32_ATOL, FP32_RTOL).ok


def test_gru_stack_backward_that_multiplies_dhn_by_w_is_caught(tmp_path_factory, tmp_path):
    """dhn's product rows have no W (dhn does not reach the input): a kernel whose W lanes
    multiply there anyway (what the stages hold of earlier tiles: no copy is made) is
    refused."""
    text = source(KERNEL)
    cut = text.replace("            if (!GRU || !lr || n < NW)   // (GRU: no W rows for dhn's "
                       "tiles)", "            if (true)")
    assert cut.count("if (true)") == 1
    exe = _build(tmp_path_factory, cut, "gru_stack_bwd_dhn_w")
    case, p, cache = make_case(16, 64, 3, 2, seed=3)
    got = run_sim(exe, tmp_path, case, launches=1)
    g = reference.backward("gru", p, cache, case["dy"].astype(f64), case["dhn"].astype(f64))
    assert not compare(got["dx"], g["dx"], FP32_ATOL, FP32_RTOL).ok


def test_pair_kernel_that_does_not_zero_dhns_w_part_is_caught(tmp_path_factory, tmp_path):
    """The pair kernel's block 1 stores zeros as the W part of dhn's tiles (dhn does not reach
    the input); a kernel that leaves the stage's W part as it is there (an earlier tile's W
    rows) is refused."""
    text = source(PAIR_KERNEL)
    old = ("*reinterpret_cast<float4*>(s + dst_w + i * 4 * SP_PU) =\n"
           "                        make_float4(0.f, 0.f, 0.f, 0.f);")
    assert text.count(old) == 1
    exe = _build(tmp_path_factory, text.replace(old, "(void)i;"), "gru_pair_dhn_w", PAIR_KERNEL)
    case, p, cache = make_case(16, 64, 3, 2, seed=3)
    got = run_sim(exe, tmp_path, case, launches=1, pair=True)
    g = reference.backward("gru", p, cache, case["dy"].astype(f64), case["dhn"].astype(f64))
    assert not compare(got["dx"], g["dx"], FP32_ATOL, FP32_RTOL).ok


def test_gru_pair_kernel_has_no_data_race(tmp_path_factory, tmp_path):
    """ThreadSanitizer over the GRU pair kernel on CPU threads (T 3: a dg^T slot written again
    after the other blocks' reads; the zeros its block 1 stores as dhn's W part beside the
    cp.async copies): no report, the reference gradients. (The waits are the LSTM kernels'
    code: test_kernels_stack_bwd.py shows the checker reports them removed.)"""
    d = tmp_path_factory.mktemp("gru_pair_tsan")
    src = d / PAIR_KERNEL
    src.write_text(source(PAIR_KERNEL))
    exe = build_host_sim(d / "sim", src, tsan=True, define="PK_SIM_STACK_BWD")
    case, p, cache = make_case(3, 64, 3, 2, seed=5)
    check_against_reference(run_sim(exe, tmp_path, case, launches=1, pair=True), case, p, cache,
                            "gru pair under TSan")


def test_fit_takes_gru_in_cluster_pairs_as_lstm():
    props = H100_SXM.props()
    fit = SB.stack_bwd_fit("gru", 512, 64, 4, 512, props)
    assert fit.ok and fit.pair and fit.kernel == SB.STACK_BWD_GRU_PAIR_KERNEL, fit.reason
    one = SB.stack_bwd_fit("gru", 512, 64, 4, 512, props, pairs=False)
    assert one.ok and not one.pair and one.kernel == SB.STACK_BWD_GRU_KERNEL
    sm80 = dict(props, major=8)   # no clusters: the one-block kernel, saying why
    old = SB.stack_bwd_fit("gru", 512, 64, 4, 512, sm80)
    assert old.ok and not old.pair and "cluster pairs decline" in old.reason, old.reason
    assert SB.stack_bwd_fit("lstm", 512, 64, 4, 512, props).pair   # LSTM's pairs as before
    bad = SB.stack_bwd_fit("rnn_tanh", 512, 64, 4, 512, props)
    assert not bad.ok and "built for LSTM and GRU only" in bad.reason
