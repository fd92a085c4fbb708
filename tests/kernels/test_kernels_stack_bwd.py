"""The stack backward (lstm_persistent_stack_bwd: every layer's backward chain of an LSTM stack
in one launch) without a GPU: the .cu on CPU threads (tests/kernels/persistent_host_sim.cpp,
PK_SIM_STACK_BWD) and the NumPy twin, each against the float64 reference (rnnrt.reference) on
random data with poisoned outputs: dx, dh0, dc0, and every weight and bias gradient from the
kernel's dg (the GEMMs the plan runs after the launch, here in float64); the sim twice on one
sync buffer; under ThreadSanitizer no data race, and the same source with its waits removed
reported; the constants and the fit's rules."""
from __future__ import annotations

import re
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


KERNELS = {False: "persistent_stack_bwd.cu", True: "persistent_stack_bwd_pair.cu"}


def _build(tmp_path_factory, src_text, name, tsan=False):
    d = tmp_path_factory.mktemp(name)
    src = d / "stack_bwd.cu"
    src.write_text(src_text)   # the sim's spin limit is persistent_host_sim.cpp's
    return build_host_sim(d / "sim", src, tsan=tsan, define="PK_SIM_STACK_BWD")


@pytest.fixture(scope="module", params=[False, True], ids=["single", "pair"])
def sim(request, tmp_path_factory):
    """(the host simulation of the one-block kernel or of the cluster-pair kernel, pair)."""
    pair = request.param
    return _build(tmp_path_factory, source(KERNELS[pair]), f"stack_bwd_sim_{pair}"), pair


def without_waits(text):
    """The source with its two waits on other blocks gone: for the layer above's dg W and
    for the layer's own dg."""
    cut = re.sub(r"ps_wait\((above|dg_done), done\);", "(void)done;", text)
    assert cut.count("(void)done;") == 3   # the two pointwise forms' and the product's
    return cut


