"""The tensor-core stack kernel (lstm_persistent_stack_mma_fwd_t<TS>: every layer of an LSTM stack
in one launch, the product on tensor cores) without a GPU: the .cu on CPU threads
(tests/kernels/persistent_host_sim.cpp, PK_SIM_STACK_MMA; mma.sync emulated over the warp's
exchange buffer by the PTX ISA's fragment layout) against the rounding-aware float64
reference (rnnrt.reference.forward(..., dtype)) on random data with poisoned outputs, twice
on one sync buffer, bf16 and fp16; the same source with its waits removed, and with two
fragment registers swapped, must be caught; the NumPy twin against the reference; the fit's
rules and the constants the host mirrors."""
from __future__ import annotations

import dataclasses
import re
import subprocess

import numpy as np
import pytest

from rnnrt import reference
from rnnrt.check import compare
from rnnrt.kernels import stack_mma as SM
from rnnrt.kernels.limits import H100_SXM
from rnnrt.kernels.mma import MMA_DTYPES
from rnnrt.kernels.sources import source
from rnnrt.precision import get_precision, round_to_storage
from testkit import build_host_sim, nvcc_instantiations

TS = {"bfloat16": "bf16", "float16": "fp16"}




def _build(tmp_path_factory, src_text, name, define=None):
    d = tmp_path_factory.mktemp(name)
    src = d / "persistent_stack_mma.cu"
    src.write_text((f"#define {define}\n" if define else "") + src_text)
    return build_host_sim(d / "sim", src, define="PK_SIM_STACK_MMA")


def without_waits(text):
    """The kernel's three waits gone: calls of a wait that returns at once."""
    cut = re.sub(r"ps_wait\((lower|mine), ", r"ps_nowait(\1, ", text)
    assert cut.count("ps_nowait(") == 3
    return "static void ps_nowait(const unsigned int*, unsigned int) {}\n" + cut


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    return _build(tmp_path_factory, source("persistent_stack_mma.cu"), "stack_mma_sim")


@pytest.fixture(scope="module")
def sim_ns2(tmp_path_factory):
    """Two stages: tile NK (the first of the h half) is issued inside the K loop, after the
    own wait there (with the default stages that takes H >= 320: too many CPU threads)."""
    return _build(tmp_path_factory, source("persistent_stack_mma.cu"), "stack_mma_ns2",
                  "PSM_NS 2")


def case(B, H, T, L, dtype, seed=0):
    """Random weights (fp32), x and h0 representable in ``dtype``, c0 fp32; -> (arrays in the
    sim's layout, the rounding-aware reference's per-layer sequences h, c, act)."""
    rng = np.random.default_rng(seed)
    f32 = np.float32
    ldw = 4 * H * H + 64          # a layer's stride in the flat parameters (as the plan's)
    ldb = 4 * H + 4
    x = round_to_storage(rng.standard_normal((T, B, H)), dtype).astype(f32)
    W = (rng.standard_normal((L, 4 * H, H)) / np.sqrt(H)).astype(f32)
    R = (rng.standard_normal((L, 4 * H, H)) / np.sqrt(H)).astype(f32)
    wih, whh = np.zeros((L, ldw), f32), np.zeros((L, ldw), f32)
    wih[:, :4 * H * H], whh[:, :4 * H * H] = W.reshape(L, -1), R.reshape(L, -1)
    bw = (0.1 * rng.standard_normal((L, ldb))).astype(f32)
    br = (0.1 * rng.standard_normal((L, ldb))).astype(f32)
    h = np.full((L, T + 1, B, H), np.nan, f32)
    c = np.full((L, T + 1, B, H), np.nan, f32)
    h[:, 0] = round_to_storage(0.5 * rng.standard_normal((L, B, H)), dtype)
    c[:, 0] = 0.5 * rng.standard_normal((L, B, H))
    arrays = dict(x=x, h=h, c=c, wih=wih, whh=whh, bw=bw, br=br)
    f64 = np.float64
    p = [{"weight_ih": W[k].astype(f64), "weight_hh": R[k].astype(f64),
          "bias_ih": bw[k, :4 * H].astype(f64), "bias_hh": br[k, :4 * H].astype(f64)}
         for k in range(L)]
    _, _, _, cache = reference.forward("lstm", p, x.astype(f64), h[:, 0].astype(f64),
                                       c[:, 0].astype(f64), dtype=dtype)
    want = [np.stack([lc.h[1:] for lc in cache.layers]),
            np.stack([lc.c[1:] for lc in cache.layers]),
            np.stack([lc.gates for lc in cache.layers])]
    return arrays, (ldw, ldb), want


