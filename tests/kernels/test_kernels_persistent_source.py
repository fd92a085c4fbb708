"""The per-layer persistent kernels' CUDA source (cuda_src/persistent.cu v3), checked without a
GPU: its constants and its decomposition formulas are rnnrt.kernels.persistent's; it compiles
for sm_90 with NVRTC (with nvcc: test_kernels_sources.py), ptxas reports no spills and no
more registers than the fit assumes (__launch_bounds__(256, 1)); the PTX stages h_t with
16-byte cp.async (and a 4-byte fallback), multiplies the first half of its chunks while the
second is in flight, prefetches gx before the grid barrier, whose fences are acq_rel and
whose spin is a relaxed load; the cluster kernels push h and meet at the cluster barrier;
the SASS keeps LDGSTS and no MEMBAR.SC.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from rnnrt.cells import get_cell
from rnnrt.kernels import persistent as P
from rnnrt.kernels import persistent_bwd as PB
from rnnrt.kernels import sources as S
from rnnrt.kernels.stack import PS_REGS, STACK_KERNELS
from rnnrt.kernels.stack_bwd import SB_REGS, STACK_BWD_GRU_KERNEL, STACK_BWD_KERNEL
from testkit import (BWD_KERNELS, CELLS, CLUSTER_KERNELS, GRID_KERNELS, PERSISTENT, find_nvrtc,
                     nvrtc_compile)

SRC = S.source("persistent.cu")


def test_constants_match_the_kernel():
    """PK_TM, PK_TB, PK_CPT, PK_MAX_THREADS are rnnrt.kernels.persistent's; the kernel's geometry
    (pk_geometry), thread roles, cells, traps and shared-memory check are the formulas that
    geometry, lane_grid, partial_stride, thread_roles and owned mirror (tested against
    hand-computed values above); the v2 constants are gone."""
    define = lambda n: int(re.search(rf"#define {n} (\d+)", SRC)[1])   # noqa: E731
    assert define("PK_TM") == P.PK_TM and define("PK_TB") == P.PK_TB
    assert define("PK_CPT") == P.PK_CPT and define("PK_MAX_THREADS") == P.PK_MAX_THREADS
    assert define("PK_CLUSTER") == P.PK_CLUSTER and define("PK_LR_MAX") == P.PK_LR_MAX
    for gone in ("PK_KT", "PK_BT", "PK_LD", "KS_MAX", "sts128"):
        assert not re.search(rf"\b{gone}\b", SRC), f"v2's {gone} is still in the .cu"
    # each kernel and its typed instantiation K_t<TS, TF32>
    assert SRC.count("__launch_bounds__(PK_MAX_THREADS, 1)") == 2 * len(PERSISTENT)
    assert S.source("persistent_stack.cu").count("__launch_bounds__(PK_MAX_THREADS, 1)") == 2
    assert S.source("persistent_stack_bwd.cu").count("__launch_bounds__(PK_MAX_THREADS, 1)") == 2
    assert "return 4 * (((H + 3) / 4) | 1);" in SRC          # stride_r
    assert "g.SR = pk_stride_r(H);" in SRC and "g.SH = pk_stride_r(KT);" in SRC   # tile_stride
    # lane_grid, k-groups, CPW (Fit.chunks_per_warp), partial_stride
    for line in ("g.M = G * U;",
                 "g.LR = min(PK_LR_MAX, pk_pow2ceil((g.M + PK_TM - 1) / PK_TM));",
                 "g.LB = min(32 / g.LR, pk_pow2ceil((B + PK_TB - 1) / PK_TB));",
                 "g.LK = 32 / (g.LR * g.LB);",
                 "g.NW = nt / 32;",
                 "g.NKG = g.NW * g.LK;",
                 "g.CPW = (KT / 4 + g.NW - 1) / g.NW;",
                 "g.BP = 32 * ((B - g.LB + 31) / 32) + g.LB;",
                 # thread_roles
                 "const int lr = lane % g.LR, lb = (lane / g.LR) % g.LB, "
                 "lk = lane / (g.LR * g.LB);",
                 # the FMA path's k-group (the tensor-core path's is the warp: kernels/mma.py)
                 "const int kg = MMA ? warp : warp * g.LK + lk;",
                 # owned: e = tid + i*threads, jj = e % U, b = e / U
                 "const int e = tid + i * nt;",
                 "const int jj = e % U;",
                 "cell_b[i] = e / U;",
                 # geometry's refusals: k_tile, whole warps, cells; the fit's: units, smem
                 "if (U < 1 || Bfull < 1 || H < 1 || KT < 4 || KT % 4 != 0 || nt % 32 != 0) __trap();",
                 "(long long)U * BG > (long long)PK_CPT * nt",
                 "if ((long long)ranks * U < H ||",
                 "(long long)dynamic_smem_bytes() < need)"):
        assert line in SRC, line
    # the shared memory the kernel checks for is the fit's sum, term by term: R slice, h
    # tile, partial sums
    # tile (two buffers in the cluster kernel, each of BG batches), partial sums
    assert "const long long need = 4LL * ((long long)g.M * g.SR + (CL ? 2LL : 1LL) * BG * g.SH\n" \
           "                                  + (long long)g.NKG * g.M * g.BP);" in SRC
    # the cluster kernel's batch slice (Fit.batch_per_block, Fit.batches) and units (rank)
    for line in ("BG = (Bfull + (int)pk_clusters() - 1) / (int)pk_clusters();",
                 "b_off = (int)pk_cluster_id() * BG;", "B = min(BG, Bfull - b_off);",
                 "rank = (int)pk_cluster_rank();", "const int j0 = rank * U;"):
        assert line in SRC, line


def test_nvrtc_compiles_sm90():
    lib = find_nvrtc()
    if lib is None:
        pytest.skip("libnvrtc not found (pip install nvidia-cuda-nvrtc to run this check)")
    ok, log = nvrtc_compile(lib, SRC, "persistent.cu", ["-std=c++17", "--gpu-architecture=sm_90"])
    assert ok, f"NVRTC failed:\n{log}"
    assert "warning" not in log.lower(), log


_USAGE = re.compile(r"Compiling entry function '(\w+)'.*?(\d+) bytes stack frame, (\d+) bytes "
                    r"spill stores, (\d+) bytes spill loads.*?Used (\d+) registers", re.S)


def _resource_usage(text):
    """{kernel: (registers, stack, spill stores, spill loads)} from ptxas -v output."""
    return {m[0]: (int(m[4]), int(m[1]), int(m[2]), int(m[3])) for m in _USAGE.findall(text)}


def test_nvcc_resource_usage_no_spills_within_the_launch_bounds(nvcc_sm90):
    """ptxas: no stack, no spills, and no more registers than the fit assumes
    (NVCC_REGS), which is at most what the header's __launch_bounds__(PK_MAX_THREADS = 256,
    1) allows a thread: 255 (256 threads x 255 registers fit one SM's 64 K)."""
    usage = {}
    for file in ("persistent.cu", "persistent_stack.cu", "persistent_bwd.cu",
                 "persistent_stack_bwd.cu", "persistent_bwd_pair.cu"):
        usage.update(_resource_usage(nvcc_sm90(file)[1]))
    pairs = {PB.pair_kernel_name(c) for c in CELLS}   # the backward grid kernels in pairs
    assert set(usage) == (set(PERSISTENT) | set(STACK_KERNELS.values())
                          | {STACK_BWD_KERNEL, STACK_BWD_GRU_KERNEL}
                          | set(BWD_KERNELS) | pairs), usage
    assert "__launch_bounds__(PK_MAX_THREADS = 256, 1)" in SRC, "the header's Resources"
    assert P.PK_MAX_THREADS * 255 <= 65536 and set(P.NVCC_REGS) == set(CELLS)
    for name, (regs, stack, st, ld) in usage.items():
        limit = _regs_limit(name)
        assert (stack, st, ld) == (0, 0, 0), f"{name}: stack/spills {stack}/{st}/{ld}"
        assert regs <= limit <= 255, f"{name}: {regs} registers > the fit's {limit}"


def _regs_limit(name):
    """The registers the fit of kernel ``name`` assumes a thread."""
    if name in STACK_KERNELS.values():
        return PS_REGS
    if name in (STACK_BWD_KERNEL, STACK_BWD_GRU_KERNEL):
        return SB_REGS
    regs = PB.NVCC_REGS if name.endswith("_bwd") else P.NVCC_REGS   # grid and cluster
    return regs[name.split("_persistent")[0]]


@pytest.mark.parametrize("file, kernels", [
    ("persistent.cu", PERSISTENT), ("persistent_stack.cu", list(STACK_KERNELS.values())),
    ("persistent_bwd.cu", BWD_KERNELS),
    ("persistent_stack_bwd.cu", [STACK_BWD_KERNEL, STACK_BWD_GRU_KERNEL])])
def test_nvrtc_ptx_resource_usage_no_spills(tmp_path, file, kernels):
    """CuPy compiles with NVRTC: its PTX, through ptxas, must not spill either."""
    lib, ptxas = find_nvrtc(), shutil.which("ptxas")
    if lib is None or ptxas is None:
        pytest.skip("needs libnvrtc and ptxas")
    import ctypes
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), S.source(file).encode(), file.encode(),
                                  0, None, None) == 0
    try:
        opts = (ctypes.c_char_p * 2)(b"-std=c++17", b"--gpu-architecture=compute_90")
        assert lib.nvrtcCompileProgram(prog, 2, opts) == 0
        size = ctypes.c_size_t()
        assert lib.nvrtcGetPTXSize(prog, ctypes.byref(size)) == 0
        ptx = ctypes.create_string_buffer(size.value)
        assert lib.nvrtcGetPTX(prog, ptx) == 0
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
    (tmp_path / "p.ptx").write_bytes(ptx.value)
    r = subprocess.run([ptxas, "-arch=sm_90", "-v", str(tmp_path / "p.ptx"), "-o",
                        str(tmp_path / "p.cubin")], capture_output=True, text=True, timeout=300)
    if r.returncode != 0 and "Unsupported .version" in r.stderr:
        # an NVRTC newer than the CUDA toolkit's ptxas (a pip wheel beside an older nvcc):
        # its PTX cannot be assembled here, which says nothing of the kernels
        pytest.skip(f"ptxas {ptxas} cannot read this NVRTC's PTX: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr
    usage = _resource_usage(r.stdout + r.stderr)
    assert set(usage) == set(kernels), usage
    for name, (regs, stack, st, ld) in usage.items():
        assert (stack, st, ld) == (0, 0, 0), f"{name}: stack/spills {stack}/{st}/{ld}"
        assert regs <= _regs_limit(name), (name, regs)


@pytest.fixture(scope="module")
def nvcc_ptx(nvcc_sm90):
    """{kernel: its PTX body} of persistent.cu's per-layer kernels (the session's compile)."""
    bodies = re.split(r"\.entry\s+", nvcc_sm90("persistent.cu")[2])[1:]
    return {k: v for k, v in ((b[:b.index("(")].strip(), b) for b in bodies)
            if k in PERSISTENT}


def _lines_at(lines, pattern):
    """Indices of the lines matching ``pattern``."""
    return [i for i, line in enumerate(lines) if re.search(pattern, line)]


def test_ptx_stages_h_with_cp_async(nvcc_ptx):
    """Each kernel stages h_t with 16-byte cp.async copies (cp.async.cg.shared.global ...,
    16: through L2, no registers), every staging call closing its own group (as many
    commit_groups as cp.async sites), the 4-byte fallback beside each (4 ld.global.cg.f32 a
    chunk). It only ever waits for all but the newest group (wait_group 1: "this half has
    landed"), and the halves are a ping-pong: after the first wait the lane multiplies (at
    least one chunk's PK_TM * PK_TB * 4 FMAs, reading shared memory 16 bytes at a time,
    ld.shared.v4.f32), then stages the next tile's half (a cp.async site) before it waits
    for its second half. v2 staged through registers (ld.global.cg.v4, then st.shared.v4)
    before any FMA."""
    for name in GRID_KERNELS:
        lines = nvcc_ptx[name].splitlines()
        cp = _lines_at(lines, r"cp\.async\.cg\.shared\.global \[[^]]+\], \[[^]]+\], 16;")
        assert len(cp) >= 2, (name, cp)
        assert len(_lines_at(lines, r"cp\.async\.commit_group;")) == len(cp), name
        assert len(_lines_at(lines, r"ld\.global\.cg\.f32")) == 4 * len(cp), name
        assert not _lines_at(lines, r"ld\.global\.cg\.v4|st\.shared\.v4"), name
        waits = _lines_at(lines, r"cp\.async\.wait_group")
        assert waits and all(re.search(r"wait_group 1;", lines[i]) for i in waits), \
            [lines[i].strip() for i in waits]
        assert cp[1] < waits[0], f"{name}: waits before both halves are in flight"
        fma = _lines_at(lines, r"fma\.rn\.f32")
        assert waits[0] < fma[0], f"{name}: multiplies before the first half has landed"
        end = waits[1] if len(waits) > 1 else len(lines)
        first_half = [i for i in fma if waits[0] < i < end]
        assert len(first_half) >= P.PK_TM * P.PK_TB * 4, f"{name}: nothing multiplied in flight"
        assert any(first_half[0] < i < end for i in cp), \
            f"{name}: the next half is not staged between this half's FMAs and the next wait"
        assert _lines_at(lines, r"ld\.shared\.v4\.f32"), name


def test_ptx_grid_barrier_is_acq_rel(nvcc_ptx):
    """The grid barrier as the header has it: thread 0's fence.acq_rel.gpu before its
    arrival (atom.global.add) and after its spin, the spin a relaxed load (ld.relaxed.gpu),
    the exit's add after both; no fence.sc / membar (__threadfence) and no ld.acquire (an
    L1 invalidation every time round the spin)."""
    for name in GRID_KERNELS:
        lines = nvcc_ptx[name].splitlines()
        fence = _lines_at(lines, r"fence\.acq_rel\.gpu;")
        add = _lines_at(lines, r"atom\.global\.add\.u32")
        spin = _lines_at(lines, r"ld\.relaxed\.gpu\.global\.u32")
        assert len(fence) == 2 and len(add) == 2 and spin, (name, fence, add, spin)
        assert fence[0] < add[0] < spin[0] <= spin[-1] < fence[1] < add[1], name
        assert not _lines_at(lines, r"fence\.sc|membar|ld\.acquire"), name


def test_ptx_prefetches_the_pointwise_inputs(nvcc_ptx):
    """gx is loaded with the streaming hint (ld.global.cs) at two places, G * PK_CPT loads
    each (every gate of every cell of the thread): before the copy of R ends (the first
    bar.sync) and so before the first step's FMAs, and after the step's h stores
    (st.global.cg) and before the grid barrier (its bar.sync and fence), so that step t+1's
    loads are in flight across it; the cluster kernels: between the cluster barrier's
    arrive and its wait. The biases are read-only loads (ld.global.nc), once, before the copy
    of R ends. v1 loaded gx after the dot products, plain."""
    for name, body in nvcc_ptx.items():
        G = get_cell(name.split("_persistent")[0]).gates
        n = G * P.PK_CPT
        lines = body.splitlines()
        cs = _lines_at(lines, r"ld\.global\.cs\.f32")
        assert len(cs) == 2 * n, (name, len(cs))
        bar = _lines_at(lines, r"bar\.sync")
        nc = _lines_at(lines, r"ld\.global\.nc\.f32")   # the two biases, once
        assert len(nc) == 2 * n and nc[-1] < bar[0], (name, len(nc))
        fma = _lines_at(lines, r"fma\.rn\.f32")
        stores = _lines_at(lines, r"st\.global\.cg\.f32")
        first, second = cs[:n], cs[n:]
        if name in CLUSTER_KERNELS:
            # the step's end is the cluster barrier (its last arrive and wait); step t+1's
            # gx is loaded between them (the arrive's release would wait for the loads)
            bar = _lines_at(lines, r"bar\.sync|barrier\.cluster\.arrive")
            arrive = _lines_at(lines, r"barrier\.cluster\.arrive")[-1]
            wait = _lines_at(lines, r"barrier\.cluster\.wait")[-1]
            assert first[-1] < bar[0] and first[-1] < fma[0], f"{name}: gx not loaded up front"
            assert arrive < second[0] and second[-1] < wait, \
                f"{name}: step t+1's gx is not loaded between the arrive and the wait"
            continue
        fence = _lines_at(lines, r"fence\.acq_rel\.gpu;")
        barrier = max(i for i in bar if i < fence[0])     # the grid barrier's __syncthreads
        assert first[-1] < bar[0] and first[-1] < fma[0], f"{name}: gx not loaded up front"
        assert stores[-1] < second[0] and second[-1] < barrier, \
            f"{name}: step t+1's gx is not loaded between the h stores and the barrier"


def test_ptx_cluster_kernels_push_h_and_meet_at_the_cluster_barrier(nvcc_ptx):
    """The cluster kernels as the header has them: no h staging from global memory (no
    cp.async) and no grid barrier (no fence, no atomics, no spin); each h_{t+1} goes to
    every block of the cluster (mapa + st.shared::cluster, PK_CLUSTER of each, unrolled),
    and the blocks meet at the cluster barrier with release / acquire semantics, once before
    the first step (after the copy of R and h_0) and once a step after the pushes, the
    step's global stores (st.global.cg) between its arrive and its wait."""
    for name in CLUSTER_KERNELS:
        lines = nvcc_ptx[name].splitlines()
        assert not _lines_at(lines, r"cp\.async|fence\.|atom\.|ld\.relaxed|membar"), name
        arrive = _lines_at(lines, r"barrier\.cluster\.arrive\.release\.aligned;")
        wait = _lines_at(lines, r"barrier\.cluster\.wait\.acquire\.aligned;")
        assert len(arrive) == len(wait) == 2, (name, arrive, wait)
        assert all(a < w for a, w in zip(arrive, wait)), name
        mapa = _lines_at(lines, r"mapa\.shared::cluster\.u32")
        push = _lines_at(lines, r"st\.shared::cluster\.f32")
        stores = _lines_at(lines, r"st\.global\.cg\.f32")
        fma = _lines_at(lines, r"fma\.rn\.f32")
        assert len(push) == len(mapa) == P.PK_CPT * P.PK_CLUSTER, (name, len(push), len(mapa))
        # the step's global stores go between the arrive and the wait (the release then
        # waits for the pushes only)
        assert len(stores) == P.PK_CPT, (name, len(stores))
        assert wait[0] < fma[0] and push[-1] < arrive[1] < stores[0], name
        assert stores[-1] < wait[1], name


def _cuobjdump():
    exe = shutil.which("cuobjdump")
    if exe is None:   # pip install nvidia-cuda-cuobjdump puts it beside the other nvidia libs
        try:
            import nvidia
            hits = [Path(p) / "cu13" / "bin" / "cuobjdump" for p in nvidia.__path__]
            exe = next((str(h) for h in hits if h.is_file()), None)
        except ImportError:
            pass
    if exe is None:
        pytest.skip("cuobjdump not found (pip install nvidia-cuda-cuobjdump to run this check)")
    return exe


def test_sass_stages_with_ldgsts(nvcc_sm90):
    """What ptxas makes of it: each kernel's SASS stages h_t with LDGSTS.E.BYPASS.128
    (16-byte global-to-shared copies past L1), closes its groups (LDGDEPBAR) and waits on
    them (DEPBAR); the barrier's fence is MEMBAR.ALL.GPU, not __threadfence's MEMBAR.SC,
    and the spin between the arrival (ATOMG.E.ADD) and the acquire fence polls with plain
    loads, no L1 invalidation (CCTL) every time round."""
    cuobjdump = _cuobjdump()   # before the compile: where it is missing, nothing to compile for
    cubin = nvcc_sm90("persistent.cu")[0]
    for name in GRID_KERNELS:
        r = subprocess.run([cuobjdump, "-sass", "-fun", name, str(cubin)],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert _lines_at(lines, r"\bLDGSTS\.E\.BYPASS\.128\b"), name
        assert _lines_at(lines, r"\bLDGDEPBAR\b") and _lines_at(lines, r"\bDEPBAR\.LE\b"), name
        assert _lines_at(lines, r"\bMEMBAR\.ALL\.GPU\b"), name
        assert not _lines_at(lines, r"\bMEMBAR\.SC\b"), name
        arrive = _lines_at(lines, r"\bATOMG\.E\.ADD\b")[0]
        fence = next(i for i in _lines_at(lines, r"\bMEMBAR\b") if i > arrive)
        spin = lines[arrive:fence]
        assert _lines_at(spin, r"\bLDG\.E\.STRONG\.GPU\b"), f"{name}: no spin load found"
        assert not _lines_at(spin, r"\bCCTL\b"), f"{name}: the spin invalidates L1"