def make_case(B, H, T, L, seed=0, dtype="float32"):
    """Random fp32 weights, inputs and output gradients; the forward (act, c) from the float64
    reference at precision ``dtype`` (its rounding points: the h the dW GEMMs read), rounded
    to fp32 as the stack kernel would have stored them. -> (case dict of fp32 arrays, params
    in float64, the reference's cache)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T, B, H)).astype(f32)
    W = (rng.standard_normal((L, 4 * H, H)) / np.sqrt(H)).astype(f32)
    R = (rng.standard_normal((L, 4 * H, H)) / np.sqrt(H)).astype(f32)
    bw = (0.1 * rng.standard_normal((L, 4 * H))).astype(f32)
    br = (0.1 * rng.standard_normal((L, 4 * H))).astype(f32)
    h0 = (0.5 * rng.standard_normal((L, B, H))).astype(f32)
    c0 = (0.5 * rng.standard_normal((L, B, H))).astype(f32)
    dy = rng.standard_normal((T, B, H)).astype(f32)
    dhn = rng.standard_normal((L, B, H)).astype(f32)
    dcn = rng.standard_normal((L, B, H)).astype(f32)
    p = [{"weight_ih": W[n].astype(f64), "weight_hh": R[n].astype(f64),
          "bias_ih": bw[n].astype(f64), "bias_hh": br[n].astype(f64)} for n in range(L)]
    _, _, _, cache = reference.forward("lstm", p, x.astype(f64), h0.astype(f64),
                                       c0.astype(f64), dtype=dtype)
    act = np.stack([lc.gates for lc in cache.layers]).astype(f32)     # [L, T, B, 4H]
    c = np.stack([lc.c for lc in cache.layers]).astype(f32)           # [L, T+1, B, H]
    # the kernel reads these as stored: the reference's backward runs on them too
    for n, lc in enumerate(cache.layers):
        lc.gates[...] = act[n]
        lc.c[...] = c[n]
    case = dict(x=x, W=W, R=R, dy=dy, dhn=dhn, dcn=dcn, act=act, c=c, h0=h0)
    return case, p, cache


def check_against_reference(got, case, p, cache, what, atol=FP32_ATOL, rtol=FP32_RTOL):
    """dx, dh0, dc0 against reference.backward (at the cache's precision); the weight and
    bias gradients from the kernel's dgx [L, T, B, 4H] (dW = dg^T x_l, dR = dg^T h_prev,
    biases = sums, in float64: the operands as stored) against the reference's; within
    atol + rtol * |ref|."""
    g = reference.backward("lstm", p, cache, case["dy"].astype(f64), case["dhn"].astype(f64),
                           case["dcn"].astype(f64))
    for name in ("dx", "dh0", "dc0"):
        assert_close(got[name], g[name], atol, rtol, name=f"{what} {name}")
    dgx = got["dgx"].astype(f64)
    L, T, B, K = dgx.shape
    for n, lc in enumerate(cache.layers):
        d = dgx[n].reshape(T * B, K)
        derived = {"weight_ih": d.T @ lc.x.reshape(T * B, -1),
                   "weight_hh": d.T @ lc.h[:-1].reshape(T * B, -1),
                   "bias_ih": d.sum(0), "bias_hh": d.sum(0)}
        for name, v in derived.items():
            assert_close(v, g["params"][n][name], atol, rtol, name=f"{what} layer {n} {name}")


def run_sim(exe, tmp_path, case, launches=2, pair=False, bulk=False, smem=None, extra=()):
    """The sim on ``case``; -> {dgx [L, T, B, 4H], dx [T, B, H], dh0, dc0 [L, B, H], dhin}.
    A failed run (or a ThreadSanitizer report) fails with its stderr's end. ``smem``: the
    bytes to launch with (default: the fp32 kernel's), ``extra``: arguments after LDW (the
    tensor-core kernel's storage type)."""
    L, T, B, K = case["act"].shape
    H = K // 4
    ldw = 4 * H * H + 64   # a layer's stride in the flat parameters (as the plan's)
    wih, whh = np.zeros((L, ldw), f32), np.zeros((L, ldw), f32)
    wih[:, :4 * H * H], whh[:, :4 * H * H] = case["W"].reshape(L, -1), case["R"].reshape(L, -1)
    dhin = np.full((L, T, B, H), np.nan, f32)
    dhin[L - 1] = case["dy"]
    files = dict(dhin=dhin, dhn=case["dhn"], dcn=case["dcn"], act=case["act"], c=case["c"],
                 wih=wih, whh=whh)
    for n, a in files.items():
        np.ascontiguousarray(a).tofile(tmp_path / f"{n}.f32")
    if smem is None:
        smem = SB.stack_bwd_pair_smem_bytes(H, bulk=bulk) if pair else SB.stack_bwd_smem_bytes(H)
    r = subprocess.run([str(a) for a in (exe, B, H, T, L, SB.SB_U, smem, launches, tmp_path,
                                         ldw) + tuple(extra)],
                       capture_output=True, text=True, timeout=600, env=SIM_ENV)
    assert r.returncode == 0 and "ThreadSanitizer" not in r.stderr, r.stderr[-2000:]

    def out(name, shape):
        return np.fromfile(tmp_path / f"{name}.out", f32).reshape(shape)
    return {"dgx": out("dgx", (L, T, B, K)), "dx": out("dx", (T, B, H)),
            "dh0": out("dh0", (L, B, H)), "dc0": out("dc0", (L, B, H)),
            "dhin": out("dhin", (L, T, B, H))}


def run_twin(case, pair=False):
    """The registry's NumPy twin of the kernel (``pair``: the cluster-pair one) on ``case``
    (fp32, poisoned outputs); the same dict."""
    L, T, B, K = case["act"].shape
    H = K // 4
    outs = [np.full(s, np.nan, f32) for s in ((L * T * B, K), (L * T * B, H), (T * B, H),
                                              (L * B, H), (L * B, H))]
    outs[1].reshape(L, T, B, H)[L - 1] = case["dy"]
    groups = 1 if B <= SB.SB_BMAX else B // SB.SB_BMAX   # (whole batch groups past 64)
    sync = np.zeros((groups, 2 * L), np.uint32)
    dgt = np.full((groups * 8 * L * H, SB.SB_BMAX), np.nan, f32)
    ins = [case["dhn"].reshape(L * B, H), case["dcn"].reshape(L * B, H),
           case["act"].reshape(L * T * B, K), case["c"].reshape(L * (T + 1) * B, H),
           case["W"].reshape(L, -1), case["R"].reshape(L, -1)]
    twin = SB.lstm_persistent_stack_bwd_pair if pair else SB.lstm_persistent_stack_bwd
    twin(B, H, outs + [sync, dgt], ins, T, L, SB.SB_U, groups)
    dgx, dhin, dx, dh0, dc0 = outs
    # the scratch as the kernel leaves it: dg^T of steps 0 and 1 in slots 0 and 1 of each
    # batch group's block
    dgts = dgt.reshape(groups, L, 2, K, SB.SB_BMAX)
    for g, t in ((g, t) for g in range(groups) for t in range(min(T, 2))):
        bs = slice(g * SB.SB_BMAX, min(B, (g + 1) * SB.SB_BMAX))
        assert np.array_equal(dgts[g, :, t, :, :bs.stop - bs.start],
                              dgx.reshape(L, T, B, K)[:, t, bs].transpose(0, 2, 1))
    return {"dgx": dgx.reshape(L, T, B, K), "dx": dx.reshape(T, B, H),
            "dh0": dh0.reshape(L, B, H), "dc0": dc0.reshape(L, B, H),
            "dhin": dhin.reshape(L, T, B, H)}


# (B, H, T, L): an odd batch past 32 (both lane halves of the batches, a part-filled float4),
# a middle layer, both dg^T slots reused; B 17: the pair kernel's 32-batch path; B 128: two
# whole batch groups side by side (a row of counters and a block of dgt each); the
# ThreadSanitizer test runs B 3, T 3, L 2
SHAPES = [(37, 64, 4, 3), (17, 64, 3, 2), (128, 64, 3, 2)]


@pytest.mark.parametrize("shape", SHAPES, ids=[f"B{b}H{h}T{t}L{ll}" for b, h, t, ll in SHAPES])
def test_stack_bwd_kernel_on_cpu_threads_matches_reference(sim, tmp_path, shape):
    exe, pair = sim
    case, p, cache = make_case(*shape)
    got = run_sim(exe, tmp_path, case, pair=pair)
    check_against_reference(got, case, p, cache, f"sim {shape} pair {pair}")
    # the twin sums as the kernel does, up to FMA contraction within a k-group
    twin = run_twin(case, pair)
    for name in ("dgx", "dx", "dh0", "dc0", "dhin"):
        r = compare(got[name], twin[name], 1e-5, 1e-4)
        assert r.ok, f"sim vs twin {name}: {r}"


def test_stack_bwd_groups_on_one_row_of_counters_are_caught(tmp_path_factory, tmp_path):
    """Each batch group counts on its own row: a kernel whose groups share row 0 lets a
    block take the other group's progress for its own and read dg^T before it is written
    (NaN poison): the comparison must fail. To show it whatever the host's scheduling (the
    race is otherwise left to how the host runs the threads, as the forward's test once
    found), group 1's first block of the top layer starts its step 0 only after every other
    block of both groups published its dg_0 on row 0 (2 NB - 1): group 1's other blocks have
    then passed their wait for dg_0 on group 0's count and read this block's rows unwritten.
    (In the right kernel that wait would never end: group 1's row reaches NB - 1.)"""
    text = source(KERNELS[False])
    old = "sync + grp * ldsync + 2 * l;"
    assert text.count(old) == 1
    top = "const unsigned int done = (unsigned int)(s + 1) * NB;   // counts after step t"
    assert text.count(top) == 1
    lag = ("if (grp == 1 && l == L - 1 && j0 == 0 && s == 0) {"
           " if (tid == 0) ps_wait(dg_done, 2u * NB - 1); __syncthreads(); }")
    text = text.replace(old, "sync + 2 * l;").replace(top, top + "\n" + lag)
    exe = _build(tmp_path_factory, text, "single_one_row_lagged")
    case, p, cache = make_case(128, 64, 3, 2, seed=7)
    got = run_sim(exe, tmp_path, case, launches=1)
    assert not compare(got["dx"], run_twin(case)["dx"], 1e-5, 1e-4).ok


def test_pair_kernel_with_bulk_copies_on_cpu_threads(tmp_path_factory, tmp_path):
    """SP_BULK 1 (each warp's dg^T rows of a tile by one bulk copy, its barrier's waits
    no-ops on the host, the copy's alignment checked): the reference gradients (the copy
    changes no sum: the twin's order, as the cp.async build's)."""
    case, p, cache = make_case(37, 64, 4, 3)
    exe = _build(tmp_path_factory, "#define SP_BULK 1\n" + source(KERNELS[True]), "bulk")
    got = run_sim(exe, tmp_path, case, pair=True, bulk=True)
    check_against_reference(got, case, p, cache, "sim pair SP_BULK 1")
    twin = run_twin(case, True)
    for name in ("dgx", "dx", "dh0", "dc0"):
        r = compare(got[name], twin[name], 1e-5, 1e-4)
        assert r.ok, f"sim SP_BULK 1 vs twin {name}: {r}"


@pytest.mark.parametrize("pair", [False, True], ids=["single", "pair"])
def test_stack_bwd_twin_matches_reference(pair):
    case, p, cache = make_case(16, 64, 5, 3, seed=4)
    check_against_reference(run_twin(case, pair), case, p, cache, f"twin pair {pair}")


def test_pair_product_sums_in_the_kernels_order():
    """The pair twin's sum: each block's half of the k rows; for B > 32 warp by warp as the
    kernel's copies take them (8 whole rows of each 64-row tile), for B <= 32 half-warp by
    half-warp (alternate rows) in the kernel's four passes; the halves added last: planted
    magnitudes show the order (a row out of place, or the halves swapped into the sum of one
    block, changes the rounding)."""
    rng = np.random.default_rng(3)
    H = 64
    half = 2 * H
    M = rng.standard_normal((4 * H, H)).astype(f32)
    for B in (40, 5):
        dg = rng.standard_normal((B, 4 * H)).astype(f32)
        got = SB.pair_product(dg, M)
        assert_close(got, dg.astype(f64) @ M.astype(f64), 1e-5, 1e-5, name=f"pair product {B}")
        if B > 32:
            rows = [[c * half + n + 8 * w + kk for n in range(0, half, 64) for kk in range(8)]
                    for c in range(2) for w in range(8)]
            assert sorted(sum(rows, [])) == list(range(4 * H))   # every k row exactly once
            a = [dg[:, r] @ M[r] for r in rows]
            s = [((a[8 * c] + a[8 * c + 4]) + (a[8 * c + 1] + a[8 * c + 5]) + (a[8 * c + 2]
                  + a[8 * c + 6])) + (a[8 * c + 3] + a[8 * c + 7]) for c in range(2)]
        else:
            rows = [[c * half + n + 8 * w + kk for n in range(0, half, 64)
                     for kk in range(h, 8, 2)] for c in range(2) for w in range(8)
                    for h in range(2)]
            assert sorted(sum(rows, [])) == list(range(4 * H))
            a = [dg[:, r] @ M[r] for r in rows]   # a[16c + 2w + h]

            def q(c, m):
                x = lambda w, h: a[16 * c + 2 * w + h]   # noqa: E731
                return x(m, 0) + (x(m, 1) + (x(m + 4, 0) + x(m + 4, 1)))
            s = [((q(c, 0) + q(c, 1)) + q(c, 2)) + q(c, 3) for c in range(2)]
        np.testing.assert_array_equal(got, s[0] + s[1])


def test_constants_match_the_kernel():
    pair = source("persistent_stack_bwd_pair.cu")
    for name in ("SP_PU", "SP_KT", "SP_NS"):
        m = re.search(rf"#define {name} (\d+)", pair)
        assert m and int(m[1]) == getattr(SB, name), name
    assert ("const long long need = 4LL * ((long long)KH * SP_PU + SP_NS * SP_STAGE + SP_RECV"
            " + SP_BARS);") \
        in pair
    assert "#define SP_STAGE (SP_XOFF + SP_KT * SB_BMAX)" in pair and SB.SP_STAGE == 6144
    assert "#define SP_RECV (SB_BMAX * SP_PU)" in pair and SB.SP_RECV == 2048
    assert "#define SP_BARS (SP_BULK ? 2 * SP_NS * SP_KG : 0)" in pair
    assert SB.stack_bwd_pair_smem_bytes(512, bulk=True) == 212992 + 8 * SB.SP_NS * SB.SB_KG
    assert "__cluster_dims__(2, 1, 1)" in pair
    text = source("persistent_stack_bwd.cu")
    for name in ("SB_U", "SB_BMAX", "SB_KT", "SB_NS"):
        m = re.search(rf"#define {name} (\d+)", text)
        assert m and int(m[1]) == getattr(SB, name), name
    assert "#define SB_M (2 * SB_U)" in text and SB.SB_M == 2 * SB.SB_U
    # the shared memory the kernel checks for is the fit's
    assert "const long long need = 4LL * ((long long)K * U + SB_NS * SB_STAGE);" in text
    assert "#define SB_STAGE ((SB_XOFF + SB_KT * SB_BMAX + 15) / 16 * 16)" in text
    assert "#define SB_XOFF (SB_WOFF + SB_KT * SB_U)" in text
    assert f"#define SB_WOFF {SB.SB_WOFF} " in text and SB.SB_STAGE == 5136


def test_fit_rules_name_what_is_wrong():
    p = H100_SXM.props()
    ok = SB.stack_bwd_fit("lstm", 512, 64, 4, 512, p)   # the pairs on the H100: 64 of 64
    assert ok.ok and ok.pair and ok.blocks == 128 and ok.kernel == SB.STACK_BWD_PAIR_KERNEL
    assert ok.grid == (128, 1, 1) and ok.block == (256, 1, 1)
    assert ok.smem_bytes == SB.stack_bwd_pair_smem_bytes(512) == 212992
    assert "cluster pairs" in ok.reason
    one = SB.stack_bwd_fit("lstm", 512, 64, 4, 512, p, pairs=False)
    assert one.ok and not one.pair and one.kernel == SB.STACK_BWD_KERNEL
    assert one.smem_bytes == SB.stack_bwd_smem_bytes(512) == 192704
    # where the pairs decline, the one-block kernel runs, saying why
    for props, args, why in [(dict(p, major=8), (512, 64, 4),
                              r"compute capability 8\.\d+ has no thread-block clusters"),
                             (dict(p, multiProcessorCount=130), (512, 64, 4),
                              r"64 pairs > 63 resident"),
                             (p, (64, 8, 33), r"66 pairs > 64 resident")]:
        H, B, L = args
        f = SB.stack_bwd_fit("lstm", H, B, L, H, props)
        assert f.ok and not f.pair and f.kernel == SB.STACK_BWD_KERNEL, (args, f.reason)
        assert re.search("cluster pairs decline: " + why, f.reason), f.reason
    cases = [(("rnn_tanh", 512, 64, 4, 512), "stack backward is built for LSTM and GRU only"),
             (("lstm", 512, 64, 4, 256), "input size 256 != hidden 512"),
             (("lstm", 512, 65, 4, 512), r"2 batch groups .* > 132 SMs"),
             (("lstm", 256, 65, 4, 256), r"batch over 64 and not a multiple of it"),
             (("lstm", 512, 64, 5, 512), "160 > 132 SMs"),
             (("lstm", 512, 64, 1, 512), "one layer")]
    for args, why in cases:
        f = SB.stack_bwd_fit(*args, p)
        assert not f.ok and re.search(why, f.reason), (args, f.reason)
        assert "DOES NOT FIT" in f.describe()
    # whole batch groups, the group count a scalar of both kernels: at H 256 two groups of
    # 32 pairs fit (64 resident); at H 128 four groups of 16; without pairs (asked, or 68
    # pairs at H 272 B 128 L 4 over 64) the one-block kernel
    two = SB.stack_bwd_fit("lstm", 256, 128, 4, 256, p)
    assert two.ok and two.pair and two.groups == 2 and two.blocks == 128, two.reason
    assert two.kernel == SB.STACK_BWD_PAIR_KERNEL and two.scalars(5)["groups"] == 2
    one = SB.stack_bwd_fit("lstm", 256, 128, 4, 256, p, pairs=False)
    assert one.ok and not one.pair and one.groups == 2 and one.kernel == SB.STACK_BWD_KERNEL
    four = SB.stack_bwd_fit("gru", 128, 256, 4, 128, p)
    assert four.ok and four.pair and four.groups == 4 and four.blocks == 128, four.reason
    assert four.kernel == SB.STACK_BWD_GRU_PAIR_KERNEL and four.scalars(5)["groups"] == 4
    # its own shared memory: a device with less than the forward needs... and the backward
    small = dict(p, sharedMemPerBlockOptin=SB.stack_bwd_smem_bytes(512) - 4,
                 sharedMemPerMultiprocessor=SB.stack_bwd_smem_bytes(512) - 4)
    f = SB.stack_bwd_fit("lstm", 256, 64, 4, 256, small)
    assert f.ok   # H 256 needs less
    f = SB.stack_bwd_fit("lstm", 512, 64, 4, 512, small)
    assert not f.ok and "shared memory" in f.reason


# The pair kernel's (the default): the one-block kernel's waits and publication are the same
# code (persistent_stack_bwd.cuh), its sim test above covers its results (CI time: each
# ThreadSanitizer build and run costs ~30 s)
@pytest.mark.parametrize("pair", [True], ids=["pair"])
def test_stack_bwd_protocol_has_no_data_race(tmp_path_factory, tmp_path, pair):
    """ThreadSanitizer over the stack backward on CPU threads: the dg^T slots' writes and
    the other blocks' staged reads (T 3: slot 1 written again after step 2's reads), dh_above's
    writes and the layer below's reads, are ordered by the progress counters (no report, and
    the reference gradients); with the waits removed (the layer above's dg W read before it
    is written, the layer's dg^T before the other blocks wrote it) it reports a data race
    (the checker is not vacuous)."""
    exe = _build(tmp_path_factory, source(KERNELS[pair]), f"tsan_{pair}", tsan=True)
    case, p, cache = make_case(3, 64, 3, 2, seed=5)
    check_against_reference(run_sim(exe, tmp_path, case, launches=1, pair=pair), case, p, cache,
                            f"tsan pair {pair}")
    broken = _build(tmp_path_factory, without_waits(source(KERNELS[pair])),
                    f"tsan_broken_{pair}", tsan=True)
    with pytest.raises(AssertionError, match="ThreadSanitizer: data race"):
        run_sim(broken, tmp_path, case, launches=1, pair=pair)


def test_pair_kernel_timing_knobs_keep_results_and_order(tmp_path_factory, tmp_path):
    """The pair kernel's SP_WPRE 1 (the first tiles' W parts copied into the stages before
    the wait for dg_t: they alias the pointwise's tile and the last step's partial sums)
    and SP_DXW 1 (the dx count by warp 7) under ThreadSanitizer: no report, the reference
    gradients."""
    knobs = "#define SP_WPRE 1\n#define SP_DXW 1\n"
    exe = _build(tmp_path_factory, knobs + source(KERNELS[True]), "tsan_knobs", tsan=True)
    case, p, cache = make_case(3, 64, 3, 2, seed=6)
    check_against_reference(run_sim(exe, tmp_path, case, launches=1, pair=True), case, p, cache,
                            "tsan pair SP_WPRE SP_DXW")


def test_a_local_header_the_loader_missed_fails_the_build(tmp_path_factory):
    """build_host_sim skips where the toolchain lacks something, but a kernel source whose
    local header was not inlined (an include line the loader's pattern does not take, e.g. with
    a trailing comment) must fail the test, not skip it."""
    text = source(KERNELS[True]).replace(
        "#include <", '#include "persistent_missing.cuh"\n#include <', 1)
    if '"persistent_missing.cuh"' not in text:   # no system include to anchor on: prepend
        text = '#include "persistent_missing.cuh"\n' + text
    try:
        _build(tmp_path_factory, text, "missing_header")
    except AssertionError as e:
        assert "persistent_missing.cuh" in str(e)
        return
    except pytest.skip.Exception:
        pytest.fail("a missing local header skipped the simulator's build instead of failing")
    pytest.fail("the simulator built without its header")