def run_sim(exe, tmp_path, B, H, T, L, dtype, seed=0, launches=2):
    """The sim's (h, c, act) [L, T, B, *] and the reference's."""
    arrays, (ldw, ldb), want = case(B, H, T, L, dtype, seed)
    for n, a in arrays.items():
        a.tofile(tmp_path / f"{n}.f32")
    smem = SM.stack_mma_smem_bytes(H)
    args = [exe, B, H, T, L, SM.PSM_M // 4, smem, launches, tmp_path, ldw, ldb, TS[dtype]]
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"host simulation failed ({r.returncode}):\n{r.stderr}"
    h = np.fromfile(tmp_path / "h.out", np.float32).reshape(L, T + 1, B, H)
    c = np.fromfile(tmp_path / "c.out", np.float32).reshape(L, T + 1, B, H)
    act = np.fromfile(tmp_path / "act.out", np.float32).reshape(L, T, B, 4 * H)
    assert np.array_equal(h[:, 0], arrays["h"][:, 0]), "h0 changed"
    return (h[:, 1:], c[:, 1:], act), want


def _check(got, want, dtype, what):
    p = get_precision(dtype)
    for name, g, w in zip(("h", "c", "act"), got, want):
        r = compare(g, w, p.atol, p.rtol, name=f"{what} {name}")
        assert r.ok, str(r)


# (B, H, T, L, dtype, launches): both batch halves and every n8 tile, twice on one sync
# buffer; B < 8 (the second half idle, dead batches in a live n8 tile), three layers
# B 128: two whole batch groups side by side (a row of counters each)
CASES = [(64, 64, 2, 2, "bfloat16", 2), (5, 64, 2, 3, "float16", 1), (128, 64, 2, 2, "bfloat16", 2)]


@pytest.mark.parametrize("B, H, T, L, dtype, launches", CASES,
                         ids=[f"B{c[0]}H{c[1]}T{c[2]}L{c[3]}-{c[4]}" for c in CASES])
def test_stack_mma_kernel_on_cpu_threads_matches_reference(sim, tmp_path, B, H, T, L, dtype,
                                                           launches):
    got, want = run_sim(sim, tmp_path, B, H, T, L, dtype, launches=launches)
    _check(got, want, dtype, f"stack mma B{B} H{H} L{L} {dtype}")


def test_own_wait_inside_the_k_loop(sim_ns2, tmp_path):
    """Two stages: the own wait inside the K loop; B 37: the second batch half partly live;
    fp16."""
    got, want = run_sim(sim_ns2, tmp_path, 37, 64, 2, 2, "float16", launches=1)
    _check(got, want, "float16", "stack mma NS 2")


def test_without_its_waits_is_caught(tmp_path_factory, tmp_path):
    """Layer 1 then reads layer 0's h before it is written (NaN poison), and each layer its
    own h_t before the other blocks wrote it: the comparison must fail."""
    exe = _build(tmp_path_factory, without_waits(source("persistent_stack_mma.cu")),
                 "stack_mma_no_waits")
    got, want = run_sim(exe, tmp_path, 16, 64, 2, 2, "bfloat16", launches=1)
    assert not compare(got[0], want[0], 2e-2, 2e-2).ok


def test_a_wrong_fragment_layout_is_caught(tmp_path_factory, tmp_path):
    """a1 and a2 swapped (rows g+8 and columns 4c+2.. exchanged): the emulated mma multiplies
    the wrong elements, and the result is refused."""
    text = source("persistent_stack_mma.cu")
    good = "const unsigned int a[4] = {r0.lo, r8.lo, r0.hi, r8.hi};"
    assert text.count(good) == 1
    bad = text.replace(good, "const unsigned int a[4] = {r0.lo, r0.hi, r8.lo, r8.hi};")
    exe = _build(tmp_path_factory, bad, "stack_mma_swapped")
    got, want = run_sim(exe, tmp_path, 8, 64, 2, 2, "bfloat16", launches=1)
    with pytest.raises(AssertionError):
        _check(got, want, "bfloat16", "planted")


@pytest.mark.parametrize("dtype", MMA_DTYPES)
def test_twin_matches_reference(dtype):
    """The registry's NumPy twin (the CPU executors' kernel) on the sim's inputs."""
    B, H, T, L = 9, 64, 4, 3
    arrays, (ldw, ldb), want = case(B, H, T, L, dtype, seed=4)
    h = arrays["h"].reshape(L * (T + 1) * B, H).copy()
    c = arrays["c"].reshape(L * (T + 1) * B, H).copy()
    act = np.full((L * T * B, 4 * H), np.nan, np.float32)
    sync = np.zeros((1, 2 * L), np.uint32)
    ins = (arrays["x"].reshape(T * B, H), arrays["wih"][:, :4 * H * H],
           arrays["whh"][:, :4 * H * H], arrays["bw"][:, :4 * H], arrays["br"][:, :4 * H])
    SM.lstm_persistent_stack_mma_fwd(B, H, (h, c, act, sync), ins, T, L, 16, dtype=dtype)
    got = (h.reshape(L, T + 1, B, H)[:, 1:], c.reshape(L, T + 1, B, H)[:, 1:],
           act.reshape(L, T, B, 4 * H))
    _check(got, want, dtype, f"twin {dtype}")
    with pytest.raises(ValueError, match="bfloat16 / float16 only"):
        SM.lstm_persistent_stack_mma_fwd(B, H, (h, c, act, sync), ins, T, L, 16,
                                         dtype="float32")


def test_constants_match_the_kernel():
    text = source("persistent_stack_mma.cu")
    for name in ("PSM_M", "PSM_BMAX", "PSM_KT", "PSM_NS", "PSM_RP"):
        m = re.search(rf"#define {name} (\d+)", text)
        assert m and int(m[1]) == getattr(SM, name), name
    m = re.search(r"#define PSM_SX \(PSM_KT \+ (\d+)\)", text)
    assert m and SM.PSM_KT + int(m[1]) == SM.PSM_SX


def test_fit_rules_name_what_is_wrong():
    p = H100_SXM.props()
    ok = SM.stack_mma_fit("lstm", 512, 64, 4, 512, p, "bfloat16")
    assert ok.ok and ok.blocks == 128 and ok.smem_bytes == SM.stack_mma_smem_bytes(512)
    assert ok.kernel == SM.STACK_MMA_KERNEL and ok.grid == (128, 1, 1)
    assert "tensor-core stack" in ok.describe()
    assert SM.stack_mma_fit("lstm", 640, 64, 2, 640, p, "float16").ok
    sm70 = dataclasses.replace(H100_SXM, cc_major=7).props()
    cases = [(("gru", 512, 64, 4, 512, p, "bfloat16"), "LSTM only"),
             (("lstm", 512, 64, 4, 512, p, "float32"), "bfloat16 and float16"),
             (("lstm", 512, 64, 4, 512, p, "tf32"), "bfloat16 and float16"),
             (("lstm", 512, 64, 4, 256, p, "bfloat16"), "input size 256 != hidden 512"),
             (("lstm", 544, 64, 2, 544, p, "bfloat16"), "multiple of 64"),
             (("lstm", 256, 65, 4, 256, p, "bfloat16"), r"batch over 64 and not a multiple"),
             (("lstm", 512, 128, 4, 512, p, "bfloat16"), r"2 batch groups .* > 132 SMs"),
             (("lstm", 512, 64, 5, 512, p, "bfloat16"), "160 > 132 SMs"),
             (("lstm", 704, 64, 2, 704, p, "bfloat16"), "shared memory"),
             (("lstm", 512, 64, 1, 512, p, "bfloat16"), "one layer"),
             (("lstm", 512, 64, 4, 512, sm70, "bfloat16"), "compute capability 8.0")]
    for args, why in cases:
        f = SM.stack_mma_fit(*args)
        assert not f.ok and re.search(why, f.reason), (args, f.reason)
        assert "DOES NOT FIT" in f.describe()
    # whole batch groups: L4 H 256 B 128, two of 64 blocks; the group count a kernel scalar
    two = SM.stack_mma_fit("lstm", 256, 128, 4, 256, p, "bfloat16")
    assert two.ok and two.groups == 2 and two.grid == (128, 1, 1) and two.scalars(3)["groups"] == 2


_ARGS = ("int, int, {T}*, int, float*, int, float*, int, unsigned int*, int, const {T}*, int, "
         "const float*, int, const float*, int, const float*, int, const float*, int, int, int, "
         "int, int")


def test_both_instantiations_compile_without_spills(tmp_path):
    """nvcc -arch=sm_90a --resource-usage: no stack frame, no spills, registers within
    PSM_REGS; the PTX multiplies with mma.sync (bf16 and f16)."""
    found, ptx = nvcc_instantiations(
        tmp_path, "persistent_stack_mma.cu",
        [f"{SM.STACK_MMA_KERNEL}_t<{t}, false>({_ARGS.format(T=t)})" for t in ("bf16", "fp16")])
    assert len(found) == 2, found
    for name, (regs, stack, st, ld) in found.items():
        assert (stack, st, ld) == (0, 0, 0), f"{name}: stack/spills {stack}/{st}/{ld}"
        assert regs <= SM.PSM_REGS, (name, regs)
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in ptx
