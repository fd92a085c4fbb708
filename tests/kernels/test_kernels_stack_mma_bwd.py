"""The tensor-core stack backward (lstm_persistent_stack_mma_bwd_t<TS>: every layer's backward
chain of an LSTM stack in one launch, in cluster pairs, the product on tensor cores) without a
GPU: the .cu on CPU threads (tests/kernels/persistent_host_sim.cpp, PK_SIM_STACK_MMA_BWD;
mma.sync emulated over the warp's exchange buffer by the PTX ISA's fragment layout, the
cluster's distributed shared memory and barrier emulated) against the rounding-aware float64
reference (rnnrt.reference at bf16 / fp16: dg stored rounded, W and R rounded) and against the
NumPy twin (the kernel's sum order), on random data with poisoned outputs, twice on one sync
buffer; dx, dh0, dc0 and every weight and bias gradient from the kernel's dgx (the GEMMs the
plan runs after the launch, here in float64). The same source with its waits removed, and
with the pair's halves not exchanged, must be caught; the twin against the reference; the
fit's rules, the constants the host mirrors, nvcc's build (no spills)."""
from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
from test_kernels_stack_bwd import check_against_reference, make_case, run_sim

from rnnrt.check import compare
from rnnrt.kernels import stack_mma_bwd as SMB
from rnnrt.kernels.limits import H100_SXM
from rnnrt.kernels.mma import MMA_DTYPES
from rnnrt.kernels.sources import source
from rnnrt.precision import get_precision, round_to_storage
from testkit import build_host_sim, nvcc_instantiations

f32 = np.float32
TS = {"bfloat16": "bf16", "float16": "fp16"}
KERNEL = "persistent_stack_mma_bwd.cu"


def _build(tmp_path_factory, src_text, name):
    d = tmp_path_factory.mktemp(name)
    src = d / KERNEL
    src.write_text(src_text)
    return build_host_sim(d / "sim", src, define="PK_SIM_STACK_MMA_BWD")


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    return _build(tmp_path_factory, source(KERNEL), "stack_mma_bwd_sim")


def sim_run(exe, tmp_path, case, dtype, launches=1):
    H = case["act"].shape[-1] // 4
    return run_sim(exe, tmp_path, case, launches=launches,
                   smem=SMB.stack_mma_bwd_smem_bytes(H), extra=(TS[dtype],))


def twin_run(case, dtype):
    """The registry's NumPy twin on ``case`` (outputs poisoned); the sim's dict."""
    L, T, B, K = case["act"].shape
    H = K // 4
    outs = [np.full(s, np.nan, f32) for s in ((L * T * B, K), (L * T * B, H), (T * B, H),
                                              (L * B, H), (L * B, H))]
    outs[1].reshape(L, T, B, H)[L - 1] = case["dy"]
    ins = [case["dhn"].reshape(L * B, H), case["dcn"].reshape(L * B, H),
           case["act"].reshape(L * T * B, K), case["c"].reshape(L * (T + 1) * B, H),
           case["W"].reshape(L, -1), case["R"].reshape(L, -1)]
    groups = max(1, B // 64)   # (whole batch groups past 64)
    SMB.lstm_persistent_stack_mma_bwd(B, H, outs + [np.zeros((groups, 2 * L), np.uint32)], ins,
                                      T, L, SMB.SB_U, groups, dtype=dtype)
    dgx, dhin, dx, dh0, dc0 = outs
    return {"dgx": dgx.reshape(L, T, B, K), "dx": dx.reshape(T, B, H),
            "dh0": dh0.reshape(L, B, H), "dc0": dc0.reshape(L, B, H),
            "dhin": dhin.reshape(L, T, B, H)}


def _tol(dtype):
    p = get_precision(dtype)
    return p.atol, p.rtol


def check_sim(got, case, p, cache, dtype, what):
    """Against the rounding-aware reference within the precision's tolerance, and against
    the twin: the same math in another order within a k16 step, so close (dgx: a storage
    value apart where a sum rounds the other way)."""
    check_against_reference(got, case, p, cache, what, *_tol(dtype))
    twin = twin_run(case, dtype)
    ulp = 2.0 ** -7 if dtype == "bfloat16" else 2.0 ** -10
    for name in ("dgx", "dx", "dh0", "dc0", "dhin"):
        r = compare(got[name], twin[name], 1e-3, 2 * ulp, name=f"{what} sim vs twin {name}")
        assert r.ok, str(r)


# (B, H, T, L, dtype): both batch halves (B 37: the second partly live, a part-filled n8
# tile), three layers (a middle one), two launches on one sync buffer; B 5 fp16 (one n8
# tile, the second batch half idle), two layers
# B 128: two whole batch groups side by side
CASES = [(37, 64, 2, 3, "bfloat16", 2), (5, 64, 2, 2, "float16", 1), (128, 64, 2, 2, "bfloat16", 2)]


@pytest.mark.parametrize("B, H, T, L, dtype, launches", CASES,
                         ids=[f"B{c[0]}H{c[1]}T{c[2]}L{c[3]}-{c[4]}" for c in CASES])
def test_stack_mma_bwd_on_cpu_threads_matches_reference_and_twin(sim, tmp_path, B, H, T, L,
                                                                  dtype, launches):
    case, p, cache = make_case(B, H, T, L, seed=B, dtype=dtype)
    got = sim_run(sim, tmp_path, case, dtype, launches)
    check_sim(got, case, p, cache, dtype, f"sim B{B} H{H} T{T} L{L} {dtype}")


def without_waits(text):
    """The kernel's two waits on other blocks gone: for the layer above's dg W and for the
    layer's own dg_t."""
    cut = re.sub(r"ps_wait\((above|dg_done), done\);", "(void)done;", text)
    assert cut.count("(void)done;") == 4   # and sb_pointwise's, sb_pointwise_gru's (unused here)
    return cut


def test_without_its_waits_is_caught(tmp_path_factory, tmp_path):
    """Layer l then reads the layer above's dg W before it is written (NaN poison) and each
    block the layer's dg_t before the other blocks stored it: the result must be refused."""
    exe = _build(tmp_path_factory, without_waits(source(KERNEL)), "stack_mma_bwd_no_waits")
    case, p, cache = make_case(16, 64, 2, 2, seed=3, dtype="bfloat16")
    got = sim_run(exe, tmp_path, case, "bfloat16")
    with pytest.raises(AssertionError):
        check_against_reference(got, case, p, cache, "planted", *_tol("bfloat16"))


def test_a_missing_half_is_caught(tmp_path_factory, tmp_path):
    """The other block's half of the k rows left out (dh_rec = own half only): the R and W
    products miss the g and o gates' (or i and f's) terms, and the result is refused."""
    text = source(KERNEL)
    good = "dhrec[i] = vr + o[0];"
    assert text.count(good) == 1
    exe = _build(tmp_path_factory, text.replace(good, "dhrec[i] = vr;"), "stack_mma_bwd_half")
    case, p, cache = make_case(8, 64, 2, 2, seed=5, dtype="bfloat16")
    got = sim_run(exe, tmp_path, case, "bfloat16")
    with pytest.raises(AssertionError):
        check_against_reference(got, case, p, cache, "planted", *_tol("bfloat16"))


@pytest.mark.parametrize("dtype", MMA_DTYPES)
def test_twin_matches_reference(dtype):
    """The registry's NumPy twin (the CPU executors' kernel) against the reference; fp32
    refused (the fp32 stack backward runs those keys)."""
    case, p, cache = make_case(9, 64, 4, 3, seed=4, dtype=dtype)
    got = twin_run(case, dtype)
    check_against_reference(got, case, p, cache, f"twin {dtype}", *_tol(dtype))
    # dg as stored: representable in the storage type
    np.testing.assert_array_equal(round_to_storage(got["dgx"], dtype), got["dgx"])
    with pytest.raises(ValueError, match="bfloat16 / float16 only"):
        twin_run(case, "float32")


def test_pair_product_sums_in_the_kernels_order():
    """Block c's k rows [2Hc, 2Hc + 2H), k-group kg the rows with (k % 64) // 16 == kg (every
    k row exactly once), (p0 + p2) + (p1 + p3), then the halves: planted magnitudes show the
    order (a k-group out of place changes the rounding)."""
    rng = np.random.default_rng(3)
    H, B = 64, 12
    groups = SMB.k_group_rows(4 * H)
    assert sorted(np.concatenate([r for g in groups for r in g]).tolist()) == \
        list(range(4 * H))
    assert all(((r // 16) % 4 == kg).all() and (r // (2 * H) == c).all()
               for c, g in enumerate(groups) for kg, r in enumerate(g))
    dg = rng.standard_normal((B, 4 * H)).astype(f32)
    M = rng.standard_normal((4 * H, H)).astype(f32)
    scale = np.ones(4 * H, f32)
    scale[(np.arange(4 * H) // 16) % 4 == 2] = 1e7   # k-group 2 dominates
    dg = dg * scale
    got = SMB.mma_pair_product(dg, M, groups)
    s = []
    for rows in groups:
        p = [dg[:, r] @ M[r] for r in rows]
        s.append((p[0] + p[2]) + (p[1] + p[3]))
    np.testing.assert_array_equal(got, s[0] + s[1])
    other = [(dg[:, g[0]] @ M[g[0]] + dg[:, g[1]] @ M[g[1]]) + (dg[:, g[2]] @ M[g[2]]
             + dg[:, g[3]] @ M[g[3]]) for g in groups]
    assert not np.array_equal(got, other[0] + other[1])   # the order shows


def test_constants_match_the_kernel():
    text = source(KERNEL)
    for name in ("SMB_PU", "SMB_NS"):
        m = re.search(rf"#define {name} (\d+)", text)
        assert m and int(m[1]) == getattr(SMB, name), name
    assert "#define SMB_M (2 * SMB_PU)" in text and SMB.SMB_M == 64
    assert "#define SMB_RECV (PSM_BMAX * SMB_PU)" in text
    assert "const long long need = 2LL * SMB_M * SA + SMB_BUF_BYTES + 4LL * SMB_RECV;" in text
    assert "__cluster_dims__(2, 1, 1)" in text
    assert SMB.stack_mma_bwd_smem_bytes(512) == 192512
    assert SMB.stack_mma_bwd_smem_bytes(640) == 225280


def test_fit_rules_name_what_is_wrong():
    p = H100_SXM.props()
    ok = SMB.stack_mma_bwd_fit("lstm", 512, 64, 4, 512, p, "bfloat16", steps=100)
    assert ok.ok and ok.pair and ok.blocks == 128 and ok.kernel == SMB.STACK_MMA_BWD_KERNEL
    assert ok.grid == (128, 1, 1) and ok.block == (256, 1, 1) and not ok.dg_scratch
    assert ok.smem_bytes == SMB.stack_mma_bwd_smem_bytes(512)
    assert "tensor-core stack backward" in ok.describe() and "64 cluster pairs" in ok.reason
    assert SMB.stack_mma_bwd_fit("lstm", 640, 32, 2, 640, p, "float16").ok
    sm80 = dataclasses.replace(H100_SXM, cc_major=8).props()
    cases = [(("gru", 512, 64, 4, 512, p, "bfloat16"), "LSTM only"),
             (("lstm", 512, 64, 4, 512, p, "float32"), "bfloat16 and float16"),
             (("lstm", 512, 64, 4, 512, p, "tf32"), "bfloat16 and float16"),
             (("lstm", 512, 64, 4, 256, p, "bfloat16"), "input size 256 != hidden 512"),
             (("lstm", 512, 65, 4, 512, p, "bfloat16"), r"batch over 64 and not a multiple"),
             (("lstm", 512, 64, 5, 512, p, "bfloat16"), "160 > 132 SMs"),
             (("lstm", 512, 64, 1, 512, p, "bfloat16"), "one layer"),
             (("lstm", 512, 64, 4, 512, sm80, "bfloat16"),
              r"cluster pairs decline: compute capability 8\.\d+ has no thread-block clusters"),
             (("lstm", 64, 8, 33, 64, p, "bfloat16"), r"cluster pairs decline: 66 pairs > 64")]
    for args, why in cases:
        f = SMB.stack_mma_bwd_fit(*args)
        assert not f.ok and re.search(why, f.reason), (args, f.reason)
        assert "DOES NOT FIT" in f.describe()
    # its shared memory is the forward's less 2,560 bytes (fewer stages, no biases, the
    # pair's sums): the forward's fit declines first; the pair rule checks it for SMB_NS builds
    assert SMB.stack_mma_bwd_smem_bytes(512) < 195072   # stack_mma_smem_bytes(512)
    small = dict(p, sharedMemPerBlockOptin=150000, sharedMemPerMultiprocessor=150000)
    assert SMB.pair_decline(512, 2, small, smem=SMB.stack_mma_bwd_smem_bytes(512, stages=6)) \
        == "202752 bytes of shared memory > 148976 a block can have"   # less the reserve
    regs = dict(p, regsPerMultiprocessor=32768)
    f = SMB.stack_mma_bwd_fit("lstm", 256, 64, 2, 256, regs, "bfloat16")
    assert not f.ok and "registers" in f.reason, f.reason
    # whole batch groups, as the forward's: two groups of 32 pairs at L4 H 256 B 128
    two = SMB.stack_mma_bwd_fit("lstm", 256, 128, 4, 256, p, "bfloat16")
    assert two.ok and two.groups == 2 and two.blocks == 128 and "2 batch groups" in two.reason
    assert two.scalars(3)["groups"] == 2


_ARGS = ("int, int, {T}*, int, float*, int, float*, int, float*, int, float*, int, "
         "unsigned int*, int, const float*, int, const float*, int, const float*, int, "
         "const float*, int, const float*, int, const float*, int, int, int, int, int")


def test_both_instantiations_compile_without_spills(tmp_path):
    """nvcc -arch=sm_90a --resource-usage: no stack frame, no spills, registers within
    SMB_REGS; the PTX multiplies with mma.sync (bf16 and f16) and exchanges the pair's sums
    through distributed shared memory."""
    found, ptx = nvcc_instantiations(
        tmp_path, KERNEL,
        [f"{SMB.STACK_MMA_BWD_KERNEL}_t<{t}, false>({_ARGS.format(T=t)})"
         for t in ("bf16", "fp16")])
    assert len(found) == 2, found
    for name, (regs, stack, st, ld) in found.items():
        assert (stack, st, ld) == (0, 0, 0), f"{name}: stack/spills {stack}/{st}/{ld}"
        assert regs <= SMB.SMB_REGS, (name, regs)
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in ptx
    assert "st.shared::cluster.f32" in ptx
